#!/usr/bin/env bash
# On a GPU machine: build the cuda-release preset, run the GPU tests and a benchmark, summarise.
#
#   bash scripts/gpu-check.sh
#
# Environment (all optional): JOBS (build jobs; default nproc), DP_BUILD_DIR (default
# build/cuda-release), DP_CUDA_ARCH (default: this GPU's compute capability, e.g. 90, so device
# code is compiled once; "preset" keeps the preset's 90;80), SIZE=448 BATCH=16 STEPS=20 WARMUP=5
# DIVISOR=1 (the benchmark: UNet16 at width / DIVISOR), STEP_TIMEOUT=600 (seconds allowed to each
# test, run and benchmark), PYTHON (a Python whose PyTorch sees the GPU: then PyTorch runs beside
# dptrain through bench/compare_gpu.sh; default python3 when it has CUDA PyTorch), DP_SKIP_DEPS=1
# (do not run scripts/install-deps.sh, e.g. offline), DP_PREBUILT=1 (use the binaries already in
# DP_BUILD_DIR, e.g. a folder made by scripts/gpu-bundle.sh on a machine that has the
# dependencies; implies DP_SKIP_DEPS=1), DPTRAIN_ARGS (more dptrain options for the end-to-end
# runs, e.g. "--max-steps 6").
# tests/emu/rehearse_gpu_check.sh runs this script on the CPU emulation of the CUDA backend.
#
# 1. A GPU must be visible (nvidia-smi, CUDA_VISIBLE_DEVICES), else exit 1 before building.
# 2. scripts/install-deps.sh (system packages; a failure only warns: CMake names what is missing).
# 3. Configure the cuda-release preset; build only the GPU tests, bench_gpu_throughput, dptrain.
# 4. Run test_cuda, test_cuda_backend (every CUDA op and a training step of each model against
#    the CPU backend) and the NCCL reducer test (1 rank, and 2 where 2 GPUs are visible).
#    Then dptrain --device cuda end to end (2 epochs, a resumed third) on the synthetic default,
#    dppredict --device cuda on its checkpoint (the CPU's IoU), and 2 epochs with --precision bf16.
# 5. Benchmark unet16 at 448x448 in fp32 with TF32 on, and in bf16 (activations and convolutions).
# 6. Print a summary: GPU, tests passed/failed/skipped, img/s, peak memory (logs in
#    <build>/gpu-check/).
# Exit status 0 only if everything was built and every test passed. Meant to take well under 8
# minutes on an H200 with 16 cores.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

BUILD=${DP_BUILD_DIR:-build/cuda-release}
LOGS=$BUILD/gpu-check
JOBS=${JOBS:-$(nproc)}
SIZE=${SIZE:-448}
BATCH=${BATCH:-16}
STEPS=${STEPS:-20}
WARMUP=${WARMUP:-5}
DIVISOR=${DIVISOR:-1}
STEP_TIMEOUT=${STEP_TIMEOUT:-600}
read -ra dptrain_extra <<<"${DPTRAIN_ARGS:-}"
START=$SECONDS
failures=()
summary=()

say() { echo "gpu-check: $*"; }
# add WORDS...: one summary line (the words joined by spaces)
add() { summary+=("$*"); }
fail() {
  failures+=("$1")
  say "FAILED: $1"
}
# tail_log FILE: the end of a log, indented, to show why a step failed.
tail_log() { tail -n "${2:-25}" "$1" | sed 's/^/    /'; }

print_summary() {
  echo
  echo "==================== gpu-check summary ===================="
  for line in "${summary[@]}"; do echo "  $line"; done
  local elapsed=$((SECONDS - START))
  echo "  time: $elapsed s$( ((elapsed > 480)) && echo " (over the 8-minute budget)")"
  if ((${#failures[@]})); then
    echo "  RESULT: FAILED (${failures[*]}); logs in $LOGS/"
  else
    echo "  RESULT: PASSED; logs in $LOGS/"
  fi
}

# ---- 1. A visible GPU, before anything is built --------------------------------------------------
if ! command -v nvidia-smi >/dev/null 2>&1; then
  say "no GPU visible: nvidia-smi is not installed (no NVIDIA driver on this machine)"
  exit 1
fi
case "${CUDA_VISIBLE_DEVICES-unset}" in
  "" | -1 | none | NoDevFiles)
    say "no GPU visible: CUDA_VISIBLE_DEVICES='${CUDA_VISIBLE_DEVICES}' hides every GPU"
    exit 1
    ;;
esac
query=("--query-gpu=name,memory.total,driver_version" "--format=csv,noheader")
if ! gpu_list=$(nvidia-smi "${query[@]}" 2>&1) ||
  [[ -z "$gpu_list" ]]; then
  say "no GPU visible: nvidia-smi says: $gpu_list"
  exit 1
fi
cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' .')
arch=${DP_CUDA_ARCH:-$cap}
[[ "$arch" == preset ]] && arch=""
visible=${CUDA_VISIBLE_DEVICES:+ (CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES)}
say "GPU(s): $(tr '\n' ';' <<<"$gpu_list" | sed 's/;$//')$visible"
gpu_line="GPU: $(head -n 1 <<<"$gpu_list" | xargs)"
[[ -n "$cap" ]] && gpu_line+=", compute capability ${cap:0:-1}.${cap: -1}"
summary+=("$gpu_line; $(wc -l <<<"$gpu_list") GPU(s) listed by nvidia-smi$visible")
mkdir -p "$LOGS"

# ---- 2. System packages --------------------------------------------------------------------------
PREBUILT=${DP_PREBUILT:-0}
if [[ -f scripts/install-deps.sh && "${DP_SKIP_DEPS:-0}" != 1 && "$PREBUILT" != 1 ]]; then
  # Bounded: apt-get on a machine without network access would otherwise wait for its timeouts.
  if ! timeout 300 bash scripts/install-deps.sh >"$LOGS/deps.log" 2>&1; then
    say "warning: scripts/install-deps.sh failed (see $LOGS/deps.log); continuing:" \
      "CMake will say what is missing"
  fi
fi

# ---- 3. Configure and build only what the check runs ---------------------------------------------
binaries=(tests/test_cuda tests/test_cuda_backend tests/test_nccl_reducer_mpi
  bench/bench_gpu_throughput app/dptrain app/dppredict)
targets=("${binaries[@]##*/}")
if [[ "$PREBUILT" == 1 ]]; then
  for b in "${binaries[@]}"; do
    if [[ ! -x "$BUILD/$b" ]]; then
      fail "build"
      summary+=("build: DP_PREBUILT=1 but $BUILD/$b is missing")
      print_summary
      exit 1
    fi
  done
  add "build: prebuilt binaries in $BUILD (DP_PREBUILT=1)"
else
  t0=$SECONDS
  say "configuring the cuda-release preset in $BUILD${arch:+ for CUDA architecture $arch}"
  if ! cmake --preset cuda-release -B "$BUILD" ${arch:+-DCMAKE_CUDA_ARCHITECTURES=$arch} \
    >"$LOGS/configure.log" 2>&1; then
    fail "configure"
    tail_log "$LOGS/configure.log"
    summary+=("build: configure failed ($LOGS/configure.log)")
    print_summary
    exit 1
  fi
  say "building ${targets[*]} with $JOBS jobs"
  if ! cmake --build "$BUILD" -j "$JOBS" --target "${targets[@]}" >"$LOGS/build.log" 2>&1; then
    fail "build"
    grep -E 'error|Error' "$LOGS/build.log" | head -n 20 | sed 's/^/    /'
    tail_log "$LOGS/build.log" 10
    summary+=("build: FAILED after $((SECONDS - t0)) s ($LOGS/build.log)")
    print_summary
    exit 1
  fi
  add "build: ok in $((SECONDS - t0)) s (cuda-release${arch:+, CUDA architecture $arch}," \
    "$JOBS jobs)"
fi

# ---- 4. Tests ------------------------------------------------------------------------------------
# gtest_count LOG WORD -> the count in gtest's "[  WORD  ] N test(s)" summary line (0 if none)
gtest_count() {
  local n
  n=$(grep -E "^\[ +$2 +\] [0-9]+ tests?[,.]" "$1" | tail -n 1 | grep -oE '[0-9]+' | head -n 1)
  echo "${n:-0}"
}

run_gtest() {
  local name=$1 log="$LOGS/$1.log" rc
  say "running $name"
  timeout "$STEP_TIMEOUT" "$BUILD/tests/$name" --gtest_color=no >"$log" 2>&1
  rc=$?
  local passed failed skipped
  passed=$(gtest_count "$log" PASSED)
  failed=$(gtest_count "$log" FAILED)
  skipped=$(gtest_count "$log" SKIPPED)
  local line="$name: $passed passed, $failed failed, $skipped skipped"
  if ((rc != 0)); then
    ((rc == 124)) && line+=" (timed out after $STEP_TIMEOUT s)" || line+=" (exit status $rc)"
    fail "$name"
    grep -E '^\[  FAILED  \] [A-Z]' "$log" | sort -u | sed 's/^/    /'
    ((failed == 0)) && tail_log "$log"
  elif ((passed == 0)); then
    # nvidia-smi saw a GPU but the CUDA runtime did not (every test skipped): not a pass.
    line+=" (nothing ran)"
    fail "$name"
  fi
  # On a GPU machine a skip is worth a look (test_cuda skips its no-GPU case by design).
  ((skipped > 0)) && line+=": $(grep -E '^\[  SKIPPED \] [A-Z]' "$log" |
    sed -E 's/^\[  SKIPPED \] //; s/ \([0-9]+ ms\)$//' | sort -u | tr '\n' ' ')"
  summary+=("$line")
}

run_gtest test_cuda
run_gtest test_cuda_backend
# The NCCL reducer against the MPI reducer: one rank per visible GPU (1, and 2 where there are 2).
ngpu=$(wc -l <<<"$gpu_list")
((ngpu > 2)) && ngpu=2
nccl_ok=0
for ((np = 1; np <= ngpu; ++np)); do
  log="$LOGS/nccl-np$np.log"
  say "running test_nccl_reducer_mpi on $np rank(s)"
  if timeout "$STEP_TIMEOUT" bash scripts/mpirun.sh -np "$np" "$BUILD/tests/test_nccl_reducer_mpi" \
    --gtest_color=no >"$log" 2>&1 &&
    (($(gtest_count "$log" PASSED) > 0)); then
    ((++nccl_ok))
  else
    fail "test_nccl_reducer_mpi np=$np"
    tail_log "$log"
  fi
done
summary+=("test_nccl_reducer_mpi: $nccl_ok of $ngpu rank count(s) passed (1..$ngpu ranks)")

# ---- 4b. dptrain end to end on the GPU ----------------------------------------------------------
# The embedded default's synthetic data, one rank per visible GPU (at most 2): 2 epochs, then a
# third resumed from the epoch-2 checkpoint (checkpoints staged through host memory, NCCL
# gradients, the batch uploader).
run_dir="$LOGS/dptrain-run"
rm -rf "$run_dir"
say "running dptrain --device cuda on $ngpu rank(s): 2 epochs, then a resumed third"
dptrain_cmd=(bash scripts/mpirun.sh -np "$ngpu" "$BUILD/app/dptrain" --device cuda
  --model-dir "$run_dir" --log-every 1000 "${dptrain_extra[@]}")
if timeout "$STEP_TIMEOUT" "${dptrain_cmd[@]}" --epochs 2 >"$LOGS/dptrain.log" 2>&1 &&
  timeout "$STEP_TIMEOUT" "${dptrain_cmd[@]}" --epochs 3 >>"$LOGS/dptrain.log" 2>&1 &&
  grep -q "resumed from epoch 2" "$LOGS/dptrain.log"; then
  add "dptrain --device cuda ($ngpu rank(s)): 2 epochs + resumed 3rd ok;" \
    "$(grep -E 'GPU memory' "$LOGS/dptrain.log" | head -n 1 | sed 's/.*GPU memory: //')," \
    "last epoch: $(grep -E 'epoch 3/3 ' "$LOGS/dptrain.log" | tail -n 1 | sed 's/.*epoch 3/epoch 3/' | cut -c1-110)"
else
  fail "dptrain --device cuda"
  tail_log "$LOGS/dptrain.log"
  add "dptrain --device cuda: FAILED ($LOGS/dptrain.log)"
fi

# dppredict --device cuda on that run's checkpoint and validation split: the IoU of the CPU's.
data_file=$(sed -n 's/^data: \(.*\.h5\): .*/\1/p' "$LOGS/dptrain.log" | head -n 1)
predict=("$BUILD/app/dppredict" -c "$run_dir/model_best.h5" --dataset "$data_file" -q)
iou_of() { sed -n 's/.* iou \([0-9.]*\) .*/\1/p' "$1" | tail -n 1; }
say "running dppredict --device cuda and --device cpu on the run's validation split"
if [[ -f "$run_dir/model_best.h5" && -n "$data_file" ]] &&
  timeout "$STEP_TIMEOUT" "${predict[@]}" --device cuda >"$LOGS/dppredict-cuda.log" 2>&1 &&
  timeout "$STEP_TIMEOUT" "${predict[@]}" --device cpu >"$LOGS/dppredict-cpu.log" 2>&1 &&
  awk -v g="$(iou_of "$LOGS/dppredict-cuda.log")" -v c="$(iou_of "$LOGS/dppredict-cpu.log")" \
    'BEGIN { exit !(g != "" && c != "" && (g - c < 0.02) && (c - g < 0.02)) }'; then
  add "dppredict --device cuda: IoU $(iou_of "$LOGS/dppredict-cuda.log")" \
    "(CPU $(iou_of "$LOGS/dppredict-cpu.log"))"
else
  fail "dppredict --device cuda"
  tail_log "$LOGS/dppredict-cuda.log"
  add "dppredict --device cuda: FAILED or IoU differs from the CPU's by 0.02 or more" \
    "($LOGS/dppredict-*.log)"
fi

# The same in bf16 (bf16 activations and convolutions), 2 epochs.
bf16_dir="$LOGS/dptrain-bf16-run"
rm -rf "$bf16_dir"
say "running dptrain --device cuda --precision bf16 on $ngpu rank(s): 2 epochs"
if timeout "$STEP_TIMEOUT" bash scripts/mpirun.sh -np "$ngpu" "$BUILD/app/dptrain" --device cuda \
  --precision bf16 --model-dir "$bf16_dir" --log-every 1000 --epochs 2 "${dptrain_extra[@]}" \
  >"$LOGS/dptrain-bf16.log" 2>&1 && grep -q "epoch 2/2 " "$LOGS/dptrain-bf16.log"; then
  last=$(grep -E 'epoch 2/2 ' "$LOGS/dptrain-bf16.log" | tail -n 1 | sed 's/.*epoch 2/epoch 2/')
  add "dptrain --device cuda --precision bf16: 2 epochs ok;" \
    "$(grep -oE 'activations [0-9.]+ MiB' "$LOGS/dptrain-bf16.log" | head -n 1)," \
    "last epoch: ${last:0:110}"
else
  fail "dptrain --device cuda --precision bf16"
  tail_log "$LOGS/dptrain-bf16.log"
  add "dptrain --device cuda --precision bf16: FAILED ($LOGS/dptrain-bf16.log)"
fi

# ---- 5. Benchmark --------------------------------------------------------------------------------
BENCH="$BUILD/bench/bench_gpu_throughput"
PYTHON=${PYTHON:-python3}
have_torch=0
if command -v "$PYTHON" >/dev/null 2>&1 &&
  "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' \
    >/dev/null 2>&1; then
  have_torch=1
fi

# json_number JSON KEY -> the number after "KEY":
json_number() { sed -n "s/.*\"$2\": *\([-0-9.eE+]*\).*/\1/p" <<<"$1"; }

# benchmark PRECISION: dptrain (and PyTorch when available), one summary line
benchmark() {
  local precision=$1 log="$LOGS/bench-$1.log" label
  [[ "$precision" == fp32 ]] && label="fp32 (TF32 on)" || label=$precision
  say "benchmark: unet16 /$DIVISOR ${SIZE}x${SIZE} batch $BATCH $label"
  local ok=1
  if ((have_torch)); then
    PYTHON=$PYTHON MODEL=unet16 DIVISOR=$DIVISOR SIZE=$SIZE BATCH=$BATCH STEPS=$STEPS WARMUP=$WARMUP \
      PRECISION=$precision timeout "$STEP_TIMEOUT" bash bench/compare_gpu.sh "$BUILD" >"$log" 2>&1 || ok=0
  else
    local extra=()
    [[ "$precision" != fp32 ]] && extra=(--precision "$precision")
    timeout "$STEP_TIMEOUT" "$BENCH" --model unet16 --width-divisor "$DIVISOR" --size "$SIZE" \
      --batch "$BATCH" --steps "$STEPS" --warmup "$WARMUP" "${extra[@]}" >"$log" 2>&1 || ok=0
  fi
  local dp pt ratio
  dp=$(grep '"impl": "dptrain"' "$log" | tail -n 1)
  pt=$(grep '"impl": "pytorch"' "$log" | tail -n 1)
  if ((!ok)) || [[ -z "$dp" ]]; then
    fail "benchmark $precision"
    tail_log "$log"
    summary+=("benchmark $label: FAILED ($log)")
    return
  fi
  local line
  line=$(awk -v ips="$(json_number "$dp" img_per_s)" -v s="$(json_number "$dp" step_seconds)" \
    -v peak="$(json_number "$dp" peak_device_bytes)" 'BEGIN {
      printf "%.1f img/s, %.2f ms/step, peak device memory %.2f GiB", ips, 1e3 * s, peak / 2^30 }')
  if [[ -n "$pt" ]]; then
    ratio=$(sed -n 's/.*"ratio": *\([0-9.]*\).*/\1/p' "$log" | tail -n 1)
    line+=$(awk -v ips="$(json_number "$pt" img_per_s)" -v r="$ratio" \
      -v peak="$(json_number "$pt" peak_device_bytes)" 'BEGIN {
        printf "; PyTorch %.1f img/s, peak %.2f GiB; dptrain/PyTorch %.2fx (target >= 1.2x)",
          ips, peak / 2^30, r }')
  else
    line+="; PyTorch: not run (no CUDA PyTorch for $PYTHON)"
  fi
  summary+=("unet16 /$DIVISOR ${SIZE}x${SIZE} batch $BATCH $label: dptrain $line")
}

benchmark fp32
benchmark bf16

print_summary
((${#failures[@]} == 0))
