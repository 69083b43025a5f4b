#!/usr/bin/python3
"""Our CPU GPT against PyTorch on the same model and micro-batches (benchmarks/README.md).

Builds //benchmarks:dump_batches and //benchmarks:cpu_bench (--config=release),
makes the job's dataset if it is missing, dumps each batching method's
micro-batches, then runs R interleaved rounds, each running ours and
PyTorch's side by side for every method (one BLAS / OpenMP thread each):

    /usr/bin/python3 benchmarks/cpu_vs_torch.py --rounds 3

and prints real tokens/s per method (ours / torch: the median of the
per-round ratios) and per op (median seconds; ours / torch time per round,
median), plus how far the two sides' losses are apart. Raw JSON lines go to
--out. Exits 0 with a message where /usr/bin/python3 has no torch.
"""

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TORCH_PY = "/usr/bin/python3"
JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
# (label, dump method, our attention kernel); PyTorch always materialises.
CONFIGS = [("dynamic", "dynamic", "varlen"), ("packing", "packing", "varlen"),
           ("packing", "packing", "materialized"), ("padding", "padding", "varlen")]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def run(cmd, env=None, capture=True):
    log("+ " + " ".join(shlex.quote(c) for c in cmd))
    r = subprocess.run(cmd, cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE if capture else None)
    if r.returncode != 0:
        sys.exit(f"cpu_vs_torch: failed ({r.returncode}): {' '.join(cmd)}")
    return r.stdout


def records(text):
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def bench_env(args):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    if args.allocator == "jemalloc":
        # Both sides: freed pages stay mapped. First touches of fresh pages are
        # very slow in some VMs, which a caching allocator (ours: BufferPool)
        # hides and glibc's malloc (PyTorch's CPU allocator) does not.
        env["LD_PRELOAD"] = JEMALLOC
        env["MALLOC_CONF"] = "dirty_decay_ms:-1,muzzy_decay_ms:-1"
    return env


def prepare(args):
    """Builds, makes the data and the dumps; returns the binaries' folder."""
    if not args.no_build:
        run(["bazel", "build", "--config=release", "//benchmarks:dump_batches", "//benchmarks:cpu_bench",
             "//cli:dynapipe"], capture=False)
    bindir = run(["bazel", "info", "--config=release", "bazel-bin"]).strip()
    job = open(os.path.join(ROOT, args.job)).read()
    m = re.search(r'dataset\s*{\s*path:\s*"([^"]+)"', job)
    dataset = os.path.join(args.data_root, m.group(1)) if m else None
    if dataset and not os.path.exists(os.path.join(ROOT, dataset, "dataset.pbtxt")):
        # The job file's comment says how its data is made.
        synth = re.search(r"dynapipe data synth(.*?)(?:\n#\s*([^\n]*))?\n", job)
        if not synth:
            sys.exit(f"cpu_vs_torch: {dataset} is missing and {args.job} does not say how to make it")
        more = synth.group(2) if synth.group(1).rstrip().endswith("\\") else ""
        words = (synth.group(1) + " " + (more or "")).replace("\\", " ").split()
        words = [os.path.join(args.data_root, w) if w.startswith("data/") else w for w in words]
        run([os.path.join(bindir, "cli/dynapipe"), "data", "synth"] + words, capture=False)
    os.makedirs(os.path.join(ROOT, args.out), exist_ok=True)
    for method in sorted({c[1] for c in CONFIGS if c[0] in args.methods}):
        prefix = os.path.join(args.out, method)
        run([os.path.join(bindir, "benchmarks/dump_batches"), "--job", args.job, "--data_root", args.data_root,
             "--method", method, "--iterations", str(args.iterations), "--out", prefix], capture=False)
    return bindir


def ours(args, bindir, method, kernel, ops):
    return records(run([os.path.join(bindir, "benchmarks/cpu_bench"), "--dump", os.path.join(args.out, method),
                        "--attention", kernel, "--warmup", str(args.warmup), f"--ops={str(ops).lower()}",
                        "--op_iterations", args.op_iterations, "--op_reps", str(args.op_reps)],
                       env=bench_env(args)))


def torch(args, method):
    return records(run([TORCH_PY, os.path.join(ROOT, "benchmarks/torch_gpt.py"), "--dump",
                        os.path.join(args.out, method), "--warmup", str(args.warmup), "--op-iterations",
                        args.op_iterations, "--op-reps", str(args.op_reps)], env=bench_env(args)))


def of_kind(recs, kind):
    return [r for r in recs if r["kind"] == kind]


def tokens_per_s(recs):
    return of_kind(recs, "end_to_end")[0]["tokens_per_s"]


def op_seconds(recs):
    return {r["op"]: r["seconds"] for r in of_kind(recs, "op")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--job", default="configs/jobs/cpu-throughput.pbtxt")
    ap.add_argument("--data-root", default=".")
    ap.add_argument("--methods", default="dynamic,packing,padding")
    ap.add_argument("--iterations", type=int, default=6, help="dumped iterations per method")
    ap.add_argument("--warmup", type=int, default=1, help="first iterations left out of tokens/s")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--op-iterations", default="1", help="iterations whose micro-batches give the op shapes")
    ap.add_argument("--op-reps", type=int, default=5)
    ap.add_argument("--allocator", choices=["jemalloc", "default"], default="jemalloc",
                    help="malloc for both sides (jemalloc keeping freed pages, if installed)")
    ap.add_argument("--out", default="out/bench", help="dumps and raw results, under the repository")
    ap.add_argument("--no-build", action="store_true")
    args = ap.parse_args()
    args.methods = args.methods.split(",")

    probe = subprocess.run([TORCH_PY, "-c", "import torch; print(torch.__version__)"], text=True,
                           capture_output=True)
    if probe.returncode != 0:
        print(f"cpu_vs_torch: skipped: {TORCH_PY} cannot import torch (Debian: apt install python3-torch); "
              "nothing to compare against.")
        return 0
    if args.allocator == "jemalloc" and not os.path.exists(JEMALLOC):
        log(f"cpu_vs_torch: {JEMALLOC} not installed; both sides use glibc malloc")
        args.allocator = "default"

    bindir = prepare(args)
    configs = [c for c in CONFIGS if c[0] in args.methods]
    ours_tps, torch_tps, ratio_tps = {}, {}, {}
    ours_ops, torch_ops, ratio_ops = {}, {}, {}
    loss_gap = {}
    raw = open(os.path.join(ROOT, args.out, f"results-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"), "w")
    for rnd in range(args.rounds):
        for method in dict.fromkeys(c[1] for c in configs):
            mine = {}
            for label, m, kernel in configs:
                if m != method:
                    continue
                mine[kernel] = ours(args, bindir, method, kernel, ops=kernel == "varlen")
            theirs = torch(args, method)
            for kernel, recs in mine.items():
                key = (method, kernel)
                r = tokens_per_s(recs) / tokens_per_s(theirs)
                ours_tps.setdefault(key, []).append(tokens_per_s(recs))
                torch_tps.setdefault(key, []).append(tokens_per_s(theirs))
                ratio_tps.setdefault(key, []).append(r)
                a = [x["loss"] for x in of_kind(recs, "iteration")]
                b = [x["loss"] for x in of_kind(theirs, "iteration")]
                loss_gap[key] = max(abs(x - y) for x, y in zip(a, b))
                print(f"round {rnd} {method:8s} {kernel:12s} ours {tokens_per_s(recs):8.0f} tok/s  torch "
                      f"{tokens_per_s(theirs):8.0f} tok/s  ratio {r:5.2f}x  max |loss diff| {loss_gap[key]:.2e}",
                      flush=True)
            theirs_ops = op_seconds(theirs)
            for op, sec in op_seconds(mine.get("varlen", [])).items():
                twin = re.sub(r"attention_(varlen|materialized)", "attention_materialized", op)
                if twin not in theirs_ops:
                    continue
                key = (method, op)
                ours_ops.setdefault(key, []).append(sec)
                torch_ops.setdefault(key, []).append(theirs_ops[twin])
                ratio_ops.setdefault(key, []).append(sec / theirs_ops[twin] if theirs_ops[twin] > 0 else float("nan"))
            for side, recs in [("torch", theirs)] + [(f"ours-{k}", v) for k, v in mine.items()]:
                for rec in recs:
                    raw.write(json.dumps(dict(rec, round=rnd, side=side, method_run=method)) + "\n")
    raw.close()

    med = statistics.median
    print(f"\nReal tokens/s, median of {args.rounds} round(s); ratio = median of per-round ours / torch "
          f"(> 1: ours faster). Allocator: {args.allocator}. Torch attention: materialised.")
    print(f"{'method':10s} {'our attention':14s} {'ours':>10s} {'torch':>10s} {'ratio':>7s} {'|loss diff|':>12s}")
    for label, method, kernel in configs:
        key = (method, kernel)
        print(f"{label:10s} {kernel:14s} {med(ours_tps[key]):10.0f} {med(torch_tps[key]):10.0f} "
              f"{med(ratio_tps[key]):6.2f}x {loss_gap[key]:12.2e}")
    for method in dict.fromkeys(c[1] for c in configs):
        print(f"\nPer op on {method}'s shapes (iterations {args.op_iterations}, one call per micro-batch, "
              f"median pass of {args.op_reps}): seconds; ratio = median of per-round ours / torch time "
              f"(< 1: ours faster). attention_* (ours) vs torch's materialised attention.")
        print(f"{'op':30s} {'ours s':>11s} {'torch s':>11s} {'ratio':>7s}")
        for (m, op), v in ours_ops.items():
            if m == method:
                print(f"{op:30s} {med(v):11.6f} {med(torch_ops[(m, op)]):11.6f} {med(ratio_ops[(m, op)]):6.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
