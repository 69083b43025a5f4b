#!/usr/bin/env python3
"""Our CUDA GPT against PyTorch on one GPU, the same model and micro-batches (benchmarks/README.md).

Runs from an unpacked GPU bundle (deploy/bundle.sh --gpu-checks), where
bin/ holds dynapipe, dump_batches and cpu_bench and the bundle root holds
configs/, tests/data/ and benchmarks/torch_gpt.py at their source paths:

    python3 benchmarks/gpu_vs_torch.py --out OUT            # in the bundle root

It makes a FLAN-like dataset (`dynapipe data synth`), dumps our planner's
micro-batches for each max length x batching method (dump_batches, pp 1 x
dp 1, with each iteration's predicted time and model FLOPs), then runs
rounds in which every (length, method) trains once with ours
(`cpu_bench --backend cuda`) and once with PyTorch (`torch_gpt.py --device
cuda --precision bf16`), in an order that alternates between rounds. It
prints, per length and method, real tokens/s of both (medians over rounds),
ours / PyTorch and dynamic / packing (medians of per-round ratios), MFU
(model FLOPs of the timed iterations over their seconds, over the GPU's
dense bf16 peak) and our planner's predicted iteration time against the
measured one, plus how far the two sides' losses are apart. Writes OUT/
gpu-bench.md (the table) and OUT/gpu-bench.jsonl (every record).

Every child runs under a timeout, and no new run starts once --budget-s has
passed: what finished is reported. --device-kind cpu runs the same flow with
both sides on the CPU (a smoke test of the driver; figures mean nothing).
"""

import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# Dense bf16 peak (TFLOP/s) by device name; --peak-tflops overrides.
PEAKS = [("H200", 989.0), ("H100", 989.0), ("A100", 312.0), ("L40S", 362.0)]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


class Failed(Exception):
    pass


def run(cmd, timeout_s, env=None):
    """stdout of cmd; Failed (with its stderr's last lines) on a non-zero exit or a timeout."""
    log("+ " + " ".join(shlex.quote(c) for c in cmd))
    try:
        r = subprocess.run(cmd, cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=max(1, timeout_s))
    except subprocess.TimeoutExpired:
        raise Failed(f"timed out after {timeout_s:.0f} s: {' '.join(cmd)}")
    if r.returncode != 0:
        tail = " | ".join(r.stderr.strip().splitlines()[-3:])
        raise Failed(f"exit {r.returncode}: {' '.join(cmd)}: {tail}")
    return r.stdout


def records(text):
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def of_kind(recs, kind):
    return [r for r in recs if r.get("kind") == kind]


def read_manifest(prefix):
    """Per dumped iteration: predicted_ms, model_flops, real tokens."""
    its = []
    for line in open(prefix + ".txt"):
        w = line.split()
        if w and w[0] == "iteration":
            f = dict(x.split("=", 1) for x in w[2:] if "=" in x)
            its.append({"predicted_ms": float(f.get("predicted_ms", 0)), "model_flops": float(f.get("model_flops", 0))})
    return its


def job_text(template, max_len, dataset, cost_profile):
    text = re.sub(r"max_seq_len:\s*\d+", f"max_seq_len: {max_len}", template)
    text = re.sub(r'dataset\s*{\s*path:\s*"[^"]*"', f'dataset {{ path: "{dataset}"', text)
    if cost_profile:
        text += f'\ncost_profile_path: "{cost_profile}"\n'
    return text


def peak_tflops(args, gpu_name):
    if args.peak_tflops > 0:
        return args.peak_tflops
    for key, peak in PEAKS:
        if key in gpu_name:
            return peak
    return 0.0


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x, f):
    return "—" if x is None else f.format(x)


def tps(recs):
    e = of_kind(recs, "end_to_end")
    return e[0]["tokens_per_s"] if e else None


def summarize(runs, dumps, peak, ours, torches):
    """runs: [(round, length, method, impl, records)] -> markdown lines. ours / torches: the impl names of
    our variants and PyTorch's, the first of each the reference of the ratios."""
    by = {}
    for rnd, length, method, impl, recs in runs:
        by.setdefault((length, method, impl), {})[rnd] = recs
    main, eager = ours[0], torches[0]
    impls = ours + torches
    head = (["max length", "method"] + [f"{i} tokens/s" for i in impls] +
            [f"{main} / {t}" for t in torches] + [f"{main} / {o}" for o in ours[1:]] +
            [f"vs packing ({main})", f"MFU {main}", f"MFU {eager}", f"predicted / measured ms ({main})",
             f"queue / compute ({main})", f"max loss difference ({main} vs {eager})"])
    out = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for (length, method) in sorted({(k[0], k[1]) for k in by}):
        sides = {i: by.get((length, method, i), {}) for i in impls}
        pack = by.get((length, "packing", main), {})
        manifest = dumps[(length, method)]

        def mfu(recs):
            timed = [r for r in of_kind(recs, "iteration") if not r["warmup"]]
            secs = sum(r["seconds"] for r in timed)
            flops = sum(manifest[r["iteration"]]["model_flops"] for r in timed)
            return flops / secs / (peak * 1e12) if secs > 0 and peak > 0 else None

        def ratio(a, b):  # median of per-round ratios of two sides' tokens/s
            return med([tps(a[r]) / tps(b[r]) for r in a if r in b and tps(a[r]) and tps(b[r])])

        predicted, measured, launch = [], [], []
        for r in sides[main].values():
            for it in of_kind(r, "iteration"):
                if not it["warmup"]:
                    predicted.append(manifest[it["iteration"]]["predicted_ms"])
                    measured.append(1e3 * it["seconds"])
                    if it.get("compute_seconds"):
                        launch.append(it["queue_seconds"] / it["compute_seconds"])
        loss_diff = None
        for r in sides[main]:
            if r in sides[eager]:
                a = [x["loss"] for x in of_kind(sides[main][r], "iteration")]
                b = [x["loss"] for x in of_kind(sides[eager][r], "iteration")]
                if a and len(a) == len(b):
                    d = max(abs(x - y) for x, y in zip(a, b))
                    loss_diff = d if loss_diff is None else max(loss_diff, d)
        pm = (f"{med(predicted):.0f} / {med(measured):.0f}" if predicted and measured else "—")
        cells = [str(length), method]
        cells += [fmt(med([tps(x) for x in sides[i].values()]), "{:,.0f}") for i in impls]
        cells += [fmt(ratio(sides[main], sides[t]), "{:.2f}x") for t in torches]
        cells += [fmt(ratio(sides[main], sides[o]), "{:.2f}x") for o in ours[1:]]
        cells += [fmt(ratio(sides[main], pack), "{:.2f}x"), fmt(med([mfu(x) for x in sides[main].values()]), "{:.1%}"),
                  fmt(med([mfu(x) for x in sides[eager].values()]), "{:.1%}"), pm, fmt(med(launch), "{:.2f}"),
                  fmt(loss_diff, "{:.2g}")]
        out.append("| " + " | ".join(cells) + " |")
    # Issue 34's GPU check: dynamic's measured tokens/s at least packing's
    # (the job's layout; the bench jobs run one stage).
    for length in sorted({k[0] for k in by}):
        r = None
        dyn, pack = by.get((length, "dynamic", main), {}), by.get((length, "packing", main), {})
        if dyn and pack:
            r = med([tps(dyn[k]) / tps(pack[k]) for k in dyn if k in pack and tps(dyn[k]) and tps(pack[k])])
        if r is not None:
            out.append(f"\ndynamic vs packing ({main}), max length {length}: {r:.2f}x "
                       f"({'meets' if r >= 1.0 else 'misses'} dynamic >= packing)")
    return out


# Kernel categories for the breakdown, first match wins (lower-cased names).
CATEGORIES = [
    ("attention", r"attn|attention|flash|fmha|sdpa|mha|cudnn"),
    ("matmul", r"gemm|cutlass|cublas|nvjet|xmma|matmul|sm\d+_"),
    ("layernorm", r"layernorm|layer_norm"),
    ("gelu", r"gelu"),
    ("loss", r"cross_?entropy|softmax|nll_loss|log_softmax"),
    ("optimizer", r"adam|multi_tensor|optimizer|sumofsquares|norm"),
    ("embedding", r"embedding|index|gather|scatter"),
    ("memcpy / memset", r"^\[mem"),
]


def category(name):
    low = name.lower()
    for cat, pattern in CATEGORIES:
        if re.search(pattern, low):
            return cat
    return "other element-wise"


def breakdown(traces):
    """traces: impl -> [kernel records] of one iteration -> markdown lines: ms per category per side."""
    cats = [c for c, _ in CATEGORIES] + ["other element-wise"]
    sums = {impl: {c: 0.0 for c in cats} for impl in traces}
    counts = {impl: {c: 0 for c in cats} for impl in traces}
    top = {impl: {} for impl in traces}
    for impl, recs in traces.items():
        for r in recs:
            c = category(r["name"])
            sums[impl][c] += r["ns"] / 1e6
            counts[impl][c] += 1
            top[impl].setdefault(c, {}).setdefault(r["name"][:90], 0.0)
            top[impl][c][r["name"][:90]] += r["ns"] / 1e6
    impls = list(traces)
    ref = impls[-1]
    head = ["category"] + [f"{i} ms (kernels)" for i in impls] + [f"{i} / {ref}" for i in impls[:-1]]
    out = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for c in cats + ["all kernels"]:
        vals = {i: (sum(sums[i].values()) if c == "all kernels" else sums[i][c]) for i in impls}
        n = {i: (sum(counts[i].values()) if c == "all kernels" else counts[i][c]) for i in impls}
        if not any(vals.values()):
            continue
        cells = [c] + [f"{vals[i]:.2f} ({n[i]})" for i in impls]
        cells += [f"{vals[i] / vals[ref]:.2f}x" if vals[ref] > 0 else "—" for i in impls[:-1]]
        out.append("| " + " | ".join(cells) + " |")
    out += ["", "Largest kernels per category (ms):"]
    for i in impls:
        for c in cats:
            names = sorted(top[i].get(c, {}).items(), key=lambda kv: -kv[1])[:3]
            if names:
                out.append(f"- {i} / {c}: " + "; ".join(f"{n} {ms:.2f}" for n, ms in names))
    return out


def variants(spec, base):
    """"name=flags;name=flags" -> [(name, [flags])]; an empty spec gives [(base, [])]."""
    out = []
    for part in spec.split(";"):
        part = part.strip()
        if not part:
            continue
        name, _, flags = part.partition("=")
        out.append((name.strip(), shlex.split(flags)))
    return out or [(base, [])]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="folder for the results (gpu-bench.md, gpu-bench.jsonl)")
    ap.add_argument("--work", default="", help="folder for the dataset and the dumps (GBs for a 350M model); "
                    "default: a temporary folder, removed at the end")
    ap.add_argument("--bin", default=os.path.join(ROOT, "bin"), help="folder with dynapipe, dump_batches, cpu_bench")
    ap.add_argument("--job", default=os.path.join(ROOT, "configs/jobs/gpu-bench.pbtxt"))
    ap.add_argument("--lengths-file", default=os.path.join(ROOT, "tests/data/flan-like-lengths.txt"))
    ap.add_argument("--samples", type=int, default=4000, help="dataset samples to synthesise")
    ap.add_argument("--max-lengths", default="4096,8192")
    ap.add_argument("--methods", default="dynamic,packing,padding")
    ap.add_argument("--iterations", type=int, default=4, help="dumped iterations per (length, method)")
    ap.add_argument("--warmup", type=int, default=1, help="first iterations left out of tokens/s")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--python", default=sys.executable, help="interpreter with torch (CUDA build)")
    ap.add_argument("--peak-tflops", type=float, default=0, help="dense bf16 peak; default from the GPU's name")
    ap.add_argument("--cost-profile", default="", help="a dynapipe-gpu-profile output for our planner")
    ap.add_argument("--budget-s", type=float, default=420, help="no new run starts after this many seconds")
    ap.add_argument("--run-timeout-s", type=float, default=180, help="limit of one training run")
    ap.add_argument("--device-kind", default="cuda", choices=("cuda", "cpu"),
                    help="cpu: both sides on the CPU, a smoke test of this driver")
    ap.add_argument("--ours", default="ours=--attention-kernel=auto;"
                    "ours-tiled=--attention-kernel=tiled --matmul-epilogues=false",
                    help="our variants, 'name=cpu_bench flags;...' (the first is the one compared); the default "
                    "pits cuDNN attention and cuBLASLt epilogues against the tiled kernel and separate glue")
    ap.add_argument("--torch", default="torch=;torch-compile=--compile",
                    help="PyTorch's variants, 'name=torch_gpt.py flags;...' (the first is the reference)")
    ap.add_argument("--tag", default="gpu-bench", help="name of the result files (TAG.md, TAG.jsonl, TAG-breakdown.jsonl)")
    ap.add_argument("--breakdown", default="", metavar="LENGTH:METHOD",
                    help="after the rounds, each side's kernel times by category on one iteration of this dump "
                    "(default: the first length, packing; 'none' skips it)")
    args = ap.parse_args()
    start = time.monotonic()
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    work = os.path.abspath(args.work) if args.work else tempfile.mkdtemp(prefix="gpu-bench-")
    os.makedirs(work, exist_ok=True)
    try:
        bench(args, start, out, work)
    except Failed as e:  # the dataset or a dump: nothing to compare
        log(f"gpu_vs_torch: {e}")
        with open(os.path.join(out, args.tag + ".md"), "w") as f:
            f.write(f"# ours vs PyTorch: not run: {e}\n")
        sys.exit(1)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)


def bench(args, start, out, work):
    cuda = args.device_kind == "cuda"
    exe = lambda name: os.path.join(args.bin, name)  # noqa: E731

    # The dataset and the dumps.
    data = os.path.join(work, "data/gpu-bench")
    if not os.path.exists(os.path.join(data, "dataset.pbtxt")):
        run([exe("dynapipe"), "data", "synth", "--out", data, "--lengths", args.lengths_file, "--samples",
             str(args.samples), "--seed", "1"], 300)
    template = open(args.job).read()
    lengths = [int(x) for x in args.max_lengths.split(",") if x]
    methods = [m for m in args.methods.split(",") if m]
    dumps = {}
    for length in lengths:
        job = os.path.join(work, f"gpu-bench-{length}.pbtxt")
        with open(job, "w") as f:
            f.write(job_text(template, length, "data/gpu-bench", args.cost_profile))
        for method in methods:
            prefix = os.path.join(work, f"dump-{length}-{method}")
            run([exe("dump_batches"), "--job", job, "--data-root", work, "--method", method, "--iterations",
                 str(args.iterations), "--out", prefix], 300)
            dumps[(length, method)] = read_manifest(prefix)
    log(f"gpu_vs_torch: dumps ready after {time.monotonic() - start:.0f} s")

    # Interleaved rounds. In a bundle, bin/dynapipe-env puts the machine's CUDA libraries on the path.
    wrap = [exe("dynapipe-env")] if cuda and os.path.exists(exe("dynapipe-env")) else []
    ours = variants(args.ours, "ours")
    torches = variants(args.torch, "torch")
    ours_names, torch_names = [n for n, _ in ours], [n for n, _ in torches]
    runs, failures, gpu, notes, broken = [], [], "", set(), set()
    breakdown_lines = []

    def command(impl_flags, is_ours, prefix, extra=()):
        if is_ours:
            return wrap + [exe("cpu_bench"), "--dump", prefix, "--backend", args.device_kind, "--noops",
                           "--warmup", str(args.warmup)] + impl_flags + list(extra)
        return [args.python, os.path.join(HERE, "torch_gpt.py"), "--dump", prefix, "--device", args.device_kind,
                "--precision", "bf16", "--no-ops", "--warmup", str(args.warmup)] + impl_flags + list(extra)

    def report(final=False):
        peak = peak_tflops(args, gpu) if cuda else 0.0
        lines = [f"# ours vs PyTorch, {gpu or args.device_kind}: {args.rounds} round(s) planned, "
                 f"{len(runs)} runs finished in {time.monotonic() - start:.0f} s; peak {peak:g} TFLOP/s"
                 + ("; stopped at the budget" if stopped else "") + ("" if final else "; still running"), ""]
        lines += summarize(runs, dumps, peak, ours_names, torch_names)
        lines += ["", "MFU counts causal pairs inside samples (n (n + 1) / 2 per sample of n tokens). "
                  "queue / compute: host time to queue an iteration's forwards and backwards over the time until "
                  "the device finished them (near 1: the launches set the pace)."]
        lines += [f"- {n}: {' '.join(f) or '(defaults)'}" for n, f in ours + torches]
        lines += sorted(notes)
        if breakdown_lines:
            lines += [""] + breakdown_lines
        if failures:
            lines += ["", "failures:"] + [f"- {f}" for f in failures]
        text = "\n".join(lines) + "\n"
        with open(os.path.join(out, args.tag + ".md"), "w") as f:
            f.write(text)
        return text

    def attempt(cmd, what, impl, length, method):
        """records of one run, or None (recorded as a failure)."""
        left = args.budget_s - (time.monotonic() - start)
        try:
            return records(run(cmd, min(args.run_timeout_s, left + 60)))
        except Failed as e:
            failures.append(f"{what} {length} {method} {impl}: {e}")
            log("gpu_vs_torch: " + failures[-1])
            broken.add((length, method, impl))
            report()
            return None

    jsonl = open(os.path.join(out, args.tag + ".jsonl"), "w")
    # Every length early in a round, so a budget cut leaves each length some cells.
    cells = [(length, method) for method in methods for length in lengths]
    sides_all = [(n, f, True) for n, f in ours] + [(n, f, False) for n, f in torches]
    stopped = False
    for rnd in range(args.rounds):
        order = cells if rnd % 2 == 0 else list(reversed(cells))
        for length, method in order:
            prefix = os.path.join(work, f"dump-{length}-{method}")
            # The sides' order rotates with the round and the cell, so none is always first.
            k = (rnd + cells.index((length, method))) % len(sides_all)
            for impl, flags, is_ours in sides_all[k:] + sides_all[:k]:
                if (length, method, impl) in broken:  # failed once: do not spend the budget again
                    continue
                if args.budget_s - (time.monotonic() - start) <= 0:
                    stopped = True
                    break
                recs = attempt(command(flags, is_ours, prefix), f"round {rnd}", impl, length, method)
                if recs is None:
                    continue
                for r in recs:
                    jsonl.write(json.dumps(dict(r, round=rnd, max_length=length, side=impl)) + "\n")
                jsonl.flush()
                cfg = of_kind(recs, "config")
                if not is_ours and cfg:
                    gpu = cfg[0].get("gpu", gpu)
                    notes.add(f"PyTorch attention: {cfg[0].get('attention_note', '')}")
                elif is_ours and cfg:
                    notes.add(f"{impl}: {cfg[0].get('backend', '')}")
                runs.append((rnd, length, method, impl, recs))
                report()  # the table so far: a run killed later still leaves it
            if stopped:
                break
        if stopped:
            break

    # One iteration's kernels on each side, after the warm-up (graphs built, compiled), by category.
    if args.breakdown != "none" and cuda:
        spec = args.breakdown or f"{lengths[0]}:packing"
        b_len, _, b_method = spec.partition(":")
        prefix = os.path.join(work, f"dump-{b_len}-{b_method}")
        if not os.path.exists(prefix + ".txt"):
            failures.append(f"breakdown {spec}: no such dump")
        else:
            traces = {}
            for impl, flags, is_ours in [sides_all[0]] + [s for s in sides_all if not s[2]][:1]:
                recs = attempt(command(flags, is_ours, prefix, ["--kernel-trace", str(args.warmup)]), "breakdown",
                               impl, b_len, b_method)
                if recs:
                    traces[impl] = of_kind(recs, "kernel")
            if len(traces) == 2:
                breakdown_lines = [f"## Kernel time by category, iteration {args.warmup} of {b_len} {b_method} "
                                   f"(every micro-batch of it; CUPTI on both sides)", ""] + breakdown(traces)
                with open(os.path.join(out, args.tag + "-breakdown.jsonl"), "w") as f:
                    for impl, recs in traces.items():
                        for r in recs:
                            f.write(json.dumps(dict(r, side=impl)) + "\n")

    text = report(final=True)
    print(text)
    sys.exit(1 if failures or not runs else 0)


if __name__ == "__main__":
    main()
