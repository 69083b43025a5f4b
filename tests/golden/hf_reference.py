#!/usr/bin/python3
"""An independent check of `dynapipe export`: GPT-2, T5 and Llama written
from Hugging Face's published architectures (GPT2LMHeadModel,
T5ForConditionalGeneration, LlamaForCausalLM) over the tensors of an
exported model.safetensors, by their Hugging Face names and layouts, read
with a small safetensors reader of its own; run in float64 on the batch of
expected.safetensors, its logits are compared with ours.

    /usr/bin/python3 tests/golden/hf_reference.py DIR
    /usr/bin/python3 tests/golden/hf_reference.py --make gpt2|t5|t5-v1.1|llama DIR

The second form is the other direction: random weights written in Hugging
Face's names and layouts by this script's own writer (GPT-2's Conv1D weights
(in, out), T5's and Llama's separate q, k, v, Llama's fewer key-value heads
and separate gate and up), with config.json and expected.safetensors
holding this reference's logits, for our loader to match
(tests/golden:hf_export_test runs hf_logits on them).

DIR holds model.safetensors and config.json (as `dynapipe export` writes
them) and expected.safetensors: `tokens` (I32, rows x seq) for GPT-2 and
Llama, or `enc_tokens` and `dec_tokens` for T5, and `logits` (F32, rows*seq
x vocab), our CPU backend's. For Llama an optional `segments` (I32, rows x
seq) packs several samples into a row: attention stays inside a sample and
rotary positions restart at each (absent: one sample per row). Prints the
relative error (L2 over all logits) and exits non-zero above 1e-5. Needs
Debian's python3-torch (deploy/setup.sh).
"""

import json
import math
import struct
import sys

import torch
import torch.nn.functional as F

DTYPES = {"F32": torch.float32, "F64": torch.float64, "I32": torch.int32, "I64": torch.int64}


def read_safetensors(path):
    """name -> tensor, from the format's definition: u64 header length, JSON, data."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        begin, end = t["data_offsets"]
        dtype = DTYPES[t["dtype"]]
        out[name] = torch.frombuffer(bytearray(data[begin:end]), dtype=dtype).reshape(t["shape"]).clone()
    return out


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


def gpt2_logits(W, cfg, tokens):
    """GPT2LMHeadModel: Conv1D weights are (in, out), so y = x @ W + b."""
    pre = "transformer." if "transformer.wte.weight" in W else ""
    g = lambda n: W[pre + n]
    C, H = cfg["n_embd"], cfg["n_head"]
    eps = cfg.get("layer_norm_epsilon", 1e-5)
    B, T = tokens.shape
    x = g("wte.weight")[tokens] + g("wpe.weight")[torch.arange(T)][None]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(cfg["n_layer"]):
        p = f"h.{i}."
        a = F.layer_norm(x, (C,), g(p + "ln_1.weight"), g(p + "ln_1.bias"), eps)
        qkv = a @ g(p + "attn.c_attn.weight") + g(p + "attn.c_attn.bias")
        q, k, v = (z.view(B, T, H, C // H).transpose(1, 2) for z in qkv.split(C, dim=2))
        s = (q @ k.transpose(-1, -2)) / math.sqrt(C // H)
        y = torch.softmax(s.masked_fill(~mask, float("-inf")), -1) @ v
        y = y.transpose(1, 2).reshape(B, T, C)
        x = x + y @ g(p + "attn.c_proj.weight") + g(p + "attn.c_proj.bias")
        m = F.layer_norm(x, (C,), g(p + "ln_2.weight"), g(p + "ln_2.bias"), eps)
        x = x + gelu_new(m @ g(p + "mlp.c_fc.weight") + g(p + "mlp.c_fc.bias")) @ g(p + "mlp.c_proj.weight") \
            + g(p + "mlp.c_proj.bias")
    x = F.layer_norm(x, (C,), g("ln_f.weight"), g("ln_f.bias"), eps)
    head = W["lm_head.weight"] if "lm_head.weight" in W else g("wte.weight")
    return (x @ head.T).reshape(B * T, -1)


def t5_bucket(rel, bidirectional, buckets, max_distance):
    """T5's relative position bucket of key position - query position."""
    out = torch.zeros_like(rel)
    if bidirectional:
        buckets //= 2
        out += (rel > 0).long() * buckets
        n = rel.abs()
    else:
        n = -torch.clamp(rel, max=0)
    exact = buckets // 2
    large = exact + (torch.log(n.float() / exact) / math.log(max_distance / exact) * (buckets - exact)).long()
    return out + torch.where(n < exact, n, torch.clamp(large, max=buckets - 1))


def t5_logits(W, cfg, enc_tokens, dec_tokens):
    """T5ForConditionalGeneration: RMS norm, unscaled attention with a relative
    bias from each stack's first block, cross-attention without one."""
    C, H, eps = cfg["d_model"], cfg["num_heads"], cfg.get("layer_norm_epsilon", 1e-6)
    nb, md = cfg["relative_attention_num_buckets"], cfg["relative_attention_max_distance"]
    gated = cfg["feed_forward_proj"] == "gated-gelu"

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    def attend(p, xq, xkv, bias, causal):
        B, Tq, Tk = xq.shape[0], xq.shape[1], xkv.shape[1]
        q, k, v = (t.view(B, -1, H, C // H).transpose(1, 2)
                   for t in (xq @ W[p + "q.weight"].T, xkv @ W[p + "k.weight"].T, xkv @ W[p + "v.weight"].T))
        s = q @ k.transpose(-1, -2)
        if bias is not None:
            s = s + bias
        if causal:
            s = s.masked_fill(~torch.ones(Tq, Tk, dtype=torch.bool).tril(), float("-inf"))
        y = (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(B, Tq, C)
        return y @ W[p + "o.weight"].T

    def ff(p, x):
        if gated:
            h = gelu_new(x @ W[p + "DenseReluDense.wi_0.weight"].T) * (x @ W[p + "DenseReluDense.wi_1.weight"].T)
        else:
            h = torch.relu(x @ W[p + "DenseReluDense.wi.weight"].T)
        return h @ W[p + "DenseReluDense.wo.weight"].T

    def position_bias(stack, T, bidirectional):
        rel = torch.arange(T)[None, :] - torch.arange(T)[:, None]
        table = W[f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"]
        return table[t5_bucket(rel, bidirectional, nb, md)].permute(2, 0, 1)[None]

    x = W["shared.weight"][enc_tokens]
    bias = position_bias("encoder", enc_tokens.shape[1], True)
    for i in range(cfg["num_layers"]):
        p = f"encoder.block.{i}.layer."
        n = rms(x, W[p + "0.layer_norm.weight"])
        x = x + attend(p + "0.SelfAttention.", n, n, bias, False)
        x = x + ff(p + "1.", rms(x, W[p + "1.layer_norm.weight"]))
    e = rms(x, W["encoder.final_layer_norm.weight"])
    x = W["shared.weight"][dec_tokens]
    bias = position_bias("decoder", dec_tokens.shape[1], False)
    for i in range(cfg["num_decoder_layers"]):
        p = f"decoder.block.{i}.layer."
        n = rms(x, W[p + "0.layer_norm.weight"])
        x = x + attend(p + "0.SelfAttention.", n, n, bias, True)
        x = x + attend(p + "1.EncDecAttention.", rms(x, W[p + "1.layer_norm.weight"]), e, None, False)
        x = x + ff(p + "2.", rms(x, W[p + "2.layer_norm.weight"]))
    x = rms(x, W["decoder.final_layer_norm.weight"])
    if cfg["tie_word_embeddings"]:
        logits = (x * C**-0.5) @ W["shared.weight"].T
    else:
        logits = x @ W["lm_head.weight"].T
    return logits.reshape(-1, logits.shape[-1])


def llama_logits(W, cfg, tokens, segments=None):
    """LlamaForCausalLM: Linear weights (out, in), so y = x @ W.T; RMS norm
    without a shift; rotary positions on q and k by rotate_half (pair (i,
    i + D/2) turned by position * rope_theta^(-2i/D)); each key-value head
    serves num_attention_heads / num_key_value_heads query heads (repeat_kv);
    down(silu(gate(x)) * up(x)). `segments` (B, T): packed samples, each
    attending only to itself, positions restarting at its first token."""
    C, H, L = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_hidden_layers"]
    KV = cfg.get("num_key_value_heads") or H
    D = cfg.get("head_dim") or C // H
    rope = cfg.get("rope_parameters") or {}  # transformers 5's place for RoPE's settings
    eps, theta = cfg.get("rms_norm_eps", 1e-6), rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
    assert cfg.get("rope_scaling") is None and rope.get("rope_type", "default") == "default"
    assert cfg.get("hidden_act", "silu") == "silu"
    B, T = tokens.shape
    if segments is None:
        segments = torch.zeros(B, T, dtype=torch.long)
    t = torch.arange(T)
    same = segments[:, :, None] == segments[:, None, :]
    mask = (same & (t[None, :, None] >= t[None, None, :]))[:, None]  # (B, 1, T, T)
    starts = torch.stack([torch.tensor([int((segments[b, :i + 1] == segments[b, i]).nonzero()[0])
                                        for i in range(T)]) for b in range(B)])
    positions = t[None, :] - starts  # (B, T): the token's place in its sample
    inv_freq = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    freqs = positions[..., None].double() * inv_freq  # (B, T, D/2)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[:, None], emb.sin()[:, None]  # (B, 1, T, D)

    def rms(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    def rotate_half(x):
        x1, x2 = x[..., :D // 2], x[..., D // 2:]
        return torch.cat((-x2, x1), dim=-1)

    def repeat_kv(x):
        n = H // KV
        return x[:, :, None].expand(B, KV, n, T, D).reshape(B, KV * n, T, D)

    x = W["model.embed_tokens.weight"][tokens]
    for i in range(L):
        p = f"model.layers.{i}."
        a = rms(x, W[p + "input_layernorm.weight"])
        q = (a @ W[p + "self_attn.q_proj.weight"].T).view(B, T, H, D).transpose(1, 2)
        k = (a @ W[p + "self_attn.k_proj.weight"].T).view(B, T, KV, D).transpose(1, 2)
        v = (a @ W[p + "self_attn.v_proj.weight"].T).view(B, T, KV, D).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = repeat_kv(k), repeat_kv(v)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(D)
        y = torch.softmax(s.masked_fill(~mask, float("-inf")), -1) @ v
        x = x + y.transpose(1, 2).reshape(B, T, H * D) @ W[p + "self_attn.o_proj.weight"].T
        m = rms(x, W[p + "post_attention_layernorm.weight"])
        h = F.silu(m @ W[p + "mlp.gate_proj.weight"].T) * (m @ W[p + "mlp.up_proj.weight"].T)
        x = x + h @ W[p + "mlp.down_proj.weight"].T
    x = rms(x, W["model.norm.weight"])
    head = W["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings", False) else W["lm_head.weight"]
    return (x @ head.T).reshape(B * T, -1)


def make_llama(rnd, g, V, C, H, F, L, B, T):
    """A small Llama with fewer key-value heads, an untied head and a rope
    base and norm eps other than the defaults; two samples packed in row 0."""
    KV, D = H // 2, C // H
    cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": C, "intermediate_size": F,
           "num_hidden_layers": L, "num_attention_heads": H, "num_key_value_heads": KV, "head_dim": D,
           "max_position_embeddings": 32, "vocab_size": V, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
           "rope_scaling": None, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
           "tie_word_embeddings": False}
    W = {"model.embed_tokens.weight": rnd(V, C)}
    for i in range(L):
        p = f"model.layers.{i}."
        W[p + "input_layernorm.weight"] = 1 + rnd(C, std=0.1)
        W[p + "post_attention_layernorm.weight"] = 1 + rnd(C, std=0.1)
        for n, shape in {"self_attn.q_proj": (H * D, C), "self_attn.k_proj": (KV * D, C),
                         "self_attn.v_proj": (KV * D, C), "self_attn.o_proj": (C, H * D), "mlp.gate_proj": (F, C),
                         "mlp.up_proj": (F, C), "mlp.down_proj": (C, F)}.items():
            W[p + n + ".weight"] = rnd(*shape)
    W["model.norm.weight"] = 1 + rnd(C, std=0.1)
    W["lm_head.weight"] = rnd(V, C)
    tokens = torch.randint(0, V, (B, T), generator=g, dtype=torch.int32)
    segments = torch.zeros(B, T, dtype=torch.int32)
    segments[0, 4:] = 1
    X = {"tokens": tokens, "segments": segments}
    logits = llama_logits({n: t.double() for n, t in W.items()}, cfg, tokens.long(), segments.long())
    return cfg, W, X, logits


def write_safetensors(path, tensors):
    """The format's definition: u64 header length, JSON (padded to 8), data."""
    header, blobs, at = {}, [], 0
    for name, t in tensors.items():
        t = t.contiguous()
        dtype = {torch.float32: "F32", torch.int32: "I32"}[t.dtype]
        data = t.numpy().tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [at, at + len(data)]}
        blobs.append(data)
        at += len(data)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def make(kind, d):
    """Random weights of a small model in Hugging Face's layout, and our reference's logits."""
    import os
    os.makedirs(d, exist_ok=True)
    g = torch.Generator().manual_seed(11)
    rnd = lambda *shape, std=0.2: (torch.randn(*shape, generator=g, dtype=torch.float64) * std).float()
    C, H, F, V, L, B, T = 64, 4, 128, 97, 2, 2, 10
    W = {}
    if kind == "llama":
        cfg, W, X, logits = make_llama(rnd, g, V, C, H, F, L, B, T)
    elif kind == "gpt2":
        cfg = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": C, "n_head": H, "n_layer": L,
               "n_positions": 32, "vocab_size": V, "n_inner": F, "activation_function": "gelu_new",
               "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True}
        W["transformer.wte.weight"], W["transformer.wpe.weight"] = rnd(V, C), rnd(32, C)
        for i in range(L):
            p = f"transformer.h.{i}."
            for n in ("ln_1", "ln_2"):
                W[p + n + ".weight"], W[p + n + ".bias"] = 1 + rnd(C, std=0.1), rnd(C, std=0.1)
            for n, (i_, o_) in {"attn.c_attn": (C, 3 * C), "attn.c_proj": (C, C), "mlp.c_fc": (C, F),
                                "mlp.c_proj": (F, C)}.items():
                W[p + n + ".weight"], W[p + n + ".bias"] = rnd(i_, o_), rnd(o_, std=0.1)
        W["transformer.ln_f.weight"], W["transformer.ln_f.bias"] = 1 + rnd(C, std=0.1), rnd(C, std=0.1)
        tokens = torch.randint(0, V, (B, T), generator=g, dtype=torch.int32)
        X = {"tokens": tokens}
        logits = gpt2_logits({n: t.double() for n, t in W.items()}, cfg, tokens.long())
    else:
        gated = kind == "t5-v1.1"
        cfg = {"model_type": "t5", "architectures": ["T5ForConditionalGeneration"], "d_model": C, "d_kv": C // H,
               "d_ff": F, "num_layers": L, "num_decoder_layers": L, "num_heads": H,
               "relative_attention_num_buckets": 8, "relative_attention_max_distance": 20, "vocab_size": V,
               "feed_forward_proj": "gated-gelu" if gated else "relu", "layer_norm_epsilon": 1e-6,
               "tie_word_embeddings": not gated, "is_encoder_decoder": True}
        W["shared.weight"] = rnd(V, C)
        for stack in ("encoder", "decoder"):
            for i in range(L):
                p = f"{stack}.block.{i}.layer."
                attn = ["0.SelfAttention."] + (["1.EncDecAttention."] if stack == "decoder" else [])
                for a in attn:
                    for n in "qkvo":
                        W[p + a + n + ".weight"] = rnd(C, C)
                if i == 0:
                    W[p + "0.SelfAttention.relative_attention_bias.weight"] = rnd(8, H)
                ff = "2." if stack == "decoder" else "1."
                for n in range(len(attn) + 1):
                    W[p + f"{n}.layer_norm.weight"] = 1 + rnd(C, std=0.1)
                for n in (["wi_0", "wi_1"] if gated else ["wi"]):
                    W[p + ff + "DenseReluDense." + n + ".weight"] = rnd(F, C)
                W[p + ff + "DenseReluDense.wo.weight"] = rnd(C, F)
            W[f"{stack}.final_layer_norm.weight"] = 1 + rnd(C, std=0.1)
        if gated:
            W["lm_head.weight"] = rnd(V, C)
        enc = torch.randint(0, V, (B, T + 3), generator=g, dtype=torch.int32)
        dec = torch.randint(0, V, (B, T), generator=g, dtype=torch.int32)
        dec[:, 0] = 0
        X = {"enc_tokens": enc, "dec_tokens": dec}
        logits = t5_logits({n: t.double() for n, t in W.items()}, cfg, enc.long(), dec.long())
    write_safetensors(d + "/model.safetensors", W)
    with open(d + "/config.json", "w") as f:
        json.dump(cfg, f)
    X["logits"] = logits.float()
    write_safetensors(d + "/expected.safetensors", X)
    print(f"wrote a random {kind} in Hugging Face's layout to {d}")


def main():
    if sys.argv[1] == "--make":
        make(sys.argv[2], sys.argv[3])
        return
    d = sys.argv[1]
    with open(d + "/config.json") as f:
        cfg = json.load(f)
    W = {n: t.double() for n, t in read_safetensors(d + "/model.safetensors").items()}
    X = read_safetensors(d + "/expected.safetensors")
    if cfg["model_type"] == "gpt2":
        got = gpt2_logits(W, cfg, X["tokens"].long())
    elif cfg["model_type"] == "llama":
        got = llama_logits(W, cfg, X["tokens"].long(), X["segments"].long() if "segments" in X else None)
    else:
        got = t5_logits(W, cfg, X["enc_tokens"].long(), X["dec_tokens"].long())
    ours = X["logits"].double()
    err = ((got - ours).norm() / ours.norm()).item()
    print(f"{cfg['architectures'][0]}: {tuple(ours.shape)} logits, relative error {err:.3e}")
    sys.exit(0 if err <= 1e-5 else 1)


if __name__ == "__main__":
    main()
