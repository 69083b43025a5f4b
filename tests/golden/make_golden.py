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
  gpt_golden_llama      Llama's block (RMS norm eps 1e-5, SwiGLU, no biases,
                        rotary positions with base 500, 2 key-value heads for
                        4 query heads), separate lm_head.w, 2 layers
  t5_golden             T5 v1.0 (RMS norm, ReLU), tied head (scaled by
                        hidden^-0.5), 2 encoder + 2 decoder layers
  t5_golden_v11         T5 v1.1 (RMS norm, gated GELU), separate lm_head.w,
                        2 encoder + 3 decoder layers
T5's batch puts each sample's input in an encoder grid and its target in a
decoder grid, same row and segment (enc_tokens and enc_segments added to
the tensors; positions are zeros, T5's are relative).

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

import collections
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

# A block: (norm, mlp, bias) as model.block names them, then Llama's parts:
# rotary positions (no wpe; queries and keys rotated, rotate-half pairs), the
# key-value heads (grouped-query attention), the norm's eps (None: the norm's
# default) and the rotary base. The manifest's codes follow the executor's
# enums (norm: 0 layernorm, 1 rmsnorm; mlp: 0 gelu, 1 relu, 2 gated_gelu,
# 3 swiglu).
Block = collections.namedtuple("Block", "norm mlp bias rotary kv_heads eps rope_base",
                               defaults=(False, HEADS, None, 10000.0))
GPT2_BLOCK = Block("layernorm", "gelu", True)
# Llama's block at test size: 2 key-value heads for 4 query heads, a base
# small enough that every pair turns visibly over 16 positions.
LLAMA_BLOCK = Block("rmsnorm", "swiglu", False, rotary=True, kv_heads=2, eps=1e-5, rope_base=500.0)
NORM_CODES = {"layernorm": 0, "rmsnorm": 1}
MLP_CODES = {"gelu": 0, "relu": 1, "gated_gelu": 2, "swiglu": 3}


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
    block = Block(*block)
    norm, mlp, bias = block.norm, block.mlp, block.bias
    width = 2 * FFN if mlp in ("gated_gelu", "swiglu") else FFN  # gated: gate rows, then up rows
    qkv = HIDDEN + 2 * block.kv_heads * (HIDDEN // HEADS)  # [q | k | v] rows
    specs = [("wte", (VOCAB, HIDDEN), "matrix")]
    if not block.rotary:
        specs.append(("wpe", (MAX_POSITIONS, HIDDEN), "matrix"))
    for l in range(layers):
        p = f"h.{l}."
        specs += [
            (p + "ln1.w", (HIDDEN,), "ln_w"), (p + "ln1.b", (HIDDEN,), "norm_bias"),
            (p + "attn.qkv.w", (qkv, HIDDEN), "matrix"), (p + "attn.qkv.b", (qkv,), "bias"),
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


def rotate(z, positions, base):
    """RoPE as Hugging Face's Llama: pair (i, i + hs/2) turned by pos * base^(-2i/hs)."""
    hs = z.shape[-1]
    inv = base ** (-torch.arange(0, hs, 2, dtype=torch.float64) / hs)
    angle = positions[:, None, :, None].double() * inv  # (B, 1, T, hs/2)
    cos, sin = torch.cat([angle.cos()] * 2, -1), torch.cat([angle.sin()] * 2, -1)
    half = hs // 2
    turned = torch.cat([-z[..., half:], z[..., :half]], -1)
    return z * cos + turned * sin


def attention(qkv, segments, positions=None, block=GPT2_BLOCK):
    b, t, _ = qkv.shape
    hs = HIDDEN // HEADS
    kvh = block.kv_heads
    q, k, v = qkv.split([HIDDEN, kvh * hs, kvh * hs], dim=2)
    q = q.view(b, t, HEADS, hs).transpose(1, 2)  # (B, NH, T, hs)
    k, v = (z.view(b, t, kvh, hs).transpose(1, 2) for z in (k, v))  # (B, kvh, T, hs)
    if block.rotary:
        q, k = rotate(q, positions, block.rope_base), rotate(k, positions, block.rope_base)
    # Query head h reads key-value head h // (NH / kvh).
    k, v = (z.repeat_interleave(HEADS // kvh, dim=1) for z in (k, v))
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
    eps = Block(*block).eps
    if block[0] == "rmsnorm":  # T5's and Llama's: no centring, no shift
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + (eps or RMS_EPS)) * P[name + ".w"]
    return F.layer_norm(x, (HIDDEN,), P[name + ".w"], P.get(name + ".b"), eps or EPS)


def activation(h, block):
    if block[1] == "relu":
        return torch.relu(h)
    if block[1] == "gated_gelu":
        gate, up = h.split(FFN, dim=-1)
        return gelu_tanh(gate) * up
    if block[1] == "swiglu":
        gate, up = h.split(FFN, dim=-1)
        return F.silu(gate) * up
    return gelu_tanh(h)


def forward(params, layers, tied, tokens, positions, segments, targets, loss_scale, block=GPT2_BLOCK):
    P = params
    block = Block(*block)
    x = P["wte"][tokens] + (0 if block.rotary else P["wpe"][positions])
    for l in range(layers):
        p = f"h.{l}."
        a = norm(x, P, p + "ln1", block)
        qkv = F.linear(a, P[p + "attn.qkv.w"], P.get(p + "attn.qkv.b"))
        y = attention(qkv, segments, positions, block)
        x = x + F.linear(y, P[p + "attn.proj.w"], P.get(p + "attn.proj.b"))
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
    block = Block(*block)
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

    config_line = (f"# config layers={layers} hidden={HIDDEN} heads={HEADS} ffn={FFN} vocab={VOCAB} "
                   f"max_positions={MAX_POSITIONS} tie_embeddings={int(tied)}"
                   + ("" if block == GPT2_BLOCK else
                      f" norm={NORM_CODES[block[0]]} mlp={MLP_CODES[block[1]]} bias={int(block[2])}")
                   + ("" if not block.rotary else
                      f" rotary=1 kv_heads={block.kv_heads} norm_eps={block.eps!r} rope_base={block.rope_base!r}"))
    dump(name, entries, config_line,
         f"# batch rows={ROWS} seq={SEQ} real_tokens={real_tokens} loss_tokens={loss_tokens}", loss)


# ---- T5 ----------------------------------------------------------------

ENC_SEQ, BUCKETS, MAX_DISTANCE = 14, 8, 20
# (row, enc offset, enc length, dec offset, dec length, scored target tokens):
# row 0 one sample (both padded), row 1 one long input and a short target,
# row 2 two packed samples on each side.
T5_SAMPLES = [(0, 0, 12, 0, 16, 9), (1, 0, 14, 0, 5, 5), (2, 0, 6, 0, 7, 4), (2, 6, 5, 7, 8, 6)]


def make_t5_batch(gen):
    grids = {}
    for side, seq in (("enc", ENC_SEQ), ("dec", SEQ)):
        grids[side] = (torch.full((ROWS, seq), PAD_TOKEN, dtype=torch.int64),
                       torch.full((ROWS, seq), -1, dtype=torch.int64))
    targets = torch.full((ROWS, SEQ), -1, dtype=torch.int64)
    next_segment = [0] * ROWS
    for row, eo, el, do, dl, scored in T5_SAMPLES:
        seg = next_segment[row]
        next_segment[row] += 1
        for side, off, length in (("enc", eo, el), ("dec", do, dl)):
            tokens, segments = grids[side]
            tokens[row, off:off + length] = torch.randint(3, VOCAB, (length,), generator=gen)
            segments[row, off:off + length] = seg
        # The decoder's last `scored` positions are scored against labels of
        # their own (teacher forcing: any labels will do for a reference).
        targets[row, do + dl - scored:do + dl] = torch.randint(3, VOCAB, (scored,), generator=gen)
    return grids["enc"], grids["dec"], targets


def make_t5_params(gen, enc_layers, dec_layers, tied, block):
    _, mlp, _ = block
    width = 2 * FFN if mlp == "gated_gelu" else FFN
    specs = [("wte", (VOCAB, HIDDEN), "matrix"), ("enc.rel_bias", (BUCKETS, HEADS), "matrix")]
    for l in range(enc_layers):
        p = f"enc.{l}."
        specs += [(p + "ln1.w", (HIDDEN,), "ln_w"), (p + "attn.qkv.w", (3 * HIDDEN, HIDDEN), "matrix"),
                  (p + "attn.proj.w", (HIDDEN, HIDDEN), "matrix"), (p + "ln2.w", (HIDDEN,), "ln_w"),
                  (p + "mlp.fc.w", (width, HIDDEN), "matrix"), (p + "mlp.proj.w", (HIDDEN, FFN), "matrix")]
    specs += [("enc.lnf.w", (HIDDEN,), "ln_w"), ("dec.rel_bias", (BUCKETS, HEADS), "matrix")]
    for l in range(dec_layers):
        p = f"dec.{l}."
        specs += [(p + "ln1.w", (HIDDEN,), "ln_w"), (p + "attn.qkv.w", (3 * HIDDEN, HIDDEN), "matrix"),
                  (p + "attn.proj.w", (HIDDEN, HIDDEN), "matrix"), (p + "ln3.w", (HIDDEN,), "ln_w"),
                  (p + "xattn.q.w", (HIDDEN, HIDDEN), "matrix"), (p + "xattn.kv.w", (2 * HIDDEN, HIDDEN), "matrix"),
                  (p + "xattn.proj.w", (HIDDEN, HIDDEN), "matrix"), (p + "ln2.w", (HIDDEN,), "ln_w"),
                  (p + "mlp.fc.w", (width, HIDDEN), "matrix"), (p + "mlp.proj.w", (HIDDEN, FFN), "matrix")]
    specs.append(("lnf.w", (HIDDEN,), "ln_w"))
    if not tied:
        specs.append(("lm_head.w", (VOCAB, HIDDEN), "matrix"))
    params = {}
    for name, shape, kind in specs:
        noise = torch.randn(shape, generator=gen, dtype=torch.float64)
        value = MATRIX_STD * noise if kind == "matrix" else 1.0 + LN_STD * noise
        params[name] = value.float().double().requires_grad_(True)
    return params


def relative_bucket(relative, bidirectional):
    """T5's bucket of key position - query position (float32 logarithms, as T5)."""
    buckets, out = BUCKETS, torch.zeros_like(relative)
    if bidirectional:
        buckets //= 2
        out += (relative > 0).long() * buckets
        relative = relative.abs()
    else:
        relative = -torch.clamp(relative, max=0)
    exact = buckets // 2
    large = exact + (torch.log(relative.float() / exact) / math.log(MAX_DISTANCE / exact)
                     * (buckets - exact)).long()
    large = torch.clamp(large, max=buckets - 1)
    return out + torch.where(relative < exact, relative, large)


def t5_attention(q, k, v, seg_q, seg_k, causal, table):
    """Unscaled multi-head attention; q (B, Tq, C), k and v (B, Tk, C)."""
    b, tq, _ = q.shape
    tk = k.shape[1]
    hs = HIDDEN // HEADS
    q, k, v = (z.view(b, -1, HEADS, hs).transpose(1, 2) for z in (q, k, v))
    scores = q @ k.transpose(-1, -2)  # (B, NH, Tq, Tk)
    if table is not None:  # self-attention: positions are the grid's (samples are contiguous)
        rel = torch.arange(tk)[None, :] - torch.arange(tq)[:, None]
        scores = scores + table[relative_bucket(rel, not causal)].permute(2, 0, 1)[None]
    allowed = (seg_q[:, :, None] == seg_k[:, None, :]) & (seg_q >= 0)[:, :, None]
    if causal:
        allowed = allowed & torch.ones(tq, tk, dtype=torch.bool).tril()[None]
    real = allowed.any(-1)  # queries with a key to see; the others output zeros
    scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    scores = scores.masked_fill(~real[:, None, :, None], 0.0)
    y = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(b, tq, HIDDEN)
    return y * real[:, :, None].to(y.dtype)


def t5_forward(P, enc_layers, dec_layers, tied, enc, dec, targets, loss_scale, block):
    (enc_tokens, enc_seg), (dec_tokens, dec_seg) = enc, dec
    x = P["wte"][enc_tokens]
    for l in range(enc_layers):
        p = f"enc.{l}."
        q, k, v = F.linear(norm(x, P, p + "ln1", block), P[p + "attn.qkv.w"]).split(HIDDEN, dim=2)
        x = x + F.linear(t5_attention(q, k, v, enc_seg, enc_seg, False, P["enc.rel_bias"]), P[p + "attn.proj.w"])
        x = x + F.linear(activation(F.linear(norm(x, P, p + "ln2", block), P[p + "mlp.fc.w"]), block),
                         P[p + "mlp.proj.w"])
    e = norm(x, P, "enc.lnf", block)
    x = P["wte"][dec_tokens]
    for l in range(dec_layers):
        p = f"dec.{l}."
        q, k, v = F.linear(norm(x, P, p + "ln1", block), P[p + "attn.qkv.w"]).split(HIDDEN, dim=2)
        x = x + F.linear(t5_attention(q, k, v, dec_seg, dec_seg, True, P["dec.rel_bias"]), P[p + "attn.proj.w"])
        q = F.linear(norm(x, P, p + "ln3", block), P[p + "xattn.q.w"])
        k, v = F.linear(e, P[p + "xattn.kv.w"]).split(HIDDEN, dim=2)
        x = x + F.linear(t5_attention(q, k, v, dec_seg, enc_seg, False, None), P[p + "xattn.proj.w"])
        x = x + F.linear(activation(F.linear(norm(x, P, p + "ln2", block), P[p + "mlp.fc.w"]), block),
                         P[p + "mlp.proj.w"])
    z = norm(x, P, "lnf", block)
    logits = (F.linear(z * HIDDEN**-0.5, P["wte"]) if tied else F.linear(z, P["lm_head.w"])).reshape(-1, VOCAB)
    ce = F.cross_entropy(logits, targets.reshape(-1), ignore_index=-1, reduction="sum")
    return ce * loss_scale, logits


def check_t5_packing(P, enc_layers, dec_layers, tied, enc, dec, targets, loss_scale, loss, block):
    """The batched loss must equal the sum over samples each run alone."""
    total = 0.0
    for row, eo, el, do, dl, _ in T5_SAMPLES:
        e_cells, d_cells = (slice(row, row + 1), slice(eo, eo + el)), (slice(row, row + 1), slice(do, do + dl))
        alone, _ = t5_forward(P, enc_layers, dec_layers, tied, (enc[0][e_cells], torch.zeros((1, el), dtype=torch.int64)),
                              (dec[0][d_cells], torch.zeros((1, dl), dtype=torch.int64)), targets[d_cells],
                              loss_scale, block)
        total += alone.item()
    assert abs(total - loss.item()) < 1e-12, (total, loss.item())


def write_t5(name, enc_layers, dec_layers, tied, seed, block):
    gen = torch.Generator().manual_seed(seed)
    enc, dec, targets = make_t5_batch(gen)
    params = make_t5_params(gen, enc_layers, dec_layers, tied, block)
    loss_tokens = int((targets >= 0).sum())
    loss, logits = t5_forward(params, enc_layers, dec_layers, tied, enc, dec, targets, 1.0 / loss_tokens, block)
    with torch.no_grad():
        check_t5_packing(params, enc_layers, dec_layers, tied, enc, dec, targets, 1.0 / loss_tokens, loss, block)
    loss.backward()
    entries = [("tokens", dec[0]), ("positions", torch.zeros_like(dec[0])), ("segments", dec[1]),
               ("targets", targets), ("enc_tokens", enc[0]), ("enc_segments", enc[1]),
               ("loss", loss.detach().reshape(1)), ("logits", logits.detach())]
    entries += [("param/" + n, p.detach()) for n, p in params.items()]
    entries += [("grad/" + n, p.grad) for n, p in params.items()]
    header = (f"# config layers={enc_layers} decoder_layers={dec_layers} hidden={HIDDEN} heads={HEADS} ffn={FFN} "
              f"vocab={VOCAB} max_positions={MAX_POSITIONS} tie_embeddings={int(tied)} buckets={BUCKETS} "
              f"max_distance={MAX_DISTANCE} norm={NORM_CODES[block[0]]} mlp={MLP_CODES[block[1]]} bias=0")
    dump(name, entries, header, f"# batch rows={ROWS} seq={SEQ} enc_seq={ENC_SEQ} loss_tokens={loss_tokens}", loss)


def dump(name, entries, config_line, batch_line, loss):
    lines = [f"# Generated by tests/golden/make_golden.py (torch {torch.__version__}); do not edit.",
             config_line, batch_line]
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
    write("gpt_golden_llama", layers=2, tied=False, seed=20240607, block=LLAMA_BLOCK)
    write_t5("t5_golden", 2, 2, tied=True, seed=20240605, block=("rmsnorm", "relu", False))
    write_t5("t5_golden_v11", 2, 3, tied=False, seed=20240606, block=("rmsnorm", "gated_gelu", False))


if __name__ == "__main__":
    main()
