#!/usr/bin/python3
"""PyTorch's side of the CPU comparison (benchmarks/README.md).

The GPT of runtime/model/gpt.h with the semantics tests/golden/make_golden.py
pins down (pre-LayerNorm with eps 1e-5, GELU tanh approximation, learned
positions, causal attention restricted to the token's own segment, padding
cells producing zero attention output, loss summed over scored tokens times
the iteration's loss scale, tied or separate LM head), written as a PyTorch
1.13 user writes it in float32: F.linear, F.layer_norm, F.gelu(tanh),
attention as q @ k^T * scale with a boolean causal + same-segment mask,
softmax, @ v (materialised; 1.13 has no varlen kernel), AdamW of
torch.optim with the job's hyper-parameters and clip_grad_norm_.

It loads a dump of our planner's micro-batches and our initial weights
(benchmarks/batch_dump.h, made by //benchmarks:dump_batches), trains the
dumped iterations in our executor's order, then times each op on the same
shapes as benchmarks/op_timings.h, and prints the same JSON lines as
//benchmarks:cpu_bench. One thread unless --threads says otherwise.

    /usr/bin/python3 benchmarks/torch_gpt.py --dump out/bench/packing
    /usr/bin/python3 benchmarks/torch_gpt.py --check-golden tests/golden/gpt_golden

--check-golden runs this model in float64 on a golden file's weights and
batch and compares loss and gradients with make_golden.py's (which shares
no code with it): the check that both describe the same model.
(/usr/bin/python3: Debian's python3-torch is installed for the system
interpreter.)
"""

import argparse
import json
import math
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

EPS = 1e-5


def emit(kind, **fields):
    print(json.dumps(dict(kind=kind, **fields)), flush=True)


# ---------------------------------------------------------------------------
# Dumps (benchmarks/batch_dump.h) and golden files (tests/golden/README.md).

def _fields(words):
    return dict(w.split("=", 1) for w in words if "=" in w)


def read_dump(prefix):
    """{'model', 'optimizer', 'job', 'iterations': [...], 'params': {name: array}}."""
    blob = open(prefix + ".bin", "rb").read()
    at = 0
    d = {"iterations": [], "params": {}}
    for line in open(prefix + ".txt"):
        w = line.split()
        if not w or w[0].startswith("#"):
            continue
        if w[0] in ("model", "optimizer", "job"):
            d[w[0]] = _fields(w[1:])
        elif w[0] == "iteration":
            f = _fields(w[2:])
            steps = [(s[0] == "f", int(s[1:])) for s in f["steps"].split(",") if s]
            d["iterations"].append({"loss_scale": float(f["loss_scale"]), "lr": float(f["lr"]),
                                    "steps": steps, "batches": []})
        elif w[0] == "micro_batch":
            f = _fields(w[3:])
            d["iterations"][-1]["batches"].append({k: int(f[k]) for k in ("rows", "seq", "real_tokens",
                                                                          "loss_tokens")})
        elif w[0] == "tensor":
            name, dtype, dims = w[1], w[2], [int(x) for x in w[3:]]
            count = int(np.prod(dims)) if dims else 1
            arr = np.frombuffer(blob, dtype="<i4" if dtype == "i32" else "<f4", count=count, offset=at)
            at += 4 * count
            arr = arr.reshape(dims)
            if name.startswith("param."):
                d["params"][name[len("param."):]] = arr
            else:
                d["iterations"][-1]["batches"][-1][name.rsplit(".", 1)[1]] = arr
        else:
            raise ValueError(f"{prefix}.txt: unknown record {w[0]}")
    if at != len(blob):
        raise ValueError(f"{prefix}.bin: {len(blob) - at} bytes beyond the manifest")
    return d


def model_config(d):
    m = d["model"]
    return {k: int(m[k]) for k in ("layers", "hidden", "heads", "ffn", "vocab", "max_positions",
                                   "tie_embeddings")}


def batch_tensors(b):
    """int64 tensors of a dumped micro-batch (prepared once, like our TokenBatch)."""
    return {k: torch.from_numpy(b[k].astype(np.int64)) for k in ("tokens", "positions", "segments", "targets")}


# ---------------------------------------------------------------------------
# The model.

def attention_mask(segments):
    """(B, 1, T, T) True where query i must not see key j; (B, T) real cells."""
    t = segments.shape[1]
    real = segments >= 0
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    allowed = causal[None] & (segments[:, :, None] == segments[:, None, :]) & real[:, :, None]
    # Padding queries see themselves (a finite softmax); their output is zeroed.
    allowed = allowed | (~real[:, :, None] & torch.eye(t, dtype=torch.bool)[None])
    return ~allowed[:, None], real


def attention(qkv, masked, real, heads):
    b, t, c3 = qkv.shape
    c = c3 // 3
    hs = c // heads
    q, k, v = (z.view(b, t, heads, hs).transpose(1, 2) for z in qkv.split(c, dim=2))  # (B, NH, T, hs)
    scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(hs))
    att = torch.softmax(scores.masked_fill(masked, float("-inf")), dim=-1)
    y = (att @ v).transpose(1, 2).reshape(b, t, c)
    return y * real[:, :, None].to(y.dtype)


class Gpt:
    def __init__(self, cfg, params):
        """params: name -> tensor in our layout's names and shapes (leaves with grad)."""
        self.cfg = cfg
        self.p = params
        self.head = params["wte"] if cfg["tie_embeddings"] else params["lm_head.w"]

    def parameters(self):
        return list(self.p.values())

    def loss(self, b, loss_scale):
        """Scored tokens' cross-entropy, summed, times loss_scale."""
        P, c = self.p, self.cfg["hidden"]
        masked, real = attention_mask(b["segments"])
        x = F.embedding(b["tokens"], P["wte"]) + F.embedding(b["positions"], P["wpe"])
        for l in range(self.cfg["layers"]):
            h = f"h.{l}."
            a = F.layer_norm(x, (c,), P[h + "ln1.w"], P[h + "ln1.b"], EPS)
            qkv = F.linear(a, P[h + "attn.qkv.w"], P[h + "attn.qkv.b"])
            x = x + F.linear(attention(qkv, masked, real, self.cfg["heads"]), P[h + "attn.proj.w"],
                             P[h + "attn.proj.b"])
            m = F.layer_norm(x, (c,), P[h + "ln2.w"], P[h + "ln2.b"], EPS)
            g = F.gelu(F.linear(m, P[h + "mlp.fc.w"], P[h + "mlp.fc.b"]), approximate="tanh")
            x = x + F.linear(g, P[h + "mlp.proj.w"], P[h + "mlp.proj.b"])
        # Only scored positions go through the final LayerNorm and the head (as ours).
        targets = b["targets"].reshape(-1)
        scored = (targets >= 0).nonzero().squeeze(1)
        z = F.layer_norm(x.reshape(-1, c)[scored], (c,), P["lnf.w"], P["lnf.b"], EPS)
        logits = F.linear(z, self.head)
        return F.cross_entropy(logits, targets[scored], reduction="sum") * loss_scale


def make_params(arrays, dtype):
    return {n: torch.tensor(np.asarray(a), dtype=dtype).requires_grad_(True) for n, a in arrays.items()}


def make_optimizer(model, opt):
    decay = [p for p in model.parameters() if p.dim() >= 2]  # matrices only, as our layout
    rest = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": float(opt["weight_decay"])},
                              {"params": rest, "weight_decay": 0.0}],
                             lr=float(opt["lr"]), betas=(float(opt["beta1"]), float(opt["beta2"])),
                             eps=float(opt["eps"]))


# ---------------------------------------------------------------------------
# Training, as our worker does it.

def train(d, warmup):
    cfg, opt = model_config(d), d["optimizer"]
    model = Gpt(cfg, make_params(d["params"], torch.float32))
    optimizer = make_optimizer(model, opt)
    clip = float(opt["grad_clip"])
    batches = [[batch_tensors(b) for b in it["batches"]] for it in d["iterations"]]
    seconds = tokens = 0.0
    timed = 0
    for i, it in enumerate(d["iterations"]):
        real = sum(b["real_tokens"] for b in it["batches"])
        t0 = time.perf_counter()
        for g in optimizer.param_groups:
            g["lr"] = it["lr"]
        pending, loss = {}, 0.0
        for forward, mb in it["steps"]:
            if forward:
                pending[mb] = model.loss(batches[i][mb], it["loss_scale"])
                loss += pending[mb].item()
            else:
                pending.pop(mb).backward()
        if clip > 0:
            norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip))
        else:
            norm = float(torch.norm(torch.stack([p.grad.norm() for p in model.parameters()])))
        optimizer.step()
        optimizer.zero_grad()
        dt = time.perf_counter() - t0
        emit("iteration", iteration=i, loss=loss, grad_norm=norm, seconds=dt, real_tokens=real,
             warmup=i < warmup)
        if i >= warmup:
            seconds += dt
            tokens += real
            timed += 1
    if timed:
        emit("end_to_end", tokens_per_s=tokens / seconds, seconds=seconds, real_tokens=tokens, iterations=timed)


# ---------------------------------------------------------------------------
# Ops one by one on the dump's shapes (benchmarks/op_timings.h's list).

def time_op(name, shapes, prepare, fwd, bwd, reps):
    """prepare(shape) -> inputs (untimed, once); fwd(inputs) -> out; bwd(inputs, out)."""
    inputs = [prepare(s) for s in shapes]
    f_pass, b_pass = [], []
    for rep in range(-1, reps):  # rep -1 warms up
        f = b = 0.0
        for x in inputs:
            t = time.perf_counter()
            out = fwd(x)
            f += time.perf_counter() - t
            if bwd is None:
                continue
            t = time.perf_counter()
            bwd(x, out)
            b += time.perf_counter() - t
        if rep >= 0:
            f_pass.append(f)
            b_pass.append(b)
    if bwd is None:
        emit("op", op=name, seconds=float(np.median(f_pass)), calls=len(shapes))
    else:
        emit("op", op=name + "_fwd", seconds=float(np.median(f_pass)), calls=len(shapes))
        emit("op", op=name + "_bwd", seconds=float(np.median(b_pass)), calls=len(shapes))


def time_ops(d, op_iterations, reps):
    cfg = model_config(d)
    C, Fh, V, NH = cfg["hidden"], cfg["ffn"], cfg["vocab"], cfg["heads"]
    gen = torch.Generator().manual_seed(1)

    def rand(*shape, std=1.0, mean=0.0, grad=True):
        return (mean + std * torch.randn(*shape, generator=gen)).requires_grad_(grad)

    shapes = []
    for i in op_iterations:
        for b in d["iterations"][i]["batches"]:
            t = batch_tensors(b)
            scored = t["targets"].reshape(-1)
            scored = scored[scored >= 0]
            shapes.append({"B": b["rows"], "T": b["seq"], "N": b["rows"] * b["seq"], "M": int(scored.numel()),
                           "segments": t["segments"], "targets": scored})

    def backward(x, out):
        out.backward(x["dout"])

    def matmul(name, ic, oc, head):
        def prepare(s):
            rows = s["M"] if head else s["N"]
            return {"x": rand(rows, ic), "w": rand(oc, ic, std=0.02), "b": None if head else rand(oc, std=0.02),
                    "dout": rand(rows, oc, grad=False)}
        time_op(name, shapes, prepare, lambda x: F.linear(x["x"], x["w"], x["b"]), backward, reps)

    matmul("matmul_qkv", C, 3 * C, False)
    matmul("matmul_proj", C, C, False)
    matmul("matmul_fc", C, Fh, False)
    matmul("matmul_mproj", Fh, C, False)
    matmul("matmul_head", C, V, True)
    time_op("layernorm", shapes,
            lambda s: {"x": rand(s["N"], C), "w": rand(C, std=0.1, mean=1.0), "b": rand(C, std=0.02),
                       "dout": rand(s["N"], C, grad=False)},
            lambda x: F.layer_norm(x["x"], (C,), x["w"], x["b"], EPS), backward, reps)
    time_op("gelu", shapes, lambda s: {"x": rand(s["N"] * Fh), "dout": rand(s["N"] * Fh, grad=False)},
            lambda x: F.gelu(x["x"], approximate="tanh"), backward, reps)

    def prepare_attention(s):
        masked, real = attention_mask(s["segments"])  # once per micro-batch in the model, shared by its layers
        return {"qkv": rand(s["B"], s["T"], 3 * C), "masked": masked, "real": real,
                "dout": rand(s["B"], s["T"], C, grad=False)}
    time_op("attention_materialized", shapes, prepare_attention,
            lambda x: attention(x["qkv"], x["masked"], x["real"], NH), backward, reps)
    time_op("crossentropy", shapes, lambda s: {"x": rand(s["M"], V), "t": s["targets"]},
            lambda x: F.cross_entropy(x["x"], x["t"], reduction="sum") * (1.0 / 8192),
            lambda x, out: out.backward(), reps)

    # AdamW: one step over the whole model per chosen iteration.
    model = Gpt(cfg, make_params(d["params"], torch.float32))
    for p in model.parameters():
        p.grad = 1e-3 * torch.randn(p.shape, generator=gen)
    optimizer = make_optimizer(model, d["optimizer"])
    time_op("adamw", list(op_iterations), lambda s: None, lambda x: optimizer.step(), None, reps)


# ---------------------------------------------------------------------------
# The golden check.

def check_golden(prefix):
    blob = open(prefix + ".bin", "rb").read()
    at, tensors, cfg = 0, {}, {}
    for line in open(prefix + ".txt"):
        w = line.split()
        if line.startswith("# config"):
            cfg = {k: int(v) for k, v in _fields(w[2:]).items()}
            continue
        if not w or w[0].startswith("#"):
            continue
        name, dtype, dims = w[0], w[1], [int(x) for x in w[2:]]
        count = int(np.prod(dims)) if dims else 1
        tensors[name] = np.frombuffer(blob, dtype="<i4" if dtype == "i32" else "<f4", count=count,
                                      offset=at).reshape(dims)
        at += 4 * count
    params = {n[len("param/"):]: a for n, a in tensors.items() if n.startswith("param/")}
    model = Gpt(cfg, make_params(params, torch.float64))
    batch = {k: torch.from_numpy(tensors[k].astype(np.int64)) for k in ("tokens", "positions", "segments",
                                                                          "targets")}
    loss_tokens = int((batch["targets"] >= 0).sum())
    loss = model.loss(batch, 1.0 / loss_tokens)
    loss.backward()
    worst, worst_name = abs(loss.item() - float(tensors["loss"][0])) / abs(float(tensors["loss"][0])), "loss"
    for n, p in model.p.items():
        g = torch.from_numpy(tensors["grad/" + n].astype(np.float64))
        err = float((p.grad - g).norm() / g.norm())
        if err > worst:
            worst, worst_name = err, "grad/" + n
    emit("golden", file=prefix, loss=loss.item(), worst_relative_error=worst, worst=worst_name)
    return worst < 1e-5  # the golden values are float32-rounded


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dump", help="dump prefix (PREFIX.txt, PREFIX.bin)")
    ap.add_argument("--warmup", type=int, default=1, help="first iterations left out of tokens/s")
    ap.add_argument("--no-train", action="store_true")
    ap.add_argument("--no-ops", action="store_true")
    ap.add_argument("--op-iterations", default="1", help="iterations whose micro-batches give the op shapes")
    ap.add_argument("--op-reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--check-golden", metavar="PREFIX", help="compare with a make_golden.py file and exit")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    if args.check_golden:
        sys.exit(0 if check_golden(args.check_golden) else 1)
    if not args.dump:
        ap.error("--dump or --check-golden is required")
    d = read_dump(args.dump)
    emit("config", impl="torch", torch=torch.__version__, dump=args.dump, method=d["job"]["method"],
         attention="materialized", threads=torch.get_num_threads())
    if not args.no_train:
        train(d, args.warmup)
    if not args.no_ops:
        its = [int(x) for x in args.op_iterations.split(",") if x]
        time_ops(d, its, args.op_reps)


if __name__ == "__main__":
    main()
