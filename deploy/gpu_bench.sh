#!/usr/bin/env bash
# Our CUDA GPT against PyTorch on the lent GPU, from the GPU bundle: the
# second device call of a GPU session, after deploy/gpu_checks.sh.
#
#   deploy/bundle.sh --gpu-checks                  # here
#   bash deploy/gpu_bench.sh BUNDLE.tar.gz OUT     # there
#
# Unpacks the bundle, finds a Python whose torch sees the GPU, and runs
# benchmarks/gpu_vs_torch.py (dataset and dumps in a temporary folder, GBs
# for the 350M model) with a budget: no new run starts after BENCH_BUDGET_S
# (default 300), and the whole script ends within BENCH_BUDGET_S + 240 s.
# OUT gets gpu-bench.md (the table), gpu-bench.jsonl (every record) and
# gpu-bench.log. Extra arguments go to the driver (e.g. --rounds 3,
# --max-lengths 8192, --cost-profile OUT/profile.json).
set -uo pipefail

usage="usage: gpu_bench.sh BUNDLE.tar.gz OUT_DIR [driver arguments]"
bundle="${1:?$usage}"
out="${2:?$usage}"
shift 2
BENCH_BUDGET_S=${BENCH_BUDGET_S:-300}
mkdir -p "$out"
out="$(cd "$out" && pwd)"
log="$out/gpu-bench.log"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

tar -xzf "$bundle" -C "$work" || { echo "gpu_bench: cannot unpack $bundle" | tee -a "$log"; exit 2; }
root="$(ls -d "$work"/*/ | head -1)"
python=""
for p in ${PYTHON:-} python3 /usr/bin/python3 /usr/local/bin/python3 /opt/conda/bin/python3; do
  command -v "$p" >/dev/null 2>&1 || continue
  if timeout 120 "$p" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
    python="$p"
    break
  fi
done
if [ -z "$python" ]; then
  echo "gpu_bench: no Python here imports a torch that sees the GPU (set PYTHON=...)" | tee -a "$log"
  exit 2
fi
echo "gpu_bench: $(timeout 120 "$python" -c 'import torch; print("torch", torch.__version__, "on", torch.cuda.get_device_name())')" \
  | tee -a "$log"
cd "$root" || exit 2
timeout -k 10 $((BENCH_BUDGET_S + 240)) "$python" benchmarks/gpu_vs_torch.py --out "$out" --work "$work/bench" \
  --python "$python" --budget-s "$BENCH_BUDGET_S" "$@" 2>>"$log"
rc=$?
{ [ $rc -eq 124 ] || [ $rc -eq 137 ]; } && echo "gpu_bench: stopped after $((BENCH_BUDGET_S + 240)) s" | tee -a "$log"
exit $rc
