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

# shellcheck source=tests/slurm/slurm_common.sh
source "$repo/tests/slurm/slurm_common.sh"
ensure_slurm_packages

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
  local rc=$?
  trap - EXIT INT TERM
  cancel_job
  stop_pidfile "$tmp/run/slurmd.pid"
  stop_pidfile "$tmp/run/slurmctld.pid"
  stop_pidfile "$tmp/run/munged.pid"
  rm -rf "$tmp"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

ctl() { "$@"; }  # Slurm's clients run here
log_files=("$tmp"/log/slurmctld.log "$tmp"/log/slurmd.log "$tmp"/log/munged.log)

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
munge_socket=$tmp/run/munge.socket
start_munged
if command -v munge >/dev/null && command -v unmunge >/dev/null; then
  munge -S "$munge_socket" -n </dev/null | unmunge -S "$munge_socket" >/dev/null 2>&1 ||
    skip_daemons "munged started but cannot encode/decode a credential"
fi

# --- slurm.conf ------------------------------------------------------------------------------------
node=$(hostname -s)
if ! ctld_port=$(free_port) || ! slurmd_port=$(free_port); then fail "no free TCP port found"; fi
{
  cat <<EOF
# Private one-node test cluster of tests/slurm/run_slurm_test.sh (removed with its folder).
ClusterName=dptest
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmdSpoolDir=$tmp/spool
SlurmdPidFile=$tmp/run/slurmd.pid
SlurmdLogFile=$tmp/log/slurmd.log
TaskPlugin=task/affinity
EOF
  slurm_conf_common
  echo "NodeName=$node NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN"
  echo "PartitionName=test Nodes=$node Default=YES MaxTime=INFINITE State=UP"
} >"$SLURM_CONF"

# --- slurmctld, slurmd -----------------------------------------------------------------------------
log "starting slurmctld (port $ctld_port) and slurmd (port $slurmd_port) for node $node"
slurmctld -c -f "$SLURM_CONF" >"$tmp/log/slurmctld.out" 2>&1 ||
  { cat "$tmp/log/slurmctld.out"; skip_daemons "slurmctld cannot start here"; }
slurmd -f "$SLURM_CONF" >"$tmp/log/slurmd.out" 2>&1 ||
  { cat "$tmp/log/slurmd.out"; skip_daemons "slurmd cannot start here"; }
node_idle() { [[ $(sinfo -h -n "$node" -o %t 2>/dev/null) == idle ]]; }
wait_until_idle "node $node" node_idle
log "node $node idle"

# --- the jobs ------------------------------------------------------------------------------------
work=$tmp/work
write_job_data
export EPOCHS EXTRA_ARGS="--width-divisor 16 --log-every 25 --workers 1 --test-fault hold@0:$HOLD_RUN_STEP"

# run_job LAUNCHER SIGNAL: submit, preempt mid-epoch 2 with SIGNAL (the job's PREEMPT_SIGNAL, so
# dptrain's --preempt-signal), requeue, release, check the finished job.
run_job() {
  export LAUNCHER=$1 MODEL_DIR=$work/run-$1 PREEMPT_SIGNAL=$2
  # srun starts the ranks through PMIx (Open MPI) or PMI-2 (MPICH's build: DP_SLURM_TEST_SRUN_MPI
  # =pmi2); the test cluster's MpiDefault is none.
  export SRUN_ARGS=--mpi=${DP_SLURM_TEST_SRUN_MPI:-pmix}
  local rows e
  # --ntasks/--cpus-per-task fit the 2-CPU node (the script asks for 2 x 32 cores).
  submit --nodes=1 --ntasks=2 --ntasks-per-node=2 --cpus-per-task=1
  log "LAUNCHER=$LAUNCHER: submitted job $job"

  # Preempt once epoch 2 is under way: a step line of epoch 2 (rank 0 then holds in its step
  # HOLD_STEP until the signal comes).
  wait_for 120 "a training step of epoch 2 in $joblog" epoch_running_or_end 2
  preempt_and_release "$PREEMPT_SIGNAL" node_idle
  wait_for 150 "the requeued job to finish" finished

  echo "----- job $job ($LAUNCHER): log lines of the preemption, the requeue and the resume -----"
  grep -E 'SIGUSR|preempt|requeu|resumed from|restart count|epoch [0-9]+/[0-9]+ |done:' "$joblog"
  echo "----- slurmctld.log on job $job -----"
  grep -E "JobId=${job}([^0-9]|$)" "$tmp/log/slurmctld.log" | grep -Ei 'requeu|allocate|kill|complete|begin'
  echo "-----------------------------------------------------------------------------------------"
  check_preempted_and_resumed 2
  log_has "SIG$PREEMPT_SIGNAL received" || fail "the batch shell did not report the SIG$PREEMPT_SIGNAL"
  log_has "preemption: (SIGTERM, )?SIG$PREEMPT_SIGNAL received by" ||
    fail "dptrain did not take SIG$PREEMPT_SIGNAL as its preemption signal"
  log_has 'restart count 1' || fail "no second run (restart count 1) in the log"
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
  log "PASS ($LAUNCHER): preempted after step $HOLD_STEP of epoch 2 through Slurm, requeued, resumed there, finished $EPOCHS epochs"
}

# srun with SIGUSR1 (the default), mpirun with SIGUSR2 (--preempt-signal USR2).
for launcher in ${DP_SLURM_TEST_LAUNCHERS:-srun mpirun}; do
  if [[ $launcher == mpirun ]]; then run_job "$launcher" USR2; else run_job "$launcher" USR1; fi
done
exit 0
