#!/usr/bin/env bash
# The embedded default: install, build, then `mpirun -np 2 dptrain` on a synthetic crack dataset.
# Extra arguments go to dptrain (e.g. --epochs 20 continues the same run).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
bash scripts/mpirun.sh -np 2 build/"${DP_PRESET:-default}"/app/dptrain --model-dir runs/demo "$@"
