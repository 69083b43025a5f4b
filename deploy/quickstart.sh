#!/usr/bin/env bash
# The README's first command: trains a tiny GPT end to end on this machine.
#
#   bash deploy/quickstart.sh [JOB]     # JOB: configs/jobs/quickstart.pbtxt (default)
#                                       #   or configs/jobs/t5-quickstart.pbtxt (a tiny T5),
#                                       #   configs/jobs/llama-tiny.pbtxt (a tiny Llama)
#
# Installs what is missing (deploy/setup.sh), builds the daemons, generates
# the synthetic multi-task dataset (FLAN-like length mix) and a held-out set
# once, starts Redis, a planner and 4 CPU executors on loopback (2 pipeline
# stages x 2 data-parallel groups), submits configs/jobs/quickstart.pbtxt,
# shows a line per iteration (loss, tokens/s, measured vs planned time),
# evaluates per-task held-out accuracy, prints a summary and shuts
# everything down. A second run reuses the build and the dataset.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
job_file="${1:-configs/jobs/quickstart.pbtxt}"
[ -f "$job_file" ] || { echo "quickstart: no job file $job_file" >&2; exit 2; }
out="$root/out/$(basename "$job_file" .pbtxt)"

bash deploy/setup.sh

echo "quickstart: building (first build takes several minutes)"
bazel build --config=release //cli:dynapipe //planner/service:dynapipe-planner \
  //runtime/executor:dynapipe-executor
# Copy the binaries: bazel-bin follows whatever configuration builds next.
bin="$out/bin"
mkdir -p "$bin/cli" "$bin/planner/service" "$bin/runtime/executor"
cp -f bazel-bin/cli/dynapipe "$bin/cli/"
cp -f bazel-bin/planner/service/dynapipe-planner "$bin/planner/service/"
cp -f bazel-bin/runtime/executor/dynapipe-executor "$bin/runtime/executor/"
dynapipe="$bin/cli/dynapipe"

if [ ! -f data/quickstart/dataset.pbtxt ]; then
  "$dynapipe" data synth --out data/quickstart --lengths tests/data/flan-like-lengths.txt --samples 20000 \
    --input-scale 0.125 --alphabet 8 --seed 1
fi
if [ ! -f data/quickstart-eval/dataset.pbtxt ]; then
  "$dynapipe" data synth --out data/quickstart-eval --lengths tests/data/flan-like-lengths.txt --samples 500 \
    --input-scale 0.125 --alphabet 8 --seed 2
fi

# The cost profile the job plans with (its cost_profile_path, if it names
# one): this machine's kernels timed per layer shape, then 40 iterations
# trained under the job's own layout for what layers leave out. Measured
# again after each rebuild (the kernels may have changed), else kept, so
# reruns plan alike.
profile="$(sed -n 's/^cost_profile_path: *"\([^"]*\)".*/\1/p' "$job_file" | head -1)"
if [ -n "$profile" ] && { [ ! -f "$profile" ] || [ bazel-bin/cli/dynapipe -nt "$profile" ]; }; then
  echo "quickstart: measuring this machine's costs (dynapipe profile, a few seconds)"
  mkdir -p "$out"
  OPENBLAS_NUM_THREADS=1 "$dynapipe" profile --job "$job_file" --out "$profile" --data-root . \
    > "$out/profile.log" 2>&1 || { cat "$out/profile.log" >&2; exit 1; }
  tail -2 "$out/profile.log"
fi

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
export DYNAPIPE_RUN_DIR="$out/cluster"
export DYNAPIPE_BIN="$bin"
export DYNAPIPE_REDIS_PORT="$(free_port)" DYNAPIPE_PLANNER_PORT="$(free_port)" DYNAPIPE_HTTP_PORT="$(free_port)"
export OPENBLAS_NUM_THREADS=1  # four executors share this machine's cores
ckpt_dir="$(sed -n 's/.*dir: *"\([^"]*\)".*/\1/p' "$job_file" | head -1)"
rm -rf "$DYNAPIPE_RUN_DIR" "${ckpt_dir:?}"
mkdir -p "$DYNAPIPE_RUN_DIR"

trap 'bash deploy/local-cluster.sh stop >/dev/null 2>&1 || true' EXIT
bash deploy/local-cluster.sh start --executors 4
export DYNAPIPE_PLANNER="127.0.0.1:$DYNAPIPE_PLANNER_PORT" DYNAPIPE_TOKEN_FILE="$DYNAPIPE_RUN_DIR/token"

start=$SECONDS
job="$("$dynapipe" submit "$job_file")"
echo "quickstart: submitted job $job; one line per iteration:"
watch_log="$out/watch.log"
set +e
"$dynapipe" watch "$job" | tee "$watch_log"
rc=${PIPESTATUS[0]}
set -e
elapsed=$((SECONDS - start))
if [ "$rc" -ne 0 ]; then
  echo "quickstart: the job did not succeed; logs in $DYNAPIPE_RUN_DIR" >&2
  "$dynapipe" status "$job" >&2 || true
  exit 1
fi

echo
"$dynapipe" eval --job "$job_file" --data data/quickstart-eval --samples 500
echo
python3 - "$watch_log" "$elapsed" "$DYNAPIPE_RUN_DIR" "$ckpt_dir" <<'PY'
import re, sys
log, elapsed, run, ckpt = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
# watch: "JOB STATE iteration D/N | lr R | loss L (avg A) | grad norm G | M ms (planned P) | T tokens/s | ETA E"
by_iteration = {}
for line in open(log):
    m = re.search(r"iteration (\d+)/(\d+) \| lr \S+ \| loss ([\d.]+) .*\| ([\d.]+) ms \(planned ([\d.]+)\) \| (\d+) tokens/s", line)
    if m:
        by_iteration[int(m.group(1))] = tuple(float(x) for x in m.groups())  # the final status repeats the last
rows = [by_iteration[k] for k in sorted(by_iteration)]
if not rows:
    sys.exit("quickstart: no iterations reported")
first, last = rows[0], rows[-1]
n = len(rows)
measured = sum(r[3] for r in rows) / n
predicted = sum(r[4] for r in rows) / n
print("quickstart summary")
tail = [r[2] for r in rows[-20:]]
print(f"  loss            {first[2]:.4f} -> {last[2]:.4f}  ({last[2] / first[2]:.2f}x; mean of the last {len(tail)}: {sum(tail) / len(tail):.4f})")
print(f"  iteration time  {measured:.1f} ms measured, {predicted:.1f} ms planned ({100 * (predicted / measured - 1):+.0f}%; "
      f"mean over {n} reported)")
print(f"  throughput      {last[5]:.0f} real tokens/s (the job's, over its last 20 iterations)")
print(f"  wall time       {elapsed} s for {int(last[1])} iterations")
print(f"  logs            {run}")
print(f"  checkpoints     {ckpt}")
PY
