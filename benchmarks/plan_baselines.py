#!/usr/bin/env python3
"""Dynamic against every baseline, and dynamic with each of its parts off.

Runs `dynapipe plan --compare --json` on the set-ups of issue 34 (GPT-350M,
GPT-1.3B, GPT-6.7B; T5-3B-like on 4 stages at 2k/4k/8k) over one lengths
file, then `dynapipe plan --ablate PART` for each part of dynamic, and
prints two Markdown tables: predicted tokens/s per method (dynamic over the
best other method, data-parallel imbalance, planning time), and the
ablation (tokens/s relative to the whole of dynamic).

usage: benchmarks/plan_baselines.py DYNAPIPE LENGTHS [--iters N]
"""

import argparse
import json
import subprocess
import sys

SETUPS = [
    # label, model, stages, dp, max length, attention
    ("GPT-350M, 1 x 1, 4,096, varlen", "gpt-350m", 1, 1, 4096, "varlen"),
    ("GPT-350M, 8 x 4, 8,192, varlen", "gpt-350m", 8, 4, 8192, "varlen"),
    ("GPT-6.7B, 8 x 4, 8,192, varlen", "gpt-6.7b", 8, 4, 8192, "varlen"),
    ("GPT-6.7B, 8 x 4, 8,192, materialized", "gpt-6.7b", 8, 4, 8192, "materialized"),
    ("GPT-1.3B, 4 x 2, 4,096, varlen", "gpt-1.3b", 4, 2, 4096, "varlen"),
    ("T5-3B-like, 4 x 1, 2,048", "t5-3b", 4, 1, 2048, "materialized"),
    ("T5-3B-like, 4 x 1, 4,096", "t5-3b", 4, 1, 4096, "materialized"),
    ("T5-3B-like, 4 x 1, 8,192", "t5-3b", 4, 1, 8192, "materialized"),
]
PARTS = ["baselines", "balanced", "group_balance", "rebalance"]


def plan(binary, lengths, iters, setup, extra):
    _, model, stages, dp, max_len, attention = setup
    cmd = [binary, "plan", "--lengths", lengths, "--model", model, "--stages", str(stages), "--dp", str(dp),
           "--max-seqlen", str(max_len), "--device", "h100", "--iters", str(iters), "--attention", attention,
           "--json"] + extra
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("binary")
    p.add_argument("lengths")
    p.add_argument("--iters", type=int, default=6)
    a = p.parse_args()
    methods = None
    compare_rows, ablation_rows = [], []
    for setup in SETUPS:
        rows = plan(a.binary, a.lengths, a.iters, setup, ["--compare"])
        by = {r["method"]: r for r in rows}
        methods = methods or [r["method"] for r in rows]
        best_other = max(r["tokens_per_s"] for m, r in by.items() if m != "dynamic")
        dyn = by["dynamic"]
        compare_rows.append((setup[0], by, dyn["tokens_per_s"] / best_other))
        cells = []
        for part in PARTS:
            summary = plan(a.binary, a.lengths, a.iters, setup, ["--ablate", part])[-1]
            cells.append(summary["tokens_per_s"] / dyn["tokens_per_s"])
        ablation_rows.append((setup[0], cells))
        print(f"{setup[0]}: done", file=sys.stderr)

    print("| set-up | " + " | ".join(methods) + " | dynamic / best other | dp imbalance (max) | plan ms |")
    print("|---" * (len(methods) + 4) + "|")
    for label, by, ratio in compare_rows:
        dyn = by["dynamic"]
        print(f"| {label} | " + " | ".join(f"{by[m]['tokens_per_s']:,.0f}" for m in methods) +
              f" | {ratio:.3f}x | {dyn['max_dp_imbalance']:.3f} | {dyn['median_plan_ms']:.1f} |")
    print()
    print("| set-up | " + " | ".join(f"without {p}" for p in PARTS) + " |")
    print("|---" * (len(PARTS) + 1) + "|")
    for label, cells in ablation_rows:
        print(f"| {label} | " + " | ".join(f"{c:.3f}x" for c in cells) + " |")


if __name__ == "__main__":
    main()
