#!/usr/bin/env bash
# Runs every test of the project: installs what is missing (deploy/setup.sh),
# builds all targets (CUDA objects included where the toolkit exists), runs
# every test and ends with "tests: N passed, M failed[, K skipped]" counting
# Catch2 test cases. Exit status 0 only when nothing failed.
#
# Extra arguments go to `bazel test`, e.g. deploy/test.sh --config=asan
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

bash deploy/setup.sh || { echo "tests: 0 passed, 1 failed (setup failed)"; exit 1; }

events="$(mktemp -t dynapipe-bep.XXXXXX.json)"
trap 'rm -f "$events"' EXIT

echo "test: building and testing //... (first build takes several minutes)"
bazel test //... --keep_going --build_event_json_file="$events" "$@"
bazel_rc=$?

python3 deploy/test_summary.py "$events"
summary_rc=$?

if [ $bazel_rc -ne 0 ] && [ $summary_rc -eq 0 ]; then
  # A build failure outside test targets, or bazel itself failed.
  echo "test: bazel exited with status $bazel_rc"
  exit $bazel_rc
fi
exit $summary_rc
