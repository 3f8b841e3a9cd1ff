#!/usr/bin/env bash
# dptrain and dppredict with --device cuda on the CPU emulation of CUDA, cuDNN and NCCL (tests/emu),
# 2 ranks on 2 emulated GPUs: what scripts/gpu-check.sh runs on a GPU, at a smaller size. 2 epochs
# then a resumed 3rd (the same losses as an uninterrupted --device cpu run), three variants (sync-BN
# ResNet, deconv + AdamW, accumulation + small buckets + clipping; the CPU's losses), dppredict on
# the checkpoint (the CPU's IoU and Dice), one rank out of device memory (one error line, no
# hang), one --precision bf16 epoch, and GPUs isolated per rank. The first run also writes
# --report and --tensorboard.
# Usage: run_dptrain_emu.sh DPTRAIN_EMU DPPREDICT_EMU MPIRUN_SCRIPT DPPREP
set -euo pipefail
dptrain=$1 dppredict=$2 mpirun=$3 dpprep=$4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export DP_EMU_DEVICES=2 DP_EMU_GRID_LIMIT=4 OMP_NUM_THREADS=1
# The demo's synthetic cracks, fewer of them: 6 steps of 2 x 4 images an epoch, and a validation
# split of 16 (the emulated convolutions are slow: the demo's 128 took half of each epoch).
"$dpprep" synth --out "$tmp/synth.h5" --train 64 --val 16 >/dev/null
# PyTorch's initialisation: the losses' 2e-4 bound below was set for it. From He's weights (the
# default) the CPU's and the emulated cuDNN's different summation orders move the third epoch's
# validation loss by 3e-3 to 4e-3 (2.3295 against 2.3252 at lr 0.002, 2.3374 against 2.3339 at
# 0.001; the first epoch agrees within 2e-4): rounding amplified over 18 steps, not a path of
# its own (initialisation is on the host, the same for both devices).
common=(--data "$tmp/synth.h5" --width-divisor 8 --max-steps 6 --log-every 1000 --no-tf32
  --weight-init pytorch)
run() { bash "$mpirun" -np 2 -x DP_EMU_DEVICES -x DP_EMU_GRID_LIMIT -x OMP_NUM_THREADS "$@"; }
check() {
  if ! eval "$1"; then
    echo "FAILED: $2"
    exit 1
  fi
  echo "ok: $2"
}
# "epoch E/N ... train_loss X  valid_loss Y ..." -> "E X Y"
losses() { sed -n 's/^epoch \([0-9]*\)\/[0-9]*  .*train_loss \([0-9.]*\)  valid_loss \([0-9.]*\).*/\1 \2 \3/p' "$1"; }
# same_losses LOG_A LOG_B N: N epochs in LOG_A, each with LOG_B's losses as printed (4 decimals)
# within 2e-4 (+1e-5 relative); prints both side by side.
same_losses() {
  losses "$1" >"$tmp/a.losses"
  losses "$2" >"$tmp/b.losses"
  paste "$tmp/a.losses" "$tmp/b.losses"
  test "$(wc -l <"$tmp/a.losses")" = "$3" && paste "$tmp/a.losses" "$tmp/b.losses" |
    awk '{ if ($1 != $4 || ($2 - $5) ^ 2 > (2e-4 + 1e-5 * $5) ^ 2 ||
               ($3 - $6) ^ 2 > (2e-4 + 1e-5 * $6) ^ 2) bad = 1 } END { exit bad }'
}

# --report and --tensorboard: rank 0 predicts the validation samples through the device backend.
outputs=(--report --tensorboard)
run "$dptrain" --device cuda --model-dir "$tmp/cuda" --epochs 2 "${common[@]}" "${outputs[@]}" \
  >"$tmp/cuda.log" 2>&1 || { tail -n 30 "$tmp/cuda.log"; exit 1; }
run "$dptrain" --device cuda --model-dir "$tmp/cuda" --epochs 3 "${common[@]}" "${outputs[@]}" \
  >>"$tmp/cuda.log" 2>&1 || { tail -n 30 "$tmp/cuda.log"; exit 1; }
grep -E "^(device|dptrain|GPU memory|gradients|epoch)" "$tmp/cuda.log"
check 'grep -q "GPU 1 of 2\|GPU 0 of 2" "$tmp/cuda.log"' "one emulated GPU per rank"
check 'grep -q "ncclAllReduce" "$tmp/cuda.log"' "gradients through the NCCL reducer"
check 'grep -q "resumed from epoch 2" "$tmp/cuda.log"' "the 3rd epoch resumed from the epoch-2 checkpoint"
check '! grep -q "warning" "$tmp/cuda.log" && test -s "$tmp/cuda/report.html" &&
  test "$(grep -c "^tensorboard: events in" "$tmp/cuda.log")" = 2 &&
  test "$(grep -ao "samples/[0-9]*" "$tmp"/cuda/tb/events.out.tfevents.* | wc -l)" = 12' \
  "--report and --tensorboard on the device: 4 sample strips in each of 3 epochs, no warning"

run "$dptrain" --device cpu --model-dir "$tmp/cpu" --epochs 3 "${common[@]}" >"$tmp/cpu.log" 2>&1 ||
  { tail -n 30 "$tmp/cpu.log"; exit 1; }
echo "epoch train_loss valid_loss: cuda (resumed) | cpu"
check 'same_losses "$tmp/cuda.log" "$tmp/cpu.log" 3' \
  "--device cuda (2 epochs + resumed 3rd) has the losses of an uninterrupted --device cpu run"

# Other paths of the GPU trainer: ResNet UNet with sync-BN, transposed-convolution decoder with
# AdamW and BCE + Dice, gradient accumulation with many small buckets, clipping and the focal
# loss; 2 epochs of 6 steps each, the losses of the same run on the CPU.
while IFS= read -r opts; do
  read -ra extra <<<"$opts"
  for device in cuda cpu; do
    run "$dptrain" --device "$device" --model-dir "$tmp/$device-variant" --epochs 2 \
      "${common[@]}" "${extra[@]}" >"$tmp/$device-variant.log" 2>&1 </dev/null ||
      { tail -n 30 "$tmp/$device-variant.log"; exit 1; }
  done
  check 'same_losses "$tmp/cuda-variant.log" "$tmp/cpu-variant.log" 2' \
    "--device cuda $opts: the CPU's losses"
  rm -rf "$tmp/cuda-variant" "$tmp/cpu-variant"
done <<'EOF'
--model unet_resnet34 --sync-bn
--deconv --optimizer adamw --loss bce+dice --pos-weight
--accumulation-steps 2 --bucket-mb 0.05 --clip-grad-norm 1.0 --loss focal
EOF

# The checkpoint's validation metrics at threshold 0.1 (0.5 finds no crack after 18 steps).
metrics() { sed -n 's/.* iou \([0-9.]*\)  dice \([0-9.]*\) .*/\1 \2/p' "$1" | tail -n 1; }
for device in cuda cpu; do
  DP_EMU_DEVICES=1 "$dppredict" -c "$tmp/cuda/model_best.h5" --dataset "$tmp/synth.h5" -q \
    --threshold 0.1 --device "$device" >"$tmp/predict-$device.log" 2>&1 ||
    { cat "$tmp/predict-$device.log"; exit 1; }
done
echo "dppredict iou dice: cuda $(metrics "$tmp/predict-cuda.log"), cpu $(metrics "$tmp/predict-cpu.log")"
check 'echo "$(metrics "$tmp/predict-cuda.log") $(metrics "$tmp/predict-cpu.log")" |
  awk "NF == 4 && \$1 > 0 { exit !((\$1 - \$3) ^ 2 < 1e-6 && (\$2 - \$4) ^ 2 < 1e-6) } NF != 4 || \$1 <= 0 { exit 1 }"' \
  "dppredict --device cuda gives the CPU's IoU and Dice (within 1e-3, IoU > 0)"

# One rank's GPU too small for the model: that rank's one error line (cudaMalloc, the device, what
# it holds), exit status 1, no rank left waiting, no checkpoint.
cat >"$tmp/small_gpu_on_rank1.sh" <<'EOF'
#!/bin/sh
[ "$OMPI_COMM_WORLD_RANK" = 1 ] && export DP_EMU_DEVICE_MIB=8
exec "$@"
EOF
status=0
timeout 120 bash "$mpirun" -np 2 -x DP_EMU_DEVICES -x DP_EMU_GRID_LIMIT -x OMP_NUM_THREADS \
  sh "$tmp/small_gpu_on_rank1.sh" "$dptrain" --device cuda --model-dir "$tmp/oom" --epochs 1 \
  "${common[@]}" >"$tmp/oom.log" 2>&1 </dev/null || status=$?
grep "error" "$tmp/oom.log" || true
check 'test "$status" = 1 && test "$(grep -c "dptrain: error:" "$tmp/oom.log")" = 1 &&
  grep -q "dptrain: error: \[rank 1\] cudaMalloc of .* failed on device 1 .*out of memory" \
    "$tmp/oom.log" && ! test -e "$tmp/oom/model_best.h5"' \
  "a GPU too small on one rank: one error line from that rank, exit status 1, no hang"

run "$dptrain" --device cuda --precision bf16 --loss bce --pos-weight none --model-dir "$tmp/bf16" --epochs 1 "${common[@]}" \
  >"$tmp/bf16.log" 2>&1 || { tail -n 30 "$tmp/bf16.log"; exit 1; }
grep -E "^epoch" "$tmp/bf16.log"
check 'grep -q "^epoch 1/1 .*train_loss 0\.[0-9]" "$tmp/bf16.log"' "--precision bf16 trains an epoch (BCE below 1)"

# GPUs isolated per rank (srun --gpus-per-task=1): each rank sees one GPU, a different one
# (DP_EMU_BUS_OFFSET per rank stands in for the launcher). Every rank takes its own and one line
# says so; one GPU that both ranks see stays a usage error.
cat >"$tmp/own_gpu.sh" <<'EOF'
#!/bin/sh
export DP_EMU_DEVICES=1 DP_EMU_BUS_OFFSET="$OMPI_COMM_WORLD_LOCAL_RANK"
exec "$@"
EOF
run sh "$tmp/own_gpu.sh" "$dptrain" --device cuda --model-dir "$tmp/isolated" --epochs 1 \
  "${common[@]}" >"$tmp/isolated.log" 2>&1 || { tail -n 30 "$tmp/isolated.log"; exit 1; }
grep -E "GPUs are isolated|device: GPU" "$tmp/isolated.log"
check 'test "$(grep -c "GPUs are isolated per rank" "$tmp/isolated.log")" = 1 &&
  grep -q "^epoch 1/1" "$tmp/isolated.log"' \
  "GPUs isolated per rank: every rank takes its own GPU, one line says so"
status=0
DP_EMU_DEVICES=1 run "$dptrain" --device cuda --model-dir "$tmp/one_gpu" --epochs 1 \
  "${common[@]}" >"$tmp/one_gpu.log" 2>&1 || status=$?
check 'test "$status" = 2 && grep -q "2 ranks on this node but 1 visible GPU" "$tmp/one_gpu.log"' \
  "one GPU that both ranks see: a usage error (exit 2)"
