# What the Slurm tests share (sourced by run_slurm_test.sh and run_slurm_cluster_test.sh): the
# packages, failing with the logs, polling, the common slurm.conf, and following a preempted job.
# The sourcing script defines log, skip, start_s and BUDGET_S, and before the functions that use
# them run: tmp (the cluster's folder), ctl (runs a Slurm client where the controller is),
# log_files (the daemons' logs to show on failure), munge_socket, sbatch_script, DPPREP, DPTRAIN,
# TRAIN_SAMPLES, work (where jobs run from) and HOLD_STEP; submit sets job and joblog.
# shellcheck shell=bash disable=SC2317,SC2154  # run from traps and wait_for; the caller sets the rest

# Installs Debian's slurm-wlm and munge where missing (skips the test where it cannot).
ensure_slurm_packages() {
  have_slurm() {
    command -v munged >/dev/null && command -v slurmctld >/dev/null &&
      command -v slurmd >/dev/null && command -v sbatch >/dev/null
  }
  have_slurm && return 0
  command -v apt-get >/dev/null || skip "slurm-wlm/munge missing and no apt-get to install them"
  log "installing slurm-wlm and munge (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  # The packages' scripts would start the system's munged/slurmd/slurmctld where no init system
  # stops them; a policy-rc.d that says "no" (only if there is none) keeps them down.
  local policy="" apt_ok=1 apt_log=/tmp/dp-slurm-apt.$$.log
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    policy=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\n# tests/slurm: no service starts while it installs\nexit 101\n' >"$policy"
    chmod 755 "$policy"
  fi
  { timeout 90 apt-get update -qq &&
    timeout 120 apt-get install -y -qq --no-install-recommends slurm-wlm slurm-client munge; } \
    >"$apt_log" 2>&1 || apt_ok=0
  [[ -n $policy ]] && rm -f "$policy"
  ((apt_ok)) || { tail -n 5 "$apt_log"; rm -f "$apt_log"; skip "apt-get could not install slurm-wlm and munge"; }
  rm -f "$apt_log"
  have_slurm || skip "slurm-wlm/munge installed but munged/slurmctld/slurmd/sbatch not found"
}

dump_logs() {
  local f
  for f in "$tmp"/work/job-*.out "${log_files[@]}"; do
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
# wait_for SECONDS WHAT COMMAND...: polls COMMAND every 0.2 s; fails after SECONDS or the budget.
wait_for() {
  local limit=$1 what=$2 t0=$SECONDS
  shift 2
  until "$@"; do
    ((SECONDS - t0 < limit)) || fail "timed out after ${limit} s waiting for $what"
    ((SECONDS - start_s < BUDGET_S)) || fail "test budget of ${BUDGET_S} s spent waiting for $what"
    sleep 0.2
  done
}

# Starts munged with its own key on the socket $munge_socket (skips the test where it cannot).
start_munged() {
  dd if=/dev/urandom of="$tmp/munge/munge.key" bs=1024 count=1 status=none
  chmod 400 "$tmp/munge/munge.key"
  ctl munged --force --socket="$munge_socket" --key-file="$tmp/munge/munge.key" \
    --pid-file="$tmp/run/munged.pid" --log-file="$tmp/log/munged.log" \
    --seed-file="$tmp/munge/munged.seed" >"$tmp/log/munged.out" 2>&1 ||
    { cat "$tmp/log/munged.out"; skip_daemons "munged cannot start here"; }
}

# wait_until_idle WHAT TEST: waits up to 30 s for TEST (the nodes idle) once the slurmds started;
# skips the test where they never get there.
wait_until_idle() {
  local t0=$SECONDS
  until "$2"; do
    ((SECONDS - t0 < 30)) ||
      skip_daemons "$1 not idle 30 s after the slurmds started: $(ctl sinfo -h -o '%N %t %E' 2>&1)"
    sleep 0.5
  done
}

# The jobs' dataset, $work/synth.h5: $TRAIN_SAMPLES training and 16 validation samples of 32x32.
write_job_data() {
  "$DPPREP" synth --out "$work/synth.h5" --train "$TRAIN_SAMPLES" --val 16 --size 32x32 \
    >"$work/synth.log" 2>&1 || { cat "$work/synth.log"; fail "dpprep synth failed"; }
  # The job script's variables, as a user would set them (sbatch exports the environment). Open
  # MPI refuses root without the first two (CI runs as root).
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  export DATA=$work/synth.h5 MODEL=unet16 BATCH_SIZE=2 LR=0.01 DPTRAIN
}

# The slurm.conf lines both test clusters have: root daemons, munge on $munge_socket, state and
# logs in $tmp, no accounting, requeue allowed, nodes back in service on their own.
slurm_conf_common() {
  : >"$tmp/etc/plugstack.conf"
  cat <<EOF
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$munge_socket
CredType=cred/munge
StateSaveLocation=$tmp/state
SlurmctldPidFile=$tmp/run/slurmctld.pid
SlurmctldLogFile=$tmp/log/slurmctld.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$tmp/etc/plugstack.conf
ProctrackType=proctrack/linuxproc
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
EOF
}

# The job's state, and waiting on it.
job_field() {  # job_field NAME: the current job's NAME=value from scontrol
  ctl scontrol -o show job "$job" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$1=//p" | head -n 1
}
log_has() { [[ -f $joblog ]] && grep -Eq -- "$1" "$joblog"; }
finished() {
  [[ $(job_field JobState) =~ ^(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE)$ ]]
}
epoch_running_or_end() {  # epoch_running_or_end E: a step line of epoch E (fails if the job ended)
  finished && fail "job $job ended ($(job_field JobState), exit $(job_field ExitCode)) before epoch $1"
  log_has "epoch $1 step [0-9]+/"
}
requeued() { [[ $(job_field Restarts) -ge 1 && $(job_field JobState) == PENDING ]]; }
# submit SBATCH_OPTIONS...: sbatch the job script from $work; sets job and joblog.
submit() {
  local out
  out=$(cd "$work" && ctl sbatch --parsable --time=10:00 --output="$work/job-%j.out" "$@" \
    "$sbatch_script" 2>&1) || fail "sbatch failed: $out"
  job=${out%%;*}
  [[ $job =~ ^[0-9]+$ ]] || fail "sbatch printed no job id: $out"
  joblog=$work/job-$job.out
}
# A job still queued or running is cancelled and given a few seconds to end, so that no
# slurmstepd or dptrain outlives the daemons.
cancel_job() {
  local i state
  [[ -n $job ]] || return 0
  ctl scancel "$job" 2>/dev/null
  for ((i = 0; i < 20; i++)); do
    state=$(job_field JobState)
    [[ -z $state || $state =~ ^(CANCELLED|COMPLETED|FAILED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY)$ ]] && break
    sleep 0.5
  done
}

# preempt_and_release SIGNAL NODES_FREE: signals the batch shell with SIGNAL (once epoch E's
# steps run: the caller waits for that), waits for the requeue, and releases the requeued job once
# NODES_FREE (a command) holds: Slurm holds it back (BeginTime) so that the old run's revoked
# credential cannot hit the new one.
preempt_and_release() {
  log "scancel --signal=$1 --batch $job"
  ctl scancel --signal="$1" --batch "$job" || fail "scancel --signal=$1 --batch $job failed"
  wait_for 60 "the job to be requeued (Restarts=1, PENDING)" requeued
  log "requeued: JobState=$(job_field JobState) Restarts=$(job_field Restarts) Reason=$(job_field Reason)"
  wait_for 60 "the nodes to be idle after the requeue" "$2"
  sleep 2
  ctl scontrol update JobId="$job" StartTime=now || fail "scontrol update JobId=$job StartTime=now failed"
}

# check_preempted_and_resumed E: the finished job was preempted in epoch E after its held step
# HOLD_STEP, requeued once and resumed there from the mid-epoch checkpoint.
check_preempted_and_resumed() {
  local e=$1 state exit_code restarts where epoch step
  state=$(job_field JobState) exit_code=$(job_field ExitCode) restarts=$(job_field Restarts)
  log "job $job: JobState=$state ExitCode=$exit_code Restarts=$restarts"
  [[ $state == COMPLETED && $exit_code == 0:0 ]] || fail "job ended $state with exit code $exit_code"
  [[ $restarts == 1 ]] || fail "expected exactly 1 restart, scontrol says Restarts=$restarts"
  where=$(grep -Eo 'preempted in epoch [0-9]+ after step [0-9]+' "$joblog" | head -n 1)
  [[ -n $where ]] || fail "no 'preempted in epoch E after step S' line: the signal did not land mid-epoch"
  read -r epoch step <<<"$(sed -E 's/preempted in epoch ([0-9]+) after step ([0-9]+)/\1 \2/' <<<"$where")"
  ((epoch == e && step == HOLD_STEP)) ||
    fail "preempted in epoch $epoch after step $step, expected epoch $e after step $HOLD_STEP (the held one)"
  log_has 'exited with 75' || fail "the wrapper did not report dptrain's exit code 75"
  log_has "requeueing job $job" || fail "the wrapper did not requeue"
  log_has "resumed from epoch $((e - 1)) \\(.*model_epoch_$((e - 1))_step_${step}\\.h5.*epoch $e continues after its step $step " ||
    fail "no 'resumed from epoch $((e - 1)) (...model_epoch_$((e - 1))_step_$step.h5...); epoch $e continues after its step $step' line"
}
