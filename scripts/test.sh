#!/usr/bin/env bash
# Install, build (warnings are errors; the CUDA backend too where CUDA is installed) and run every
# test (with build/venv for the tests that read outputs with PyPI packages).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
bash scripts/install-test-deps.sh
ctest --preset "${DP_PRESET:-default}" -j "$(nproc)" --timeout 600
