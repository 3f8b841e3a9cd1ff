#!/usr/bin/env bash
# Install, build (warnings are errors; the CUDA backend too where CUDA is installed) and run every
# test (with build/venv for the tests that read outputs with PyPI packages), then the MPICH half
# and the oneDNN 3 half. The three builds share one ccache (build/ccache): a source that includes
# neither the MPI nor oneDNN is compiled once. The two other halves build at a lower priority while
# the first half's tests run (many of them wait on timeouts, signals and daemons), and their tests
# run side by side.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
bash scripts/install-test-deps.sh
# Two ctest slots per core: many tests wait (for a signal, a timeout, a daemon) more than they
# compute. Tests of 2 busy ranks or more take 2 slots (PROCESSORS in tests/).
jobs=$((2 * $(nproc)))
halves=()
# The MPICH half (DP_MPICH=0 skips it): the same sources built against MPICH in build/mpich (CPU
# backend), and every test run under its mpiexec (Hydra): the MPI tests, the distributed
# equivalences, resume, preemption, faults, the stall watchdog, the simulated cluster with Hydra's
# proxies on the namespace nodes, and the Slurm jobs started by srun --mpi=pmi2 (1 and 2 nodes).
# Not the photograph-size tests: one rank each, they test the CPU backend at ISA caps, which the
# two other halves run (the MPI makes no difference to them, and they are a third of its time).
[[ ${DP_MPICH:-1} == 0 || -n ${DP_PRESET:-} ]] || halves+=(mpich)
# The oneDNN 3 half (DP_ONEDNN3=0 skips it): the CPU backend built on oneDNN 3.2 (its 3.x API, and
# the brgconv AVX2 kernels that 2.x lacks) in build/onednn3, and every unit and e2e test run on it.
[[ ${DP_ONEDNN3:-1} == 0 || -n ${DP_PRESET:-} ]] || halves+=(onednn3)
declare -A filter=([mpich]="-E ^(PhotographSizes\.|test_photograph_sizes_)" [onednn3]="-L ^(unit|e2e)$")

builder=""
if ((${#halves[@]} > 0)); then
  (for preset in "${halves[@]}"; do DP_PRESET=$preset nice -n 10 bash scripts/build.sh || exit; done) \
    >build/halves-build.log 2>&1 &
  builder=$!
fi
status=0
ctest --preset "${DP_PRESET:-default}" -j "$jobs" --timeout 600 || status=$?
[[ -z $builder ]] || wait "$builder" || { cat build/halves-build.log; exit 1; }
((${#halves[@]} > 0)) || exit "$status"

# The other halves' tests side by side, each with three quarters of the slots (the one that ends
# later then has most of them); each log printed when both end.
pids=()
for preset in "${halves[@]}"; do
  # shellcheck disable=SC2086  # the filter is two words
  ctest --preset "$preset" -j "$((jobs * 3 / 4))" --timeout 600 ${filter[$preset]} \
    >"build/ctest-$preset.log" 2>&1 &
  pids+=($!)
done
for i in "${!halves[@]}"; do
  wait "${pids[$i]}" || status=$?
  echo "===== ctest --preset ${halves[$i]} ====="
  cat "build/ctest-${halves[$i]}.log"
done
exit "$status"
