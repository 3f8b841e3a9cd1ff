#!/usr/bin/env bash
# Where one GPU training step's time goes: the kernels of dptrain's step and PyTorch's, from ncu.
#
#   bash bench/profile_gpu.sh [BUILD_DIR]   (default build/cuda-release, with bench_gpu_throughput)
#   environment: MODEL=unet16 DIVISOR=1 SIZE=448 BATCH=16 PRECISION=fp32|bf16 TOP=25
#                PYTHON=python3 (a Python whose PyTorch sees the GPU; skipped without one)
#                NCU=ncu (Nsight Compute; the clocks are left alone: --clock-control none)
#
# Each side runs a few warm-up steps and brackets its last step with cudaProfilerStart/Stop
# (bench_gpu_throughput --profile, bench/pytorch_peer.py --profile); ncu times every kernel of
# that step alone (gpu__time_duration.sum, one replay each). Prints per side the kernel time in
# total, the kernel count and the TOP kernels by time (name, calls, ms, share), then one line per
# side: `profile_gpu: {"impl": ..., "kernel_ms": ..., "kernels": ...}`. The sum of kernel times
# against the step's wall time (bench/compare_gpu.sh) is what the launches and gaps cost.
set -euo pipefail

BUILD=${1:-build/cuda-release}
MODEL=${MODEL:-unet16}
DIVISOR=${DIVISOR:-1}
SIZE=${SIZE:-448}
BATCH=${BATCH:-16}
PRECISION=${PRECISION:-fp32}
TOP=${TOP:-25}
PYTHON=${PYTHON:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
BENCH="$BUILD/bench/bench_gpu_throughput"
NCU=${NCU:-$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -n 1 || true)}

[[ -x "$BENCH" ]] || {
  echo "profile_gpu: $BENCH is not built (cmake --build $BUILD --target bench_gpu_throughput)" >&2
  exit 1
}
[[ -n "$NCU" && -x "$NCU" ]] || {
  echo "profile_gpu: ncu (Nsight Compute) not found: set NCU" >&2
  exit 1
}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
ncu_args=(--profile-from-start off --clock-control none --metrics gpu__time_duration.sum
  --csv --print-units base --page raw --target-processes all)

# summarise CSV IMPL: the kernel table of one side and its JSON line.
summarise() {
  python3 - "$1" "$2" "$TOP" <<'EOF'
import collections, csv, json, sys
path, impl, top = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = [l for l in open(path, errors="replace") if l.startswith('"')]
reader = csv.DictReader(rows)
ms = collections.Counter()
calls = collections.Counter()
for r in reader:
    v = r.get("gpu__time_duration.sum", "")
    try:
        t = float(v.replace(",", ""))
    except ValueError:
        continue  # the units row
    name = r.get("Kernel Name", "?")
    ms[name] += t / 1e6  # ns -> ms
    calls[name] += 1
total = sum(ms.values())
print(f"{impl}: {sum(calls.values())} kernels, {total:.2f} ms of kernel time in the step")
for name, t in ms.most_common(top):
    print(f"  {t:8.3f} ms {100 * t / total:5.1f}%  x{calls[name]:<4d} {name[:110]}")
print("profile_gpu: " + json.dumps({"impl": impl, "kernel_ms": round(total, 3),
                                     "kernels": sum(calls.values())}))
EOF
}

dp_args=(--model "$MODEL" --width-divisor "$DIVISOR" --size "$SIZE" --batch "$BATCH" --steps 1
  --warmup 3 --profile)
[[ "$PRECISION" != fp32 ]] && dp_args+=(--precision "$PRECISION")
echo "profile_gpu: dptrain $MODEL /$DIVISOR ${SIZE}x$SIZE batch $BATCH $PRECISION"
"$NCU" "${ncu_args[@]}" "$BENCH" "${dp_args[@]}" >"$work/dp.csv" 2>"$work/dp.err" || {
  tail -n 20 "$work/dp.err" "$work/dp.csv" >&2
  exit 1
}
summarise "$work/dp.csv" dptrain

has_cuda_torch='import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'
if "$PYTHON" -c "$has_cuda_torch" 2>/dev/null; then
  echo "profile_gpu: PyTorch, the same step"
  "$NCU" "${ncu_args[@]}" "$PYTHON" "$HERE/pytorch_peer.py" --device cuda --model "$MODEL" \
    --divisor "$DIVISOR" --size "$SIZE" --batch "$BATCH" --steps 1 --warmup 3 \
    --precision "$PRECISION" --profile >"$work/pt.csv" 2>"$work/pt.err" || {
    tail -n 20 "$work/pt.err" "$work/pt.csv" >&2
    exit 1
  }
  summarise "$work/pt.csv" pytorch
else
  echo "profile_gpu: PyTorch skipped: $PYTHON has no CUDA PyTorch"
fi
