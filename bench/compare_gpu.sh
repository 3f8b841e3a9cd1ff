#!/usr/bin/env bash
# dptrain's CUDA backend vs PyTorch on one GPU: training img/s of the same model, and the ratio.
#
#   bash bench/compare_gpu.sh [BUILD_DIR]   (default build/cuda-release, with bench_gpu_throughput)
#   environment: MODEL=unet16 DIVISOR=1 SIZE=448 BATCH=16 STEPS=20 WARMUP=5 DECONV=0
#                PRECISION=fp32|bf16 PYTHON=python3 (a Python whose PyTorch sees the GPU)
#
# Same model (tools/reference/models.py has dptrain's layers), batch, image size, BCE with logits
# and SGD (momentum 0.9, weight decay 1e-4) on random data made once. fp32 means TF32 allowed on
# both sides (dptrain's default BackendOptions::tf32; PyTorch's cudnn.allow_tf32), NHWC on both
# (PyTorch channels_last, cudnn.benchmark). Each side times STEPS steps after WARMUP, each step
# ending synchronised, and reports the median step. Target: dptrain >= 1.2x PyTorch.
# Prints each side's JSON line, a human summary, and last `compare_gpu: {...}` with the ratio.
set -euo pipefail

BUILD=${1:-build/cuda-release}
MODEL=${MODEL:-unet16}
DIVISOR=${DIVISOR:-1}
SIZE=${SIZE:-448}
BATCH=${BATCH:-16}
STEPS=${STEPS:-20}
WARMUP=${WARMUP:-5}
DECONV=${DECONV:-0}
PRECISION=${PRECISION:-fp32}
PYTHON=${PYTHON:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
BENCH="$BUILD/bench/bench_gpu_throughput"

if [[ ! -x "$BENCH" ]]; then
  echo "compare_gpu: $BENCH is not built (cmake --build $BUILD --target bench_gpu_throughput)" >&2
  exit 1
fi

dp_args=(--model "$MODEL" --width-divisor "$DIVISOR" --size "$SIZE" --batch "$BATCH"
         --steps "$STEPS" --warmup "$WARMUP")
pt_args=(--device cuda --model "$MODEL" --divisor "$DIVISOR" --size "$SIZE" --batch "$BATCH"
         --steps "$STEPS" --warmup "$WARMUP" --precision "$PRECISION")
if [[ "$DECONV" == 1 ]]; then
  dp_args+=(--deconv)
  pt_args+=(--deconv)
fi
if [[ "$PRECISION" != fp32 ]]; then
  if ! "$BENCH" --help | grep -q -- '--precision'; then
    echo "compare_gpu: $PRECISION skipped: bench_gpu_throughput has no --precision option" \
         "(the CUDA backend computes in fp32, TF32 allowed)"
    exit 0
  fi
  dp_args+=(--precision "$PRECISION")
fi

# json_number JSON KEY -> the number after "KEY": (both sides print flat JSON objects)
json_number() { sed -n "s/.*\"$2\": *\([-0-9.eE+]*\).*/\1/p" <<<"$1"; }

dp_out=$("$BENCH" "${dp_args[@]}")
dp_json=$(tail -n 1 <<<"$dp_out")
echo "$dp_json"
pt_json=$("$PYTHON" "$HERE/pytorch_peer.py" "${pt_args[@]}" | tail -n 1)
echo "$pt_json"

dp_ips=$(json_number "$dp_json" img_per_s)
pt_ips=$(json_number "$pt_json" img_per_s)
dp_step=$(json_number "$dp_json" step_seconds)
pt_step=$(json_number "$pt_json" step_seconds)
dp_peak=$(json_number "$dp_json" peak_device_bytes)
pt_peak=$(json_number "$pt_json" peak_device_bytes)
torch_version=$(sed -n 's/.*"torch": *"\([^"]*\)".*/\1/p' <<<"$pt_json")
gpu=$(sed -n 's/.*"gpu": *"\([^"]*\)".*/\1/p' <<<"$dp_json")

echo
echo "$gpu: $MODEL /$DIVISOR$([[ "$DECONV" == 1 ]] && echo " deconv") ${SIZE}x${SIZE}" \
     "batch $BATCH $PRECISION, median of $STEPS steps after $WARMUP warm-up"
awk -v a="$dp_ips" -v b="$pt_ips" -v sa="$dp_step" -v sb="$pt_step" -v ma="$dp_peak" \
    -v mb="$pt_peak" -v tv="$torch_version" 'BEGIN {
  printf "  dptrain        %8.1f img/s  %8.2f ms/step  peak %6.2f GiB\n", a, 1e3 * sa, ma / 2^30
  printf "  PyTorch %-6s %8.1f img/s  %8.2f ms/step  peak %6.2f GiB\n", tv, b, 1e3 * sb, mb / 2^30
  printf "  dptrain / PyTorch: %.2fx (target >= 1.2x)\n", a / b
  printf "compare_gpu: {\"dptrain_img_per_s\": %.3f, \"pytorch_img_per_s\": %.3f, " \
         "\"ratio\": %.4f}\n", a, b, a / b }'
