#!/usr/bin/env bash
# Our CUDA GPT against PyTorch on the lent GPU, from the GPU bundle: the
# second step of a GPU session's one device call, after deploy/gpu_checks.sh.
#
#   deploy/bundle.sh --gpu-checks                  # here
#   bash deploy/gpu_bench.sh BUNDLE.tar.xz OUT     # there
#
# Unpacks the bundle, finds a Python whose torch sees the GPU, and runs
# benchmarks/gpu_vs_torch.py twice (dataset and dumps in a temporary folder,
# GBs for these models), each under a budget after which no new run starts:
#   GPT-350M (configs/jobs/gpu-bench.pbtxt) at max length 4,096 and 8,192,
#     dynamic and packing, for BENCH_BUDGET_S (default 200): ours (cuDNN
#     attention and cuBLASLt epilogues where the start-up check passes),
#     ours with the tiled kernel and separate glue, PyTorch eager and
#     PyTorch with torch.compile, interleaved; then one iteration's kernel
#     times of ours and PyTorch by category (the breakdown);
#   GPT-1.3B (configs/jobs/gpu-bench-1.3b.pbtxt) at 4,096, dynamic and
#     packing, ours and PyTorch eager, for BENCH_13B_BUDGET_S (default 90;
#     0 skips it).
# The whole script ends within the two budgets + 2 x 120 s. OUT gets
# gpu-bench.md / .jsonl / -breakdown.jsonl, gpu-bench-1.3b.md / .jsonl and
# gpu-bench.log. Extra arguments go to the first driver run (e.g. --rounds
# 3, --cost-profile OUT/profile.json).
set -uo pipefail

usage="usage: gpu_bench.sh BUNDLE.tar.xz OUT_DIR [driver arguments]"
bundle="${1:?$usage}"
out="${2:?$usage}"
shift 2
BENCH_BUDGET_S=${BENCH_BUDGET_S:-200}
BENCH_13B_BUDGET_S=${BENCH_13B_BUDGET_S:-90}
mkdir -p "$out"
out="$(cd "$out" && pwd)"
log="$out/gpu-bench.log"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

tar -xf "$bundle" -C "$work" || { echo "gpu_bench: cannot unpack $bundle" | tee -a "$log"; exit 2; }
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
# torch.compile's compiled graphs are kept on disk between its runs (the
# first run of a shape pays the compilation, counted in its warm-up).
export TORCHINDUCTOR_CACHE_DIR="$work/inductor-cache"

# drive BUDGET ARGS...: one driver run, bounded.
drive() {
  local budget=$1
  shift
  timeout -k 10 $((budget + 120)) "$python" benchmarks/gpu_vs_torch.py --out "$out" --work "$work/bench" \
    --python "$python" --budget-s "$budget" "$@" 2>>"$log"
  local rc=$?
  { [ $rc -eq 124 ] || [ $rc -eq 137 ]; } && echo "gpu_bench: stopped after $((budget + 120)) s" | tee -a "$log"
  return $rc
}

rc=0
drive "$BENCH_BUDGET_S" --methods dynamic,packing --iterations 3 "$@" || rc=1
[ "$BENCH_13B_BUDGET_S" -gt 0 ] && { drive "$BENCH_13B_BUDGET_S" --tag gpu-bench-1.3b --job configs/jobs/gpu-bench-1.3b.pbtxt --max-lengths 4096 \
  --methods dynamic,packing --iterations 3 --rounds 1 --torch torch= --ours ours= --breakdown none || rc=1; }
exit $rc
