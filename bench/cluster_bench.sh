#!/usr/bin/env bash
# 2 simulated nodes (tests/cluster) against one node: bench_allreduce over TCP vs shared memory, and dptrain's throughput and all-reduce wait with and without overlap.
#
# Usage: bash bench/cluster_bench.sh [BUILD_DIR]   (root; default build/default)
# Environment: REPEATS (2) rounds, interleaved; EPOCHS (3) per run, the best epoch after the first
# is kept; DIVISOR (8), SIZE (64), BATCH (4), TRAIN (512) as in the first cluster measurements; MPI_EXTRA:
# more mpirun options for the 2-node runs (e.g. "--mca mpi_yield_when_idle 0"); SKIP_ALLREDUCE=1:
# dptrain only. bench_allreduce runs with --bind-to none and, as the first cluster measurements did, Open
# MPI's default --bind-to core; dptrain with --bind-to none, overlapped (with and without the
# reducer's progress thread) and --no-overlap.
# The nodes are network namespaces joined by veth links through a bridge: one kernel, memory
# copies, no NIC. A functional cluster, not a fast network.
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$(readlink -f "${1:-$repo/build/default}")
# shellcheck source=tests/cluster/cluster.sh disable=SC1091
source "$repo/tests/cluster/cluster.sh"
REPEATS=${REPEATS:-2} EPOCHS=${EPOCHS:-3} DIVISOR=${DIVISOR:-8} SIZE=${SIZE:-64} BATCH=${BATCH:-4}
TRAIN=${TRAIN:-512}
read -r -a extra <<<"${MPI_EXTRA:-}"
why=$(cluster_can_run) || { echo "cluster_bench: $why" >&2; exit 1; }
trap cluster_down EXIT
trap 'exit 1' INT TERM
cluster_up 2 3600 || exit 1
export OMP_NUM_THREADS=1
work=$CLUSTER_DIR/work
mkdir -p "$work"
"$build/app/dpprep" synth --out "$work/d.h5" --train "$TRAIN" --val 16 --size "${SIZE}x$SIZE" >/dev/null
# shellcheck disable=SC2054  # host lists and BTL lists are single arguments
one_node=(on_node 1 mpirun --allow-run-as-root --bind-to none --mca pml ob1 --mca btl self,vader)
# shellcheck disable=SC2054
two_nodes=(cluster_mpirun ${extra[@]+"${extra[@]}"} --host node1:1,node2:1)

echo "== load average: $(cut -d' ' -f1-3 /proc/loadavg)"
[[ ${SKIP_ALLREDUCE:-0} == 1 ]] || for bind in none core; do
  echo "== bench_allreduce, 2 ranks on 2 nodes (btl tcp,self), --bind-to $bind"
  CLUSTER_BIND=$bind "${two_nodes[@]}" -np 2 -x OMP_NUM_THREADS "$build/bench/bench_allreduce" \
    --iters 10 | grep '|'
done
echo "== bench_allreduce, 2 ranks on 1 node (btl vader,self)"
[[ ${SKIP_ALLREDUCE:-0} == 1 ]] || "${one_node[@]}" -np 2 -x OMP_NUM_THREADS "$build/bench/bench_allreduce" --iters 10 | grep '|'

# best_epoch LOG: the best img/s of epochs 2.. and the all-reduce wait logged with it
best_epoch() {
  awk '/gradient all-reduce:/ { wait = $3 }
       /^epoch [0-9]+\// { split($2, e, "/"); if (e[1] > 1) for (i = 1; i < NF; ++i)
         if ($(i + 1) == "img/s" && $i + 0 > best) { best = $i + 0; bw = wait } }
       END { printf "%.1f img/s, wait %s ms/step", best, bw }' "$1"
}
common=(--data "$work/d.h5" --width-divisor "$DIVISOR" --batch-size "$BATCH" --epochs "$EPOCHS"
        --log-every 100000 --cpu-conv direct)
echo "== dptrain unet16 /$DIVISOR ${SIZE}x$SIZE batch $BATCH per rank, 1 thread per rank; best epoch after the first"
for ((round = 1; round <= REPEATS; ++round)); do
  for overlap in "" "--progress-us 0" --no-overlap; do
    for where in "1 node, 2 ranks (vader)" "2 nodes, 1 rank each (tcp), --bind-to none"; do
      dir=$work/m$RANDOM
      if [[ $where == 1* ]]; then launch=("${one_node[@]}"); else launch=("${two_nodes[@]}"); fi
      # shellcheck disable=SC2086  # $overlap: zero, one or two words
      CLUSTER_BIND=${where##* } "${launch[@]}" -np 2 -x OMP_NUM_THREADS "$build/app/dptrain" \
        "${common[@]}" --model-dir "$dir" $overlap >"$dir.log" 2>&1 || { tail -n 5 "$dir.log"; exit 1; }
      echo "round $round | $where | ${overlap:-overlapped, progress thread} | $(best_epoch "$dir.log")"
    done
  done
done
echo "== dptrain np=1 on node1 (no communication)"
"${one_node[@]}" -np 1 -x OMP_NUM_THREADS "$build/app/dptrain" "${common[@]}" \
  --model-dir "$work/np1" >"$work/np1.log" 2>&1 && echo "np=1 | $(best_epoch "$work/np1.log")"
echo "== load average: $(cut -d' ' -f1-3 /proc/loadavg)"
