#!/usr/bin/env bash
# Open MPI against MPICH (Hydra) on one node: 2-rank training img/s, bound and unbound ranks, and
# the all-reduce bus bandwidth of the UNet16 /8 (1.8 MiB) and /1 (112 MiB) gradient arenas.
#
#   bash bench/mpi_families.sh [OPENMPI_BUILD] [MPICH_BUILD]   (default build/default build/mpich)
#   environment: REPEATS=3 STEPS=16 EPOCHS=4 SIZE=128 BATCH=8 DIVISOR=8
#
# dptrain runs without --threads, as a user would: the threads per rank are dptrain's own choice
# (the start-up line's source is printed once per launcher). Each run trains EPOCHS epochs of
# STEPS steps on a synthetic dataset (no augmentation, shards cached); the first epoch is
# discarded and the best of the others kept. The launchers alternate, REPEATS rounds, best of
# each kept. Then bench_allreduce runs under each MPI (median of its iterations).
set -euo pipefail

OMPI=${1:-build/default}
MPICH=${2:-build/mpich}
REPEATS=${REPEATS:-3}
STEPS=${STEPS:-16}
EPOCHS=${EPOCHS:-4}
SIZE=${SIZE:-128}
BATCH=${BATCH:-8}
DIVISOR=${DIVISOR:-8}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
for exe in "$OMPI/app/dptrain" "$MPICH/app/dptrain" "$OMPI/bench/bench_allreduce" \
  "$MPICH/bench/bench_allreduce"; do
  [[ -x $exe ]] || { echo "mpi_families: error: $exe is missing (build both presets)" >&2; exit 2; }
done
ROOT=()
[[ $(id -u) == 0 ]] && ROOT=(--allow-run-as-root)

declare -A LAUNCH=(
  [openmpi_bound]="mpirun -np 2 ${ROOT[*]} --bind-to core --mca pml ob1 --mca btl self,vader"
  [openmpi_unbound]="mpirun -np 2 ${ROOT[*]} --bind-to none --mca pml ob1 --mca btl self,vader"
  [mpich_hydra]="mpiexec.mpich -n 2 -launcher fork"
)
declare -A BUILD=([openmpi_bound]=$OMPI [openmpi_unbound]=$OMPI [mpich_hydra]=$MPICH)
declare -A best=([openmpi_bound]=0 [openmpi_unbound]=0 [mpich_hydra]=0)
ORDER=(openmpi_bound mpich_hydra openmpi_unbound)

"$OMPI/app/dpprep" synth --out "$WORK/bench.h5" --train 512 --val 0 --size "${SIZE}x${SIZE}" \
  >/dev/null

# run CONFIG -> best img/s over the epochs after the first (the log is kept in $WORK/CONFIG.log)
run() {
  rm -rf "$WORK/run"
  # shellcheck disable=SC2086  # the launcher's words
  ${LAUNCH[$1]} "${BUILD[$1]}/app/dptrain" --data "$WORK/bench.h5" --width-divisor "$DIVISOR" \
    --batch-size "$BATCH" --epochs "$EPOCHS" --max-steps "$STEPS" --augment none --cache \
    --resume never --model-dir "$WORK/run" --progress lines >"$WORK/$1.log" 2>&1
  grep -E '^epoch [0-9]+/' "$WORK/$1.log" | tail -n +2 | grep -oE '[0-9.]+ img/s' |
    awk '{ if ($1 > m) m = $1 } END { print m + 0 }'
}

echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "Open MPI: $(mpirun --version 2>&1 | head -1); MPICH: $(mpiexec.mpich --version 2>&1 |
  grep -m1 -i 'version' | xargs)"
for ((r = 1; r <= REPEATS; ++r)); do
  echo "round $r: load average $(cut -d' ' -f1-3 /proc/loadavg)"
  for c in "${ORDER[@]}"; do
    v=$(run "$c")
    best[$c]=$(awk -v a="${best[$c]}" -v b="$v" 'BEGIN { print (b > a ? b : a) }')
  done
done
echo
echo "unet16 /$DIVISOR, ${SIZE}x${SIZE}, batch $BATCH per rank, 2 ranks, threads chosen by dptrain"
echo
echo "| launcher | threads per rank (dptrain's start-up line) | img/s | vs Open MPI bound |"
echo "|---|---|---:|---:|"
for c in "${ORDER[@]}"; do
  threads=$(grep -m1 -oE '[0-9]+ thread\(s\)[^;,]*' "$WORK/$c.log" || echo '?')
  awk -v l="${LAUNCH[$c]}" -v t="$threads" -v v="${best[$c]}" -v ref="${best[openmpi_bound]}" \
    'BEGIN { printf "| `%s` | %s | %.1f | %.1f%% |\n", l, t, v, 100 * v / ref }'
done
echo
echo "Open MPI:"
# shellcheck disable=SC2086
${LAUNCH[openmpi_bound]} "$OMPI/bench/bench_allreduce"
echo
echo "MPICH:"
# shellcheck disable=SC2086
${LAUNCH[mpich_hydra]} "$MPICH/bench/bench_allreduce"
