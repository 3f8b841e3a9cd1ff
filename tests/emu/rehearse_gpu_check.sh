#!/usr/bin/env bash
# Runs scripts/gpu-check.sh on the CPU emulation of the CUDA backend (tests/emu), so that the
# script itself (its steps, log parsing and summary) is checked before a GPU machine runs it: the
# emulated binaries stand in for the real ones (DP_PREBUILT=1), a stub nvidia-smi lists 2 emulated
# GPUs, and the sizes are small (SIZE=32 BATCH=2 STEPS=2 DIVISOR=8, --max-steps 6). No PyTorch, no
# speed.
# Usage: rehearse_gpu_check.sh EMU_DIR (where the emu targets are, e.g. build/default/tests/emu)
set -euo pipefail
emu=$(cd "$1" && pwd)
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bin" "$tmp/build/tests" "$tmp/build/app" "$tmp/build/bench"
cat >"$tmp/bin/nvidia-smi" <<'EOF'
#!/bin/sh
# Stub for tests/emu/rehearse_gpu_check.sh: 2 emulated GPUs.
case "$*" in
  *compute_cap*) printf '9.0\n9.0\n' ;;
  *) printf 'dp_emu (CUDA emulated on the CPU), 16384 MiB, emu\n%.0s' 1 2 ;;
esac
EOF
chmod +x "$tmp/bin/nvidia-smi"
for b in tests/test_cuda tests/test_cuda_backend tests/test_nccl_reducer_mpi \
  bench/bench_gpu_throughput app/dptrain app/dppredict; do
  ln -s "$emu/${b#*/}_emu" "$tmp/build/$b"
done
cd "$root"
# The GPU tests without the convolution and model-step tests (test_cuda_backend_emu runs those).
PATH="$tmp/bin:$PATH" DP_BUILD_DIR="$tmp/build" DP_PREBUILT=1 PYTHON=/nonexistent SIZE=32 \
  BATCH=2 STEPS=2 WARMUP=1 DIVISOR=8 DPTRAIN_ARGS="--max-steps 6" DP_EMU_DEVICES=2 \
  DP_EMU_GRID_LIMIT=4 GTEST_FILTER='Cuda*:NcclGradReducer.*:-CudaModelStep.*:CudaVsCpu.*Conv*' \
  OMP_NUM_THREADS=1 bash scripts/gpu-check.sh | tee "$tmp/out.txt"
grep -q "RESULT: PASSED" "$tmp/out.txt"
