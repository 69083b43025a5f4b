#!/usr/bin/env bash
# deploy/slurm/dynapipe.sbatch on a real one-node Slurm on this machine:
# munged, slurmctld and slurmd (Debian's slurm-wlm and munge) from a private
# temporary directory, with their own munge key and slurm.conf, on loopback
# ports that were free; then tiny CPU training jobs through sbatch, each of
# which must end COMPLETED with the DynaPipe job succeeded.
#
#   deploy/slurm/local-slurm-test.sh            # as root, after building the binaries
#
# Jobs (2 CPU executors each, a pp=2 job of 8 iterations):
#   no-gpu  no GPUs asked for; DYNAPIPE_EXECUTORS_PER_NODE=2
#   gres    --gpus-per-node=fake:2 --ntasks-per-node=1 on a stand-in GRES
#           (Name=gpu Type=fake): executors per node come from the
#           allocation, not from the SLURM_NTASKS=1 that --ntasks-per-node=1
#           leaves, and the Redis and planner steps must not claim the GPUs
#   planner-restart  as no-gpu, 300 iterations; the planner is SIGKILLed
#           mid-job: the script restarts it, the executors and `watch` ride
#           through, and Slurm records COMPLETED
#
# Exit status: 0 all jobs passed; 1 a failure (one line says which, then the
# tails of the relevant logs); 77 skipped (slurm-wlm or munge not installed,
# or not root: slurmd starts jobs as their user). Every wait has a deadline;
# the whole run takes at most DYNAPIPE_SLURM_TEST_TIMEOUT_S. Whatever it
# started is stopped on exit, whatever way it exits, and its temporary
# directory is removed.
#
# Environment:
#   DYNAPIPE_BIN                    binaries, bazel-bin layout (default: $PWD/bazel-bin)
#   DYNAPIPE_SLURM_TEST_GPUS        stand-in GPUs configured on the node (default: 2;
#                                   0: no GRES configured at all, no gres job)
#   DYNAPIPE_SLURM_TEST_TIMEOUT_S   deadline of the whole run (default: 300)
#   DYNAPIPE_SLURM_TEST_KEEP=1      keep the temporary directory (its path is printed)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bin="${DYNAPIPE_BIN:-$PWD/bazel-bin}"
gpus="${DYNAPIPE_SLURM_TEST_GPUS:-2}"
timeout_s="${DYNAPIPE_SLURM_TEST_TIMEOUT_S:-300}"
node="$(hostname -s)"
start=$SECONDS
deadline=$((SECONDS + timeout_s))

say() { echo "local-slurm-test: $*"; }
skip() { say "skipped: $*"; exit 77; }

for tool in slurmctld slurmd sbatch scontrol sinfo squeue scancel munged munge unmunge; do
  command -v "$tool" > /dev/null || skip "slurm-wlm not installed (apt-get install slurm-wlm munge): no $tool"
done
[ "$(id -u)" -eq 0 ] || skip "needs root (slurmd starts jobs as their user)"
for b in planner/service/dynapipe-planner runtime/executor/dynapipe-executor cli/dynapipe; do
  [ -x "$bin/$b" ] || { say "FAIL: no $bin/$b (build first, or set DYNAPIPE_BIN)"; exit 1; }
done
bin="$(cd "$bin" && pwd)"  # the jobs run elsewhere
command -v redis-server > /dev/null || { say "FAIL: no redis-server (apt-get install redis-server)"; exit 1; }
[[ $gpus =~ ^[0-9]+$ ]] || { say "FAIL: DYNAPIPE_SLURM_TEST_GPUS='$gpus' is not a count"; exit 1; }

# Nothing from a surrounding Slurm job or installation may steer this one.
while read -r v; do unset "$v"; done < <(compgen -e | grep '^SLURM_' || true)

state="$(mktemp -d "${TMPDIR:-/tmp}/dynapipe-slurm.XXXXXX")"
conf="$state/slurm.conf"
socket="$state/munge/munge.socket"
work="$state/work"
log="$state/log"
daemon_pids=()
job_ids=()
result=""

# Processes of this run that no pid was kept for (slurmstepd, job steps left
# behind): any with a file open under $state or $state in its environment.
strays() {
  local p
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    [ "$p" = $$ ] || [ "$p" = "$BASHPID" ] && continue
    if find "/proc/$p/fd" -maxdepth 1 -lname "$state/*" 2>/dev/null | grep -q . ||
       { tr '\0' '\n' < "/proc/$p/environ"; } 2>/dev/null | grep -qF -- "$state/"; then
      echo "$p"
    fi
  done
}

running() { ps -o stat= -p "$(IFS=,; echo "$*")" 2>/dev/null | grep -qv '^Z'; }  # any of PID... (not a zombie)
stop_pids() {  # stop_pids PID...: SIGTERM, then SIGKILL after 10 s
  [ $# -gt 0 ] || return 0
  kill "$@" 2>/dev/null || true
  local until=$((SECONDS + 10))
  while running "$@" && [ $SECONDS -lt $until ]; do sleep 0.2; done
  kill -KILL "$@" 2>/dev/null || true
}

cleanup() {
  local rc=$?
  set +e
  trap - EXIT INT TERM
  if [ ${#job_ids[@]} -gt 0 ]; then
    SLURM_CONF="$conf" timeout 10 scancel "${job_ids[@]}" 2>/dev/null
    local until=$((SECONDS + 20))
    while [ -n "$(SLURM_CONF="$conf" timeout 5 squeue -h -o %i 2>/dev/null)" ] && [ $SECONDS -lt $until ]; do sleep 0.5; done
  fi
  stop_pids "${daemon_pids[@]}"
  wait 2>/dev/null
  unset SLURM_CONF
  local left
  left=$(strays)
  if [ -n "$left" ]; then
    say "stopping processes left behind: ${left//$'\n'/ }"
    # shellcheck disable=SC2086
    kill -KILL $left 2>/dev/null
  fi
  if [ "${DYNAPIPE_SLURM_TEST_KEEP:-0}" = 1 ]; then
    say "kept $state"
  else
    rm -rf "$state"
  fi
  [ -n "$result" ] || result="FAIL: interrupted after $((SECONDS - start)) s"
  say "$result"
  [ "$rc" -ne 0 ] || [[ $result == PASS* ]] || rc=1
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

tail_logs() {  # the last lines of every log this run wrote
  local f
  while IFS= read -r f; do
    echo "---- ${f#"$state"/} (last 25 lines)"
    tail -n 25 "$f"
  done < <(find "$log" "$work" -type f \( -name '*.log' -o -name '*.out' \) 2>/dev/null | sort)
}
fail() {
  result="FAIL: $* (after $((SECONDS - start)) s)"
  tail_logs >&2
  exit 1
}

# wait_for WHAT SECONDS COMMAND...: poll COMMAND until it succeeds, for at
# most SECONDS and never past the run's deadline.
wait_for() {
  local what=$1 limit=$2 until=$((SECONDS + $2))
  shift 2
  [ $until -le $deadline ] || until=$deadline
  until "$@" > /dev/null 2>&1; do
    [ $SECONDS -lt $until ] || fail "$what within ${limit}s"
    sleep 0.5
  done
}

# Free loopback ports, none twice.
picked=" "
free_port() {
  local p
  while :; do
    p=$((20000 + RANDOM % 20000))
    [[ $picked == *" $p "* ]] && continue
    ss -Htan | awk '{ print $4 }' | grep -q ":$p\$" && continue
    picked+="$p "
    echo "$p"
    return
  done
}
ctld_port=$(free_port); slurmd_port=$(free_port)
redis_port=$(free_port); planner_port=$(free_port); http_port=$(free_port)

mkdir -p "$state/munge" "$state/ctld" "$state/slurmd" "$log" "$work"
chmod 700 "$state" "$state/munge"

# The daemons run in sessions of their own (setsid execs them: $! is the
# daemon), so a Ctrl-C or `timeout` that signals this script's process group
# leaves them up for the cleanup to cancel the jobs through them.

# munge: a fresh key, a private socket.
(umask 077; head -c 1024 /dev/urandom > "$state/munge/munge.key")
setsid munged --foreground --force --key-file="$state/munge/munge.key" --socket="$socket" \
  --pid-file="$state/munge/munged.pid" --seed-file="$state/munge/munged.seed" > "$log/munged.out" 2>&1 &
daemon_pids+=($!)
munge_works() { munge --socket="$socket" --no-input | unmunge --socket="$socket"; }
wait_for "munged did not answer on $socket" 20 munge_works

# The node as slurmd sees it (CPUs, sockets, memory), on loopback.
hardware=$(timeout 20 slurmd -C | sed -n -e "1s/^NodeName=[^ ]* //p")
[[ $hardware == *CPUs=* ]] || fail "slurmd -C did not describe this machine"
gres_node="" gres_types=""
if [ "$gpus" -gt 0 ]; then
  gres_types="GresTypes=gpu"
  gres_node="Gres=gpu:fake:$gpus"
  # slurmd drops a GPU without device files; these are /dev/null's twins
  # (or, where mknod is not allowed, plain files: slurmd logs an error and
  # keeps them). Nothing opens them: no GPU code runs here.
  for i in $(seq 0 $((gpus - 1))); do
    mknod "$state/fake-gpu$i" c 1 3 2>/dev/null || touch "$state/fake-gpu$i"
  done
  echo "NodeName=$node Name=gpu Type=fake File=$state/fake-gpu[0-$((gpus - 1))]" > "$state/gres.conf"
fi
cat > "$conf" <<CONF
ClusterName=dynapipe-test
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$socket
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/slurmd
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd.pid
SlurmctldLogFile=$log/slurmctld.log
SlurmdLogFile=$log/slurmd.log
PlugStackConfig=$state/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
KillWait=5
MinJobAge=600
MailProg=/bin/true
$gres_types
NodeName=$node NodeAddr=127.0.0.1 NodeHostname=$node $hardware $gres_node State=UNKNOWN
PartitionName=test Nodes=$node Default=YES MaxTime=10 State=UP
CONF
: > "$state/plugstack.conf"
export SLURM_CONF="$conf"

setsid slurmctld -D -i -f "$conf" > "$log/slurmctld.out" 2>&1 &
daemon_pids+=($!)
setsid slurmd -D -N "$node" -f "$conf" > "$log/slurmd.out" 2>&1 &
daemon_pids+=($!)
# Idle once slurmd has registered; a node that registers with less than
# slurm.conf says (CPUs, memory, GPUs) is drained at once, with a reason.
until=$((SECONDS + 60))
until node_state=$(timeout 5 sinfo -h -n "$node" -o %T 2>/dev/null) && [ "$node_state" = idle ]; do
  [[ $node_state != drain* && $node_state != inval* ]] ||
    fail "node $node is $node_state: $(timeout 5 sinfo -h -R -n "$node" -o %E)"
  if [ $SECONDS -ge $until ] || [ $SECONDS -ge $deadline ]; then
    fail "node $node did not become idle in sinfo within 60s (last: ${node_state:-no answer})"
  fi
  sleep 0.5
done
up_s=$((SECONDS - start))

# A tiny dataset and job, as deploy/slurm_test uses.
(cd "$work" && timeout 60 "$bin/cli/dynapipe" data synth --out data/ds --lengths "$repo/tests/data/flan-like-lengths.txt" \
  --samples 300 --input-scale 0.125 --alphabet 8 --seed 1) > "$log/data-synth.out" 2>&1 ||
  fail "dynapipe data synth"
cp "$repo/deploy/slurm/test-job.pbtxt" "$work/job.pbtxt" || fail "no $repo/deploy/slurm/test-job.pbtxt"

job_state() { timeout 5 scontrol show job -o "$1" | grep -o 'JobState=[A-Z_]*' | cut -d= -f2; }

sed 's/^iterations: 8$/iterations: 300/' "$work/job.pbtxt" > "$work/long-job.pbtxt"
grep -q '^iterations: 300$' "$work/long-job.pbtxt" || fail "deploy/slurm/test-job.pbtxt has no 'iterations: 8' line"

# The planner process of a running sbatch job (not the srun or bash that
# started it: its command line starts with the binary).
planner_pid() { pgrep -f -- "^$bin/planner/service/dynapipe-planner --listen=127.0.0.1:$planner_port"; }

# kill_planner_mid_job OUT: once `watch` printed iteration 3 into OUT, SIGKILL
# the planner (the script restarts it).
kill_planner_mid_job() {
  local out=$1 pid
  wait_for "the job did not reach iteration 3" 120 grep -Eq ' running iteration ([3-9]|[0-9]{2,})/' "$out"
  pid=$(planner_pid) || fail "no dynapipe-planner process on port $planner_port"
  kill -KILL "$pid"
  say "SIGKILLed the planner ($pid) at: $(grep -E ' running iteration ' "$out" | tail -n 1 | cut -d'|' -f1)"
}

# run_job NAME JOB_FILE ITERATIONS FAULT SBATCH_OPTION...: submit the sbatch
# script, inject FAULT ("" or a function given the output file) while it runs,
# wait for its end, require COMPLETED and the DynaPipe job succeeded.
summary=()
run_job() {
  local name=$1 job_file=$2 iterations=$3 fault=$4 t0=$SECONDS id st out layout
  shift 4
  out="$work/$name.out"
  id=$(cd "$work" && timeout 20 sbatch --parsable --job-name="dynapipe-$name" --nodes=1 --time=4 \
    --output="$out" "$@" "$repo/deploy/slurm/dynapipe.sbatch" "$job_file") || fail "sbatch ($name)"
  id=${id%%;*}
  job_ids+=("$id")
  [ -z "$fault" ] || "$fault" "$out"
  until st=$(job_state "$id") && [[ $st =~ ^(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE|PREEMPTED)$ ]]; do
    [ $SECONDS -lt $deadline ] ||
      fail "job $name ($id) still ${st:-unknown} at the deadline: $(timeout 5 scontrol show job -o "$id" | grep -o 'Reason=[^ ]*')"
    sleep 1
  done
  [ "$st" = COMPLETED ] || fail "job $name ($id) ended $st"
  grep -q " succeeded iteration $iterations/$iterations" "$out" ||
    fail "job $name ($id) COMPLETED without the DynaPipe job succeeding"
  layout=$(grep -m1 -o '2 cpu executors (2 per node on [^)]*)' "$out") ||
    fail "job $name ($id) did not run 2 cpu executors on the node"
  say "job $name ($id): COMPLETED in $((SECONDS - t0)) s: $layout, $(grep -m1 -o "^[^ ]* succeeded iteration $iterations/$iterations" "$out")"
  summary+=("$name $((SECONDS - t0)) s")
}

# What the sbatch script reads (sbatch exports this environment to the job).
# The head address is loopback whatever this host's name resolves to.
export DYNAPIPE_BIN="$bin" DYNAPIPE_BACKEND=cpu DYNAPIPE_START_TIMEOUT_S=60 OPENBLAS_NUM_THREADS=1
export DYNAPIPE_HEAD_ADDR=127.0.0.1 REDIS_PORT="$redis_port" PLANNER_PORT="$planner_port" HTTP_PORT="$http_port"
run_job no-gpu job.pbtxt 8 "" --export=ALL,DYNAPIPE_EXECUTORS_PER_NODE=2
# --ntasks-per-node=1 puts SLURM_NTASKS=1 in the batch environment; the
# executor step must still start 2 tasks.
[ "$gpus" -lt 2 ] || run_job gres job.pbtxt 8 "" --gpus-per-node="fake:2" --ntasks-per-node=1
run_job planner-restart long-job.pbtxt 300 kill_planner_mid_job --export=ALL,DYNAPIPE_EXECUTORS_PER_NODE=2
restarts=$(grep -c 'restarting it in 1 s' "$work/out/slurm-${job_ids[-1]}/planner.out" 2>/dev/null) ||
  fail "the planner was not restarted by the sbatch script (no line in its planner.out)"
say "job planner-restart: the script restarted the planner $restarts time(s)"
jobs=$(printf '%s, ' "${summary[@]}")
result="PASS: ${jobs%, }; Slurm up in $up_s s, $((SECONDS - start)) s in all"
