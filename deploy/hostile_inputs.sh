#!/usr/bin/env bash
# Feeds the hostile-input corpus (tests/hostile: malformed job specs, lengths
# files, datasets, checkpoint shards, plans in Redis, junk on the gRPC and
# HTTP ports, bad tokens) to a real dynapipe-planner and the `dynapipe` CLI,
# copies the table the test writes (input surface -> refused / accepted /
# hang / crash, and what the user sees) to docs/hostile-inputs.md under a
# header saying how and when it was made, and prints the totals.
#
#   deploy/hostile_inputs.sh
#
# Exits with the test's status: non-zero while any input is accepted, hangs
# or crashes (or a valid control is refused). The table is written either way.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

target=//tests/hostile:hostile_inputs_test
# Not cached: the table must come from this run, and carry its date.
cmd=(bazel test "$target" --test_output=errors --nocache_test_results)
echo "hostile_inputs: ${cmd[*]}"
"${cmd[@]}"
rc=$?

# The default configuration's test logs (not whatever configuration the
# convenience symlink last pointed at).
testlogs="$(bazel info bazel-testlogs 2>/dev/null)" || testlogs="$root/bazel-testlogs"
dir="$testlogs/tests/hostile/hostile_inputs_test"
table=""
if [ -f "$dir/test.outputs/outputs.zip" ]; then
  table="$(unzip -p "$dir/test.outputs/outputs.zip" hostile-inputs.md 2>/dev/null)"
elif [ -f "$dir/test.outputs/hostile-inputs.md" ]; then
  table="$(cat "$dir/test.outputs/hostile-inputs.md")"
fi
if [ -z "$table" ]; then
  echo "hostile_inputs: the test wrote no table (exit $rc); see $dir/test.log" >&2
  exit $(( rc == 0 ? 1 : rc ))
fi

commit="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
git diff --quiet HEAD 2>/dev/null || commit="$commit + uncommitted changes"
{
  cat <<EOF
# Hostile inputs: what the user sees

Produced by \`deploy/hostile_inputs.sh\` on $(date -u '+%Y-%m-%d %H:%M UTC') at commit ${commit}, which runs

    ${cmd[*]}

The test (\`tests/hostile/hostile_inputs_test.cc\`) starts a real \`redis-server\` and a real
\`dynapipe-planner\` (\`--data_root\` a scratch directory it fills, \`--token_file\`, one planning
thread; a second planner with \`--data_root=/\` for devices, FIFOs and \`/proc\` files), then feeds
every input of the corpus (\`tests/hostile/corpus/\` and what \`tests/hostile/*_corpus.cc\` and
\`data_root.cc\` generate) over gRPC (one attempt, raw stubs: what the planner itself answers), raw
sockets, Redis, or the \`dynapipe\` CLI as a child process. Each input is:

- **refused**: a non-OK status, a non-zero exit, an HTTP 4xx/5xx, or the connection closed (for
  junk on the gRPC port that the planner leaves open: it keeps serving other calls meanwhile);
- **accepted**: garbage taken as valid (a failure);
- **hang**: no answer within the deadline (15 s; 5 s for FetchPlan; a stalled connection that
  starves other calls) (a failure);
- **crash**: the CLI died of a signal, or the planner died or stopped answering \`GET /healthz\`
  after the input (a failure; the planner is restarted so the rest still runs).

Valid controls (the base job, defaults, edge values, an intact plan, a valid shard) must be
accepted, so that "refused" means the input, not a broken set-up. "Refused in one line" counts
refusals whose message is exactly one non-empty line.

EOF
  printf '%s\n' "$table"
} > docs/hostile-inputs.md

echo "hostile_inputs: wrote docs/hostile-inputs.md"
printf '%s\n' "$table" | grep -E '^[0-9]+ malformed inputs:' || true
printf '%s\n' "$table" | sed -n '/^Inputs not refused cleanly:/,$p' | grep -E '^\| [^-S]' || true
exit $rc
