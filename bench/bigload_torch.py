#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""PyTorch's side of bench/bigload_bench.sh: a LLaMA model directory (bench/make_llama_dir.py) loaded
from its safetensors shards, then either LoRA training steps or KV-cached greedy generation, hand
written here as transformers and PEFT compute them (torch 1.13 has neither installed):
RMSNorm, rotary embeddings, grouped-query attention, SwiGLU MLP; LoRA on every projection as PEFT's
Linear: y = W x + (alpha / r) B(A(x)), A kaiming-uniform, B zero, base weights frozen.

    /usr/bin/python3 bench/bigload_torch.py DIR --mode train|generate [--precision fp32|bf16]
        [--steps 4] [--warmup 1] [--context 256] [--rank 16] [--alpha 32] [--tokens 64] [--threads 2]

fp32 widens the weights to float32 on load (torch's usual way); bf16 keeps float32 weights and runs
under torch.autocast("cpu", torch.bfloat16). Prints one JSON line: load seconds, tokens/s (median
step after warm-up), the step times.
"""
import argparse
import json
import math
import os
import statistics
import struct
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

ST_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}


def read_safetensors(path):
    """{name: tensor} of one file, through a memory map (torch.frombuffer over the mapped bytes)."""
    import mmap
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    (n,) = struct.unpack("<Q", mm[:8])
    header = json.loads(mm[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        dt = ST_DTYPES[e["dtype"]]
        t = torch.frombuffer(mm, dtype=dt, count=(end - b) // torch.tensor([], dtype=dt).element_size(), offset=8 + n + b)
        out[name] = t.view(e["shape"])
    return out


def load_dir(d):
    idx = os.path.join(d, "model.safetensors.index.json")
    files = sorted(set(json.load(open(idx))["weight_map"].values())) if os.path.exists(idx) else ["model.safetensors"]
    weights = {}
    for f in files:
        weights.update(read_safetensors(os.path.join(d, f)))
    return json.load(open(os.path.join(d, "config.json"))), weights


class LoraLinear(nn.Module):
    def __init__(self, w, r, alpha):
        super().__init__()
        self.weight = nn.Parameter(w, requires_grad=False)
        self.r = r
        if r:
            self.lora_A = nn.Parameter(torch.empty(r, w.shape[1]))
            self.lora_B = nn.Parameter(torch.zeros(w.shape[0], r))
            nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
            self.scaling = alpha / r

    def forward(self, x):
        y = F.linear(x, self.weight)
        if self.r:
            y = y + F.linear(F.linear(x, self.lora_A), self.lora_B) * self.scaling
        return y


def rms(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rope(x, cos, sin):
    h = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., h:], x[..., :h]), -1) * sin


class Llama(nn.Module):
    def __init__(self, c, w, r, alpha, dtype):
        super().__init__()
        self.c = c
        get = lambda n: w[n].to(dtype)
        self.embed = nn.Parameter(get("model.embed_tokens.weight"), requires_grad=False)
        self.layers = nn.ModuleList()
        names = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        for i in range(c["num_hidden_layers"]):
            p = f"model.layers.{i}."
            m = nn.Module()
            for n in names:
                part = "self_attn." if n.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else "mlp."
                setattr(m, n, LoraLinear(get(p + part + n + ".weight"), r, alpha))
            m.ln1 = nn.Parameter(get(p + "input_layernorm.weight"), requires_grad=False)
            m.ln2 = nn.Parameter(get(p + "post_attention_layernorm.weight"), requires_grad=False)
            self.layers.append(m)
        self.norm = nn.Parameter(get("model.norm.weight"), requires_grad=False)
        self.head = nn.Parameter(get("lm_head.weight"), requires_grad=False)
        hd = c["hidden_size"] // c["num_attention_heads"]
        self.hd = hd
        self.inv = 1.0 / (c.get("rope_theta", 10000.0) ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))

    def forward(self, ids, cache=None, pos0=0):
        c, hd = self.c, self.hd
        H, KV, eps = c["num_attention_heads"], c["num_key_value_heads"], c["rms_norm_eps"]
        B, T = ids.shape
        x = F.embedding(ids, self.embed)
        f = torch.outer(torch.arange(pos0, pos0 + T, dtype=torch.float32), self.inv)
        emb = torch.cat((f, f), -1)
        cos, sin = emb.cos(), emb.sin()
        for i, m in enumerate(self.layers):
            h = rms(x, m.ln1, eps)
            q = m.q_proj(h).view(B, T, H, hd).transpose(1, 2)
            k = m.k_proj(h).view(B, T, KV, hd).transpose(1, 2)
            v = m.v_proj(h).view(B, T, KV, hd).transpose(1, 2)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            if cache is not None:
                if i in cache:
                    k = torch.cat((cache[i][0], k), 2)
                    v = torch.cat((cache[i][1], v), 2)
                cache[i] = (k, v)
            k = k.repeat_interleave(H // KV, 1)
            v = v.repeat_interleave(H // KV, 1)
            S = k.shape[2]
            att = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
            mask = torch.ones(T, S, dtype=torch.bool).tril(S - T)
            att = att.masked_fill(~mask, float("-inf")).softmax(-1)
            x = x + m.o_proj((att @ v).transpose(1, 2).reshape(B, T, H * hd))
            h = rms(x, m.ln2, eps)
            x = x + m.down_proj(F.silu(m.gate_proj(h)) * m.up_proj(h))
        return F.linear(rms(x, self.norm, eps), self.head)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--mode", choices=["train", "generate"], default="train")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--alpha", type=float, default=32)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    c, w = load_dir(a.dir)
    model = Llama(c, w, a.rank if a.mode == "train" else 0, a.alpha, torch.float32)
    del w
    load_s = time.perf_counter() - t0
    vocab = c["vocab_size"]
    g = torch.Generator().manual_seed(1)
    auto = torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision == "bf16")
    times = []
    if a.mode == "train":
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3, weight_decay=0.1)
        for s in range(a.warmup + a.steps):
            ids = torch.randint(0, 65, (1, a.context + 1), generator=g)
            t = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            with auto:
                logits = model(ids[:, :-1])
                loss = F.cross_entropy(logits.float().view(-1, vocab), ids[:, 1:].reshape(-1))
            loss.backward()
            opt.step()
            if s >= a.warmup:
                times.append(time.perf_counter() - t)
        tps = a.context / statistics.median(times)
    else:
        with torch.no_grad(), auto:
            ids = torch.randint(0, 65, (1, 8), generator=g)
            cache = {}
            logits = model(ids, cache, 0)
            pos = ids.shape[1]
            for s in range(a.tokens):
                t = time.perf_counter()
                nxt = logits[:, -1].argmax(-1, keepdim=True)
                logits = model(nxt, cache, pos)
                pos += 1
                times.append(time.perf_counter() - t)
        tps = 1 / statistics.median(times[1:])
    print(json.dumps({"framework": "pytorch", "mode": a.mode, "precision": a.precision, "load_s": round(load_s, 2),
                      "tokens_per_s": round(tps, 2), "step_s": [round(x, 3) for x in times],
                      "threads": a.threads}))


if __name__ == "__main__":
    main()
