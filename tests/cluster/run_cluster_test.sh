#!/usr/bin/env bash
# dptrain across the nodes of a simulated cluster (ctest label "cluster"): Open MPI or MPICH over TCP between network namespaces.
#
# Usage: run_cluster_test.sh mpi       TEST_DIST_TRAIN_MPI DPTRAIN DPPREP
#        run_cluster_test.sh emu-gpus  DPTRAIN_EMU DPPREP
#        run_cluster_test.sh node-loss DPTRAIN DPPREP
# Exit: 0 passed, 1 failed, 77 skipped (the reason is printed: not root, no namespaces here).
# DP_CLUSTER_MPI=mpich (the MPICH build) launches with Hydra's mpiexec ($CLUSTER_MPIEXEC) instead
# of Open MPI's mpirun; the mpi mode only (the others read Open MPI's messages or need tests/emu).
#
#   mpi        2 nodes x 2 ranks: test_dist_train_mpi (np=4 == np=1 with 4x the batch, same
#              tolerances as on one node; a parameter out of sync is named), then dptrain with
#              --log-all-ranks --check-sync-every 1: every rank's node and node-local rank, and
#              the losses of one rank with 4x the batch.
#   emu-gpus   dptrain_emu --device cuda with 2 emulated GPUs per node (tests/emu; NCCL's
#              all-reduce is MPI's, over TCP here): rank r gets its node-local rank's GPU, and the
#              losses are those of --device cpu on the same nodes.
#   node-loss  2 nodes x 2 ranks train; once 2 epochs are checkpointed, node 2 is lost, (a) its
#              ranks killed, (b) its link taken down. The job must end within 60 s with one line
#              naming the lost rank / node, and a rerun on node 1 alone resumes from the newest
#              checkpoint.
# Every namespace, link and process it makes is removed on exit (tests/cluster/cluster.sh), also
# on failure, INT or TERM; the whole test fails (does not hang) after BUDGET_S.
# shellcheck disable=SC2317,SC2016,SC2054  # functions run from traps; check's eval strings; host lists
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/cluster/cluster.sh
source "$here/cluster.sh"

mode=${1:-}
shift || true
BUDGET_S=${DP_CLUSTER_TEST_BUDGET_S:-150}  # ctest's TIMEOUT is above this
LOSS_BOUND_S=60                            # a lost node must end the job within this
start_s=$SECONDS

log() { echo "[cluster-test $((SECONDS - start_s))s] $*"; }
fail() {
  echo "FAIL: $*"
  exit 1
}
check() {  # check COMMAND WHAT: runs COMMAND (a string for eval); fails with WHAT if it fails
  if eval "$1"; then echo "ok: $2"; else fail "$2"; fi
}

MPI=${DP_CLUSTER_MPI:-openmpi}
[[ $MPI == openmpi || ($MPI == mpich && $mode == mpi) ]] ||
  { echo "DP_CLUSTER_MPI=$MPI: only openmpi, or mpich with the mpi mode" >&2; exit 2; }
case $mode in
  mpi) (($# == 3)) || { echo "usage: $0 mpi TEST_DIST_TRAIN_MPI DPTRAIN DPPREP" >&2; exit 2; } ;;
  emu-gpus | node-loss) (($# == 2)) || { echo "usage: $0 $mode DPTRAIN DPPREP" >&2; exit 2; } ;;
  *) echo "usage: $0 mpi|emu-gpus|node-loss BINARIES..." >&2; exit 2 ;;
esac
bins=()
for b in "$@"; do
  [[ -x $b ]] || fail "$b is not executable"
  bins+=("$(readlink -f "$b")")
done
if ! why=$(cluster_can_run); then
  echo "SKIP: $why"
  exit 77
fi

trap cluster_down EXIT
trap 'exit 1' INT TERM
cluster_up 2 $((BUDGET_S + 30)) || fail "could not make the simulated cluster"
work=$CLUSTER_DIR/work
mkdir -p "$work"
log "2 nodes up: $(on_node 1 hostname) $CLUSTER_SUBNET.1, $(on_node 2 hostname) $CLUSTER_SUBNET.2 (bridge in its own namespace)"
export OMP_NUM_THREADS=1
HOSTS=node1:2,node2:2

# run_job SECONDS LOG HOSTS CMD...: CMD as ranks on HOSTS ("node1:2,node2:2": slots per node, filled
# in order) by the launcher of the build's MPI, its output in LOG; bounded by SECONDS and by what is
# left of the budget. Returns the launcher's status (Open MPI: 124 when timed out). The exported
# OMP_NUM_THREADS and DP_EMU_* reach every rank (Hydra passes the whole environment).
run_job() {
  local limit=$1 out=$2 hosts=$3 left=$((BUDGET_S - (SECONDS - start_s))) np=0 slot v pass=()
  shift 3
  ((left > 0)) || fail "test budget of ${BUDGET_S} s spent"
  ((limit < left)) || limit=$left
  IFS=, read -ra slot <<<"$hosts"
  for v in "${slot[@]}"; do np=$((np + ${v#*:})); done
  if [[ $MPI == mpich ]]; then
    MPIEXEC_TIMEOUT=$limit cluster_hydra -hosts "$hosts" -n "$np" "$@" >"$out" 2>&1 </dev/null
  else
    for v in OMP_NUM_THREADS DP_EMU_DEVICES DP_EMU_GRID_LIMIT; do [[ -v $v ]] && pass+=(-x "$v"); done
    cluster_mpirun --timeout "$limit" "${pass[@]}" --host "$hosts" -np "$np" "$@" >"$out" 2>&1 </dev/null
  fi
}
show() {  # show LOG: the log without the configuration block
  grep -v '^\(\[rank [0-9]*\] \)\?  [a-z_0-9]* = ' "$1" | grep -v '^\(\[rank [0-9]*\] \)\?configuration ('
}
# "epoch E/N ... train_loss X  valid_loss Y ..." of rank 0 -> "E X Y"
losses() {
  sed -n 's/^\(\[rank 0\] \)\?epoch \([0-9]*\)\/[0-9]*  .*train_loss \([0-9.]*\)  valid_loss \([0-9.]*\).*/\2 \3 \4/p' "$1"
}
# same_losses LOG_A LOG_B N: N epochs in each, the same losses as printed (4 decimals) within
# 2e-4 (+1e-5 relative), as tests/emu/run_dptrain_emu.sh; prints both side by side.
same_losses() {
  losses "$1" >"$work/a.losses"
  losses "$2" >"$work/b.losses"
  paste "$work/a.losses" "$work/b.losses"
  test "$(wc -l <"$work/a.losses")" = "$3" && test "$(wc -l <"$work/b.losses")" = "$3" &&
    paste "$work/a.losses" "$work/b.losses" |
    awk '{ if ($1 != $4 || ($2 - $5) ^ 2 > (2e-4 + 1e-5 * $5) ^ 2 ||
               ($3 - $6) ^ 2 > (2e-4 + 1e-5 * $6) ^ 2) bad = 1 } END { exit bad }'
}
# placed LOG: every rank r of 4 logged node node<r/2+1> and node-local rank r%2.
placed() {
  local r
  for r in 0 1 2 3; do
    grep -q "^\[rank $r\] rank $r of 4 on node node$((r / 2 + 1)), node-local rank $((r % 2)) of 2$" "$1" ||
      return 1
  done
}

synth() {  # synth TRAIN VAL: a 32x32 dataset at $work/data.h5
  "${bins[-1]}" synth --out "$work/data.h5" --train "$1" --val "$2" --size 32x32 >"$work/synth.log" 2>&1 ||
    { cat "$work/synth.log"; fail "dpprep synth failed"; }
}

case $mode in
mpi)
  test_dist=${bins[0]} dptrain=${bins[1]}
  log "test_dist_train_mpi, 4 ranks on 2 nodes ($MPI over TCP)"
  run_job 90 "$work/gtest.log" "$HOSTS" "$test_dist" --gtest_color=no
  rc=$?
  grep -E '^\[ *(PASSED|FAILED|SKIPPED) *\] [0-9]' "$work/gtest.log" | sort | uniq -c  # one per rank
  ((rc == 0)) || { tail -n 40 "$work/gtest.log"; fail "test_dist_train_mpi on 2 nodes x 2 ranks (exit $rc)"; }
  check 'grep -q "OK \] DistTrain.ResultsDoNotDependOnTheWorldSize" "$work/gtest.log"' \
    "np=4 on 2 nodes == np=1 with 4x the batch (test_dist_train_mpi's tolerances)"
  check 'grep -q "OK \] DistTrain.CheckSyncNamesTheFirstTensorThatDiffers" "$work/gtest.log"' \
    "--check-sync-every names a tensor that differs across nodes"

  synth 64 16
  common=(--data "$work/data.h5" --width-divisor 16 --epochs 2 --log-every 1000 --deterministic)
  log "dptrain, 4 ranks on 2 nodes, batch 2, --check-sync-every 1"
  run_job 60 "$work/np4.log" "$HOSTS" "$dptrain" "${common[@]}" --batch-size 2 \
    --model-dir "$work/np4" --log-all-ranks --check-sync-every 1 ||
    { show "$work/np4.log" | tail -n 30; fail "dptrain on 2 nodes x 2 ranks"; }
  grep -E "^\[rank [0-9]\] rank [0-9] of 4 on node" "$work/np4.log" | sort
  check 'placed "$work/np4.log"' "every rank logged its node and node-local rank (2 per node)"
  check '! grep -q "out of sync" "$work/np4.log"' "--check-sync-every 1 held for every step (exit 0)"
  log "dptrain, 1 rank on node1, batch 8"
  run_job 60 "$work/np1.log" node1:1 "$dptrain" "${common[@]}" --batch-size 8 \
    --model-dir "$work/np1" || { show "$work/np1.log" | tail -n 30; fail "dptrain with 1 rank"; }
  echo "epoch train_loss valid_loss: 4 ranks on 2 nodes | 1 rank, 4x the batch"
  check 'same_losses "$work/np4.log" "$work/np1.log" 2' \
    "dptrain np=4 on 2 nodes has the losses of np=1 with 4x the batch"
  ;;

emu-gpus)
  dptrain=${bins[0]}
  synth 32 8
  export DP_EMU_DEVICES=2 DP_EMU_GRID_LIMIT=4
  common=(--data "$work/data.h5" --width-divisor 16 --epochs 2 --batch-size 2
          --log-every 1000 --no-tf32 --log-all-ranks)
  for device in cuda cpu; do
    log "dptrain_emu --device $device, 4 ranks on 2 nodes, 2 emulated GPUs per node"
    run_job 100 "$work/$device.log" "$HOSTS" "$dptrain" --device "$device" \
      --model-dir "$work/$device" "${common[@]}" ||
      { show "$work/$device.log" | tail -n 30; fail "dptrain_emu --device $device"; }
  done
  grep -E "^\[rank [0-9]\] (rank [0-9] of 4 on node|device: GPU)" "$work/cuda.log" | sort
  check 'placed "$work/cuda.log"' "every rank logged its node and node-local rank"
  gpus_ok() {
    local r
    for r in 0 1 2 3; do
      grep -q "^\[rank $r\] device: GPU $((r % 2)) of 2 " "$work/cuda.log" || return 1
    done
  }
  check gpus_ok "each rank got the GPU of its node-local rank (GPU 0, 1 on each node)"
  check 'grep -q "^\[rank 0\] gradients: ncclAllReduce" "$work/cuda.log"' \
    "gradients through the NCCL reducer (its stand-in's all-reduce crosses the nodes over TCP)"
  echo "epoch train_loss valid_loss: --device cuda | --device cpu"
  check 'same_losses "$work/cuda.log" "$work/cpu.log" 2' "--device cuda has the losses of --device cpu"
  ;;

node-loss)
  dptrain=${bins[0]}
  synth 64 8
  # 64 samples / (4 ranks x batch 2): 8 steps per epoch, a checkpoint after each.
  train=("$dptrain" --data "$work/data.h5" --width-divisor 16 --batch-size 2 --log-every 1000)
  for how in ranks link; do
    dir=$work/$how
    log "node loss ($how): 4 ranks on 2 nodes train until 2 epochs are checkpointed"
    run_job 120 "$work/$how.log" "$HOSTS" "${train[@]}" --model-dir "$dir" --epochs 1000 &
    job=$!
    t=$SECONDS
    until [[ -e $dir/model_epoch_2.h5 ]]; do
      kill -0 "$job" 2>/dev/null || { show "$work/$how.log" | tail -n 30; fail "the job ended early"; }
      ((SECONDS - t < 60)) || fail "no epoch-2 checkpoint after 60 s"
      sleep 0.1
    done
    if [[ $how == ranks ]]; then
      victims=()
      for p in $(node_pids 2); do
        [[ $(readlink "/proc/$p/exe" 2>/dev/null) == "$dptrain" ]] && victims+=("$p")
      done
      ((${#victims[@]} == 2)) || fail "expected 2 dptrain ranks on node2, found ${#victims[@]}"
      kill -KILL "${victims[@]}"
      log "killed both ranks of node2 (pids ${victims[*]})"
    else
      link_down 2
      log "took node2's link down"
    fi
    t_lost=$SECONDS
    wait "$job"
    rc=$?
    took=$((SECONDS - t_lost))
    show "$work/$how.log" | grep -v "^epoch\|gradient all-reduce:" | tail -n 25
    log "the job ended $took s after node2 was lost (mpirun exit $rc)"
    ((rc != 0 && rc != 124)) || fail "the job did not end with an error within its bound (exit $rc)"
    ((took <= LOSS_BOUND_S)) || fail "the job took $took s (> $LOSS_BOUND_S s) to end"
    if [[ $how == ranks ]]; then
      pattern='^mpirun noticed that process rank [23] with PID [0-9]+ on node node2 exited on signal 9'
    else
      pattern='^ *Remote daemon: \[\[[0-9]+,0\],1\] on node node2$'
    fi
    check '(( $(grep -cE "$pattern" "$work/$how.log") == 1 ))' \
      "one line names the lost $( [[ $how == ranks ]] && echo "rank and ")node: $(grep -E "$pattern" "$work/$how.log" | sed 's/^ *//')"
    # What node 2 left behind (its orted, ranks cut off from the job) goes; node 1 carries on.
    for p in $(node_pids 2); do kill -KILL "$p" 2>/dev/null; done
    newest=$(find "$dir" -maxdepth 1 -name 'model_epoch_*.h5' | sed 's/.*model_epoch_\([0-9]*\)\.h5$/\1/' |
      grep -E '^[0-9]+$' | sort -n | tail -n 1)
    log "rerun on node1 alone (2 ranks, --resume auto); newest checkpoint: epoch $newest"
    run_job 60 "$work/$how-resume.log" node1:2 "${train[@]}" --model-dir "$dir" \
      --epochs $((newest + 1)) --resume auto ||
      { show "$work/$how-resume.log" | tail -n 30; fail "the rerun on node1 failed"; }
    grep -E "^(resumed|epoch|done)" "$work/$how-resume.log"
    check 'grep -q "^resumed from epoch $newest (.*model_epoch_${newest}.h5" "$work/$how-resume.log" &&
      grep -q "^epoch $((newest + 1))/$((newest + 1)) " "$work/$how-resume.log"' \
      "the rerun on node1 resumed from the newest checkpoint (epoch $newest) and trained epoch $((newest + 1))"
  done
  ;;
esac
log "passed"
