#!/usr/bin/env bash
# Builds the fuzz preset (clang-14, libFuzzer, ASan + UBSan) and runs each fuzz target for a bounded time.
#
# Usage: scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]   (default 600 s; targets dataset,
# checkpoint, image, config). One target at a time, one libFuzzer job (-fork=1, so that a crash,
# timeout or out-of-memory is saved and the run goes on), niced. Seeds: tests/fuzz/corpus/<t>
# (read only); the growing corpus and the findings (crash-*, leak-*, timeout-*, oom-*) go to
# build/fuzz/runs/<t>/. At the end, one line per target: executions, coverage (libFuzzer's cov
# and ft), corpus size and findings. Exit status 1 if any target has findings.
# Replay one finding: build/fuzz/tests/fuzz/fuzz_<t> build/fuzz/runs/<t>/artifacts/crash-...
# Minimise it: ... fuzz_<t> -minimize_crash=1 -runs=10000 -exact_artifact_path=OUT crash-...
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-600}
shift || true
targets=("$@")
((${#targets[@]})) || targets=(dataset checkpoint image config)

# clang-14 with libFuzzer's runtime and OpenMP (not needed by the normal gcc build).
need=()
command -v clang++-14 > /dev/null || need+=(clang-14)
for p in libclang-rt-14-dev libomp-14-dev; do
  dpkg-query -W -f='${Status}' "$p" 2> /dev/null | grep -q "install ok installed" || need+=("$p")
done
if ((${#need[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "fuzz: error: missing ${need[*]} and not root" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
bash scripts/install-deps.sh

build=build/fuzz
[[ -f $build/build.ninja ]] || cmake --preset fuzz
cmake --build "$build" -j "$(nproc)" --target "${targets[@]/#/fuzz_}"

# Largest input per target: the seeds fit (a UNet16/32 checkpoint is ~140 KB).
declare -A max_len=([dataset]=65536 [checkpoint]=200000 [image]=16384 [config]=4096)

summary=()
findings_total=0
for t in "${targets[@]}"; do
  run=$build/runs/$t
  mkdir -p "$run/corpus" "$run/artifacts"
  log=$run/fuzz.log
  echo "fuzz: $t for ${seconds} s (log $log)"
  set +e
  # A request beyond the address space gets NULL, as from malloc in production (HDF5 then fails
  # cleanly); one of 2 GiB or more is still an out-of-memory finding (-malloc_limit_mb).
  ASAN_OPTIONS=allocator_may_return_null=1 OMP_NUM_THREADS=1 \
    LSAN_OPTIONS=suppressions=$PWD/tests/fuzz/lsan.supp timeout $((seconds + 300)) \
    nice -n 10 "$build/tests/fuzz/fuzz_$t" -fork=1 -ignore_crashes=1 -ignore_timeouts=1 \
    -ignore_ooms=1 -max_total_time="$seconds" -max_len="${max_len[$t]:-65536}" \
    -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 -print_funcs=0 \
    -artifact_prefix="$run/artifacts/" "$run/corpus" "tests/fuzz/corpus/$t" > "$log" 2>&1
  status=$?
  set -e
  # Fork mode's status lines: "#<execs>: cov: C ft: F corp: N exec/s: E oom/timeout/crash: ...".
  last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
  execs=$(sed -E 's/^#([0-9]+).*/\1/' <<< "$last")
  cov=$(grep -oE 'cov: [0-9]+' <<< "$last" | awk '{print $2}')
  ft=$(grep -oE 'ft: [0-9]+' <<< "$last" | awk '{print $2}')
  corp=$(find "$run/corpus" -type f | wc -l)
  found=$(find "$run/artifacts" -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' \
    -o -name 'oom-*' \) | wc -l)
  findings_total=$((findings_total + found))
  summary+=("$(printf '%-11s %6ss  execs %-9s cov %-6s ft %-6s corpus %-5s findings %s  (exit %s)' \
    "$t" "$seconds" "${execs:-?}" "${cov:-?}" "${ft:-?}" "$corp" "$found" "$status")")
done

echo "fuzz: summary"
printf '  %s\n' "${summary[@]}"
if ((findings_total)); then
  echo "fuzz: findings in $build/runs/*/artifacts" >&2
  exit 1
fi
