#!/usr/bin/env bash
# The fault soak, long version: tests/fault_soak/fault_soak_test with many
# runs (default 100), each a small 2 x 2 training job during which one
# executor, the planner or Redis gets SIGKILL, SIGSTOP or SIGTERM. Writes the
# table per fault kind to docs/fault-soak.md. Loopback only; bounded by
# DYNAPIPE_SOAK_SECONDS (default 3600: no new run starts after it).
#
#   deploy/soak.sh [RUNS]          # e.g. deploy/soak.sh 100 (about 6 s a run on 2 cores)
#
# DYNAPIPE_SOAK_SEED picks the fault sequence (default: from the clock, printed).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
runs="${1:-100}"
[[ $runs =~ ^[1-9][0-9]*$ ]] || { echo "soak: RUNS must be a positive count, got '$runs'" >&2; exit 2; }

bash deploy/setup.sh > /dev/null
bazel build //tests/fault_soak:fault_soak_test
report="$(mktemp -t dynapipe-soak.XXXXXX)"
log="$root/out/soak.log"
mkdir -p "$root/out"
trap 'rm -f "$report"' EXIT

echo "soak: $runs runs (log: $log)"
started=$(date -u +%Y-%m-%dT%H:%MZ)
rc=0
(cd bazel-bin/tests/fault_soak/fault_soak_test.runfiles/dynapipe &&
  DYNAPIPE_SOAK_RUNS="$runs" DYNAPIPE_SOAK_REPORT="$report" \
    DYNAPIPE_SOAK_SECONDS="${DYNAPIPE_SOAK_SECONDS:-3600}" \
    timeout -s KILL $((${DYNAPIPE_SOAK_SECONDS:-3600} + 600)) ../../fault_soak_test) > "$log" 2>&1 || rc=$?
grep -E '^run [0-9]+:' "$log" | cut -c1-160 || true
if [ ! -s "$report" ]; then
  echo "soak: no report (exit status $rc); see $log" >&2
  exit 1
fi
cat "$report"

{
  echo "# Fault soak"
  echo
  echo "Written by \`deploy/soak.sh $runs\` ($started, $(nproc) CPUs, Linux $(uname -r),"
  echo "commit $(git rev-parse --short HEAD)). Each run trains a small 2 x 2 job"
  echo "(4 CPU executors over Gloo, real Redis with its append-only file, a"
  echo "dynapipe-planner process, all on loopback) and sends one signal to one"
  echo "process at a random iteration; faults are drawn in shuffled rounds of the"
  echo "9 kinds. Executor faults must fail the job naming a rank within 6 s (the"
  echo "soak's 3 s heartbeat timeout + 3 s) and a resume must end with every rank's"
  echo "parameters bit-identical to an undisturbed run; planner and Redis faults of"
  echo "1-8 s (restarted on the same address, or SIGCONT) must be ridden through,"
  echo "ending bit-identically without a resume. A hang is a job that neither ends"
  echo "nor fails within 120 s; a crash is a daemon exiting that no fault aimed at"
  echo "(or a SIGTERMed one exiting uncleanly)."
  echo
  cat "$report"
  echo
  echo "Exit status of the soak: $rc (0: every check held)."
} > docs/fault-soak.md
echo "soak: wrote docs/fault-soak.md"
exit $rc
