#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Parity fixtures for cgrad's LLaMA decoder (models/llama.c), in plain torch.

Rerun:  /usr/bin/python3 tests/make_llama_fixtures.py      (from the repository root or anywhere)
Needs torch (1.13 tested) and numpy only; it does not use `transformers`: the reference follows
Hugging Face's LlamaForCausalLM (modeling_llama.py) line for line (the helpers below; the attention,
MLP and blocks are make_family_fixtures.py's, shared with the other families):
  - LlamaRMSNorm: x * rsqrt(mean(x^2) + eps), computed in at least float32, times the gain;
  - rotary embeddings with rotate_half (the GPT-NeoX half-split pairing), inv_freq = theta^(-2i/d),
    cos/sin of cat(freqs, freqs), applied to q and k after the head split;
    rope_scaling "llama3" (LLaMA 3.1's frequency rescaling) as _compute_llama3_parameters does it;
  - grouped-query attention: repeat_kv repeats each of the num_key_value_heads K/V heads for
    num_attention_heads / num_key_value_heads query heads; scores / sqrt(head_dim), causal mask,
    softmax in at least float32;
  - LlamaMLP: down_proj(silu(gate_proj(x)) * up_proj(x));
  - pre-norm residual blocks, final model.norm, untied lm_head (no biases anywhere).
The script checks the reference against two independent re-derivations before writing anything:
the half-split rotation equals Meta's interleaved (complex-number) rotation after HF's q/k row
permutation, and repeat_kv attention equals a per-head loop over the shared K/V head.

Files in tests/fixtures/models/llama/ are laid out as make_model_fixtures.py documents (config.json,
weights.safetensors, batch.safetensors, expected.safetensors with logits, loss and grad.<name> for
every parameter, adamw.json, adamw.safetensors after 3 AdamW steps), plus
  weights_hf_buffers.safetensors  weights.safetensors plus the model.layers.{i}.self_attn.rotary_emb.inv_freq
                                  buffers older HF checkpoints carry: a loader must skip them.
Batch: input_ids [2,9], targets [2,9] (next token; row 1 is 6 tokens then pad id 0, its targets
from position 5 on are -100; targets[0,3] and the last column are -100).
Numerics as make_model_fixtures.py: float32 weights, float64 arithmetic, results rounded once.
"""

import math
import os
import sys

import numpy as np
import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_model_fixtures as mm  # noqa: E402  (the shared writer, run_family and float32 check)

torch.set_default_dtype(torch.float64)


def at_least_f32(x):
    return x.to(torch.promote_types(x.dtype, torch.float32))


class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        h = at_least_f32(x)  # HF: hidden_states.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def inv_freq(c, dim):
    f = 1.0 / (c.get("rope_theta", 10000.0) ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    rs = c.get("rope_scaling")
    if rs and rs.get("rope_type", rs.get("type")) == "llama3":
        factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        low_wl, high_wl = old / lo, old / hi
        wl = 2 * math.pi / f
        fl = torch.where(wl > low_wl, f / factor, f)
        smooth = (old / wl - lo) / (hi - lo)
        smoothed = (1 - smooth) * fl / factor + smooth * fl
        medium = ~(wl < high_wl) * ~(wl > low_wl)
        f = torch.where(medium, smoothed, fl)
    elif rs and rs.get("rope_type", rs.get("type")) == "linear":
        f = f / rs["factor"]
    return f


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rope_cos_sin(c, dim, positions):
    freqs = positions.to(torch.float64)[:, None] * inv_freq(c, dim)[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def repeat_kv(x, n_rep):
    b, hk, t, d = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(b, hk, n_rep, t, d).reshape(b, hk * n_rep, t, d)


def LlamaForCausalLM(c):
    """LlamaForCausalLM: the decoder of make_family_fixtures.py (its attention, MLP and blocks, written
    from the families' modelling code) on a plain llama config, where none of the families' additions
    applies: no biases, no window, no q/k norm, an untied head."""
    import make_family_fixtures as family  # noqa: E402  (here: it imports this module for RMSNorm and RoPE)
    assert c["model_type"] == "llama" and not (c.get("attention_bias") or c.get("mlp_bias") or
                                               c.get("tie_word_embeddings")), c
    return family.ForCausalLM(c)


def init_llama(model, seed):
    """RMSNorm gains 1+0.1*randn, embeddings 0.1*randn, matrices 0.08*randn; float32 draws from a
    seeded generator in named_parameters order."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if p.dim() == 1:
                v = 1.0 + 0.1 * r
            elif "embed_tokens" in name:
                v = 0.1 * r
            else:
                v = 0.08 * r
            p.copy_(v.to(p.dtype))


def check_rope_against_interleaved(c, hd):
    """Meta's LLaMA rotates interleaved pairs (2i, 2i+1) as complex numbers; HF permutes the q/k
    projection rows so that rotate_half on its weights gives the same scores. Both must agree."""
    g = torch.Generator().manual_seed(7)
    T, H, d = 9, 2, 16
    x = torch.randn(T, d, generator=g)
    w = torch.randn(H * hd, d, generator=g)
    pos = torch.arange(T)
    # Meta: interleaved pairs
    y = (x @ w.t()).view(T, H, hd // 2, 2)
    z = torch.view_as_complex(y.contiguous())
    ang = pos.to(torch.float64)[:, None] * inv_freq(c, hd)[None, :]
    meta = torch.view_as_real(z * torch.polar(torch.ones_like(ang), ang)[:, None, :]).reshape(T, H, hd)
    # HF: permuted rows, half-split rotation
    perm = w.view(H, hd // 2, 2, d).transpose(1, 2).reshape(H * hd, d)
    q = (x @ perm.t()).view(T, H, hd)
    cos, sin = rope_cos_sin(c, hd, pos)
    hf = q * cos[:, None, :] + rotate_half(q) * sin[:, None, :]
    # the permutation maps HF feature (j, half) to Meta feature (2j + half)
    back = hf.view(T, H, 2, hd // 2).transpose(2, 3).reshape(T, H, hd)
    err = float((back - meta).abs().max())
    assert err < 1e-12, err
    return err


def check_gqa_loop(model, ids):
    """Attention of layer 0 as a loop over query heads, each reading key head h // (Hq / Hk)."""
    a = model.model.layers[0].self_attn
    x = model.model.layers[0].input_layernorm(model.model.embed_tokens(ids))
    B, T, _ = x.shape
    cos, sin = rope_cos_sin(model.c, a.hd, torch.arange(T))
    q = a.q_proj(x).view(B, T, a.hq, a.hd)
    k = a.k_proj(x).view(B, T, a.hk, a.hd)
    v = a.v_proj(x).view(B, T, a.hk, a.hd)
    outs = []
    for h in range(a.hq):
        kh = h // (a.hq // a.hk)
        qh = q[:, :, h] * cos + rotate_half(q[:, :, h]) * sin
        khr = k[:, :, kh] * cos + rotate_half(k[:, :, kh]) * sin
        s = qh @ khr.transpose(1, 2) / math.sqrt(a.hd)
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        outs.append(torch.softmax(s, -1) @ v[:, :, kh])
    ref = a.o_proj(torch.cat(outs, -1))
    got = a(x, cos, sin)
    err = float((ref - got).abs().max())
    assert err < 1e-12, err
    return err


def llama_fixture():
    c = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 83, "hidden_size": 32,
         "intermediate_size": 88, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "max_position_embeddings": 16, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
         "rope_scaling": {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 64},
         "hidden_act": "silu", "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
         "attention_dropout": 0.0, "initializer_range": 0.02, "bos_token_id": 1, "eos_token_id": 2,
         "pretraining_tp": 1, "use_cache": True, "torch_dtype": "float32"}
    hd = c["hidden_size"] // c["num_attention_heads"]
    # the llama3 rescaling must touch every kind of frequency here: kept, smoothed and divided
    f0 = 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    ratio = (inv_freq(c, hd) / f0).tolist()
    assert ratio[0] == 1.0 and ratio[-1] == 0.25 and any(0.25 < r < 1 for r in ratio), ratio
    rope_err = check_rope_against_interleaved(c, hd)

    g = torch.Generator().manual_seed(5005)
    B, T, V = 2, 9, c["vocab_size"]
    ids = torch.randint(1, V, (B, T), generator=g)
    ids[1, 6:] = 0                      # row 1: 6 real tokens, then padding (token 0)
    tgt = torch.full((B, T), -100, dtype=torch.long)
    tgt[:, :-1] = ids[:, 1:]
    tgt[1, 5:] = -100
    tgt[0, 3] = -100
    batch = {"input_ids": ids, "targets": tgt}
    model = LlamaForCausalLM(c)

    def fwd(m, b):
        logits = m(b["input_ids"])
        return {"logits": logits, "loss": mm.ce(logits, b["targets"])}

    names = [n for n, _ in model.named_parameters()]
    assert names == list(model.state_dict().keys()) and "lm_head.weight" in names, names
    loss, losses, gap, out = mm.run_family("llama", model, batch, fwd, c, seed=5, init=init_llama)

    d = os.path.join(mm.OUT, "llama")
    w = mm.read_back(os.path.join(d, "weights.safetensors"))
    with torch.no_grad():
        m2 = LlamaForCausalLM(c)
        m2.load_state_dict({k: torch.from_numpy(v).double() for k, v in w.items()})
        gqa_err = check_gqa_loop(m2, ids)
        # causality: changing a later token leaves earlier logits alone
        ids2 = ids.clone()
        ids2[0, 6] = (ids2[0, 6] + 1) % V
        a, b2 = m2(ids), m2(ids2)
        assert torch.equal(a[0, :6], b2[0, :6]) and not torch.allclose(a[0, 6:], b2[0, 6:])
    hf = dict(w)
    for i in range(c["num_hidden_layers"]):
        hf["model.layers.%d.self_attn.rotary_emb.inv_freq" % i] = inv_freq(c, hd).numpy().astype(np.float32)
    mm.save_st(os.path.join(d, "weights_hf_buffers.safetensors"), hf)
    print("  llama rope: half-split vs interleaved %.1e; GQA repeat_kv vs per-head loop %.1e" % (rope_err, gqa_err))
    return loss, losses, gap


def main():
    torch.manual_seed(0)
    loss, losses, (dlog, gerr, perr, kerr) = llama_fixture()
    print("%-10s loss %.6f  adamw losses %s" % ("llama", loss, " ".join("%.6f" % l for l in losses)))
    print("  torch float32 vs these references: logits %.1e, grads %.1e of the largest |grad|, "
          "params after AdamW %.1e" % (dlog, gerr, perr))
    for path, size in mm.WRITTEN:
        print("  %7d  %s" % (size, os.path.relpath(path, os.path.dirname(mm.HERE))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
