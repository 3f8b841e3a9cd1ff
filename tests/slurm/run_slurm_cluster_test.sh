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

# --- packages (as tests/slurm/run_slurm_test.sh) ------------------------------------------------------
have_slurm() {
  command -v munged >/dev/null && command -v slurmctld >/dev/null &&
    command -v slurmd >/dev/null && command -v sbatch >/dev/null
}
if ! have_slurm; then
  command -v apt-get >/dev/null || skip "slurm-wlm/munge missing and no apt-get to install them"
  log "installing slurm-wlm and munge (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  policy=""  # keeps the packages' scripts from starting system daemons (only if there is none)
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    policy=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\n# tests/slurm/run_slurm_cluster_test.sh: no service starts while it installs\nexit 101\n' >"$policy"
    chmod 755 "$policy"
  fi
  apt_ok=1
  { timeout 90 apt-get update -qq &&
    timeout 120 apt-get install -y -qq --no-install-recommends slurm-wlm slurm-client munge; } \
    >/tmp/dp-slurm2-apt.$$.log 2>&1 || apt_ok=0
  [[ -n $policy ]] && rm -f "$policy"
  ((apt_ok)) || { tail -n 5 /tmp/dp-slurm2-apt.$$.log; rm -f /tmp/dp-slurm2-apt.$$.log;
                  skip "apt-get could not install slurm-wlm and munge"; }
  rm -f /tmp/dp-slurm2-apt.$$.log
  have_slurm || skip "slurm-wlm/munge installed but munged/slurmctld/slurmd/sbatch not found"
fi

# --- the nodes, and their removal ------------------------------------------------------------------
job=""
cleanup() {
  local rc=$? i state
  trap - EXIT INT TERM
  if [[ -n $job && -n $CLUSTER_DIR ]]; then  # no slurmstepd or dptrain outlives the daemons
    ctl scancel "$job" 2>/dev/null
    for ((i = 0; i < 20; i++)); do
      state=$(job_field JobState)
      [[ -z $state || $state =~ ^(CANCELLED|COMPLETED|FAILED|TIMEOUT|NODE_FAIL)$ ]] && break
      sleep 0.5
    done
  fi
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

dump_logs() {
  local f
  for f in "$tmp"/work/job-*.out "$tmp"/log/slurmctld.log "$tmp"/log/slurmd-node1.log \
           "$tmp"/log/slurmd-node2.log "$tmp"/log/munged.log; do
    [[ -f $f ]] || continue
    echo "----- ${f#"$tmp"/} (last 30 lines) -----"
    tail -n 30 "$f"
  done
}
fail() {
  echo "FAIL: $*"
  dump_logs
  exit 1
}
skip_daemons() {
  echo "SKIP: $*"
  dump_logs
  exit 77
}
wait_for() {  # wait_for SECONDS WHAT COMMAND...: polls COMMAND every 0.2 s
  local limit=$1 what=$2 t0=$SECONDS
  shift 2
  until "$@"; do
    ((SECONDS - t0 < limit)) || fail "timed out after ${limit} s waiting for $what"
    ((SECONDS - start_s < BUDGET_S)) || fail "test budget of ${BUDGET_S} s spent waiting for $what"
    sleep 0.2
  done
}

# --- munge, slurm.conf, daemons --------------------------------------------------------------------
dd if=/dev/urandom of="$tmp/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$tmp/munge/munge.key"
munge_socket=$tmp/run/munge.socket  # a file-system socket: every node reaches it
ctl munged --force --socket="$munge_socket" --key-file="$tmp/munge/munge.key" \
  --pid-file="$tmp/run/munged.pid" --log-file="$tmp/log/munged.log" \
  --seed-file="$tmp/munge/munged.seed" >"$tmp/log/munged.out" 2>&1 ||
  { cat "$tmp/log/munged.out"; skip_daemons "munged cannot start here"; }
: >"$tmp/etc/plugstack.conf"
cat >"$SLURM_CONF" <<EOC
# Private two-node test cluster of tests/slurm/run_slurm_cluster_test.sh (removed with its folder).
ClusterName=dpcluster
SlurmctldHost=node1($CLUSTER_SUBNET.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$munge_socket
CredType=cred/munge
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool/%n
SlurmctldPidFile=$tmp/run/slurmctld.pid
SlurmdPidFile=$tmp/run/slurmd-%n.pid
SlurmctldLogFile=$tmp/log/slurmctld.log
SlurmdLogFile=$tmp/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$tmp/etc/plugstack.conf
ProctrackType=proctrack/linuxproc
# Both nodes have CPUs 0-1 of one machine: binding would put the ranks of both on CPU 0.
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
JobRequeue=1
ReturnToService=2
KillWait=5
MinJobAge=600
InactiveLimit=0
SlurmdParameters=config_overrides
NodeName=node1 NodeAddr=$CLUSTER_SUBNET.1 CPUs=2 State=UNKNOWN
NodeName=node2 NodeAddr=$CLUSTER_SUBNET.2 CPUs=2 State=UNKNOWN
PartitionName=test Nodes=node[1-2] Default=YES MaxTime=INFINITE State=UP
EOC
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
t0=$SECONDS
until nodes_idle; do
  ((SECONDS - t0 < 30)) || skip_daemons "nodes not idle 30 s after the slurmds started: $(ctl sinfo -h -o '%N %t %E' 2>&1)"
  sleep 0.5
done
log "nodes idle: $(ctl sinfo -h -o '%P %D %t %N')"

# --- the jobs ------------------------------------------------------------------------------------
work=$tmp/work
"$DPPREP" synth --out "$work/synth.h5" --train "$TRAIN_SAMPLES" --val 16 --size 32x32 \
  >"$work/synth.log" 2>&1 || { cat "$work/synth.log"; fail "dpprep synth failed"; }
# The job script's variables, as a user would set them (sbatch exports the environment). Open MPI
# refuses root without the first two (CI runs as root).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export DEVICE=cpu DATA=$work/synth.h5 MODEL=unet16 BATCH_SIZE=2 LR=0.01 WORKERS=1 DPTRAIN \
  MODEL_DIR=$work/run
train_args="--width-divisor 16 --log-every 25"

job_field() {  # job_field NAME: the current job's NAME=value from scontrol
  ctl scontrol -o show job "$job" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$1=//p" | head -n 1
}
log_has() { [[ -f $joblog ]] && grep -Eq -- "$1" "$joblog"; }
finished() {
  [[ $(job_field JobState) =~ ^(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE)$ ]]
}
epoch_running_or_end() {  # epoch_running_or_end E
  finished && fail "job $job ended ($(job_field JobState), exit $(job_field ExitCode)) before epoch $1"
  log_has "epoch $1 step [0-9]+/"
}
requeued() { [[ $(job_field Restarts) -ge 1 && $(job_field JobState) == PENDING ]]; }
submit() {  # submit SBATCH_OPTIONS...: sets job and joblog
  local out
  out=$(cd "$work" && ctl sbatch --parsable --gres=none --cpus-per-task=1 --time=10:00 \
    --output="$work/job-%j.out" "$@" "$sbatch_script" 2>&1) || fail "sbatch failed: $out"
  job=${out%%;*}
  [[ $job =~ ^[0-9]+$ ]] || fail "sbatch printed no job id: $out"
  joblog=$work/job-$job.out
}
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
  local launcher=$1 e=$2 state exit_code restarts where epoch step
  export EPOCHS=$e LAUNCHER=$launcher SRUN_ARGS=${3:-}
  export EXTRA_ARGS="$train_args --test-fault hold@0:$(((e - 1) * TRAIN_SAMPLES / 4 + HOLD_STEP))"
  submit --nodes=2 --ntasks-per-node=1
  log "job $job: 2 nodes x 1 rank ($launcher${SRUN_ARGS:+ $SRUN_ARGS}), EPOCHS=$e"
  wait_for 90 "a training step of epoch $e in $joblog" epoch_running_or_end "$e"
  log "epoch $e running: scancel --signal=USR1 --batch $job"
  ctl scancel --signal=USR1 --batch "$job" || fail "scancel --signal=USR1 --batch $job failed"
  wait_for 60 "the job to be requeued (Restarts=1, PENDING)" requeued
  log "requeued: JobState=$(job_field JobState) Restarts=$(job_field Restarts) Reason=$(job_field Reason)"
  # Slurm holds a requeued job back (BeginTime); released once both nodes are free again.
  wait_for 60 "both nodes idle after the requeue" nodes_idle
  sleep 2
  ctl scontrol update JobId="$job" StartTime=now || fail "scontrol update JobId=$job StartTime=now failed"
  wait_for 90 "the requeued job to finish" finished
  state=$(job_field JobState) exit_code=$(job_field ExitCode) restarts=$(job_field Restarts)
  log "job $job: JobState=$state ExitCode=$exit_code Restarts=$restarts"
  show_job
  [[ $state == COMPLETED && $exit_code == 0:0 ]] || fail "job ended $state with exit code $exit_code"
  [[ $restarts == 1 ]] || fail "expected exactly 1 restart, scontrol says Restarts=$restarts"
  [[ $(grep -c '2 ranks on 2 node(s) (node\[1-2\])' "$joblog") == 2 ]] ||
    fail "the job did not run twice with 2 ranks on node[1-2]"
  where=$(grep -Eo 'preempted in epoch [0-9]+ after step [0-9]+' "$joblog" | head -n 1)
  [[ -n $where ]] || fail "no 'preempted in epoch E after step S' line: the signal did not land mid-epoch"
  read -r epoch step <<<"$(sed -E 's/preempted in epoch ([0-9]+) after step ([0-9]+)/\1 \2/' <<<"$where")"
  ((epoch == e && step == HOLD_STEP)) ||
    fail "preempted in epoch $epoch after step $step, expected epoch $e after step $HOLD_STEP (the held one)"
  log_has 'exited with 75' || fail "the wrapper did not report dptrain's exit code 75"
  log_has "requeueing job $job" || fail "the wrapper did not requeue"
  log_has "resumed from epoch $((e - 1)) \\(.*model_epoch_$((e - 1))_step_${step}\\.h5.*epoch $e continues after its step $step " ||
    fail "no 'resumed from epoch $((e - 1)) (...model_epoch_$((e - 1))_step_$step.h5...); epoch $e continues after its step $step' line"
  log_has "epoch $e/$e " || fail "epoch $e/$e not logged"
  [[ -f $MODEL_DIR/model_epoch_$e.h5 ]] || fail "model_epoch_$e.h5 not written"
  log "PASS ($launcher): 2 nodes, preempted after step $step of epoch $e, requeued, resumed there, finished"
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
submit --nodes=1 --ntasks-per-node=1
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
