#!/usr/bin/python3
"""An independent check of `dynapipe export`: GPT-2 and T5 written from
Hugging Face's published architectures (GPT2LMHeadModel,
T5ForConditionalGeneration) over the tensors of an exported
model.safetensors, by their Hugging Face names and layouts, read with a
small safetensors reader of its own; run in float64 on the batch of
expected.safetensors, its logits are compared with ours.

    /usr/bin/python3 tests/golden/hf_reference.py DIR

DIR holds model.safetensors and config.json (as `dynapipe export` writes
them) and expected.safetensors: `tokens` (I32, rows x seq) for GPT-2, or
`enc_tokens` and `dec_tokens` for T5, and `logits` (F32, rows*seq x vocab),
our CPU backend's. Prints the relative error (L2 over all logits) and exits
non-zero above 1e-5. Needs Debian's python3-torch (deploy/setup.sh).
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
    eps = cfg["layer_norm_epsilon"]
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
    C, H, eps = cfg["d_model"], cfg["num_heads"], cfg["layer_norm_epsilon"]
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


def main():
    d = sys.argv[1]
    with open(d + "/config.json") as f:
        cfg = json.load(f)
    W = {n: t.double() for n, t in read_safetensors(d + "/model.safetensors").items()}
    X = read_safetensors(d + "/expected.safetensors")
    if cfg["model_type"] == "gpt2":
        got = gpt2_logits(W, cfg, X["tokens"].long())
    else:
        got = t5_logits(W, cfg, X["enc_tokens"].long(), X["dec_tokens"].long())
    ours = X["logits"].double()
    err = ((got - ours).norm() / ours.norm()).item()
    print(f"{cfg['architectures'][0]}: {tuple(ours.shape)} logits, relative error {err:.3e}")
    sys.exit(0 if err <= 1e-5 else 1)


if __name__ == "__main__":
    main()
