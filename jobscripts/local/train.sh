#!/usr/bin/env bash
# Runs dptrain on this machine with mpirun: one rank per GPU, or NP CPU ranks when there is no GPU.
#
# Usage: jobscripts/local/train.sh   (override any variable below: EPOCHS=5 NP=2 jobscripts/local/train.sh)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

# --- what to train -------------------------------------------------------------------------------
DATA=${DATA:-$repo/out/cracks.h5}        # HDF5 dataset written by dpprep
MODEL=${MODEL:-unet16}                    # model architecture
# Checkpoints go here, one per epoch. dptrain (--resume auto) continues from the newest valid
# checkpoint in MODEL_DIR, so running this script again after an interruption picks up where the
# last run stopped; use a new directory to start from scratch.
MODEL_DIR=${MODEL_DIR:-$repo/out/runs/$MODEL}
EPOCHS=${EPOCHS:-50}                      # total epochs, counted across restarts
BATCH_SIZE=${BATCH_SIZE:-4}               # dptrain --batch-size
LR=${LR:-0.001}                           # learning rate
# cuda or cpu; by default cuda when nvidia-smi lists a GPU, else cpu.
gpus=0
if command -v nvidia-smi >/dev/null 2>&1; then gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true); fi
if [[ $gpus -gt 0 ]]; then DEVICE=${DEVICE:-cuda}; else DEVICE=${DEVICE:-cpu}; fi
# Ranks: one per GPU with cuda; with cpu, 1 (oneDNN then uses every core through its threads).
if [[ $DEVICE == cuda && $gpus -gt 0 ]]; then NP=${NP:-$gpus}; else NP=${NP:-1}; fi
# The binary of the matching preset build (cmake --preset cpu-release or cuda-release).
DPTRAIN=${DPTRAIN:-$repo/build/$DEVICE-release/app/dptrain}

export HDF5_USE_FILE_LOCKING=FALSE
# Split the cores between the ranks.
threads=$(( $(nproc) / NP ))
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( threads > 0 ? threads : 1 ))}

mpi_flags=()
if mpirun --version 2>/dev/null | grep "Open MPI" >/dev/null; then
  # Open MPI binds each of up to 2 ranks to a single core, which would starve its threads.
  mpi_flags+=(--bind-to none)
  if [[ $(id -u) -eq 0 ]]; then mpi_flags+=(--allow-run-as-root); fi
  if (( NP > $(nproc) )); then mpi_flags+=(--oversubscribe); fi
fi

mkdir -p "$MODEL_DIR"
exec mpirun -np "$NP" ${mpi_flags[@]+"${mpi_flags[@]}"} "$DPTRAIN" \
  --data "$DATA" --model-dir "$MODEL_DIR" --model "$MODEL" --epochs "$EPOCHS" \
  --batch-size "$BATCH_SIZE" --lr "$LR" --device "$DEVICE" --resume auto
