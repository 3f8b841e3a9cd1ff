#!/usr/bin/env bash
# Slurm on 2 simulated nodes (ctest cluster.slurm_2nodes): train-multinode.sbatch (DEVICE=cpu) on --nodes=2, preempted, requeued, resumed; then resumed on --nodes=1.
#
# Usage: tests/slurm/run_slurm_cluster_test.sh DPTRAIN DPPREP
# Exit: 0 passed, 1 failed, 77 skipped (the reason is printed: not root, no namespaces, no packages,
# daemons that cannot start). As root it installs Debian's slurm-wlm and munge when missing.
#
# What it does:
#  1. Two namespace nodes of tests/cluster/cluster.sh (node1, node2 on a private bridge; their
#     folder under /var/tmp). munged and slurmctld run on node1, one slurmd on each node (its own
#     NodeName, address, spool and pid file). Each slurmd (and so each job step) gets a private
#     /tmp, as real nodes have: the nodes would otherwise share Slurm's PMIx folders there.
#  2. `DEVICE=cpu sbatch --gres=none --nodes=2 --ntasks-per-node=1 train-multinode.sbatch` with
#     LAUNCHER=srun (--mpi=pmix; DP_SLURM_TEST_SRUN_MPI=pmi2 in the MPICH build), EPOCHS=2: 2
#     ranks on 2 nodes. Once epoch 2 runs, `scancel --signal=USR1 --batch JOB` (rank 0 holds in
#     step 26 of the epoch until the signal comes: --test-fault hold, as in run_slurm_test.sh):
#     dptrain writes model_epoch_1_step_26.h5 and exits 75, the script requeues the job;
#     released, it resumes at that step on the 2 nodes and finishes. Then the same with LAUNCHER=mpirun and EPOCHS=3
#     (preempted in epoch 3), where DP_SLURM_TEST_LAUNCHERS (default "srun mpirun") has it.
#  3. The same model dir with --nodes=1 (srun, 1 rank) and one epoch more: resumed from the
#     2-node runs' last epoch, the next one trained on one node.
#  4. Every daemon and process of the nodes is ended and the folder removed (cluster_down), also
#     on failure, INT or TERM; the test fails (does not hang) after BUDGET_S.
# shellcheck disable=SC2317  # functions run from traps and from wait_for look unreachable
set -uo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 DPTRAIN DPPREP" >&2
  exit 2
fi
DPTRAIN=$(readlink -f "$1")
DPPREP=$(readlink -f "$2")
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
sbatch_script=$repo/jobscripts/slurm/train-multinode.sbatch
# shellcheck source=tests/cluster/cluster.sh disable=SC1091
source "$repo/tests/cluster/cluster.sh"

TRAIN_SAMPLES=8000                       # 2 ranks x batch 2 -> 2000 steps per epoch (about 4 s on 2 cores)
HOLD_STEP=26  # the step of the preempted epoch that waits for the signal: after its first line
BUDGET_S=${DP_SLURM_TEST_BUDGET_S:-200}  # the test fails (not hangs) past this; ctest kills later
start_s=$SECONDS

log() { echo "[slurm-2nodes $((SECONDS - start_s))s] $*"; }
skip() {
  echo "SKIP: $*"
  exit 77
}
[[ -x $DPTRAIN && -x $DPPREP ]] || { echo "FAIL: $DPTRAIN or $DPPREP is not executable"; exit 1; }
[[ -f $sbatch_script ]] || { echo "FAIL: $sbatch_script missing"; exit 1; }
why=$(cluster_can_run) || skip "$why"

# shellcheck source=tests/slurm/slurm_common.sh
source "$repo/tests/slurm/slurm_common.sh"
ensure_slurm_packages

# --- the nodes, and their removal ------------------------------------------------------------------
job=""
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  [[ -z $CLUSTER_DIR ]] || cancel_job
  cluster_down
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
# The cluster's folder outside /tmp: each node mounts a /tmp of its own over it.
TMPDIR=/var/tmp cluster_up 2 $((BUDGET_S + 30)) || { echo "FAIL: could not make the simulated cluster"; exit 1; }
tmp=$CLUSTER_DIR
chmod 755 "$tmp"
mkdir -p "$tmp"/{etc,state,log,run,munge,work} "$tmp"/spool/node{1,2} "$tmp"/nodetmp/node{1,2}
chmod 1777 "$tmp"/nodetmp/node{1,2}
export SLURM_CONF=$tmp/etc/slurm.conf
ctl() { on_node 1 "$@"; }  # Slurm's clients, run on the head node

log_files=("$tmp"/log/slurmctld.log "$tmp"/log/slurmd-node1.log "$tmp"/log/slurmd-node2.log
  "$tmp"/log/munged.log)

# --- munge, slurm.conf, daemons --------------------------------------------------------------------
munge_socket=$tmp/run/munge.socket  # a file-system socket: every node reaches it
start_munged
{
  cat <<EOC
# Private two-node test cluster of tests/slurm/run_slurm_cluster_test.sh (removed with its folder).
ClusterName=dpcluster
SlurmctldHost=node1($CLUSTER_SUBNET.1)
SlurmdSpoolDir=$tmp/spool/%n
SlurmdPidFile=$tmp/run/slurmd-%n.pid
SlurmdLogFile=$tmp/log/slurmd-%n.log
# Both nodes have CPUs 0-1 of one machine: binding would put the ranks of both on CPU 0.
TaskPlugin=task/none
EOC
  slurm_conf_common
  echo "NodeName=node1 NodeAddr=$CLUSTER_SUBNET.1 CPUs=2 State=UNKNOWN"
  echo "NodeName=node2 NodeAddr=$CLUSTER_SUBNET.2 CPUs=2 State=UNKNOWN"
  echo "PartitionName=test Nodes=node[1-2] Default=YES MaxTime=INFINITE State=UP"
} >"$SLURM_CONF"
log "starting slurmctld on node1 and a slurmd on node1 and node2"
ctl slurmctld -c -f "$SLURM_CONF" >"$tmp/log/slurmctld.out" 2>&1 ||
  { cat "$tmp/log/slurmctld.out"; skip_daemons "slurmctld cannot start here"; }
# What the jobs run from /tmp (a checkout or build there, as a CI clone may be) stays visible
# at the same path in each node's own /tmp.
under_tmp=()
for p in "$repo" "$(dirname "$DPTRAIN")" "$(dirname "$DPPREP")"; do
  [[ $p == /tmp/* ]] || continue
  covered=0
  for q in "${under_tmp[@]}"; do [[ $p == "$q" || $p == "$q"/* ]] && covered=1; done
  ((covered)) || under_tmp+=("$p")
done
for i in 1 2; do
  binds=""
  for p in "${under_tmp[@]}"; do
    mkdir -p "$tmp/nodetmp/node$i${p#/tmp}"
    binds+="mount --bind '$p' '$tmp/nodetmp/node$i${p#/tmp}' && "
  done
  on_node "$i" unshare --mount --propagation private sh -c \
    "${binds}mount --rbind '$tmp/nodetmp/node$i' /tmp && exec slurmd -f '$SLURM_CONF'" \
    >"$tmp/log/slurmd-node$i.out" 2>&1 ||
    { cat "$tmp/log/slurmd-node$i.out"; skip_daemons "slurmd cannot start on node$i"; }
done
nodes_idle() { [[ $(ctl sinfo -h -o '%D %t' 2>/dev/null) == "2 idle" ]]; }
wait_until_idle "nodes" nodes_idle
log "nodes idle: $(ctl sinfo -h -o '%P %D %t %N')"

# --- the jobs ------------------------------------------------------------------------------------
work=$tmp/work
write_job_data
export DEVICE=cpu WORKERS=1 MODEL_DIR=$work/run
train_args="--width-divisor 16 --log-every 25"

show_job() {
  echo "----- job $job: its log lines of nodes, the preemption, the requeue and the resume -----"
  grep -E 'ranks on|SIGUSR1|preempt|requeu|resumed from|epoch [0-9]+/[0-9]+ |done:|finished' "$joblog"
  echo "----- slurmctld.log on job $job -----"
  grep -E "JobId=${job}([^0-9]|$)" "$tmp/log/slurmctld.log" | grep -Ei 'requeu|allocate|complete|begin' | head -n 8
  echo "-----------------------------------------------------------------------------------------"
}

# preempt_cycle LAUNCHER E [SRUN_ARGS]: 2 nodes x 1 rank with EPOCHS=E (the model dir holds epoch
# E-1): preempted mid-epoch E, requeued, resumed there, finished.
preempt_cycle() {
  local launcher=$1 e=$2
  export EPOCHS=$e LAUNCHER=$launcher SRUN_ARGS=${3:-}
  export EXTRA_ARGS="$train_args --test-fault hold@0:$(((e - 1) * TRAIN_SAMPLES / 4 + HOLD_STEP))"
  submit --gres=none --cpus-per-task=1 --nodes=2 --ntasks-per-node=1
  log "job $job: 2 nodes x 1 rank ($launcher${SRUN_ARGS:+ $SRUN_ARGS}), EPOCHS=$e"
  wait_for 90 "a training step of epoch $e in $joblog" epoch_running_or_end "$e"
  preempt_and_release USR1 nodes_idle
  wait_for 90 "the requeued job to finish" finished
  show_job
  check_preempted_and_resumed "$e"
  [[ $(grep -c '2 ranks on 2 node(s) (node\[1-2\])' "$joblog") == 2 ]] ||
    fail "the job did not run twice with 2 ranks on node[1-2]"
  log_has "epoch $e/$e " || fail "epoch $e/$e not logged"
  [[ -f $MODEL_DIR/model_epoch_$e.h5 ]] || fail "model_epoch_$e.h5 not written"
  log "PASS ($launcher): 2 nodes, preempted after step $HOLD_STEP of epoch $e, requeued, resumed there, finished"
}

# 1. Two nodes, srun with PMIx (Open MPI) or PMI-2 (the MPICH build: DP_SLURM_TEST_SRUN_MPI=pmi2),
# then mpirun where DP_SLURM_TEST_LAUNCHERS has it (Open MPI starts its daemon on node2 with srun).
srun_mpi=--mpi=${DP_SLURM_TEST_SRUN_MPI:-pmix}
e=1
for launcher in ${DP_SLURM_TEST_LAUNCHERS:-srun mpirun}; do
  e=$((e + 1))
  if [[ $launcher == srun ]]; then preempt_cycle srun $e "$srun_mpi"; else preempt_cycle "$launcher" $e; fi
done

# 2. The same model dir on one node (1 rank, srun): a changed node count resumes.
export EPOCHS=$((e + 1)) LAUNCHER=srun SRUN_ARGS=$srun_mpi EXTRA_ARGS=$train_args
submit --gres=none --cpus-per-task=1 --nodes=1 --ntasks-per-node=1
log "job $job: 1 node x 1 rank (srun $srun_mpi), EPOCHS=$EPOCHS"
wait_for 60 "job $job to finish" finished
state=$(job_field JobState) exit_code=$(job_field ExitCode)
show_job
[[ $state == COMPLETED && $exit_code == 0:0 ]] || fail "job ended $state with exit code $exit_code"
log_has '1 ranks on 1 node\(s\)' || fail "the job did not run with 1 rank on 1 node"
log_has "resumed from epoch $e \\(.*model_epoch_$e\\.h5" || fail "no 'resumed from epoch $e' line"
log_has "epoch $EPOCHS/$EPOCHS " || fail "epoch $EPOCHS/$EPOCHS not logged"
rows=$(($(wc -l <"$MODEL_DIR/metrics.csv") - 1))
[[ $rows == "$EPOCHS" ]] || fail "metrics.csv has $rows epoch rows, expected $EPOCHS"
log "PASS: resumed on 1 node from the 2-node runs' epoch $e, finished epoch $EPOCHS"
