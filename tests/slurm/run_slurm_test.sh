#!/usr/bin/env bash
# Slurm end to end (ctest "slurm"): a private one-node Slurm runs train-cpu.sbatch, preempts it, requeues, resumes, finishes.
#
# Usage: tests/slurm/run_slurm_test.sh DPTRAIN DPPREP
# Exit: 0 passed, 1 failed, 77 skipped (the reason is printed: no root, no packages, daemons
# that cannot start). As root it installs Debian's slurm-wlm and munge when they are missing.
#
# What it does, all under one mktemp folder (removed at exit, also on failure):
#  1. munged with its own key and socket; slurm.conf for one node named after `hostname -s`
#     (CPUs=2, free ports, state/spool/log/pid files in the folder); slurmctld and slurmd.
#  2. `dpprep synth` writes a tiny dataset; `sbatch jobscripts/slurm/train-cpu.sbatch` trains on
#     it with 2 ranks (width divisor 16, 32x32 images, 3 epochs of 1024 steps), once with
#     LAUNCHER=srun (PMIx) and once with LAUNCHER=mpirun (DP_SLURM_TEST_LAUNCHERS picks). Rank 0
#     holds in step 26 of epoch 2 until a preemption signal arrives (the hidden --test-fault
#     hold@0:STEP), so the signal lands mid-epoch however long Slurm and this machine's load take
#     to bring it (once 9 s, once a 36 s late poll: more than a whole epoch).
#  3. Once the job has logged a step of epoch 2, `scancel --signal=USR1 --batch JOB` (what
#     `--signal=B:USR1@<grace>` does near the time limit; USR2 and PREEMPT_SIGNAL=USR2, so
#     dptrain --preempt-signal USR2, for the mpirun job): the batch shell passes the signal on,
#     dptrain writes model_epoch_1_step_26.h5 and exits 75, the script runs `scontrol requeue`.
#  4. The requeued job (Restarts=1) is released (StartTime=now; Slurm would hold it back for about
#     two minutes), resumes at that step and finishes all 3 epochs; the job log must show each stage.
#  5. Every daemon it started is stopped by its pid file; the folder is removed.
# shellcheck disable=SC2317  # functions run from traps and from wait_for look unreachable
set -uo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 DPTRAIN DPPREP" >&2
  exit 2
fi
DPTRAIN=$(readlink -f "$1")
DPPREP=$(readlink -f "$2")
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
sbatch_script=$repo/jobscripts/slurm/train-cpu.sbatch

EPOCHS=3                              # epochs the job must finish with
TRAIN_SAMPLES=4096                    # 2 ranks x batch 2 -> 1024 steps per epoch
# The step of epoch 2 that waits for the signal: the one after epoch 2's first progress line
# (--log-every 25), which the test waits for before it signals, so the signal cannot come earlier.
HOLD_STEP=26
HOLD_RUN_STEP=$((TRAIN_SAMPLES / 4 + HOLD_STEP))  # the same, counted over the run
BUDGET_S=${DP_SLURM_TEST_BUDGET_S:-300}  # the test fails (not hangs) past this; ctest kills at 360
start_s=$SECONDS

log() { echo "[slurm-test $(( SECONDS - start_s ))s] $*"; }
skip() {
  echo "SKIP: $*"
  exit 77
}

[[ -x $DPTRAIN && -x $DPPREP ]] || { echo "FAIL: $DPTRAIN or $DPPREP is not executable"; exit 1; }
[[ -f $sbatch_script ]] || { echo "FAIL: $sbatch_script missing"; exit 1; }
[[ $(id -u) -eq 0 ]] || skip "not root: slurmd and munged of a private test cluster need root"

# --- packages -------------------------------------------------------------------------------------
have_slurm() {
  command -v munged >/dev/null && command -v slurmctld >/dev/null &&
    command -v slurmd >/dev/null && command -v sbatch >/dev/null
}
if ! have_slurm; then
  command -v apt-get >/dev/null || skip "slurm-wlm/munge missing and no apt-get to install them"
  log "installing slurm-wlm and munge (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  # The packages' scripts would start the system's munged/slurmd/slurmctld where no init system
  # stops them; a policy-rc.d that says "no" (only if there is none) keeps them down.
  policy=""
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    policy=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\n# tests/slurm/run_slurm_test.sh: no service starts while it installs\nexit 101\n' >"$policy"
    chmod 755 "$policy"
  fi
  apt_ok=1
  { timeout 90 apt-get update -qq &&
    timeout 120 apt-get install -y -qq --no-install-recommends slurm-wlm slurm-client munge; } \
    >/tmp/dp-slurm-apt.$$.log 2>&1 || apt_ok=0
  [[ -n $policy ]] && rm -f "$policy"
  if (( ! apt_ok )); then
    tail -n 5 /tmp/dp-slurm-apt.$$.log
    rm -f /tmp/dp-slurm-apt.$$.log
    skip "apt-get could not install slurm-wlm and munge"
  fi
  rm -f /tmp/dp-slurm-apt.$$.log
  have_slurm || skip "slurm-wlm/munge installed but munged/slurmctld/slurmd/sbatch not found"
fi

# --- the private cluster's folder, and its removal --------------------------------------------------
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dp-slurm.XXXXXX")
chmod 700 "$tmp"
mkdir -p "$tmp"/{etc,state,spool,log,run,munge,work}
export SLURM_CONF=$tmp/etc/slurm.conf
job=""

stop_pidfile() {  # stop_pidfile FILE: TERM the daemon, KILL it after 10 s
  local f=$1 pid i
  [[ -s $f ]] || return 0
  pid=$(cat "$f")
  [[ $pid =~ ^[0-9]+$ ]] || return 0
  kill "$pid" 2>/dev/null || return 0
  for (( i = 0; i < 100; i++ )); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
}

cleanup() {
  local rc=$? i
  trap - EXIT INT TERM
  if [[ -n $job ]]; then
    # A job still queued or running is cancelled and given a few seconds to end, so that no
    # slurmstepd or dptrain outlives the daemons.
    scancel "$job" 2>/dev/null
    for (( i = 0; i < 30; i++ )); do
      state=$(scontrol -o show job "$job" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2)
      [[ -z $state || $state =~ ^(CANCELLED|COMPLETED|FAILED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY)$ ]] &&
        break
      sleep 0.5
    done
  fi
  stop_pidfile "$tmp/run/slurmd.pid"
  stop_pidfile "$tmp/run/slurmctld.pid"
  stop_pidfile "$tmp/run/munged.pid"
  rm -rf "$tmp"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

dump_logs() {
  local f
  for f in "$tmp"/work/job-*.out "$tmp"/log/slurmctld.log "$tmp"/log/slurmd.log "$tmp"/log/munged.log; do
    [[ -f $f ]] || continue
    echo "----- ${f#"$tmp"/} (last 40 lines) -----"
    tail -n 40 "$f"
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
# wait_for SECONDS WHAT COMMAND...: polls COMMAND every 0.2 s; fails after SECONDS or the budget.
wait_for() {
  local limit=$1 what=$2 t0=$SECONDS
  shift 2
  until "$@"; do
    (( SECONDS - t0 < limit )) || fail "timed out after ${limit} s waiting for $what"
    (( SECONDS - start_s < BUDGET_S )) || fail "test budget of ${BUDGET_S} s spent waiting for $what"
    sleep 0.2
  done
}

# A free TCP port on this machine (nothing accepts a connection to it).
used_ports=" "
free_port() {
  local p i
  for (( i = 0; i < 200; i++ )); do
    p=$(( 20000 + (RANDOM * 32768 + RANDOM) % 40000 ))
    [[ $used_ports == *" $p "* ]] && continue
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      used_ports+="$p "
      echo "$p"
      return 0
    fi
  done
  return 1
}

# --- munge ---------------------------------------------------------------------------------------
dd if=/dev/urandom of="$tmp/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$tmp/munge/munge.key"
munge_socket=$tmp/run/munge.socket
if ! munged --force --socket="$munge_socket" --key-file="$tmp/munge/munge.key" \
     --pid-file="$tmp/run/munged.pid" --log-file="$tmp/log/munged.log" \
     --seed-file="$tmp/munge/munged.seed" >"$tmp/log/munged.out" 2>&1; then
  cat "$tmp/log/munged.out"
  skip_daemons "munged cannot start here"
fi
if command -v munge >/dev/null && command -v unmunge >/dev/null; then
  munge -S "$munge_socket" -n </dev/null | unmunge -S "$munge_socket" >/dev/null 2>&1 ||
    skip_daemons "munged started but cannot encode/decode a credential"
fi

# --- slurm.conf ------------------------------------------------------------------------------------
node=$(hostname -s)
if ! ctld_port=$(free_port) || ! slurmd_port=$(free_port); then fail "no free TCP port found"; fi
: >"$tmp/etc/plugstack.conf"
cat >"$SLURM_CONF" <<EOF
# Private one-node test cluster of tests/slurm/run_slurm_test.sh (removed with its folder).
ClusterName=dptest
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$munge_socket
CredType=cred/munge
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/run/slurmctld.pid
SlurmdPidFile=$tmp/run/slurmd.pid
SlurmctldLogFile=$tmp/log/slurmctld.log
SlurmdLogFile=$tmp/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$tmp/etc/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
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
NodeName=$node NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=test Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF

# --- slurmctld, slurmd -----------------------------------------------------------------------------
log "starting slurmctld (port $ctld_port) and slurmd (port $slurmd_port) for node $node"
slurmctld -c -f "$SLURM_CONF" >"$tmp/log/slurmctld.out" 2>&1 ||
  { cat "$tmp/log/slurmctld.out"; skip_daemons "slurmctld cannot start here"; }
slurmd -f "$SLURM_CONF" >"$tmp/log/slurmd.out" 2>&1 ||
  { cat "$tmp/log/slurmd.out"; skip_daemons "slurmd cannot start here"; }
node_idle() { [[ $(sinfo -h -n "$node" -o %t 2>/dev/null) == idle ]]; }
t0=$SECONDS
until node_idle; do
  (( SECONDS - t0 < 30 )) || skip_daemons "node $node not idle 30 s after slurmd started: $(sinfo -h -o '%t %E' 2>&1)"
  sleep 0.5
done
log "node $node idle"

# --- the jobs ------------------------------------------------------------------------------------
work=$tmp/work
"$DPPREP" synth --out "$work/synth.h5" --train "$TRAIN_SAMPLES" --val 16 --size 32x32 \
  >"$work/synth.log" 2>&1 || { cat "$work/synth.log"; fail "dpprep synth failed"; }

# The job script's variables, as a user would set them (sbatch exports the environment).
# Open MPI refuses root without these two (CI runs as root).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export DATA=$work/synth.h5 MODEL=unet16 EPOCHS=$EPOCHS BATCH_SIZE=2 LR=0.01 DPTRAIN \
  EXTRA_ARGS="--width-divisor 16 --log-every 25 --workers 1 --test-fault hold@0:$HOLD_RUN_STEP"

job_field() {  # job_field NAME: the current job's NAME=value from scontrol
  scontrol -o show job "$job" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$1=//p" | head -n 1
}
log_has() { [[ -f $joblog ]] && grep -Eq -- "$1" "$joblog"; }
finished() {
  [[ $(job_field JobState) =~ ^(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE)$ ]]
}
epoch2_or_end() {
  finished && fail "job $job ended ($(job_field JobState), exit $(job_field ExitCode)) before epoch 2"
  log_has 'epoch 2 step [0-9]+/'
}
requeued() { [[ $(job_field Restarts) -ge 1 && $(job_field JobState) == PENDING ]]; }
node_idle_again() { [[ $(sinfo -h -n "$node" -o %t 2>/dev/null) == idle ]]; }

# run_job LAUNCHER SIGNAL: submit, preempt mid-epoch 2 with SIGNAL (the job's PREEMPT_SIGNAL, so
# dptrain's --preempt-signal), requeue, release, check the finished job.
run_job() {
  export LAUNCHER=$1 MODEL_DIR=$work/run-$1 PREEMPT_SIGNAL=$2
  # srun starts the ranks through PMIx (Open MPI) or PMI-2 (MPICH's build: DP_SLURM_TEST_SRUN_MPI
  # =pmi2); the test cluster's MpiDefault is none.
  export SRUN_ARGS=--mpi=${DP_SLURM_TEST_SRUN_MPI:-pmix}
  local submit_out state exit_code restarts rows e
  # --ntasks/--cpus-per-task fit the 2-CPU node (the script asks for 2 x 32 cores).
  submit_out=$(cd "$work" && sbatch --parsable --nodes=1 --ntasks=2 --ntasks-per-node=2 \
    --cpus-per-task=1 --time=10:00 --output="$work/job-%j.out" "$sbatch_script" 2>&1) ||
    fail "sbatch failed: $submit_out"
  job=${submit_out%%;*}
  [[ $job =~ ^[0-9]+$ ]] || fail "sbatch printed no job id: $submit_out"
  joblog=$work/job-$job.out
  log "LAUNCHER=$LAUNCHER: submitted job $job"

  # Preempt once epoch 2 is under way: a step line of epoch 2 (rank 0 then holds in its step
  # HOLD_STEP until the signal comes).
  wait_for 120 "a training step of epoch 2 in $joblog" epoch2_or_end
  log "epoch 2 running: scancel --signal=$PREEMPT_SIGNAL --batch $job"
  scancel --signal="$PREEMPT_SIGNAL" --batch "$job" ||
    fail "scancel --signal=$PREEMPT_SIGNAL --batch $job failed"

  wait_for 60 "the job to be requeued (Restarts=1, PENDING)" requeued
  log "requeued: JobState=$(job_field JobState) Restarts=$(job_field Restarts) Reason=$(job_field Reason)"
  # Slurm holds a requeued job back (BeginTime) so that the old run's revoked credential cannot
  # hit the new one; the test waits until the node is free plus 2 s, then releases it.
  wait_for 60 "node $node to be idle after the requeue" node_idle_again
  sleep 2
  scontrol update JobId="$job" StartTime=now || fail "scontrol update JobId=$job StartTime=now failed"

  wait_for 150 "the requeued job to finish" finished
  state=$(job_field JobState) exit_code=$(job_field ExitCode) restarts=$(job_field Restarts)
  log "job $job: JobState=$state ExitCode=$exit_code Restarts=$restarts"

  echo "----- job $job ($LAUNCHER): log lines of the preemption, the requeue and the resume -----"
  grep -E 'SIGUSR|preempt|requeu|resumed from|restart count|epoch [0-9]+/[0-9]+ |done:' "$joblog"
  echo "----- slurmctld.log on job $job -----"
  grep -E "JobId=${job}([^0-9]|$)" "$tmp/log/slurmctld.log" | grep -Ei 'requeu|allocate|kill|complete|begin'
  echo "-----------------------------------------------------------------------------------------"
  [[ $state == COMPLETED && $exit_code == 0:0 ]] || fail "job ended $state with exit code $exit_code"
  [[ $restarts == 1 ]] || fail "expected exactly 1 restart, scontrol says Restarts=$restarts"
  log_has "SIG$PREEMPT_SIGNAL received" || fail "the batch shell did not report the SIG$PREEMPT_SIGNAL"
  log_has "preemption: (SIGTERM, )?SIG$PREEMPT_SIGNAL received by" ||
    fail "dptrain did not take SIG$PREEMPT_SIGNAL as its preemption signal"
  local where epoch step
  where=$(grep -Eo 'preempted in epoch [0-9]+ after step [0-9]+' "$joblog" | head -n 1)
  [[ -n $where ]] || fail "no 'preempted in epoch E after step S' line: the signal did not land mid-epoch"
  read -r epoch step <<<"$(sed -E 's/preempted in epoch ([0-9]+) after step ([0-9]+)/\1 \2/' <<<"$where")"
  (( epoch == 2 && step == HOLD_STEP )) ||
    fail "preempted in epoch $epoch after step $step, expected epoch 2 after step $HOLD_STEP (the held one)"
  log_has 'exited with 75' || fail "the wrapper did not report dptrain's exit code 75"
  log_has 'requeueing job '"$job" || fail "the wrapper did not requeue"
  log_has 'restart count 1' || fail "no second run (restart count 1) in the log"
  log_has "resumed from epoch $(( epoch - 1 )) \\(.*model_epoch_$(( epoch - 1 ))_step_${step}\\.h5.*epoch $epoch continues after its step $step " ||
    fail "no 'resumed from epoch $(( epoch - 1 )) (...model_epoch_$(( epoch - 1 ))_step_$step.h5...); epoch $epoch continues after its step $step' line"
  for (( e = 1; e <= EPOCHS; e++ )); do
    log_has "epoch $e/$EPOCHS " || fail "epoch $e/$EPOCHS not logged"
  done
  log_has 'done: best epoch' || fail "no final 'done:' line"
  [[ -f $MODEL_DIR/model_epoch_$EPOCHS.h5 ]] || fail "model_epoch_$EPOCHS.h5 not written"
  rows=$(( $(wc -l <"$MODEL_DIR/metrics.csv") - 1 ))
  [[ $rows == "$EPOCHS" ]] || fail "metrics.csv has $rows epoch rows, expected $EPOCHS"
  if compgen -G "$MODEL_DIR/model_epoch_*_step_*.h5" >/dev/null; then
    fail "the mid-epoch checkpoint was not removed after the resumed epoch ended"
  fi
  log "PASS ($LAUNCHER): preempted after step $step of epoch $epoch through Slurm, requeued, resumed there, finished $EPOCHS epochs"
}

# srun with SIGUSR1 (the default), mpirun with SIGUSR2 (--preempt-signal USR2).
for launcher in ${DP_SLURM_TEST_LAUNCHERS:-srun mpirun}; do
  if [[ $launcher == mpirun ]]; then run_job "$launcher" USR2; else run_job "$launcher" USR1; fi
done
exit 0
