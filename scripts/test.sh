#!/usr/bin/env bash
# Install, build (warnings are errors; the CUDA backend too where CUDA is installed) and run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
ctest --preset "${DP_PRESET:-default}" -j "$(nproc)" --timeout 600
