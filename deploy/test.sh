#!/usr/bin/env bash
# Runs every test of the project: installs what is missing (deploy/setup.sh),
# builds all targets (CUDA objects included where the toolkit exists), runs
# every test, checks the structure (dependencies only point down the layers of
# bazel/layers.bzl; no file or function over its size limit), then fuzzes each parser briefly (deploy/fuzz.sh, clang in its
# own output base), and ends with "tests: N passed, M failed[, K skipped]"
# counting Catch2 test cases and one case per fuzz harness. Exit status 0
# only when nothing failed.
#
# Extra arguments go to `bazel test`, e.g. deploy/test.sh --config=asan
# DYNAPIPE_FUZZ=0 skips the fuzzing; FUZZ_SECONDS sets its time per harness.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

bash deploy/setup.sh || { echo "tests: 0 passed, 1 failed (setup failed)"; exit 1; }

events="$(mktemp -t dynapipe-bep.XXXXXX.json)"
fuzz_results="$(mktemp -t dynapipe-fuzz.XXXXXX.txt)"
check_results="$(mktemp -t dynapipe-checks.XXXXXX.txt)"
trap 'rm -f "$events" "$fuzz_results" "$check_results"' EXIT

echo "test: building and testing //... (first build takes several minutes)"
bazel test //... --keep_going --build_event_json_file="$events" "$@"
bazel_rc=$?

# One "<name> passed|failed <why>" line per structure check.
check() {
  local name="$1"; shift
  local out
  if out="$("$@" 2>&1)"; then
    echo "$name passed" >> "$check_results"
  else
    echo "$out" | sed "s/^/check $name: /"
    echo "$name failed $(echo "$out" | tail -1)" >> "$check_results"
  fi
}
echo "test: checking the layering (tools/check_layers.py), code size (tools/code_size.sh) and the architecture picture"
check layering python3 tools/check_layers.py --self-test
check code_size bash tools/code_size.sh
check architecture python3 tools/architecture.py --check

if [ "${DYNAPIPE_FUZZ:-1}" != 0 ]; then
  echo "test: fuzzing the parsers (deploy/fuzz.sh)"
  bash deploy/fuzz.sh --results "$fuzz_results"
fi

python3 deploy/test_summary.py "$events" --fuzz "$fuzz_results" --checks "$check_results"
summary_rc=$?

if [ $bazel_rc -ne 0 ] && [ $summary_rc -eq 0 ]; then
  # A build failure outside test targets, or bazel itself failed.
  echo "test: bazel exited with status $bazel_rc"
  exit $bazel_rc
fi
exit $summary_rc
