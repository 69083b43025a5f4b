#!/usr/bin/env python3
"""Our Hugging Face import and export against `transformers` itself, on a
machine that has it (the lent GPU machine; deploy/gpu_checks.sh runs this
there, on its CPU, and skips it where python3 lacks transformers). For each
family (GPT-2, T5 v1.0, T5 v1.1, Llama with 2 key-value heads for 4 query
heads, an untied head, rope_theta 500000 and rms_norm_eps 1e-5):

  in:  a small random model built by `transformers`, saved with
       save_pretrained (safetensors), its logits on a batch; our hf_logits
       loads the folder and must give the same logits;
  out: our hf_logits exports a model of ours (--export), and
       `transformers` loads it with from_pretrained and must give our logits.

    python3 tests/golden/hf_transformers_check.py HF_LOGITS WORKDIR

One line per check, then a summary; exit 0 only when all eight pass
(relative error of the logits <= 1e-4: float32 on both sides, other
summation orders; equal logits give equal losses).
"""

import subprocess
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, T5Config,
                          T5ForConditionalGeneration)

TOLERANCE = 1e-4
KINDS = ("gpt2", "t5", "t5-v1.1", "llama")
DECODERS = {"gpt2": GPT2LMHeadModel, "llama": LlamaForCausalLM}  # one token tensor in


def build(kind):
    torch.manual_seed(3)
    if kind == "gpt2":
        cfg = GPT2Config(vocab_size=97, n_positions=32, n_embd=64, n_layer=2, n_head=4, n_inner=128,
                         activation_function="gelu_new", resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)
        return GPT2LMHeadModel(cfg).eval()
    if kind == "llama":
        # initializer_range 0.2 (not 0.02): attention far from uniform, so
        # rotary positions and the key-value head each query reads matter.
        cfg = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32, rms_norm_eps=1e-5,
                          rope_theta=500000.0, rope_scaling=None, hidden_act="silu", tie_word_embeddings=False,
                          initializer_range=0.2, attention_dropout=0.0)
        return LlamaForCausalLM(cfg).eval()
    cfg = T5Config(vocab_size=97, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4,
                   relative_attention_num_buckets=8, relative_attention_max_distance=20, dropout_rate=0.0,
                   feed_forward_proj="gated-gelu" if kind == "t5-v1.1" else "relu",
                   tie_word_embeddings=kind == "t5", decoder_start_token_id=0)
    return T5ForConditionalGeneration(cfg).eval()


def logits(model, kind, batch):
    with torch.no_grad():
        if kind in DECODERS:
            out = model(input_ids=batch["tokens"].long()).logits
        else:
            out = model(input_ids=batch["enc_tokens"].long(), decoder_input_ids=batch["dec_tokens"].long()).logits
    return out.reshape(-1, out.shape[-1]).float()


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def check_in(tool, kind, d):
    model = build(kind)
    model.save_pretrained(d, safe_serialization=True)
    g = torch.Generator().manual_seed(9)
    if kind in DECODERS:
        batch = {"tokens": torch.randint(0, 97, (2, 12), generator=g, dtype=torch.int32)}
    else:
        dec = torch.randint(0, 97, (2, 12), generator=g, dtype=torch.int32)
        dec[:, 0] = 0
        batch = {"enc_tokens": torch.randint(0, 97, (2, 15), generator=g, dtype=torch.int32), "dec_tokens": dec}
    batch["logits"] = logits(model, kind, batch)
    save_file(batch, d + "/expected.safetensors")
    r = subprocess.run([tool, "--model", d, "--expected", d + "/expected.safetensors", "--tolerance", str(TOLERANCE)],
                       capture_output=True, text=True, timeout=120)
    return r.returncode == 0, (r.stdout + r.stderr).strip()


def check_out(tool, kind, d):
    r = subprocess.run([tool, "--export", kind, "--out", d], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        return False, (r.stdout + r.stderr).strip()
    cls = DECODERS.get(kind, T5ForConditionalGeneration)
    model = cls.from_pretrained(d).eval()
    expected = load_file(d + "/expected.safetensors")
    err = rel(logits(model, kind, expected), expected["logits"])
    return err <= TOLERANCE, f"{cls.__name__}.from_pretrained({d}): relative error {err:.3e}"


def main():
    tool, work = sys.argv[1], sys.argv[2]
    failed = 0
    for kind in KINDS:
        for name, check in (("in", check_in), ("out", check_out)):
            try:
                ok, text = check(tool, kind, f"{work}/{kind}-{name}")
            except Exception as e:  # a crash in either library is a failure, reported on one line
                ok, text = False, f"{type(e).__name__}: {e}"
            failed += not ok
            print(f"hf {kind} {name}: {'ok' if ok else 'FAIL'}: {text.splitlines()[-1] if text else ''}")
    print(f"hf round trip: {2 * len(KINDS) - failed}/{2 * len(KINDS)} passed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
