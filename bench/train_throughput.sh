#!/usr/bin/env bash
# Training throughput: dptrain np=1 vs np=2 (one thread per rank; overlapped, --no-overlap and
# without communication) and PyTorch DDP-gloo, UNet16 /8 on 128x128 images, batch 8 per rank.
#
#   bash bench/train_throughput.sh [BUILD_DIR]     (default build/default)
#   environment: REPEATS=3 STEPS=16 EPOCHS=4 SIZE=128 BATCH=8 DIVISOR=8 PYTHON=/usr/bin/python3
#
# Each dptrain run trains EPOCHS epochs of STEPS steps on a synthetic dataset (no augmentation,
# shards cached in memory); the first epoch (oneDNN primitive creation, first reads) is
# discarded and the best of the others kept: img/s = training images of the epoch over all ranks
# / the epoch's training seconds. The PyTorch peer (pytorch_peer.py) times STEPS steps
# after 3 warm-up steps. The configurations run interleaved, REPEATS rounds, best of each kept,
# so that load from other users of the machine hits every configuration alike.
set -euo pipefail

BUILD=${1:-build/default}
REPEATS=${REPEATS:-3}
STEPS=${STEPS:-16}
EPOCHS=${EPOCHS:-4}
SIZE=${SIZE:-128}
BATCH=${BATCH:-8}
DIVISOR=${DIVISOR:-8}
PYTHON=${PYTHON:-/usr/bin/python3}
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

MPI_FLAGS=(--bind-to core --mca pml ob1 --mca btl self,vader)
[ "$(id -u)" = 0 ] && MPI_FLAGS+=(--allow-run-as-root)

"$BUILD/app/dpprep" synth --out "$WORK/bench.h5" --train 512 --val 0 --size "${SIZE}x${SIZE}" \
  >/dev/null

# dptrain NP [options...] -> best img/s over the epochs after the first
dptrain_ips() {
  local np=$1
  shift
  rm -rf "$WORK/run"
  OMP_NUM_THREADS=1 mpirun -np "$np" "${MPI_FLAGS[@]}" "$BUILD/app/dptrain" \
    --data "$WORK/bench.h5" --width-divisor "$DIVISOR" --batch-size "$BATCH" --epochs "$EPOCHS" \
    --max-steps "$STEPS" --augment none --cache --resume none --model-dir "$WORK/run" "$@" |
    grep -E '^epoch [0-9]+/' | tail -n +2 | grep -oE '[0-9.]+ img/s' |
    awk '{ if ($1 > m) m = $1 } END { print m + 0 }'
}

# pytorch_ips WORLD -> img/s over all ranks
pytorch_ips() {
  "$PYTHON" "$HERE/pytorch_peer.py" --world "$1" --size "$SIZE" --batch "$BATCH" \
    --divisor "$DIVISOR" --steps "$STEPS" --pin |
    "$PYTHON" -c 'import json, sys; print(json.loads(sys.stdin.read().splitlines()[-1])["img_per_s"])'
}

declare -A best=([one]=0 [two]=0 [two_no_overlap]=0 [two_skip]=0 [pt_one]=0 [pt_two]=0)
keep() { best[$1]=$(awk -v a="${best[$1]}" -v b="$2" 'BEGIN { print (b > a ? b : a) }'); }

echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
for ((r = 1; r <= REPEATS; ++r)); do
  echo "round $r: load average $(cut -d' ' -f1-3 /proc/loadavg)"
  keep one "$(dptrain_ips 1)"
  keep two "$(dptrain_ips 2)"
  keep two_no_overlap "$(dptrain_ips 2 --no-overlap)"
  keep two_skip "$(dptrain_ips 2 --bench-skip-allreduce)"
  keep pt_one "$(pytorch_ips 1)"
  keep pt_two "$(pytorch_ips 2)"
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

# row LABEL IMG_S ONE_RANK_IMG_S NO_COMM_IMG_S DDP_IMG_S
row() {
  awk -v l="$1" -v v="$2" -v one="$3" -v ref="$4" -v pt="$5" 'BEGIN {
    printf "| %-40s | %7.2f | %6.1f%% | %7s | %6s |\n", l, v, 100 * v / (2 * one),
           (ref > 0 ? sprintf("%.1f%%", 100 * v / ref) : "-"), (pt > 0 ? sprintf("%.2fx", v / pt) : "-") }'
}
single() { awk -v l="$1" -v v="$2" 'BEGIN { printf "| %-40s | %7.2f | %7s | %7s | %6s |\n", l, v, "-", "-", "-" }'; }

echo
echo "unet16 /$DIVISOR, ${SIZE}x${SIZE}, batch $BATCH per rank, 1 thread per rank; scaling = img/s / (2 x np=1)"
echo
echo "| run                                      |   img/s | scaling | vs no-comm | vs DDP |"
echo "|------------------------------------------|---------|---------|------------|--------|"
single "dptrain np=1" "${best[one]}"
row "dptrain np=2, overlapped (default)" "${best[two]}" "${best[one]}" "${best[two_skip]}" "${best[pt_two]}"
row "dptrain np=2, --no-overlap" "${best[two_no_overlap]}" "${best[one]}" "${best[two_skip]}" "${best[pt_two]}"
row "dptrain np=2, --bench-skip-allreduce" "${best[two_skip]}" "${best[one]}" "${best[two_skip]}" "${best[pt_two]}"
single "PyTorch 1.13 np=1 (no DDP)" "${best[pt_one]}"
row "PyTorch 1.13 DDP gloo np=2" "${best[pt_two]}" "${best[pt_one]}" 0 0
