#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Parity fixtures for the Hugging Face families of cgrad's LLaMA-style decoder (models/llama.c):
Mistral, Qwen2, Qwen3, and LLaMA with the optional fields (biases, explicit head_dim, tied head).

Rerun:  /usr/bin/python3 tests/make_family_fixtures.py      (from the repository root or anywhere)
Needs torch (1.13 tested) and numpy only; `transformers` is not used: the reference below is the
LLaMA decoder (RMSNorm, half-split RoPE and repeat_kv GQA from make_llama_fixtures.py; SwiGLU) with
what each family's modelling file adds, following transformers' code (make_llama_fixtures.py builds
its plain LLaMA from these classes too):
  - MistralForCausalLM (modeling_mistral.py): sliding-window attention on every layer. The mask is
    masking_utils' sliding_window_causal_mask_function: causal (kv_idx <= q_idx) AND
    sliding_window_overlay (kv_idx > q_idx - sliding_window), so query i sees keys
    i - sliding_window < j <= i; head_dim may differ from hidden_size / num_attention_heads.
  - Qwen2ForCausalLM (modeling_qwen2.py): q_proj, k_proj, v_proj with bias=True, o_proj without;
    Qwen2Config.layer_types: "sliding_attention" on layers i >= max_window_layers when
    use_sliding_window (the window as Mistral's), "full_attention" before.
  - Qwen3ForCausalLM (modeling_qwen3.py): q_norm and k_norm, RMSNorm(head_dim, eps=rms_norm_eps),
    applied to q_proj(x).view(B, T, heads, head_dim) and k_proj(x).view(...) -- each head over its
    head_dim features -- before the transpose and RoPE; bias = attention_bias on q/k/v/o; an explicit
    head_dim; its windows as Qwen2's (an explicit layer_types overrides max_window_layers, and without
    use_sliding_window there is no window at all: transformers sets sliding_window to None).
  - MixtralForCausalLM (modeling_mixtral.py): Mistral's attention, and MixtralSparseMoeBlock in place
    of the MLP: router_logits = gate(x) over the B*T rows, routing_weights = softmax(router_logits) in
    at least float32, torch.topk(num_experts_per_tok), renormalised to sum 1; each expert
    (MixtralBlockSparseTop2MLP: w2(silu(w1(x)) * w3(x))) runs on the rows torch.where picks from the
    one-hot expert mask, its output times the row's routing weight index_add_'ed into the result. The
    loss adds router_aux_loss_coef * load_balancing_loss_func(router logits of every layer) when
    output_router_logits: the logits concatenated over layers, softmax, top-k one-hot averaged over
    rows ([k, E]) times the mean probability per expert, summed, times num_experts.
  - LlamaForCausalLM's optional fields: attention_bias (q/k/v/o biases), mlp_bias
    (gate/up/down biases), head_dim, tie_word_embeddings (lm_head is embed_tokens: one parameter whose
    gradient holds both uses).
Before writing, the script checks that no token of a Mixtral fixture sits near a routing tie (the
top-k choice is piecewise constant), the sliding-window attention against a per-query loop over the
keys it may see, and Qwen3's q/k norm against a per-head loop.

Files in tests/fixtures/models/<name>/ (mistral, qwen2, qwen3, llama_ext, mixtral, mixtral_noaux), laid out as
make_model_fixtures.py documents: config.json, weights.safetensors, batch.safetensors,
expected.safetensors (logits, loss, grad.<name> of every parameter), adamw.json, adamw.safetensors.
Batch: input_ids [2,11] and targets [2,11] (next token; row 1 is 8 tokens then pad id 0, its targets
from position 7 on are -100; targets[0,3] and the last column are -100): longer than every window.
Numerics as make_model_fixtures.py: float32 weights, float64 arithmetic, results rounded once.
"""

import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_model_fixtures as mm  # noqa: E402  (the shared writer, run_family and float32 check)
import make_llama_fixtures as ml  # noqa: E402  (RMSNorm, RoPE, repeat_kv, MLP of LLaMA)

torch.set_default_dtype(torch.float64)


def layer_window(c, i):
    """The sliding window of layer i (None: full attention), as the families' configs decide it."""
    mt = c["model_type"]
    if mt in ("mistral", "mixtral"):
        return c.get("sliding_window")
    if mt in ("qwen2", "qwen3"):
        w = c.get("sliding_window") if c.get("use_sliding_window") else None
        types = c.get("layer_types") or ["sliding_attention" if w is not None and j >= c["max_window_layers"]
                                         else "full_attention" for j in range(c["num_hidden_layers"])]
        return w if types[i] == "sliding_attention" else None
    return None


def visible(T, window):
    """masking_utils: causal_mask_function AND sliding_window_overlay -> bool [T, T], True = attend."""
    q = torch.arange(T)[:, None]
    kv = torch.arange(T)[None, :]
    m = kv <= q
    if window is not None:
        m = m & (kv > q - window)
    return m


class Attention(nn.Module):
    def __init__(self, c, layer):
        super().__init__()
        d, self.hq, self.hk = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
        self.hd = c.get("head_dim") or d // self.hq
        mt = c["model_type"]
        qkv_bias = mt == "qwen2" or c.get("attention_bias", False)
        o_bias = mt != "qwen2" and c.get("attention_bias", False)
        self.q_proj = nn.Linear(d, self.hq * self.hd, bias=qkv_bias)
        self.k_proj = nn.Linear(d, self.hk * self.hd, bias=qkv_bias)
        self.v_proj = nn.Linear(d, self.hk * self.hd, bias=qkv_bias)
        self.o_proj = nn.Linear(self.hq * self.hd, d, bias=o_bias)
        if mt == "qwen3":
            self.q_norm = ml.RMSNorm(self.hd, c["rms_norm_eps"])
            self.k_norm = ml.RMSNorm(self.hd, c["rms_norm_eps"])
        self.window = layer_window(c, layer)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.hq, self.hd)
        k = self.k_proj(x).view(B, T, self.hk, self.hd)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.hk, self.hd).transpose(1, 2)
        q = q * cos + ml.rotate_half(q) * sin
        k = k * cos + ml.rotate_half(k) * sin
        k, v = ml.repeat_kv(k, self.hq // self.hk), ml.repeat_kv(v, self.hq // self.hk)
        s = q @ k.transpose(2, 3) / math.sqrt(self.hd)
        s = s.masked_fill(~visible(T, self.window), float("-inf"))
        w = F.softmax(ml.at_least_f32(s), dim=-1).to(q.dtype)
        y = (w @ v).transpose(1, 2).reshape(B, T, self.hq * self.hd)
        return self.o_proj(y)


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, f, b = c["hidden_size"], c["intermediate_size"], c.get("mlp_bias", False)
        self.gate_proj = nn.Linear(d, f, bias=b)
        self.up_proj = nn.Linear(d, f, bias=b)
        self.down_proj = nn.Linear(f, d, bias=b)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class ExpertMLP(nn.Module):
    """MixtralBlockSparseTop2MLP: w1 is the gate, w3 the up projection, w2 the down projection."""

    def __init__(self, c):
        super().__init__()
        d, f = c["hidden_size"], c["intermediate_size"]
        self.w1 = nn.Linear(d, f, bias=False)
        self.w2 = nn.Linear(f, d, bias=False)
        self.w3 = nn.Linear(d, f, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class SparseMoeBlock(nn.Module):
    """MixtralSparseMoeBlock (router_jitter_noise 0): returns the output and the router logits [B*T, E]."""

    def __init__(self, c):
        super().__init__()
        self.num_experts, self.top_k = c["num_local_experts"], c["num_experts_per_tok"]
        self.gate = nn.Linear(c["hidden_size"], self.num_experts, bias=False)
        self.experts = nn.ModuleList(ExpertMLP(c) for _ in range(self.num_experts))

    def forward(self, x):
        B, T, D = x.shape
        h = x.reshape(-1, D)
        router_logits = self.gate(h)
        routing_weights = F.softmax(ml.at_least_f32(router_logits), dim=1)
        routing_weights, selected = torch.topk(routing_weights, self.top_k, dim=-1)
        routing_weights = (routing_weights / routing_weights.sum(dim=-1, keepdim=True)).to(h.dtype)
        out = torch.zeros_like(h)
        expert_mask = F.one_hot(selected, num_classes=self.num_experts).permute(2, 1, 0)
        for e in range(self.num_experts):
            idx, top_x = torch.where(expert_mask[e])
            y = self.experts[e](h[top_x]) * routing_weights[top_x, idx, None]
            out = out.index_add(0, top_x, y.to(h.dtype))
        return out.reshape(B, T, D), router_logits


def load_balancing_loss(router_logits, num_experts, top_k):
    """load_balancing_loss_func without an attention mask."""
    logits = torch.cat(router_logits, dim=0)
    p = F.softmax(logits, dim=-1)
    _, selected = torch.topk(p, top_k, dim=-1)
    mask = F.one_hot(selected, num_experts)
    tokens_per_expert = torch.mean(mask.to(p.dtype), dim=0)
    prob_per_expert = torch.mean(p, dim=0)
    return torch.sum(tokens_per_expert * prob_per_expert.unsqueeze(0)) * num_experts


class Layer(nn.Module):
    def __init__(self, c, i):
        super().__init__()
        self.self_attn = Attention(c, i)
        if c["model_type"] == "mixtral":
            self.block_sparse_moe = SparseMoeBlock(c)
        else:
            self.mlp = MLP(c)
        self.input_layernorm = ml.RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.post_attention_layernorm = ml.RMSNorm(c["hidden_size"], c["rms_norm_eps"])

    def forward(self, x, cos, sin, router_logits=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        h = self.post_attention_layernorm(x)
        if hasattr(self, "mlp"):
            return x + self.mlp(h)
        y, logits = self.block_sparse_moe(h)
        if router_logits is not None:
            router_logits.append(logits)
        return x + y


class Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(Layer(c, i) for i in range(c["num_hidden_layers"]))
        self.norm = ml.RMSNorm(c["hidden_size"], c["rms_norm_eps"])


class ForCausalLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.model = Model(c)
        self.tied = c.get("tie_word_embeddings", False)
        if not self.tied:
            self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)

    def forward(self, ids, router_logits=None):
        T = ids.shape[1]
        hd = self.model.layers[0].self_attn.hd
        cos, sin = ml.rope_cos_sin(self.c, hd, torch.arange(T))
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, cos.to(x.dtype), sin.to(x.dtype), router_logits)
        h = self.model.norm(x)
        return h @ self.model.embed_tokens.weight.t() if self.tied else self.lm_head(h)


def init_family(model, seed):
    """As make_llama_fixtures.init_llama (norm gains 1+0.1*randn, embeddings 0.1*randn, matrices
    0.08*randn), and biases 0.05*randn; float32 draws in named_parameters order."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if name.endswith(".bias"):
                v = 0.05 * r
            elif p.dim() == 1:
                v = 1.0 + 0.1 * r
            elif "embed_tokens" in name:
                v = 0.1 * r
            else:
                v = 0.08 * r
            p.copy_(v.to(p.dtype))


def check_window_loop(model, ids):
    """Each windowed layer's attention against a loop over queries, each attending over the keys
    max(0, i - window + 1) .. i by a plain softmax: the mask must be exactly transformers' band."""
    worst, checked = 0.0, 0
    x = model.model.embed_tokens(ids)
    T = ids.shape[1]
    for layer in model.model.layers:
        a = layer.self_attn
        h = layer.input_layernorm(x)
        cos, sin = ml.rope_cos_sin(model.c, a.hd, torch.arange(T))
        if a.window is not None:
            B = h.shape[0]
            q = a.q_proj(h).view(B, T, a.hq, a.hd)
            k = a.k_proj(h).view(B, T, a.hk, a.hd)
            if hasattr(a, "q_norm"):
                q, k = a.q_norm(q), a.k_norm(k)
            q, k = q.transpose(1, 2), k.transpose(1, 2)
            v = a.v_proj(h).view(B, T, a.hk, a.hd).transpose(1, 2)
            q = q * cos + ml.rotate_half(q) * sin
            k = k * cos + ml.rotate_half(k) * sin
            rep = a.hq // a.hk
            out = torch.zeros(B, a.hq, T, a.hd)
            for hh in range(a.hq):
                for i in range(T):
                    lo = max(0, i - a.window + 1)
                    s = q[:, hh, i:i + 1] @ k[:, hh // rep, lo:i + 1].transpose(1, 2) / math.sqrt(a.hd)
                    out[:, hh, i] = (torch.softmax(s, -1) @ v[:, hh // rep, lo:i + 1])[:, 0]
            ref = a.o_proj(out.transpose(1, 2).reshape(B, T, a.hq * a.hd))
            worst = max(worst, float((ref - a(h, cos, sin)).abs().max()))
            checked += 1
        x = layer(x, cos, sin)
    assert worst < 1e-12, worst
    return worst, checked


def check_qk_norm_loop(model, ids):
    """Qwen3's q_norm as a loop over heads: each head's head_dim features normalised on their own."""
    a = model.model.layers[0].self_attn
    h = model.model.layers[0].input_layernorm(model.model.embed_tokens(ids))
    B, T, _ = h.shape
    q = a.q_proj(h)
    eps = a.q_norm.eps
    parts = []
    for hh in range(a.hq):
        x = q[..., hh * a.hd:(hh + 1) * a.hd]
        parts.append(x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * a.q_norm.weight)
    ref = torch.stack(parts, 2)
    err = float((ref - a.q_norm(q.view(B, T, a.hq, a.hd))).abs().max())
    assert err < 1e-12, err
    return err


def batch_for(c, seed):
    g = torch.Generator().manual_seed(seed)
    B, T, V = 2, 11, c["vocab_size"]
    ids = torch.randint(1, V, (B, T), generator=g)
    ids[1, 8:] = 0                       # row 1: 8 real tokens, then padding (token 0)
    tgt = torch.full((B, T), -100, dtype=torch.long)
    tgt[:, :-1] = ids[:, 1:]
    tgt[1, 7:] = -100
    tgt[0, 3] = -100
    return {"input_ids": ids, "targets": tgt}


def base(model_type, cls, **kw):
    c = {"architectures": [cls], "model_type": model_type, "vocab_size": 71, "hidden_size": 32,
         "intermediate_size": 56, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "max_position_embeddings": 32, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu",
         "tie_word_embeddings": False, "attention_dropout": 0.0, "initializer_range": 0.02,
         "bos_token_id": 1, "eos_token_id": 2, "use_cache": True, "torch_dtype": "float32",
         "transformers_version": "4.53.0"}
    c.update(kw)
    return c


FAMILIES = [
    # Mistral: every layer windowed (3 keys of 11), head_dim 12 though hidden / heads is 8
    ("mistral", base("mistral", "MistralForCausalLM", sliding_window=3, head_dim=12, rope_theta=1000000.0), 601),
    # Qwen2: q/k/v biases, the tied head, layer 0 full and layers 1.. windowed (use_sliding_window)
    ("qwen2", base("qwen2", "Qwen2ForCausalLM", num_hidden_layers=3, use_sliding_window=True, sliding_window=4,
                   max_window_layers=1, tie_word_embeddings=True, rope_theta=1000000.0), 602),
    # Qwen3: per-head q/k RMSNorm, head_dim 16 against hidden / heads = 8, no biases; layer_types (which
    # overrides max_window_layers) puts a window of 4 on layer 1
    ("qwen3", base("qwen3", "Qwen3ForCausalLM", head_dim=16, attention_bias=False, use_sliding_window=True,
                   sliding_window=4, max_window_layers=28, layer_types=["full_attention", "sliding_attention"],
                   rms_norm_eps=1e-5, rope_scaling={"rope_type": "linear", "factor": 2.0}), 603),
    # LLaMA's optional fields: attention_bias, mlp_bias, head_dim, a tied head
    ("llama_ext", base("llama", "LlamaForCausalLM", head_dim=12, attention_bias=True, mlp_bias=True,
                       tie_word_embeddings=True, pretraining_tp=1, rope_theta=500000.0), 604),
    # Mixtral: 4 experts of width 24, 2 a token, the load-balancing loss in the loss (a coefficient large
    # enough to move it and the router's gradients well past the tolerances), a window of 5 keys
    ("mixtral", base("mixtral", "MixtralForCausalLM", intermediate_size=24, num_local_experts=4,
                     num_experts_per_tok=2, router_aux_loss_coef=0.05, output_router_logits=True,
                     router_jitter_noise=0.0, sliding_window=5, rms_norm_eps=1e-5, rope_theta=1000000.0), 605),
    # Mixtral without the auxiliary loss (output_router_logits false): 3 experts, 2 a token, no window
    ("mixtral_noaux", base("mixtral", "MixtralForCausalLM", intermediate_size=20, num_local_experts=3,
                           num_experts_per_tok=2, router_aux_loss_coef=0.05, output_router_logits=False,
                           sliding_window=None, rms_norm_eps=1e-5, rope_theta=1000000.0), 606),
]


def routing_margin(model, ids):
    """The smallest gap between a token's k-th and (k+1)-th router probability over every layer: the
    C side must pick the same experts, so the fixture keeps away from ties."""
    logits = []
    model(ids, logits)
    worst = float("inf")
    for lg in logits:
        p = torch.sort(F.softmax(lg, -1), -1, descending=True).values
        k = model.c["num_experts_per_tok"]
        worst = min(worst, float((p[:, k - 1] - p[:, k]).min()) if k < p.shape[1] else float("inf"))
    return worst


def family_fixture(name, c, seed):
    batch = batch_for(c, seed)
    model = ForCausalLM(c)

    moe = c["model_type"] == "mixtral"

    def fwd(m, b):
        router = [] if moe else None
        logits = m(b["input_ids"], router)
        out = {"logits": logits, "loss": mm.ce(logits, b["targets"])}
        if moe:
            out["aux_loss"] = load_balancing_loss(router, c["num_local_experts"], c["num_experts_per_tok"])
            if c["output_router_logits"]:
                out["loss"] = out["loss"] + c["router_aux_loss_coef"] * out["aux_loss"]
        return out

    loss, losses, gap, _ = mm.run_family(name, model, batch, fwd, c, seed=seed, init=init_family,
                                         extra_expected_keys=("aux_loss",) if moe else ())
    with torch.no_grad():
        if moe:
            init_family(model, seed)  # the margins of the weights the fixture starts from
            margin = routing_margin(model, batch["input_ids"])
            assert margin > 1e-3, (name, margin)
            print("  %s: every token's top-%d router probabilities clear the next by >= %.1e" %
                  (name, c["num_experts_per_tok"], margin))
        werr, nwin = check_window_loop(model, batch["input_ids"])
        qerr = check_qk_norm_loop(model, batch["input_ids"]) if c["model_type"] == "qwen3" else None
        # the window matters: with full attention instead, the logits of the last positions change
        if nwin:
            saved = [layer.self_attn.window for layer in model.model.layers]
            for layer in model.model.layers:
                layer.self_attn.window = None
            full = model(batch["input_ids"])
            for layer, w in zip(model.model.layers, saved):
                layer.self_attn.window = w
            moved = float((full - model(batch["input_ids"])).abs().max())
            assert moved > 1e-3, moved
            print("  %s: %d windowed layers match a per-query loop (%.1e); full attention would move the logits "
                  "by %.3f" % (name, nwin, werr, moved))
        if qerr is not None:
            print("  %s: q_norm matches a per-head loop (%.1e)" % (name, qerr))
    return loss, losses, gap


def main():
    torch.manual_seed(0)
    for name, c, seed in FAMILIES:
        loss, losses, (dlog, gerr, perr, kerr) = family_fixture(name, c, seed)
        print("%-10s loss %.6f  adamw losses %s" % (name, loss, " ".join("%.6f" % v for v in losses)))
        print("  torch float32 vs these references: logits %.1e, grads %.1e of the largest |grad|, "
              "params after AdamW %.1e" % (dlog, gerr, perr))
    for path, size in mm.WRITTEN:
        print("  %7d  %s" % (size, os.path.relpath(path, os.path.dirname(mm.HERE))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
