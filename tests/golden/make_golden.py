#!/usr/bin/python3
"""Golden reference for the C++ GPT (runtime/model/gpt.h), computed by PyTorch.

Builds the same tiny GPT as the C++ model (pre-LayerNorm, GELU-tanh MLP,
learned positions, segment-masked causal attention, optionally tied LM head),
one fixed batch (a full row, a padded row, a packed row of two samples) and
fixed random weights, and computes in float64 the loss, the logits of every
position and the gradient of every parameter (autograd). golden_test.cc
loads the weights into GptStage and checks its CPU backend against these
within 1e-4 relative.

Four models, each written as <name>.txt (manifest) and <name>.bin (data):
  gpt_golden            tied embeddings, 4 layers
  gpt_golden_untied     separate lm_head.w, 2 layers
  gpt_golden_t5_block   T5 v1.1's block (RMS norm, gated GELU, no biases),
                        separate lm_head.w, 2 layers
  gpt_golden_relu       LayerNorm without a shift, ReLU, no biases, tied, 2 layers

Manifest: '#' lines carry the config; then one line per tensor, in file
order: `name dtype d0 d1 ...`, dtype f32 or i32. The .bin holds the tensors
back to back, little-endian: inputs (tokens, positions, segments, targets;
int32), loss and logits, param/<name> and grad/<name> (float32, rounded from
the float64 results; the weights are rounded to float32 before the forward,
so both sides start from identical parameters).

Rerun by hand with Debian's python3-torch (1.13) after a change to the model:
    /usr/bin/python3 tests/golden/make_golden.py
(/usr/bin/python3: Debian's torch is installed for the system interpreter.)
The outputs are committed; the C++ test does not need torch.
"""

import math
import os

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))

HIDDEN, HEADS, FFN, VOCAB, MAX_POSITIONS = 32, 4, 64, 61, 40
ROWS, SEQ = 3, 16
PAD_TOKEN = 0
# (row, offset, length, target tokens) of each sample. Row 1 is padded after
# its sample, row 2 packs two samples (positions restart) and is padded.
SAMPLES = [(0, 0, 16, 5), (1, 0, 9, 4), (2, 0, 6, 3), (2, 6, 7, 3)]
# Large enough that every term of the forward matters at float32 precision.
MATRIX_STD, BIAS_STD, LN_STD = 0.2, 0.1, 0.1
EPS = 1e-5
RMS_EPS = 1e-6

# A block: (norm, mlp, bias) as model.block names them; the manifest's codes
# follow the executor's enums (norm: 0 layernorm, 1 rmsnorm; mlp: 0 gelu,
# 1 relu, 2 gated_gelu).
GPT2_BLOCK = ("layernorm", "gelu", True)
NORM_CODES = {"layernorm": 0, "rmsnorm": 1}
MLP_CODES = {"gelu": 0, "relu": 1, "gated_gelu": 2}


def make_batch(gen):
    tokens = torch.full((ROWS, SEQ), PAD_TOKEN, dtype=torch.int64)
    positions = torch.zeros((ROWS, SEQ), dtype=torch.int64)
    segments = torch.full((ROWS, SEQ), -1, dtype=torch.int64)
    targets = torch.full((ROWS, SEQ), -1, dtype=torch.int64)
    next_segment = [0] * ROWS
    for row, offset, length, scored in SAMPLES:
        cells = slice(offset, offset + length)
        tokens[row, cells] = torch.randint(3, VOCAB, (length,), generator=gen)
        positions[row, cells] = torch.arange(length)
        segments[row, cells] = next_segment[row]
        next_segment[row] += 1
        # The last `scored` tokens of the sample are predicted by the
        # positions just before them.
        end = offset + length
        for p in range(end - 1 - scored, end - 1):
            targets[row, p] = tokens[row, p + 1]
    return tokens, positions, segments, targets


def make_params(gen, layers, tied, block=GPT2_BLOCK):
    """Name -> float64 tensor holding float32-representable values."""
    norm, mlp, bias = block
    width = 2 * FFN if mlp == "gated_gelu" else FFN  # gated: gate rows, then up rows
    specs = [("wte", (VOCAB, HIDDEN), "matrix"), ("wpe", (MAX_POSITIONS, HIDDEN), "matrix")]
    for l in range(layers):
        p = f"h.{l}."
        specs += [
            (p + "ln1.w", (HIDDEN,), "ln_w"), (p + "ln1.b", (HIDDEN,), "norm_bias"),
            (p + "attn.qkv.w", (3 * HIDDEN, HIDDEN), "matrix"), (p + "attn.qkv.b", (3 * HIDDEN,), "bias"),
            (p + "attn.proj.w", (HIDDEN, HIDDEN), "matrix"), (p + "attn.proj.b", (HIDDEN,), "bias"),
            (p + "ln2.w", (HIDDEN,), "ln_w"), (p + "ln2.b", (HIDDEN,), "norm_bias"),
            (p + "mlp.fc.w", (width, HIDDEN), "matrix"), (p + "mlp.fc.b", (width,), "bias"),
            (p + "mlp.proj.w", (HIDDEN, FFN), "matrix"), (p + "mlp.proj.b", (HIDDEN,), "bias"),
        ]
    specs += [("lnf.w", (HIDDEN,), "ln_w"), ("lnf.b", (HIDDEN,), "norm_bias")]
    if not tied:
        specs.append(("lm_head.w", (VOCAB, HIDDEN), "matrix"))
    # A block without biases has none of them; LayerNorm's shift is a bias,
    # and RMS norm has none.
    keep = {"matrix": True, "ln_w": True, "bias": bias, "norm_bias": bias and norm == "layernorm"}
    specs = [(n, shape, "bias" if kind == "norm_bias" else kind) for n, shape, kind in specs if keep[kind]]
    params = {}
    for name, shape, kind in specs:
        noise = torch.randn(shape, generator=gen, dtype=torch.float64)
        if kind == "matrix":
            value = MATRIX_STD * noise
        elif kind == "ln_w":
            value = 1.0 + LN_STD * noise
        else:
            value = BIAS_STD * noise
        params[name] = value.float().double().requires_grad_(True)
    return params


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def attention(qkv, segments):
    b, t, _ = qkv.shape
    hs = HIDDEN // HEADS
    q, k, v = qkv.split(HIDDEN, dim=2)
    q, k, v = (z.view(b, t, HEADS, hs).transpose(1, 2) for z in (q, k, v))  # (B, NH, T, hs)
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    same = segments[:, :, None] == segments[:, None, :]
    real = segments >= 0
    allowed = causal[None] & same & real[:, :, None]  # (B, T, T): query i, key j
    # Padding queries attend to nothing; let them see themselves so the softmax
    # is finite, then zero their output (so nothing flows back through them).
    allowed = allowed | (~real[:, :, None] & torch.eye(t, dtype=torch.bool)[None])
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(hs)
    scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    y = torch.softmax(scores, dim=-1) @ v  # (B, NH, T, hs)
    y = y.transpose(1, 2).reshape(b, t, HIDDEN)
    return y * real[:, :, None].to(y.dtype)


def norm(x, P, name, block):
    if block[0] == "rmsnorm":  # T5's: no centring, no shift
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + RMS_EPS) * P[name + ".w"]
    return F.layer_norm(x, (HIDDEN,), P[name + ".w"], P.get(name + ".b"), EPS)


def activation(h, block):
    if block[1] == "relu":
        return torch.relu(h)
    if block[1] == "gated_gelu":
        gate, up = h.split(FFN, dim=-1)
        return gelu_tanh(gate) * up
    return gelu_tanh(h)


def forward(params, layers, tied, tokens, positions, segments, targets, loss_scale, block=GPT2_BLOCK):
    P = params
    x = P["wte"][tokens] + P["wpe"][positions]
    for l in range(layers):
        p = f"h.{l}."
        a = norm(x, P, p + "ln1", block)
        qkv = F.linear(a, P[p + "attn.qkv.w"], P.get(p + "attn.qkv.b"))
        x = x + F.linear(attention(qkv, segments), P[p + "attn.proj.w"], P.get(p + "attn.proj.b"))
        m = norm(x, P, p + "ln2", block)
        hmid = activation(F.linear(m, P[p + "mlp.fc.w"], P.get(p + "mlp.fc.b")), block)
        x = x + F.linear(hmid, P[p + "mlp.proj.w"], P.get(p + "mlp.proj.b"))
    z = norm(x, P, "lnf", block)
    logits = F.linear(z, P["wte"] if tied else P["lm_head.w"]).reshape(-1, VOCAB)
    ce = F.cross_entropy(logits, targets.reshape(-1), ignore_index=-1, reduction="sum")
    return ce * loss_scale, logits


def check_packing(params, layers, tied, batch, loss_scale, loss, block):
    """The batched loss must equal the sum over samples each run alone."""
    tokens, positions, _, targets = batch
    total = 0.0
    for row, offset, length, _ in SAMPLES:
        cells = (slice(row, row + 1), slice(offset, offset + length))
        alone, _ = forward(params, layers, tied, tokens[cells], positions[cells],
                           torch.zeros((1, length), dtype=torch.int64), targets[cells], loss_scale, block)
        total += alone.item()
    assert abs(total - loss.item()) < 1e-12, (total, loss.item())


def write(name, layers, tied, seed, block=GPT2_BLOCK):
    gen = torch.Generator().manual_seed(seed)
    tokens, positions, segments, targets = make_batch(gen)
    params = make_params(gen, layers, tied, block)
    real_tokens = int((segments >= 0).sum())
    loss_tokens = int((targets >= 0).sum())
    batch = (tokens, positions, segments, targets)
    loss, logits = forward(params, layers, tied, *batch, 1.0 / loss_tokens, block)
    with torch.no_grad():
        check_packing(params, layers, tied, batch, 1.0 / loss_tokens, loss, block)
    loss.backward()

    entries = [
        ("tokens", tokens), ("positions", positions), ("segments", segments), ("targets", targets),
        ("loss", loss.detach().reshape(1)), ("logits", logits.detach()),
    ]
    entries += [("param/" + n, p.detach()) for n, p in params.items()]
    entries += [("grad/" + n, p.grad) for n, p in params.items()]

    lines = [
        f"# Generated by tests/golden/make_golden.py (torch {torch.__version__}); do not edit.",
        f"# config layers={layers} hidden={HIDDEN} heads={HEADS} ffn={FFN} vocab={VOCAB} "
        f"max_positions={MAX_POSITIONS} tie_embeddings={int(tied)}"
        + ("" if block == GPT2_BLOCK else
           f" norm={NORM_CODES[block[0]]} mlp={MLP_CODES[block[1]]} bias={int(block[2])}"),
        f"# batch rows={ROWS} seq={SEQ} real_tokens={real_tokens} loss_tokens={loss_tokens}",
    ]
    blob = bytearray()
    for tname, t in entries:
        dtype = "i32" if t.dtype == torch.int64 else "f32"
        lines.append(" ".join([tname, dtype] + [str(d) for d in t.shape]))
        blob += t.numpy().astype("<i4" if dtype == "i32" else "<f4").tobytes()
    with open(os.path.join(HERE, name + ".txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(HERE, name + ".bin"), "wb") as f:
        f.write(bytes(blob))
    print(f"{name}: loss {loss.item():.9f}, {len(entries)} tensors, {len(blob)} bytes")


def main():
    torch.set_default_dtype(torch.float64)
    write("gpt_golden", layers=4, tied=True, seed=20240601)
    write("gpt_golden_untied", layers=2, tied=False, seed=20240602)
    write("gpt_golden_t5_block", layers=2, tied=False, seed=20240603, block=("rmsnorm", "gated_gelu", False))
    write("gpt_golden_relu", layers=2, tied=True, seed=20240604, block=("layernorm", "relu", False))


if __name__ == "__main__":
    main()
