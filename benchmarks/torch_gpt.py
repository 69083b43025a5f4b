#!/usr/bin/python3
"""PyTorch's side of the comparisons with our GPT (benchmarks/README.md).

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

--device cuda --precision bf16 is the GPU reference (benchmarks/gpu_vs_torch.py):
the same model with fp32 master weights under bf16 autocast, as a PyTorch 2
user trains it, attention through FlashAttention's varlen kernel
(torch.nn.attention.varlen, checked at start against a masked
scaled_dot_product_attention and replaced by it where it is missing or
disagrees) on each micro-batch's real tokens, and fused AdamW. Times are
taken after torch.cuda.synchronize(). No numpy is needed.

--check-golden runs this model in float64 on a golden file's weights and
batch and compares loss and gradients with make_golden.py's (which shares
no code with it): the check that both describe the same model.
(/usr/bin/python3: Debian's python3-torch is installed for the system
interpreter.)
"""

import argparse
import inspect
import json
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F

EPS = 1e-5


def emit(kind, **fields):
    print(json.dumps(dict(kind=kind, **fields)), flush=True)


# ---------------------------------------------------------------------------
# Dumps (benchmarks/batch_dump.h) and golden files (tests/golden/README.md).

def _fields(words):
    return dict(w.split("=", 1) for w in words if "=" in w)


def tensor_at(blob, at, dtype, dims):
    """A little-endian i32 or f32 tensor of shape dims at byte `at` of blob (a bytearray)."""
    count = math.prod(dims) if dims else 1
    t = torch.frombuffer(blob, dtype=torch.int32 if dtype == "i32" else torch.float32, count=count, offset=at)
    if sys.byteorder != "little":
        t = t.byteswap()
    return t.reshape(dims)


def read_dump(prefix):
    """{'model', 'optimizer', 'job', 'iterations': [...], 'params': {name: array}}."""
    blob = bytearray(open(prefix + ".bin", "rb").read())
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
                                    "predicted_ms": float(f.get("predicted_ms", 0)),
                                    "model_flops": float(f.get("model_flops", 0)),
                                    "steps": steps, "batches": []})
        elif w[0] == "micro_batch":
            f = _fields(w[3:])
            d["iterations"][-1]["batches"].append({k: int(f[k]) for k in ("rows", "seq", "real_tokens",
                                                                          "loss_tokens")})
        elif w[0] == "tensor":
            name, dtype, dims = w[1], w[2], [int(x) for x in w[3:]]
            arr = tensor_at(blob, at, dtype, dims)
            at += 4 * arr.numel()
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


def batch_tensors(b, device="cpu"):
    """int64 tensors of a dumped micro-batch (prepared once, like our TokenBatch)."""
    return {k: b[k].to(device=device, dtype=torch.int64) for k in ("tokens", "positions", "segments", "targets")}


# ---------------------------------------------------------------------------
# The model.

def attention_mask(segments):
    """(B, 1, T, T) True where query i must not see key j; (B, T) real cells."""
    t = segments.shape[1]
    real = segments >= 0
    causal = torch.ones(t, t, dtype=torch.bool, device=segments.device).tril()
    allowed = causal[None] & (segments[:, :, None] == segments[:, None, :]) & real[:, :, None]
    # Padding queries see themselves (a finite softmax); their output is zeroed.
    allowed = allowed | (~real[:, :, None] & torch.eye(t, dtype=torch.bool, device=segments.device)[None])
    return ~allowed[:, None], real


def split_heads(qkv, heads):
    b, t, c3 = qkv.shape
    c = c3 // 3
    return (z.view(b, t, heads, c // heads).transpose(1, 2) for z in qkv.split(c, dim=2))  # (B, NH, T, hs)


def attention(qkv, masked, real, heads):
    b, t, c3 = qkv.shape
    q, k, v = split_heads(qkv, heads)
    scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    att = torch.softmax(scores.masked_fill(masked, float("-inf")), dim=-1)
    y = (att @ v).transpose(1, 2).reshape(b, t, c3 // 3)
    return y * real[:, :, None].to(y.dtype)


# One attention per micro-batch, built once from its segments and shared by
# its layers: __call__(qkv (B, T, 3C), heads) -> (B, T, C), zeros at padding.

class MaterializedAttention:
    """Scores materialised with a boolean mask: what a PyTorch 1.13 user writes."""
    name = "materialized"

    def __init__(self, segments):
        self.masked, self.real = attention_mask(segments)

    def __call__(self, qkv, heads):
        return attention(qkv, self.masked, self.real, heads)


class SdpaAttention:
    """F.scaled_dot_product_attention with the same mask (PyTorch 2 picks its kernel)."""
    name = "sdpa_mask"

    def __init__(self, segments):
        masked, self.real = attention_mask(segments)
        self.allowed = ~masked

    def __call__(self, qkv, heads):
        b, t, c3 = qkv.shape
        q, k, v = split_heads(qkv, heads)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=self.allowed).transpose(1, 2).reshape(b, t, c3 // 3)
        return y * self.real[:, :, None].to(y.dtype)


def varlen_layout(segments):
    """Flat indices of the real tokens, int32 cumulative sample starts among them, the longest sample.
    A sample is a run of one segment id within a row."""
    t = segments.shape[1]
    flat = segments.reshape(-1)
    idx = (flat >= 0).nonzero().squeeze(1)
    row, seg = idx // t, flat[idx]
    first = torch.ones_like(idx, dtype=torch.bool)
    first[1:] = (row[1:] != row[:-1]) | (seg[1:] != seg[:-1])
    cu = torch.cat([first.nonzero().squeeze(1), idx.new_tensor([idx.numel()])]).to(torch.int32)
    return idx, cu, int((cu[1:] - cu[:-1]).max())


def flash_varlen_kernel():
    """kernel(q, k, v (N, H, D), cu, longest) -> (N, H, D), causal within each sample; None without one."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    params = inspect.signature(varlen_attn).parameters
    if "is_causal" in params:
        causal = {"is_causal": True}
    elif "window_size" in params:
        causal = {"window_size": (-1, 0)}  # (left, right): every earlier key, no later one
    else:
        return None
    return lambda q, k, v, cu, longest: varlen_attn(q, k, v, cu, cu, longest, longest, **causal)


class VarlenAttention:
    """A varlen kernel over the micro-batch's real tokens only (no padding, no pairs across samples)."""
    name = "varlen_attn"

    def __init__(self, segments, kernel):
        self.idx, self.cu, self.longest = varlen_layout(segments)
        self.kernel = kernel

    def __call__(self, qkv, heads):
        b, t, c3 = qkv.shape
        c = c3 // 3
        x = qkv.reshape(b * t, c3).index_select(0, self.idx)
        q, k, v = (z.reshape(-1, heads, c // heads) for z in x.split(c, dim=1))
        y = self.kernel(q, k, v, self.cu, self.longest).reshape(-1, c)
        return torch.zeros(b * t, c, dtype=y.dtype, device=y.device).index_copy(0, self.idx, y).reshape(b, t, c)


def reference_varlen_kernel(q, k, v, cu, longest):
    """What a varlen kernel computes, sample by sample (for --self-test)."""
    out = []
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        qs, ks, vs = (z[a:b].transpose(0, 1) for z in (q, k, v))  # (H, n, D)
        scores = (qs @ ks.transpose(-1, -2)) / math.sqrt(qs.shape[-1])
        causal = torch.ones(b - a, b - a, dtype=torch.bool, device=q.device).tril()
        att = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
        out.append((att @ vs).transpose(0, 1))
    return torch.cat(out)


def self_test():
    """The varlen gather / scatter around a reference kernel equals the masked reference
    (rows with several samples, padding, a row of one sample), values and gradients."""
    g = torch.Generator().manual_seed(3)
    segments = torch.tensor([[0, 0, 0, 1, 1, 2, -1, -1], [0] * 8, [0, 0, 0, 0, 0, -1, -1, -1]])
    qkv = torch.randn(3, 8, 3 * 8, generator=g, dtype=torch.float64).requires_grad_(True)
    dout = torch.randn(3, 8, 8, generator=g, dtype=torch.float64)
    results = []
    for att in (MaterializedAttention(segments), VarlenAttention(segments, reference_varlen_kernel)):
        qkv.grad = None
        y = att(qkv, 2)
        y.backward(dout)
        results.append((y.detach(), qkv.grad.clone()))
    err = max(float((a - b).abs().max()) for a, b in zip(*results))
    emit("self_test", max_difference=err)
    return err < 1e-10


def pick_attention(device, precision):
    """(factory(segments) -> attention, note). On CUDA in bf16 the varlen kernel, once it matches
    the masked reference on a small batch; otherwise SDPA with the mask (PyTorch 2) or the
    materialised reference."""
    if device != "cuda":
        return MaterializedAttention, "materialized reference"
    kernel = flash_varlen_kernel()
    if kernel is None or precision != "bf16":
        return SdpaAttention, "no usable torch.nn.attention.varlen.varlen_attn" if kernel is None else "fp32"
    # Samples longer than 128 tokens, so the kernel the real runs get is the one checked; the
    # reference in fp32, the difference relative to its largest value.
    g = torch.Generator(device="cuda").manual_seed(7)
    segments = torch.tensor([[0] * 300 + [1] * 150 + [2] * 40 + [-1] * 22, [0] * 480 + [-1] * 32], device="cuda")
    qkv = torch.randn(2, 512, 3 * 128, device="cuda", generator=g).to(torch.bfloat16)
    want = SdpaAttention(segments)(qkv.float(), 2)
    try:
        got = VarlenAttention(segments, kernel)(qkv, 2).float()
    except Exception as e:  # a kernel the GPU or build lacks
        return SdpaAttention, f"varlen_attn failed ({type(e).__name__}: {e}); masked SDPA used"
    err = float((got - want).abs().max() / want.abs().max())
    if not err < 2e-2:
        return SdpaAttention, f"varlen_attn differs from the fp32 reference by {err:.3g} (relative); masked SDPA used"
    note = f"varlen_attn (relative difference to the fp32 reference {err:.2g})"
    return (lambda seg: VarlenAttention(seg, kernel)), note


class Gpt:
    def __init__(self, cfg, params, attention_factory=MaterializedAttention):
        """params: name -> tensor in our layout's names and shapes (leaves with grad)."""
        self.cfg = cfg
        self.p = params
        self.head = params["wte"] if cfg["tie_embeddings"] else params["lm_head.w"]
        self.attention_factory = attention_factory

    def parameters(self):
        return list(self.p.values())

    def loss(self, b, loss_scale):
        """Scored tokens' cross-entropy, summed, times loss_scale."""
        P, c = self.p, self.cfg["hidden"]
        att = self.attention_factory(b["segments"])
        x = F.embedding(b["tokens"], P["wte"]) + F.embedding(b["positions"], P["wpe"])
        for l in range(self.cfg["layers"]):
            h = f"h.{l}."
            a = F.layer_norm(x, (c,), P[h + "ln1.w"], P[h + "ln1.b"], EPS)
            qkv = F.linear(a, P[h + "attn.qkv.w"], P[h + "attn.qkv.b"])
            x = x + F.linear(att(qkv, self.cfg["heads"]), P[h + "attn.proj.w"], P[h + "attn.proj.b"])
            m = F.layer_norm(x, (c,), P[h + "ln2.w"], P[h + "ln2.b"], EPS)
            g = F.gelu(F.linear(m, P[h + "mlp.fc.w"], P[h + "mlp.fc.b"]), approximate="tanh")
            x = x + F.linear(g, P[h + "mlp.proj.w"], P[h + "mlp.proj.b"])
        # Only scored positions go through the final LayerNorm and the head (as ours).
        targets = b["targets"].reshape(-1)
        scored = (targets >= 0).nonzero().squeeze(1)
        z = F.layer_norm(x.reshape(-1, c)[scored], (c,), P["lnf.w"], P["lnf.b"], EPS)
        logits = F.linear(z, self.head)
        return F.cross_entropy(logits, targets[scored], reduction="sum") * loss_scale


def make_params(arrays, dtype, device="cpu"):
    return {n: a.to(device=device, dtype=dtype).clone().requires_grad_(True) for n, a in arrays.items()}


def make_optimizer(model, opt, fused=False):
    decay = [p for p in model.parameters() if p.dim() >= 2]  # matrices only, as our layout
    rest = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": float(opt["weight_decay"])}, {"params": rest, "weight_decay": 0.0}]
    kw = dict(lr=float(opt["lr"]), betas=(float(opt["beta1"]), float(opt["beta2"])), eps=float(opt["eps"]))
    if fused:  # one kernel for the whole step (PyTorch 2 on CUDA)
        try:
            return torch.optim.AdamW(groups, fused=True, **kw)
        except (TypeError, RuntimeError):
            pass
    return torch.optim.AdamW(groups, **kw)


# ---------------------------------------------------------------------------
# Training, as our worker does it.

def kernel_records(prof, iteration):
    """One {"kind": "kernel"} line per device kernel, copy and fill of a torch.profiler run (CUPTI's
    records, as //benchmarks:cpu_bench --kernel-trace prints ours)."""
    for e in prof.events():
        if getattr(e, "device_type", None) != torch.autograd.DeviceType.CUDA:
            continue
        name = e.name
        low = name.lower()
        if low.startswith("memcpy"):
            name = "[memcpy]"
        elif low.startswith("memset"):
            name = "[memset]"
        emit("kernel", iteration=iteration, name=name, ns=int(round(e.time_range.elapsed_us() * 1000)))


def train(d, warmup, device="cpu", precision="fp32", attention_factory=MaterializedAttention, compile_model=False,
          trace_iteration=-1):
    """fp32 parameters and AdamW; with precision bf16 the forward runs under bf16 autocast. compile_model:
    the loss through torch.compile (dynamic shapes; the varlen attention's data-dependent indexing breaks
    the graph there, as it does for a user). trace_iteration: that iteration's kernels as "kernel" lines."""
    cfg, opt = model_config(d), d["optimizer"]
    model = Gpt(cfg, make_params(d["params"], torch.float32, device), attention_factory)
    loss_fn = torch.compile(model.loss, dynamic=True) if compile_model else model.loss
    optimizer = make_optimizer(model, opt, fused=device == "cuda")
    clip = float(opt["grad_clip"])
    batches = [[batch_tensors(b, device) for b in it["batches"]] for it in d["iterations"]]
    cuda = device == "cuda"

    def autocast():
        return torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=precision == "bf16")

    seconds = tokens = 0.0
    timed = 0
    for i, it in enumerate(d["iterations"]):
        real = sum(b["real_tokens"] for b in it["batches"])
        if cuda:
            torch.cuda.synchronize()
        prof = None
        if i == trace_iteration:
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
            prof.__enter__()
        t0 = time.perf_counter()
        for g in optimizer.param_groups:
            g["lr"] = it["lr"]
        pending, losses = {}, []
        for forward, mb in it["steps"]:
            if forward:
                with autocast():
                    pending[mb] = loss_fn(batches[i][mb], it["loss_scale"])
                losses.append(pending[mb].detach())
            else:
                pending.pop(mb).backward()
        if clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        else:
            norm = torch.norm(torch.stack([p.grad.norm() for p in model.parameters()]))
        optimizer.step()
        optimizer.zero_grad()
        if cuda:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        if prof is not None:
            prof.__exit__(None, None, None)
            kernel_records(prof, i)
        loss, norm = sum(float(x) for x in losses), float(norm)
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
        emit("op", op=name, seconds=statistics.median(f_pass), calls=len(shapes))
    else:
        emit("op", op=name + "_fwd", seconds=statistics.median(f_pass), calls=len(shapes))
        emit("op", op=name + "_bwd", seconds=statistics.median(b_pass), calls=len(shapes))


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
    blob = bytearray(open(prefix + ".bin", "rb").read())
    at, tensors, cfg = 0, {}, {}
    for line in open(prefix + ".txt"):
        w = line.split()
        if line.startswith("# config"):
            cfg = {k: int(v) for k, v in _fields(w[2:]).items()}
            continue
        if not w or w[0].startswith("#"):
            continue
        name, dtype, dims = w[0], w[1], [int(x) for x in w[2:]]
        tensors[name] = tensor_at(blob, at, dtype, dims)
        at += 4 * tensors[name].numel()
    params = {n[len("param/"):]: a for n, a in tensors.items() if n.startswith("param/")}
    model = Gpt(cfg, make_params(params, torch.float64))
    batch = {k: tensors[k].to(torch.int64) for k in ("tokens", "positions", "segments", "targets")}
    loss_tokens = int((batch["targets"] >= 0).sum())
    loss = model.loss(batch, 1.0 / loss_tokens)
    loss.backward()
    worst, worst_name = abs(loss.item() - float(tensors["loss"][0])) / abs(float(tensors["loss"][0])), "loss"
    for n, p in model.p.items():
        g = tensors["grad/" + n].to(torch.float64)
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
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--precision", default="fp32", choices=("fp32", "bf16"),
                    help="bf16: the forward under bf16 autocast (fp32 weights and optimizer)")
    ap.add_argument("--compile", action="store_true",
                    help="train through torch.compile (dynamic shapes), PyTorch's second peer on the GPU")
    ap.add_argument("--kernel-trace", type=int, default=-1, metavar="I",
                    help="--device cuda: print every kernel of iteration I (torch.profiler) as a \"kernel\" line")
    ap.add_argument("--check-golden", metavar="PREFIX", help="compare with a make_golden.py file and exit")
    ap.add_argument("--self-test", action="store_true",
                    help="check the varlen attention's token layout against the masked reference and exit")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    if args.check_golden:
        sys.exit(0 if check_golden(args.check_golden) else 1)
    if args.self_test:
        sys.exit(0 if self_test() else 1)
    if not args.dump:
        ap.error("--dump or --check-golden is required")
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"torch_gpt: --device cuda: this torch {torch.__version__} sees no CUDA device", file=sys.stderr)
        sys.exit(2)
    if args.device == "cuda" and not args.no_ops:
        ap.error("--device cuda: the per-op timings are the CPU comparison's; pass --no-ops")
    d = read_dump(args.dump)
    factory, note = pick_attention(args.device, args.precision)
    fields = dict(impl="torch", torch=torch.__version__, dump=args.dump, method=d["job"]["method"],
                  attention=factory.name if hasattr(factory, "name") else VarlenAttention.name, attention_note=note,
                  device=args.device, precision=args.precision, threads=torch.get_num_threads(), compiled=args.compile)
    if args.device == "cuda":
        fields["gpu"] = torch.cuda.get_device_name()
    emit("config", **fields)
    if not args.no_train:
        train(d, args.warmup, args.device, args.precision, factory, args.compile, args.kernel_trace)
    if not args.no_ops:
        its = [int(x) for x in args.op_iterations.split(",") if x]
        time_ops(d, its, args.op_reps)


if __name__ == "__main__":
    main()
