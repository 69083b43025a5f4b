#!/usr/bin/env bash
# Builds the libFuzzer harnesses (fuzz/) with clang in their own Bazel output
# base and runs each on its seed corpus (fuzz/corpus/<name>/) for a bounded
# time. Prints one line per harness,
#   fuzz: <name> N runs, 0 crashes
#   fuzz: <name> CRASH after N runs: <sanitizer summary> (input: ..., log: ...)
# and exits non-zero if any harness failed to build, crashed, leaked, ran out
# of memory or timed out on an input. New inputs the fuzzer finds go to a
# temporary directory, never into the checked-in corpus.
#
#   deploy/fuzz.sh [--results FILE] [NAME...]      (default: every harness)
# Environment:
#   FUZZ_SECONDS      fuzzing time per harness (default 10)
#   FUZZ_OUTPUT_BASE  Bazel output base for the clang build
#                     (default $HOME/.cache/bazel-fuzz; never the shared one)
#   FUZZ_OUT          logs and crashing inputs (default out/fuzz)
# --results FILE: also writes "<name> passed|failed <why>" per harness
# (deploy/test_summary.py counts them as test cases).
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

all=(config lengths dataset checkpoint safetensors plan http_head)
seconds="${FUZZ_SECONDS:-10}"
output_base="${FUZZ_OUTPUT_BASE:-$HOME/.cache/bazel-fuzz}"
out="${FUZZ_OUT:-$root/out/fuzz}"
results=""
names=()
while [ $# -gt 0 ]; do
  case "$1" in
    --results) results="$2"; shift 2 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) names+=("$1"); shift ;;
  esac
done
[ ${#names[@]} -gt 0 ] || names=("${all[@]}")
[ -z "$results" ] || : > "$results"

# Largest input per harness: above every seed, small enough that one input
# runs in milliseconds (plans are the largest seeds, about 7 KB).
max_len() {
  case "$1" in
    plan) echo 16384 ;;
    *) echo 8192 ;;
  esac
}

# The most telling line of a crash log: UBSan's "file:line: runtime error",
# an uncaught exception's what(), else the sanitizer's SUMMARY line.
crash_summary() {
  local line
  line="$(grep -m 1 ': runtime error: ' "$1")"
  [ -n "$line" ] || line="$(grep -m 1 -A 1 '^terminate called' "$1" | tr '\n' ' ')"
  [ -n "$line" ] || line="$(grep -m 1 '^SUMMARY: ' "$1")"
  [ -n "$line" ] || line="$(grep -m 1 -E 'ERROR: (libFuzzer|[A-Za-z]+Sanitizer)' "$1" | sed 's/^==[0-9]*== *//')"
  echo "$line" | sed 's/  */ /g; s/ $//'
}

report() {  # name, passed|failed, line to print
  echo "$3"
  [ -z "$results" ] || echo "$1 $2 ${3#fuzz: $1 }" >> "$results"
}

mkdir -p "$out"

# clang, lld and the fuzzer runtime come from the distribution (deploy/setup.sh).
if ! command -v clang >/dev/null || ! command -v ld.lld >/dev/null; then
  echo "fuzz: clang or lld missing; running deploy/setup.sh"
  bash deploy/setup.sh >"$out/setup.log" 2>&1 || true
fi

# Its own output base, so the shared one keeps its GCC toolchain; CC is set
# here, not in .bazelrc (see the fuzz config there).
bazel_fuzz=(bazel --output_base="$output_base")
build_flags=(--config=fuzz --repo_env=CC=clang)
start=$(date +%s)
echo "fuzz: building the harnesses with clang in $output_base"
targets=()
for n in "${names[@]}"; do targets+=("//fuzz:${n}_fuzzer"); done
if ! timeout -k 30 1500 "${bazel_fuzz[@]}" build "${build_flags[@]}" "${targets[@]}" >"$out/build.log" 2>&1; then
  tail -n 30 "$out/build.log" | grep -v "^\[" | sed 's/^/  /'
  for n in "${names[@]}"; do report "$n" failed "fuzz: $n did not build (log: $out/build.log)"; done
  exit 1
fi
bin="$("${bazel_fuzz[@]}" info "${build_flags[@]}" bazel-bin 2>/dev/null)/fuzz"
echo "fuzz: built in $(( $(date +%s) - start )) s; ${seconds} s per harness"

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
symbolizer="$(command -v llvm-symbolizer || true)"
[ -z "$symbolizer" ] || export ASAN_SYMBOLIZER_PATH="$symbolizer"

# New inputs and the harnesses' scratch files (TMPDIR, fuzz/scratch_dir.h),
# in memory where possible; removed at the end, crashed runs' included.
shm=/dev/shm
[ -d "$shm" ] && [ -w "$shm" ] || shm="${TMPDIR:-/tmp}"
scratch="$(mktemp -d "$shm/dynapipe-fuzz-run.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch/tmp"

failed=0
for n in "${names[@]}"; do
  log="$out/$n.log"
  mkdir -p "$scratch/$n" "$out/$n"
  # libFuzzer stops itself after -max_total_time; timeout is the backstop
  # should a harness hang outside an input (-timeout covers one input).
  TMPDIR="$scratch/tmp" timeout -k 10 $((seconds + 120)) "$bin/${n}_fuzzer" \
    -max_total_time="$seconds" -timeout=5 -rss_limit_mb=2048 -max_len="$(max_len "$n")" \
    -print_final_stats=1 -artifact_prefix="$out/$n/" \
    "$scratch/$n" "fuzz/corpus/$n" >"$log" 2>&1
  rc=$?
  runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)"
  runs="${runs:-0}"
  if [ $rc -eq 0 ]; then
    report "$n" passed "fuzz: $n $runs runs, 0 crashes"
    continue
  fi
  failed=1
  summary="$(crash_summary "$log")"
  [ -n "$summary" ] || summary="exit status $rc"
  [ $rc -ne 124 ] && [ $rc -ne 137 ] || summary="no result within $((seconds + 120)) s"
  input="$(sed -n 's/.*Test unit written to //p' "$log" | tail -n 1)"
  report "$n" failed "fuzz: $n CRASH after $runs runs: $summary (input: ${input:-none}, log: $log)"
done
exit $failed
