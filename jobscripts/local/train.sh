#!/usr/bin/env bash
# Runs dptrain on this machine with mpirun: one rank per GPU, or NP CPU ranks when there is no GPU; Ctrl-C/SIGTERM/SIGUSR1 checkpoint mid-epoch.
#
# Usage: jobscripts/local/train.sh   (override any variable below: EPOCHS=5 NP=2 jobscripts/local/train.sh)
# Stopping: Ctrl-C, `kill -TERM <pid of this script>` or `kill -USR1 ...` make dptrain write
# model_epoch_<E>_step_<S>.h5 at the next step and exit 75; running the script again continues
# there. Exit status: 0 done, 75 stopped and resumable, anything else a failure.
# Submitted with sbatch (sbatch --requeue --signal=B:USR1@120 ... jobscripts/local/train.sh) it
# also requeues its job on exit 75, as jobscripts/slurm/*.sbatch do.
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
LR=${LR:-0.003}                           # learning rate (dptrain's AdamW default)
EXTRA_ARGS=${EXTRA_ARGS:-}                # more dptrain options, e.g. "--workers 4 --report"
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

# The signal passed on to dptrain (its --preempt-signal, beside TERM): USR1, or USR2 where NCCL 2.12 takes
# SIGUSR1 for itself (then also ask Slurm for it: #SBATCH --signal=B:USR2@<seconds>).
PREEMPT_SIGNAL=${PREEMPT_SIGNAL:-USR1}

# --- stopping, resuming ---------------------------------------------------------------------------
# The trap passes SIGUSR1 to mpirun, which forwards it to every rank (mpirun answers SIGINT/SIGTERM
# by killing the ranks a few seconds later, which could cut the checkpoint short).
mpirun_pid=""
interrupted=0
passed_on=0
# shellcheck disable=SC2317  # run from the traps below
pass_on() {  # pass_on SIGNAL
  interrupted=1
  echo "train.sh: SIG$1 received; passing SIG$PREEMPT_SIGNAL to dptrain (checkpoint, then exit 75)"
  [[ -n $mpirun_pid ]] && kill -s "$PREEMPT_SIGNAL" "$mpirun_pid" 2>/dev/null && passed_on=1
}
trap 'pass_on INT' INT
trap 'pass_on TERM' TERM
trap 'pass_on USR1' USR1
trap 'pass_on USR2' USR2

read -r -a extra_args <<<"$EXTRA_ARGS"
mkdir -p "$MODEL_DIR"
# setsid: Ctrl-C reaches this script only, not mpirun and the ranks directly.
setsid mpirun -np "$NP" ${mpi_flags[@]+"${mpi_flags[@]}"} "$DPTRAIN" \
  --data "$DATA" --model-dir "$MODEL_DIR" --model "$MODEL" --epochs "$EPOCHS" \
  --batch-size "$BATCH_SIZE" --lr "$LR" --device "$DEVICE" --resume auto --preempt-signal TERM --preempt-signal "$PREEMPT_SIGNAL" \
  ${extra_args[@]+"${extra_args[@]}"} &
mpirun_pid=$!
set +e
# A trapped signal interrupts `wait`; wait again until mpirun has really ended.
while :; do
  interrupted=0
  wait "$mpirun_pid"
  rc=$?
  (( interrupted )) || break
done
# Stopped while dptrain was still starting (before it catches signals): nothing was written, the
# checkpoints stand, so it is as resumable as an exit 75.
if (( passed_on && rc == 128 + $(kill -l "$PREEMPT_SIGNAL") )); then rc=75; fi
case $rc in
  0) exit 0 ;;
  75)
    if [[ -n ${SLURM_JOB_ID:-} ]] && command -v scontrol >/dev/null; then
      echo "train.sh: dptrain exited with 75 (preempted, resumable); requeueing job $SLURM_JOB_ID"
      scontrol requeue "$SLURM_JOB_ID" || echo "train.sh: scontrol requeue failed; resubmit to continue"
    else
      echo "train.sh: dptrain exited with 75 (stopped, resumable): run $0 again to continue"
    fi
    exit 75 ;;
  *)
    echo "train.sh: dptrain failed (exit $rc)"
    exit "$rc" ;;
esac
