#!/usr/bin/env bash
# The whole GPU validation in one command, on a machine with a GPU and nothing
# of ours installed (a lent device machine, or a cluster node): the CUDA test
# binaries, a few of them again under compute-sanitizer's memcheck on small
# shapes, a one-rank end-to-end training job (then the same job killed after
# its first checkpoint and resumed, its losses against the uninterrupted
# run's), the GPU profiler, and one-rank T5 and Llama-style training jobs.
#
#   deploy/bundle.sh --gpu-checks                 # here: out/bundle/dynapipe-gpu-bundle.tar.xz
#   bash deploy/gpu_checks.sh BUNDLE.tar.xz OUT   # there
#
# Needs only bash, coreutils, tar, grep, sed and awk there, plus the NVIDIA
# driver and the CUDA runtime, cuBLAS and NCCL (bin/dynapipe-env finds them).
# Redis comes with the bundle; no curl, python or network is used.
#
# Time: at most about 7 minutes in all (TOTAL_BUDGET_S), so that this and
# a short deploy/gpu_bench.sh fit one 10-minute device call. Every step runs under
# `timeout -k`, so a hang is a failure, never a stuck session:
#   test binaries   each at most TEST_LIMIT_S, all together TESTS_BUDGET_S
#   memcheck        MEMCHECK_BUDGET_S: compute-sanitizer on small cases
#   end-to-end job  E2E_BUDGET_S: dataset, Redis, planner, one CUDA executor;
#                   then RESUME_BUDGET_S: the job killed and resumed
#   profiler        PROFILE_BUDGET_S, a small grid
#   T5 job          T5_BUDGET_S: configs/jobs/cuda-t5-tiny.pbtxt, fresh daemons
#   Llama job       LLAMA_BUDGET_S: configs/jobs/cuda-llama-tiny.pbtxt, fresh daemons
#   HF round trip   HF_BUDGET_S: transformers' models into ours and back
#                   (tests/golden/hf_transformers_check.py; skipped without
#                   transformers in python3)
# ONLY_TESTS names the test binaries to run (default: all); E2E_ITERATIONS
# sets the GPT job's length (default 1000 on a GPU, the job's 50 on the CPU),
# E2E_T5_ITERATIONS and E2E_LLAMA_ITERATIONS the T5 and Llama jobs' (default
# 300 on a GPU, the jobs' 20 on the CPU).
#
# OUT gets at most 7 files, each written as the run goes (a run killed
# half-way still leaves what it did):
#   gpu-checks-summary.txt  device lines, one line per test binary, e2e,
#                           profile, the T5 and Llama jobs, totals (also
#                           printed to stdout)
#   gpu-checks.log          nvidia-smi, every test binary's Catch2 output,
#                           the profiler's output
#   e2e.log                 the job's steps, `dynapipe watch` (one line per
#                           iteration: loss, ms, tokens/s), the final status
#   planner.log, executor.log, redis.log   the daemons' output
#   profile.json            the cost profile of the cuda-tiny model
# Exit status 0 only when every test binary, every job and the profiler passed.
#
# GPU_CHECKS_BACKEND=cpu is a dry run of the script itself on a machine
# without a GPU (deploy/gpu_checks_test): the job and its resume on a CPU
# executor (fp32, Gloo), the kernel tests, memcheck and the profiler skipped.
set -uo pipefail

BACKEND=${GPU_CHECKS_BACKEND:-cuda}

TOTAL_BUDGET_S=${TOTAL_BUDGET_S:-420}  # + timeout -k and daemon shutdown grace: under 7.5 minutes
TEST_LIMIT_S=${TEST_LIMIT_S:-60}
TESTS_BUDGET_S=${TESTS_BUDGET_S:-140}
MEMCHECK_BUDGET_S=${MEMCHECK_BUDGET_S:-50}
E2E_BUDGET_S=${E2E_BUDGET_S:-80}
RESUME_BUDGET_S=${RESUME_BUDGET_S:-70}
PROFILE_BUDGET_S=${PROFILE_BUDGET_S:-20}
T5_BUDGET_S=${T5_BUDGET_S:-50}
LLAMA_BUDGET_S=${LLAMA_BUDGET_S:-45}
HF_BUDGET_S=${HF_BUDGET_S:-60}
KILL_AFTER_S=10  # timeout -k: SIGKILL this long after SIGTERM

usage="usage: gpu_checks.sh BUNDLE.tar.gz OUT_DIR"
bundle="${1:?$usage}"
out="${2:?$usage}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
log="$out/gpu-checks.log"
summary="$out/gpu-checks-summary.txt"
e2e_log="$out/e2e.log"
: >"$log"
: >"$summary"

work="$(mktemp -d)"
daemons=()  # pids of background `timeout` processes (each wraps one daemon)

stop_daemons() {  # SIGTERM every daemon, newest first; SIGKILL whatever is left after 10 s
  local i pid deadline=$((SECONDS + 10))
  for ((i = ${#daemons[@]} - 1; i >= 0; --i)); do kill -TERM "${daemons[i]}" 2>/dev/null; done
  for pid in ${daemons[@]+"${daemons[@]}"}; do
    while kill -0 "$pid" 2>/dev/null; do
      # timeout leads its own process group: SIGKILL the group, daemon included.
      if [ $SECONDS -ge $deadline ]; then kill -KILL -- "-$pid" "$pid" 2>/dev/null; break; fi
      sleep 0.1
    done
  done
  daemons=()
}
trap 'stop_daemons; rm -rf "$work"' EXIT
trap 'echo "gpu_checks: interrupted after ${SECONDS}s" >>"$summary"; exit 143' TERM INT

say() { echo "$*" | tee -a "$summary"; }      # a summary line, shown as it is written
note() { echo "$*" >>"$e2e_log"; }             # a step of the end-to-end job
left() {  # left DEADLINE: seconds until SECONDS reaches DEADLINE, at most what the total budget leaves
  local to_deadline=$(($1 - SECONDS)) to_total=$((TOTAL_BUDGET_S - SECONDS))
  echo $((to_total < to_deadline ? to_total : to_deadline))
}
limited() {  # limited SECS CMD...: CMD under timeout -k (SECS at least 1)
  local secs=$1; shift
  [ "$secs" -lt 1 ] && secs=1
  timeout -k "$KILL_AFTER_S" "$secs" "$@"
}

# ---------------------------------------------------------------- the device
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(uname -n) ($(uname -srm))"
  if command -v nvidia-smi >/dev/null; then
    limited 20 nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader 2>&1 |
      sed 's/^/device: /'
  else
    echo "device: none (no nvidia-smi)"
  fi
} | tee -a "$summary" "$log"
command -v nvidia-smi >/dev/null && limited 20 nvidia-smi >>"$log" 2>&1

if ! limited 60 tar -xf "$bundle" -C "$work"; then
  say "gpu_checks: cannot unpack $bundle"
  exit 1
fi
root="$work/dynapipe-gpu"
sed -n 2p "$root/MANIFEST" | tee -a "$summary" "$log"
env_run="$root/bin/dynapipe-env"
# Where bin/dynapipe-env found the target's CUDA libraries, and any the
# executor still lacks (the usual reason for every check below failing).
limited 60 "$env_run" sh -c 'echo "cuda libraries: ${LD_LIBRARY_PATH:-none found}"' | tee -a "$summary" "$log"
missing="$(limited 60 "$env_run" ldd "$root/bin/dynapipe-executor" 2>&1 | awk '/not found/ {print $1}' | tr '\n' ' ')"
[ -n "$missing" ] && echo "missing libraries: $missing" | tee -a "$summary" "$log"

failed=0
dry_run=0
[ "$BACKEND" = cpu ] && dry_run=1

# ---------------------------------------------------------- the test binaries
tests_deadline=$((SECONDS + TESTS_BUDGET_S))
passed_tests=0
total_tests=0
for t in "$root"/bin/*_test; do
  [ $dry_run -eq 1 ] && break
  name="$(basename "$t")"
  # ONLY_TESTS="a_test b_test": those binaries alone (a rerun after a fix).
  [ -n "${ONLY_TESTS:-}" ] && [[ " $ONLY_TESTS " != *" $name "* ]] && continue
  total_tests=$((total_tests + 1))
  secs=$(left "$tests_deadline")
  [ "$secs" -gt "$TEST_LIMIT_S" ] && secs=$TEST_LIMIT_S
  if [ "$secs" -lt 10 ]; then
    echo "===== $name: not run (test budget of ${TESTS_BUDGET_S}s spent)" >>"$log"
    say "$name: NOT RUN (test budget of ${TESTS_BUDGET_S}s spent)"
    failed=$((failed + 1))
    continue
  fi
  echo "===== $name (limit ${secs}s)" >>"$log"
  offset=$(stat -c %s "$log")
  start=$SECONDS
  # Straight into the log, so a killed run keeps what the test printed.
  limited "$secs" "$env_run" "$t" -r console -d yes >>"$log" 2>&1 </dev/null
  rc=$?
  took=$((SECONDS - start))
  section="$(tail -c +$((offset + 1)) "$log")"
  echo "===== $name: exit $rc, ${took}s" >>"$log"
  result="$(grep -E '^(All tests passed|test cases:|No tests ran)' <<<"$section" | tail -1)"
  # A [gpu] case skipped here means the device was not usable: not a pass.
  skipped="$(grep -E '^skipped: ' <<<"$section" | head -1)"
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    verdict="FAIL (timed out after ${secs}s)"
  elif [ $rc -ne 0 ]; then
    verdict="FAIL (exit $rc)"
  elif [ -n "$skipped" ]; then
    verdict="FAIL (GPU cases skipped)"
  else
    verdict="ok"
    passed_tests=$((passed_tests + 1))
  fi
  [ "$verdict" = ok ] || failed=$((failed + 1))
  say "$name: $verdict, ${took}s: ${result:-no Catch2 summary}${skipped:+; $skipped}"
done

# ------------------------------------------------------------- memcheck
# A few kernels' tests again under compute-sanitizer's memcheck, on cases
# with small shapes (it runs every kernel 10-100 times slower): the new
# attention paths, the fused matmul glue, the initialiser, model.block's
# norms and activations, Llama's SwiGLU and rotary positions.
sanitizer=""
for s in compute-sanitizer /usr/local/cuda/bin/compute-sanitizer ${CUDA_HOME:+$CUDA_HOME/bin/compute-sanitizer}; do
  command -v "$s" >/dev/null 2>&1 && { sanitizer="$(command -v "$s")"; break; }
done
memcheck_deadline=$((SECONDS + MEMCHECK_BUDGET_S))
memcheck_failed=0
memcheck_cases=(
  "cast_test|FillKeyedNormal draws the host generator's bits"
  "attention_test|Attention matches the CPU on a single token"
  "cudnn_attention_test|cuDNN attention passes the start-up check for head dimensions 64 and 128"
  "matmul_test|Matmul's GELU operations refuse leading dimensions the epilogues cannot take"
  "layers_test|GeluForward/Backward match the CPU backend"
  "layers_test|ReLU and gated GELU forward/backward match the CPU backend"
  "layers_test|RmsNormForward/Backward and LayerNorm without a shift match the CPU backend"
  "layers_test|SwiGLU forward/backward match the CPU backend (saturated gates too)"
  "qkv_test|RotaryApply matches the CPU forward and inverse; the values past the heads stay put"
  "t5_attention_test|T5 cross-attention matches the CPU (targets against their own inputs)"
  "t5_attention_test|T5 decoder self-attention matches the CPU (causal, bias)"
)
if [ $dry_run -eq 1 ]; then
  say "memcheck: skipped (cpu dry run)"
elif [ -z "$sanitizer" ]; then
  say "memcheck: NOT RUN (no compute-sanitizer on this machine)"
  memcheck_failed=1
else
  for c in "${memcheck_cases[@]}"; do
    bin="${c%%|*}" name="${c#*|}"
    secs=$(left "$memcheck_deadline")
    if [ "$secs" -lt 5 ]; then
      say "memcheck $bin: NOT RUN (memcheck budget of ${MEMCHECK_BUDGET_S}s spent)"
      memcheck_failed=$((memcheck_failed + 1))
      continue
    fi
    echo "===== memcheck $bin \"$name\" (limit ${secs}s)" >>"$log"
    start=$SECONDS
    limited "$secs" "$env_run" "$sanitizer" --tool memcheck --error-exitcode 86 --print-limit 20 \
      "$root/bin/$bin" "$name" >>"$log" 2>&1 </dev/null
    rc=$?
    case $rc in
      0) verdict=ok ;;
      86) verdict="FAIL (memory errors; see gpu-checks.log)" ;;
      124 | 137) verdict="FAIL (timed out after ${secs}s)" ;;
      *) verdict="FAIL (exit $rc)" ;;
    esac
    [ "$verdict" = ok ] || memcheck_failed=$((memcheck_failed + 1))
    say "memcheck $bin \"$name\": $verdict, $((SECONDS - start))s"
  done
fi
failed=$((failed + memcheck_failed))

# ------------------------------------------------------ the end-to-end job
# One CUDA executor trains configs/jobs/cuda-tiny.pbtxt through a planner and
# Redis on loopback, all from the unpacked bundle (its folder is the data root,
# so the job's relative dataset and checkpoint paths land inside it).
job_file="configs/jobs/cuda-tiny.pbtxt"
if [ $dry_run -eq 1 ]; then  # the CPU backend computes in fp32
  sed 's/dtype: bf16/dtype: fp32/' "$root/$job_file" >"$work/cuda-tiny-cpu.pbtxt"
  job_file="$work/cuda-tiny-cpu.pbtxt"
fi
# On a GPU the 50-iteration job ends in under a second, before the resume
# check can kill it after its first checkpoint: both runs train longer there.
E2E_ITERATIONS=${E2E_ITERATIONS:-}
[ -z "$E2E_ITERATIONS" ] && [ $dry_run -eq 0 ] && E2E_ITERATIONS=1000
if [ -n "$E2E_ITERATIONS" ]; then
  src="$job_file"
  [[ "$src" == /* ]] || src="$root/$src"
  sed "s/^iterations: .*/iterations: $E2E_ITERATIONS/" "$src" >"$work/cuda-tiny-e2e.pbtxt"
  job_file="$work/cuda-tiny-e2e.pbtxt"
fi
e2e_result=""

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
redis_ping() {  # redis_ping PORT: true once Redis answers PONG
  (
    exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
    printf 'PING\r\n' >&3
    read -r -t 2 reply <&3 || exit 1
    [[ "$reply" == "+PONG"* ]]
  ) 2>/dev/null
}
wait_for() {  # wait_for DEADLINE PID COMMAND...: poll COMMAND until it succeeds; fail at DEADLINE or if PID exits
  local deadline=$1 pid=$2; shift 2
  until "$@"; do
    kill -0 "$pid" 2>/dev/null || return 2
    [ $SECONDS -ge "$deadline" ] && return 1
    sleep 0.2
  done
}
daemon() {  # daemon LOG SECS CMD...: CMD in the background under timeout; sets $pid
  local log_file=$1 secs=$2; shift 2
  [ "$secs" -lt 1 ] && secs=1
  # `timeout` itself is the background process (not a subshell around it), so
  # a signal to $pid reaches the daemon: timeout passes it on.
  timeout -k "$KILL_AFTER_S" "$secs" "$@" >>"$log_file" 2>&1 </dev/null &
  pid=$!
  daemons+=("$pid")
}
last_line() { grep -v '^[[:space:]]*$' "$1" 2>/dev/null | tail -1 | cut -c1-300; }

planner_pid="" executor_pid="" grpc_port="" job=""

start_executor() {  # start_executor SECS: one executor on device 0, CUDA and NCCL (sets executor_pid)
  local comm=nccl
  [ "$BACKEND" = cpu ] && comm=gloo
  note "e2e: dynapipe-executor --backend $BACKEND --comm $comm --device 0"
  daemon "$out/executor.log" "$1" "$env_run" bin/dynapipe-executor --backend="$BACKEND" --comm="$comm" \
    --device=0 --node=gpu-checks --planner="127.0.0.1:$grpc_port" --token-file="$work/token" --data-root="$root" \
    --http-port=0 --port-file="$work/executor.port"
  executor_pid=$pid
}

run_e2e() {
  local deadline=$((SECONDS + E2E_BUDGET_S))
  cd "$root" || return 1
  note "e2e: $(date -u +%H:%M:%SZ) job $job_file, budget ${E2E_BUDGET_S}s"

  # The quickstart's dataset (deploy/quickstart.sh), under the data root
  # (made once: the T5 job reads it too).
  note "e2e: dataset: dynapipe data synth --out data/quickstart ..."
  if [ -d data/quickstart ]; then
    note "e2e: dataset: data/quickstart is there already"
  elif ! limited "$(left "$deadline")" bin/dynapipe data synth --out data/quickstart \
    --lengths tests/data/flan-like-lengths.txt --samples 20000 --input-scale 0.125 --alphabet 8 --seed 1 \
    >>"$e2e_log" 2>&1; then
    e2e_result="FAIL (dataset: dynapipe data synth failed; see e2e.log)"
    return 1
  fi

  (umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/token")

  # Redis on a free loopback port (no tool here picks one: probe, retry on a lost race).
  local redis_port="" tries=0 pid
  while [ -z "$redis_port" ] && [ $tries -lt 5 ]; do
    tries=$((tries + 1))
    local p=$((20000 + RANDOM % 40000))
    port_in_use "$p" && continue
    note "e2e: redis-server on 127.0.0.1:$p"
    daemon "$out/redis.log" "$(left $((deadline + RESUME_BUDGET_S + 30)))" bin/redis-server --port "$p" --bind 127.0.0.1 --save '' \
      --appendonly no --daemonize no --dir "$work"
    if wait_for $((SECONDS + 10)) "$pid" redis_ping "$p"; then redis_port=$p; fi
  done
  if [ -z "$redis_port" ]; then
    e2e_result="FAIL (redis-server did not answer: $(last_line "$out/redis.log"))"
    return 1
  fi

  # The planner picks its own ports and writes them once it serves (a
  # previous job's port files go first: that planner is gone).
  rm -f "$work/planner.port" "$work/executor.port"
  note "e2e: dynapipe-planner"
  daemon "$out/planner.log" "$(left $((deadline + RESUME_BUDGET_S + 30)))" bin/dynapipe-planner --listen=127.0.0.1:0 --http-port=0 \
    --redis="127.0.0.1:$redis_port" --token-file="$work/token" --data-root="$root" \
    --port-file="$work/planner.port"
  planner_pid=$pid
  if ! wait_for $((SECONDS + 20)) "$planner_pid" test -s "$work/planner.port"; then
    e2e_result="FAIL (planner did not start: $(last_line "$out/planner.log"))"
    return 1
  fi
  local http_port
  read -r grpc_port http_port <"$work/planner.port"
  note "e2e: planner on 127.0.0.1:$grpc_port, status on http://127.0.0.1:$http_port/status"
  export DYNAPIPE_PLANNER="127.0.0.1:$grpc_port" DYNAPIPE_TOKEN_FILE="$work/token"

  start_executor "$(left $((deadline + RESUME_BUDGET_S + 30)))"

  if ! job="$(limited "$(left "$deadline")" bin/dynapipe submit "$job_file" 2>>"$e2e_log")" || [ -z "$job" ]; then
    e2e_result="FAIL (submit refused: $(last_line "$e2e_log"))"
    return 1
  fi
  note "e2e: submitted job $job; dynapipe watch:"

  # Watch until the job ends, the executor dies, or the budget is spent.
  local watch_start=$SECONDS
  daemon "$e2e_log" "$(left "$deadline")" bin/dynapipe watch "$job"
  local watch_pid=$pid
  local why=""
  while kill -0 "$watch_pid" 2>/dev/null; do
    if ! kill -0 "$executor_pid" 2>/dev/null; then
      wait "$executor_pid"
      why="executor exited (status $?) before the job ended: $(last_line "$out/executor.log")"
      break
    fi
    if ! kill -0 "$planner_pid" 2>/dev/null; then
      why="planner exited before the job ended: $(last_line "$out/planner.log")"
      break
    fi
    [ $SECONDS -ge "$deadline" ] && break
    sleep 0.5
  done
  # Give a just-finishing watch a moment to print its last line.
  local grace=$((SECONDS + 2))
  while kill -0 "$watch_pid" 2>/dev/null && [ $SECONDS -lt "$grace" ]; do sleep 0.1; done
  kill -TERM "$watch_pid" 2>/dev/null
  wait "$watch_pid"
  local watch_rc=$?
  local watch_s=$((SECONDS - watch_start))

  note "e2e: final status ($(date -u +%H:%M:%SZ)):"
  local status state=""
  # Status line: "JOB NAME STATE iteration done/total | loss ... | elapsed ...".
  if status="$(limited 10 bin/dynapipe status "$job" 2>&1)"; then
    state="$(awk '{print $3; exit}' <<<"$status")"
  fi
  note "$status"
  local ckpt_dir
  ckpt_dir="$(sed -n 's/^checkpoint { dir: "\([^"]*\)".*/\1/p' "$job_file")"
  [ -n "$ckpt_dir" ] && [ -d "$ckpt_dir" ] && note "e2e: checkpoints: $(ls "$ckpt_dir" | tr '\n' ' ')"

  # Per-iteration figures from watch's lines:
  # "JOB STATE iteration D/N | lr R | loss L (avg A) | grad norm G | M ms (planned P) | T tokens/s | ETA E".
  local figures
  figures="$(grep -E "^$job .*iteration [0-9]+/[0-9]+ \| lr .*\| loss " "$e2e_log" | awk '
    { for (i = 1; i <= NF; ++i) {
        if ($i == "iteration") { split($(i + 1), it, "/"); sub(",", "", it[2]) }
        if ($i == "loss") { l = $(i + 1); sub(",", "", l); if (n == 0) first = l; last = l }
        if ($i == "ms") ms += $(i - 1)
        if ($i == "tokens/s") tps += $(i - 1)
      }
      ++n; done = it[1]; total = it[2] }
    END { if (n > 0) printf "%d/%d iterations, loss %s -> %s, %.1f ms/iteration, %.0f tokens/s (means over %d reports)",
                            done, total, first, last, ms / n, tps / n, n }')"
  if [ "$state" = succeeded ] && [ $watch_rc -eq 0 ]; then
    e2e_result="ok, ${watch_s}s: ${figures:-no iteration reports}"
    return 0
  fi
  if [ -z "$why" ]; then
    if [ -z "$state" ]; then
      why="no final status (watch exit $watch_rc): $(cut -c1-300 <<<"$status")"
    elif [ "$state" != running ] && [ "$state" != pending ]; then
      why="job $state (watch exit $watch_rc): $(cut -c1-300 <<<"$status")"
    else
      why="job still $state when the ${E2E_BUDGET_S}s budget ran out (watch exit $watch_rc)"
    fi
  fi
  e2e_result="FAIL ($why)${figures:+; $figures}"
  return 1
}

# The job's losses, "ITERATION LOSS" a line, from `dynapipe history`.
losses() {
  limited 10 bin/dynapipe history "$1" --limit 100000 2>>"$e2e_log" |
    awk '{ for (i = 1; i <= NF; ++i) { if ($i == "iteration") it = $(i + 1); if ($i == "loss") print it, $(i + 1) } }'
}
job_state() { limited 10 bin/dynapipe status "$1" 2>/dev/null | awk '{print $3; exit}'; }

# The same job killed (SIGKILL to its executor) once its first checkpoint is
# written, then resubmitted with checkpoint.resume: its iterations after the
# checkpoint must have the uninterrupted job's losses (within 1e-3, the
# history's 4 decimals). Runs in the root, with the e2e job's daemons.
run_resume() {
  local deadline=$((SECONDS + RESUME_BUDGET_S)) uninterrupted=$1
  local dir="out/cuda-tiny-resume/checkpoints" file="$work/cuda-tiny-resume.pbtxt"
  sed -e 's/^name: "cuda-tiny"/name: "cuda-tiny-resume"/' -e "s|out/cuda-tiny/checkpoints|$dir|" "$job_file" >"$file"
  note "resume: $(date -u +%H:%M:%SZ) $file (checkpoints in $dir)"
  local first
  if ! first="$(limited 10 bin/dynapipe submit "$file" 2>>"$e2e_log")" || [ -z "$first" ]; then
    resume_result="FAIL (submit refused: $(last_line "$e2e_log"))"
    return 1
  fi
  # Past the first checkpoint the planner counts as complete (the executor
  # reports a shard once it is on disk, while training goes on; shards on
  # disk alone are not yet a checkpoint), and a few iterations after it. On
  # an H200 the tiny job runs ~400 iterations a second, far ahead of that
  # report: waiting for files alone killed it before any checkpoint counted.
  local done_its=0 ckpt=""
  while :; do
    ckpt="$(grep -oE "job $first: checkpoint of iteration [0-9]+ complete" "$out/planner.log" 2>/dev/null |
      tail -1 | awk '{print $6}')"
    done_its=$(losses "$first" | wc -l)
    [ -n "$ckpt" ] && [ "$done_its" -ge $((ckpt + 4)) ] && break
    if [ $SECONDS -ge $deadline ] || [ "$(job_state "$first")" = succeeded ]; then
      resume_result="FAIL (no checkpoint to resume from: $done_its iterations, ${ckpt:-no} complete checkpoint)"
      return 1
    fi
    sleep 0.2
  done
  note "resume: SIGKILL to the executor after $done_its iterations of $first (checkpoint of iteration $ckpt complete)"
  kill -KILL -- "-$executor_pid" "$executor_pid" 2>/dev/null
  wait "$executor_pid" 2>/dev/null
  # The planner fails the job once the executor's heartbeats stop.
  until [ "$(job_state "$first")" = failed ]; do
    if [ $SECONDS -ge $deadline ]; then
      resume_result="FAIL (the killed executor's job never failed: $(job_state "$first"))"
      return 1
    fi
    sleep 0.5
  done
  start_executor "$(left $((deadline + 30)))"
  sed -i 's/^\(checkpoint { dir: .* interval: 25\) }$/\1 resume: true }/' "$file"
  local second
  if ! second="$(limited 10 bin/dynapipe submit "$file" 2>>"$e2e_log")" || [ -z "$second" ]; then
    resume_result="FAIL (resubmission refused: $(last_line "$e2e_log"))"
    return 1
  fi
  note "resume: resubmitted as $second"
  local state
  while state="$(job_state "$second")"; [ "$state" != succeeded ]; do
    if [ "$state" = failed ] || [ "$state" = cancelled ] || [ $SECONDS -ge $deadline ]; then
      resume_result="FAIL (resumed job $state: $(limited 10 bin/dynapipe status "$second" 2>&1 | cut -c1-200))"
      return 1
    fi
    sleep 0.5
  done
  # The resumed job's losses against the killed job's on the iterations both
  # ran (from the checkpoint to the kill: the restored state, so the same
  # losses), and against the uninterrupted job's. The CPU computes the same
  # bits run after run, so there every iteration must match the uninterrupted
  # job; a GPU's backward sums in no fixed order, so two runs drift apart
  # with training, and the uninterrupted job is compared on the first 10
  # resumed iterations only where no iteration overlaps the killed job's.
  local n from worst n10 worst10 on ow
  read -r n from worst n10 worst10 <<<"$(compare_losses "$uninterrupted" "$second")"
  read -r on _ ow _ _ <<<"$(compare_losses "$first" "$second")"
  note "resume: resumed from iteration $from; $on iteration(s) overlap the killed run's (worst loss difference $ow);" \
    "against the uninterrupted run: $n iterations, worst $worst (first 10: $worst10)"
  local ok=1
  if [ "${n:-0}" -lt 10 ]; then
    ok=0
  elif [ $dry_run -eq 1 ]; then
    awk -v w="$worst" 'BEGIN { exit !(w <= 1e-3) }' || ok=0
  elif [ "${on:-0}" -ge 1 ]; then
    awk -v w="$ow" 'BEGIN { exit !(w <= 1e-3) }' || ok=0
  else
    awk -v w="$worst10" 'BEGIN { exit !(w <= 1e-3) }' || ok=0
  fi
  local figures="killed after $done_its iterations, resumed from iteration $from; $on iteration(s) overlapping the killed run within $ow; against the uninterrupted run $n iterations within $worst (first 10 within $worst10)"
  if [ $ok -eq 1 ]; then
    resume_result="ok: $figures"
    return 0
  fi
  resume_result="FAIL ($figures; at most 1e-3 allowed, at least 10 iterations)"
  return 1
}

# compare_losses JOB_A JOB_B: "N FROM WORST N10 WORST10" over the iterations
# both reported (WORST10: over the first 10 of them).
compare_losses() {
  join <(losses "$1" | sort -k1,1) <(losses "$2" | sort -k1,1) | sort -n -k1,1 | awk '
    { d = $2 - $3; if (d < 0) d = -d; if (d > worst) worst = d; ++n; if (n == 1) first = $1
      if (n <= 10) { n10 = n; if (d > worst10) worst10 = d } }
    END { printf "%d %s %.6f %d %.6f", n, (n ? first : "-"), worst, n10, worst10 }'
}

: >"$e2e_log"
e2e_start=$SECONDS
if [ $((TOTAL_BUDGET_S - SECONDS)) -lt 30 ]; then
  e2e_result="NOT RUN (total budget spent)"
  e2e_rc=1
else
  run_e2e
  e2e_rc=$?
fi
say "e2e cuda-tiny: ${e2e_result:-FAIL (no result)} [$((SECONDS - e2e_start))s in all]"
[ $e2e_rc -eq 0 ] || failed=$((failed + 1))
resume_start=$SECONDS
resume_result=""
if [ $e2e_rc -ne 0 ]; then
  resume_result="NOT RUN (the uninterrupted job did not succeed)"
elif [ $((TOTAL_BUDGET_S - SECONDS)) -lt 30 ]; then
  resume_result="NOT RUN (total budget spent)"
else
  run_resume "$job"  # in the bundle's root (run_e2e went there), this shell: its executor is one of `daemons`
  resume_rc=$?
fi
[ "${resume_rc:-1}" -eq 0 ] || failed=$((failed + 1))
stop_daemons
cd "$work" || exit 1
say "resume cuda-tiny: ${resume_result:-see e2e.log} [$((SECONDS - resume_start))s]"

# ---------------------------------------------------------------- the profiler
secs=$(left $((SECONDS + PROFILE_BUDGET_S)))
echo "===== dynapipe-gpu-profile (limit ${secs}s)" >>"$log"
start=$SECONDS
if [ $dry_run -eq 1 ]; then
  rc=0
  verdict="skipped (cpu dry run)"
elif [ "$secs" -lt 10 ]; then
  rc=1
  verdict="NOT RUN (total budget spent)"
else
  (cd "$root" && limited "$secs" "$env_run" bin/dynapipe-gpu-profile --job "$job_file" --out "$out/profile.json" \
    --seq 32,64,128 --mbs 1,4,16 --max-tokens 2048 --repetitions 5 >>"$log" 2>&1 </dev/null)
  rc=$?
  if [ $rc -eq 0 ]; then
    verdict="ok: $(grep '^wrote ' "$log" | tail -1 | sed "s|$out/||")"
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    verdict="FAIL (timed out after ${secs}s)"
  else
    verdict="FAIL (exit $rc: $(grep -E '^dynapipe profile: ' "$log" | tail -1 | cut -c1-300))"
  fi
fi
echo "===== dynapipe-gpu-profile: exit $rc, $((SECONDS - start))s" >>"$log"
[ $rc -eq 0 ] || failed=$((failed + 1))
say "profile cuda-tiny: $verdict, $((SECONDS - start))s"

# ------------------------------------------------- T5 and Llama jobs
# A job file of configs/jobs through fresh daemons, as the GPT job: its
# iterations raised to $3 on a GPU, its bf16 made fp32 in the dry run.
# Sets model_rc; prints the job's summary line.
run_model_job() {  # NAME BUDGET_S ITERATIONS
  local name=$1 budget=$2 iterations=$3 start=$SECONDS
  job_file="configs/jobs/$name.pbtxt"
  if [ $dry_run -eq 1 ]; then
    sed 's/dtype: bf16/dtype: fp32/' "$root/$job_file" >"$work/$name-cpu.pbtxt"
    job_file="$work/$name-cpu.pbtxt"
  else  # the file's 20 iterations end in a blink on a GPU
    sed "s/^iterations: .*/iterations: $iterations/" "$root/$job_file" >"$work/$name-e2e.pbtxt"
    job_file="$work/$name-e2e.pbtxt"
  fi
  e2e_result=""
  if [ $((TOTAL_BUDGET_S - SECONDS)) -lt 30 ]; then
    e2e_result="NOT RUN (total budget spent)"
    model_rc=1
  else
    E2E_BUDGET_S=$budget run_e2e
    model_rc=$?
  fi
  stop_daemons
  cd "$work" || exit 1
  say "e2e $name: ${e2e_result:-FAIL (no result)} [$((SECONDS - start))s in all]"
  [ $model_rc -eq 0 ] || failed=$((failed + 1))
}

# Encoder-decoder stages (runtime/model/t5_cuda.h) on the device.
run_model_job cuda-t5-tiny "$T5_BUDGET_S" "${E2E_T5_ITERATIONS:-300}"
t5_rc=$model_rc
# Llama's block (rotary positions, SwiGLU, grouped-query heads) on the device.
run_model_job cuda-llama-tiny "$LLAMA_BUDGET_S" "${E2E_LLAMA_ITERATIONS:-300}"
llama_rc=$model_rc

# ------------------------------------ Hugging Face round trip (transformers)
# Where python3 has transformers and safetensors (the lent machine does):
# models built by transformers load into ours with their logits, and ours
# export to what transformers loads (tests/golden/hf_transformers_check.py).
hf_rc=0
hf_start=$SECONDS
if ! python3 -c "import transformers, safetensors" >/dev/null 2>&1; then
  say "hf round trip: skipped (no transformers in python3)"
elif [ $((TOTAL_BUDGET_S - SECONDS)) -lt 20 ]; then
  say "hf round trip: NOT RUN (total budget spent)"
  hf_rc=1
else
  mkdir -p "$work/hf"
  echo "===== hf round trip (limit $(left $((SECONDS + HF_BUDGET_S)))s)" >>"$log"
  limited "$(left $((SECONDS + HF_BUDGET_S)))" python3 "$root/tests/golden/hf_transformers_check.py" \
    "$root/bin/hf_logits" "$work/hf" >>"$log" 2>&1 </dev/null
  hf_rc=$?
  say "hf round trip: $(grep -E '^hf round trip:' "$log" | tail -1 | sed 's/^hf round trip: //')" \
    "$([ $hf_rc -eq 0 ] && echo ok || echo "FAILED (exit $hf_rc; see gpu-checks.log)"), $((SECONDS - hf_start))s"
fi
[ $hf_rc -eq 0 ] || failed=$((failed + 1))

say "gpu_checks: $passed_tests/$total_tests test binaries passed; memcheck $([ $memcheck_failed -eq 0 ] && echo ok || echo FAILED);" \
  "e2e $([ $e2e_rc -eq 0 ] && echo ok || echo FAILED); resume $([ "${resume_rc:-1}" -eq 0 ] && echo ok || echo FAILED);" \
  "profile $([ $rc -eq 0 ] && echo ok || echo FAILED); t5 $([ $t5_rc -eq 0 ] && echo ok || echo FAILED);" \
  "llama $([ $llama_rc -eq 0 ] && echo ok || echo FAILED);" \
  "$failed check(s) failed; ${SECONDS}s in all"
[ $failed -eq 0 ]
