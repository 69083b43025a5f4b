#!/usr/bin/env bash
# Runs the CUDA checks of a GPU bundle on a machine with a GPU (a lent device
# machine, or a cluster node) and writes one log and a summary.
#
#   deploy/bundle.sh --gpu-checks                 # here: out/bundle/dynapipe-gpu-bundle.tar.gz
#   deploy/gpu_checks.sh BUNDLE.tar.gz OUT_DIR    # there
#
# OUT_DIR/gpu-checks.log holds the device, driver and every test's output;
# OUT_DIR/gpu-checks-summary.txt one line per test binary and the totals.
# Exit status 0 only when every test binary passed.
set -uo pipefail

bundle="${1:?usage: gpu_checks.sh BUNDLE.tar.gz OUT_DIR}"
out="${2:?usage: gpu_checks.sh BUNDLE.tar.gz OUT_DIR}"
mkdir -p "$out"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
tar -xzf "$bundle" -C "$work" || { echo "gpu_checks: cannot unpack $bundle" >&2; exit 1; }
root="$work/dynapipe-gpu"
log="$out/gpu-checks.log"
summary="$out/gpu-checks-summary.txt"
: >"$log"
: >"$summary"

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | sed 's/^/device: /'
  else
    echo "device: none (no nvidia-smi)"
  fi
  sed -n 2p "$root/MANIFEST"
} | tee -a "$summary" >>"$log"

failed=0
for t in "$root"/bin/*_test; do
  name="$(basename "$t")"
  start=$(date +%s)
  # Each binary gets 5 minutes: a hang is a failure, not a stuck session.
  timeout 300 "$root/bin/dynapipe-env" "$t" -r console -d yes >"$work/$name.log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - start ))
  { echo "===== $name (exit $rc, ${secs}s)"; cat "$work/$name.log"; } >>"$log"
  result="$(grep -E '^(All tests passed|test cases:|No tests ran)' "$work/$name.log" | tail -1)"
  # Where the device is not visible the [gpu] cases are skipped: say so loudly.
  skipped="$(grep -E '^skipped: ' "$work/$name.log" | head -1)"
  [ -n "$skipped" ] && result="$result; $skipped"
  [ $rc -ne 0 ] && failed=$((failed + 1))
  echo "$name: exit $rc, ${secs}s: ${result:-no Catch2 summary}" >>"$summary"
done
echo "gpu_checks: $failed test binary(ies) failed" >>"$summary"
cat "$summary"
[ $failed -eq 0 ]
