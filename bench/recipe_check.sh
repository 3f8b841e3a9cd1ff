#!/usr/bin/env bash
# The default recipe at every model and width: STEPS optimiser steps of each on one rank at
# dptrain's defaults, one table row per run (first step's loss, mean of the last five, the
# largest, exit status). Extra arguments go to every dptrain.
#
#   bash bench/recipe_check.sh [--build build/default] [--data FILE | --size HxW] [--steps 50]
#        [--batch 2] [--models "unet16:1 unet16:2 ..."] [-- DPTRAIN_ARGS...]
#
# Without --data, a synthetic set of STEPS x BATCH training images of --size (dpprep synth).
set -euo pipefail
build=build/default data= size=192x256 steps=50 batch=2
models="unet16:1 unet16:2 unet16:4 unet16:8 unet_resnet34:1 unet_resnet101:1"
while (($#)); do
  case $1 in
    --build) build=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --models) models=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "recipe_check: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [[ -z $data ]]; then
  data=$work/synth.h5
  "$build/app/dpprep" synth --out "$data" --train $((steps * batch)) --val 2 --size "$size" \
    --seed 3 >/dev/null
fi
printf '%-18s %6s %8s %10s %10s %10s %6s %8s\n' model divisor lr first last5_mean max exit seconds
for spec in $models; do
  model=${spec%:*} divisor=${spec#*:}
  log=$work/$model-$divisor.log
  start=$(date +%s)
  status=0
  "$build/app/dptrain" --data "$data" --model "$model" --width-divisor "$divisor" \
    --batch-size "$batch" --max-steps "$steps" --epochs 1 --log-every 1 --progress lines \
    --model-dir "$work/$model-$divisor" "$@" >"$log" 2>&1 || status=$?
  seconds=$(($(date +%s) - start))
  # The progress lines print the epoch's running mean: step k's loss is k m_k - (k-1) m_(k-1).
  python3 - "$log" "$model" "$divisor" "$status" "$seconds" <<'PY'
import re, sys
log, model, divisor, status, seconds = sys.argv[1:]
text = open(log).read()
means = [float(m) for m in re.findall(r"epoch 1 step \d+/\d+\s+loss (\S+)", text)]
steps = [m if k == 0 else (k + 1) * m - k * means[k - 1] for k, m in enumerate(means)]
lr = re.search(r"^\s*lr = (\S+)", text, re.M)
nan = float("nan")
first = steps[0] if steps else nan
last5 = sum(steps[-5:]) / len(steps[-5:]) if steps else nan
top = max(steps) if steps else nan
print(f"{model:18s} {divisor:>6s} {lr.group(1) if lr else '?':>8s} {first:10.4f} {last5:10.4f} "
      f"{top:10.4g} {status:>6s} {seconds:>8s}")
PY
done
