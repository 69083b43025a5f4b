#!/usr/bin/env bash
# Every declaration of cuDNN's attention backward graph that the executor can
# build (CudnnGraphOptions: 32 variants), each against the tiled kernel on
# cudnn_attention_test's cases, one process per variant (an illegal address
# ends a CUDA context) and PARALLEL processes at a time on the one GPU. For a
# GPU session, from the GPU bundle:
#
#   deploy/bundle.sh --gpu-checks                    # here
#   bash deploy/cudnn_variants.sh BUNDLE.tar.xz OUT  # there
#
# OUT/cudnn-variants.txt gets one line per variant and case ("variant V
# (options), case: ok" or the difference, per part dq / dk / dv); the lines
# that passed every case are printed last. At most VARIANTS_BUDGET_S (60).
set -uo pipefail
usage="usage: cudnn_variants.sh BUNDLE.tar.xz OUT_DIR"
bundle="${1:?$usage}"
out="${2:?$usage}"
PARALLEL=${PARALLEL:-4}
VARIANTS_BUDGET_S=${VARIANTS_BUDGET_S:-60}
mkdir -p "$out"
out="$(cd "$out" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
tar -xf "$bundle" -C "$work" || { echo "cudnn_variants: cannot unpack $bundle"; exit 2; }
root="$work/dynapipe-gpu"
result="$out/cudnn-variants.txt"
: >"$result"
one() {  # one VARIANT: its lines, or why the process ended without them
  local v=$1 log="$work/variant-$1.log"
  DYNAPIPE_CUDNN_VARIANT=$v timeout -k 5 30 "$root/bin/dynapipe-env" "$root/bin/cudnn_attention_test" \
    "cuDNN backward graph declarations side by side (diagnostic)" >"$log" 2>&1 </dev/null
  local rc=$?
  grep '^variant ' "$log" || true
  [ $rc -eq 0 ] || echo "variant $v: process exit $rc: $(grep -v '^variant ' "$log" | grep -m1 -E 'FAILED|error|rror' | cut -c1-200)"
}
deadline=$((SECONDS + VARIANTS_BUDGET_S))
for ((v = 0; v < 32; v += PARALLEL)); do
  [ $SECONDS -ge $deadline ] && { echo "cudnn_variants: budget of ${VARIANTS_BUDGET_S}s spent at variant $v" >>"$result"; break; }
  for ((k = v; k < v + PARALLEL && k < 32; ++k)); do one $k >"$work/out-$k.txt" & done
  wait
  for ((k = v; k < v + PARALLEL && k < 32; ++k)); do cat "$work/out-$k.txt" >>"$result"; done
done
echo "== variants that passed every case:"
awk -F'[ ,]' '/^variant [0-9]+ \(/ { v = $2; n[v]++; if ($0 ~ /: ok$/) ok[v]++ }
  END { for (v in n) if (ok[v] == n[v] && n[v] >= 5) print "variant " v " passed " n[v] " cases" }' "$result" | sort -n -k2
