#!/usr/bin/env bash
# mpirun with what Open MPI needs on a small machine: --oversubscribe, and --allow-run-as-root as root.
set -euo pipefail
flags=(--oversubscribe)
[[ $(id -u) -eq 0 ]] && flags+=(--allow-run-as-root)
exec mpirun "${flags[@]}" "$@"
