#!/usr/bin/env bash
# Install, build (warnings are errors; the CUDA backend too where CUDA is installed) and run every
# test (with build/venv for the tests that read outputs with PyPI packages), then the MPICH half
# and the oneDNN 3 half. The three builds share one ccache (build/ccache): a source that includes
# neither the MPI nor oneDNN is compiled once.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
bash scripts/install-test-deps.sh
ctest --preset "${DP_PRESET:-default}" -j "$(nproc)" --timeout 600
# The MPICH half (DP_MPICH=0 skips it): the same sources built against MPICH in build/mpich (CPU
# backend), and every test run under its mpiexec (Hydra): the MPI tests, the distributed
# equivalences, resume, preemption, faults, the stall watchdog, the simulated cluster with Hydra's
# proxies on the namespace nodes, and the Slurm jobs started by srun --mpi=pmi2 (1 and 2 nodes).
# Not the photograph-size tests: one rank each, they test the CPU backend at ISA caps, which the
# two other halves run (the MPI makes no difference to them, and they are a third of its time).
if [[ ${DP_MPICH:-1} != 0 && -z ${DP_PRESET:-} ]]; then
  DP_PRESET=mpich bash scripts/build.sh
  ctest --preset mpich -j "$(nproc)" --timeout 600 -E '^(PhotographSizes\.|test_photograph_sizes_)'
fi
# The oneDNN 3 half (DP_ONEDNN3=0 skips it): the CPU backend built on oneDNN 3.2 (its 3.x API, and
# the brgconv AVX2 kernels that 2.x lacks) in build/onednn3, and every unit and e2e test run on it.
if [[ ${DP_ONEDNN3:-1} != 0 && -z ${DP_PRESET:-} ]]; then
  DP_PRESET=onednn3 bash scripts/build.sh
  ctest --preset onednn3 -L '^(unit|e2e)$' -j "$(nproc)" --timeout 600
fi
