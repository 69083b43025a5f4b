#!/usr/bin/env bash
# The fault soak, long version: tests/fault_soak/fault_soak_test with many
# runs (default 100), each a small 2 x 2 training job during which one
# executor, the planner or Redis gets SIGKILL, SIGSTOP or SIGTERM (outages of
# 1-20 s, and SIGSTOPs of 40 s), with a `dynapipe watch` through every job,
# `dynapipe status` during every Redis outage and SIGTERM exit times. Writes
# the table per fault kind to docs/fault-soak.md. Loopback only; bounded by
# DYNAPIPE_SOAK_SECONDS (default 3600: no new run starts after it).
#
#   deploy/soak.sh [RUNS]          # e.g. deploy/soak.sh 100 (about 20 s a run on 2 cores)
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
  echo "11 kinds. Executor faults must fail the job naming a rank within 6 s (the"
  echo "soak's 3 s heartbeat timeout + 3 s) and a resume must end with every rank's"
  echo "parameters bit-identical to an undisturbed run; planner and Redis faults of"
  echo "1-20 s (restarted on the same address, or SIGCONT), and SIGSTOPs of 40 s,"
  echo "must be ridden through, ending bit-identically without a resume. A"
  echo "\`dynapipe watch\` follows every job and must exit 0 exactly when the job"
  echo "succeeded; \`dynapipe status\` during every Redis outage must answer within"
  echo "1 s; a SIGTERMed planner or executor (the fault, and every daemon at the"
  echo "end) must exit within 2 s. A hang is a job that neither ends nor fails"
  echo "within 120 s; a crash is a daemon exiting that no fault aimed at (or a"
  echo "SIGTERMed one exiting uncleanly)."
  echo
  cat "$report"
  echo
  echo "Exit status of the soak: $rc (0: every check held)."
} > docs/fault-soak.md
echo "soak: wrote docs/fault-soak.md"
exit $rc
