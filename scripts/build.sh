#!/usr/bin/env bash
# Installs missing packages, then configures and builds dptrain with a CMake preset (default: "default").
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${DP_PRESET:-default}
bash scripts/install-deps.sh
[[ $preset != onednn3 ]] || bash scripts/install-onednn.sh
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" -j "$(nproc)"
echo "build: build/$preset"
