#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""The cgrad benchmark configs in PyTorch (torch 1.13, Debian's python3-torch), for bench/compare.sh.

Same shapes, AdamW, dropout 0, random token data; a timed step is zero_grad + forward + loss +
backward + optimizer.step, and the median over the timed steps after warm-up is reported. Each
run is its own subprocess, so its peak RSS (ru_maxrss) is its own, and the BLAS library, its
thread count and kernel set and OpenMP's wait policy, all read when libraries load, can differ.

PyTorch is measured at its best on this machine, per thread budget (1 or 2 cores):
  - fp32 on each BLAS torch can load: OpenBLAS and BLIS (BLIS with --blis-kernels, the set cgrad
    runs). The library is chosen with LD_LIBRARY_PATH, the system is left as it is.
  - bf16 mixed precision: torch.autocast("cpu", dtype=torch.bfloat16) around forward and loss
    (oneDNN's bf16 kernels). torch 1.13 fails on the BERT reference's LayerNorm: reported n/a.
  - thread splits (torch intra-op threads, BLAS threads) within the budget and OMP_WAIT_POLICY
    unset or passive, swept once per variant on gpt-tiny; each config then runs every variant at
    its best setting, and the fastest fp32 and the fastest bf16 are reported.

    /usr/bin/python3 bench/torch_bench.py [--config NAME|all] [--steps N] [--warmup N] [--gen]
                                         [--budgets 1,2] [--blis-kernels NAME]
                                         [--threads T --blas-threads B]   (fixed split, no sweep)

Prints one JSON line per config and budget, tagged "framework":"pytorch", with the fields of
`cgrad bench` for the fastest fp32 variant, plus bf16_* fields and every variant's time.
"""
import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time

CONFIGS = {
    "gpt-tiny": dict(arch="gpt2", vocab=256, ctx=256, d=256, heads=4, layers=4, batch=16, t=256),
    "gpt-small": dict(arch="gpt2", vocab=50304, ctx=1024, d=768, heads=12, layers=12, batch=4, t=256),
    "bert-small": dict(arch="bert", vocab=30522, ctx=512, d=256, heads=4, layers=4, ff=1024, batch=16, t=128),
    "encdec-base": dict(arch="encdec", vocab=8000, d=512, heads=8, layers=3, ff=2048, batch=16, t=64, s=64),
    "gpt-tiny-4k": dict(arch="gpt2", vocab=256, ctx=4096, d=256, heads=4, layers=4, batch=1, t=4096),
    # gpt-tiny as LLaMA, as cgrad bench's llama-tiny: SwiGLU width 688, 2 key/value heads, untied head
    "llama-tiny": dict(arch="llama", vocab=256, ctx=256, d=256, heads=4, kv_heads=2, layers=4, ff=688, batch=16,
                       t=256),
}
MLM_FULL = False  # --mlm-full: BERT's MLM head over every position, as Hugging Face computes it


def blas_library():
    """Path of the libblas.so.3 torch loaded (LD_LIBRARY_PATH or Debian's alternative); OpenBLAS's
    LAPACK may be mapped beside BLIS, but BLAS calls go to the libblas.so.3 loaded first."""
    for line in open("/proc/self/maps"):
        path = line.split()[-1]
        if "libblas.so" in path:
            return os.path.realpath(path)
    return "unknown"


BLAS_DIRS = {"openblas": "/usr/lib/x86_64-linux-gnu/openblas-pthread", "blis": "/usr/lib/x86_64-linux-gnu/blis-openmp"}


def blis_arch_id(name):
    """BLIS's id for a kernel set's name, looked up through BLIS's own bli_arch_string."""
    import ctypes
    lib = ctypes.CDLL(os.path.join(BLAS_DIRS["blis"], "libblis.so.4"))
    lib.bli_arch_string.restype = ctypes.c_char_p
    for i in range(64):
        s = lib.bli_arch_string(i)
        if s is None:
            break
        if s.decode() == name:
            return i
        if s.decode() == "generic":  # the last id
            break
    return None


def models():
    """The model families, defined only in the child (import torch there)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class GPTBlock(nn.Module):
        def __init__(self, d, h):
            super().__init__()
            self.h = h
            self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.c_fc, self.mlp_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def attn(self, x, past):
            b, t, d = x.shape
            q, k, v = self.c_attn(x).split(d, dim=2)
            q, k, v = (z.view(b, t, self.h, d // self.h).transpose(1, 2) for z in (q, k, v))
            if past is not None:  # HF-style cache: keys and values of earlier positions, concatenated
                k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
            tk = k.shape[2]
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // self.h))
            if t > 1:
                causal = torch.ones(t, tk, dtype=torch.bool).tril(diagonal=tk - t)
                att = att.masked_fill(~causal, float("-inf"))
            y = F.softmax(att, dim=-1) @ v
            return self.c_proj(y.transpose(1, 2).reshape(b, t, d)), (k, v)

        def forward(self, x, past=None):
            a, kv = self.attn(self.ln_1(x), past)
            x = x + a
            x = x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))
            return x, kv

    class GPT(nn.Module):
        """GPT-2: learned positions, pre-LN blocks, tanh GELU, final LN, head tied to wte."""

        def __init__(self, c):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(c["vocab"], c["d"]), nn.Embedding(c["ctx"], c["d"])
            self.h = nn.ModuleList(GPTBlock(c["d"], c["heads"]) for _ in range(c["layers"]))
            self.ln_f = nn.LayerNorm(c["d"])

        def forward(self, ids, past=None):
            off = 0 if past is None else past[0][0].shape[2]
            pos = torch.arange(off, off + ids.shape[1])
            x = self.wte(ids) + self.wpe(pos)
            new = []
            for i, blk in enumerate(self.h):
                x, kv = blk(x, None if past is None else past[i])
                new.append(kv)
            return F.linear(self.ln_f(x), self.wte.weight), new

        def loss(self, batch):
            logits, _ = self(batch["input_ids"])
            return F.cross_entropy(logits.view(-1, logits.shape[-1]), batch["targets"].view(-1))

        lookup_only = ("wpe.weight",)

    class BERT(nn.Module):
        """BertForPreTraining: embeddings + LN, post-LN encoder (exact GELU), MLM head tied to the
        word embeddings, NSP on the tanh pooler over [CLS]."""

        def __init__(self, c):
            super().__init__()
            d = c["d"]
            self.word, self.pos, self.tok_type = nn.Embedding(c["vocab"], d), nn.Embedding(c["ctx"], d), nn.Embedding(2, d)
            self.emb_ln = nn.LayerNorm(d, eps=1e-12)
            self.layers = nn.ModuleList(
                nn.TransformerEncoderLayer(d, c["heads"], c["ff"], dropout=0.0, activation="gelu", layer_norm_eps=1e-12,
                                           batch_first=True) for _ in range(c["layers"]))
            self.pooler, self.nsp = nn.Linear(d, d), nn.Linear(d, 2)
            self.mlm_dense, self.mlm_ln = nn.Linear(d, d), nn.LayerNorm(d, eps=1e-12)
            self.mlm_bias = nn.Parameter(torch.zeros(c["vocab"]))

        def loss(self, b):
            ids = b["input_ids"]
            x = self.emb_ln(self.word(ids) + self.pos(torch.arange(ids.shape[1])) + self.tok_type(b["token_type_ids"]))
            pad = b["attention_mask"] == 0
            for layer in self.layers:
                x = layer(x, src_key_padding_mask=pad)
            labels = b["labels"].reshape(-1)
            h = x.reshape(-1, x.shape[-1])
            if not MLM_FULL:  # the head only on labelled rows: same loss, 15% of the head's work
                keep = labels != -100
                h, labels = h[keep], labels[keep]
            mlm = F.linear(self.mlm_ln(F.gelu(self.mlm_dense(h))), self.word.weight, self.mlm_bias)
            nsp = self.nsp(torch.tanh(self.pooler(x[:, 0])))
            return F.cross_entropy(mlm, labels, ignore_index=-100) + F.cross_entropy(nsp, b["next_sentence_label"])

        lookup_only = ("pos.weight", "tok_type.weight")

    class EncDec(nn.Module):
        """nn.Transformer (post-LN, ReLU, batch_first) + scaled embeddings + sinusoidal positions + generator."""

        def __init__(self, c):
            super().__init__()
            d = c["d"]
            self.d = d
            self.src_emb, self.tgt_emb = nn.Embedding(c["vocab"], d), nn.Embedding(c["vocab"], d)
            self.transformer = nn.Transformer(d, c["heads"], c["layers"], c["layers"], c["ff"], dropout=0.0,
                                              batch_first=True)
            self.generator = nn.Linear(d, c["vocab"])
            pos = torch.arange(512).unsqueeze(1)
            div = torch.exp(torch.arange(0, d, 2) * (-math.log(10000.0) / d))
            pe = torch.zeros(512, d)
            pe[:, 0::2], pe[:, 1::2] = torch.sin(pos * div), torch.cos(pos * div)
            self.register_buffer("pe", pe)

        def loss(self, b):
            src, tgt = b["src"], b["tgt_in"]
            scale = math.sqrt(self.d)
            xs = self.src_emb(src) * scale + self.pe[: src.shape[1]]
            xt = self.tgt_emb(tgt) * scale + self.pe[: tgt.shape[1]]
            pad = b["src_mask"] == 0
            causal = self.transformer.generate_square_subsequent_mask(tgt.shape[1])
            y = self.transformer(xs, xt, tgt_mask=causal, src_key_padding_mask=pad, memory_key_padding_mask=pad)
            logits = self.generator(y)
            return F.cross_entropy(logits.view(-1, logits.shape[-1]), b["tgt_out"].view(-1))

        lookup_only = ("src_emb.weight", "tgt_emb.weight")

    class LlamaBlock(nn.Module):
        """LlamaDecoderLayer: RMSNorm, half-split rotary q and k, grouped-query heads, SwiGLU; no biases."""

        def __init__(self, c):
            super().__init__()
            d, self.h, self.hk = c["d"], c["heads"], c["kv_heads"]
            hd = d // self.h
            self.q, self.o = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
            self.k, self.v = nn.Linear(d, self.hk * hd, bias=False), nn.Linear(d, self.hk * hd, bias=False)
            self.gate, self.up = nn.Linear(d, c["ff"], bias=False), nn.Linear(d, c["ff"], bias=False)
            self.down = nn.Linear(c["ff"], d, bias=False)
            self.n1, self.n2 = nn.Parameter(torch.ones(d)), nn.Parameter(torch.ones(d))

        @staticmethod
        def rms(x, w):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

        def forward(self, x, cos, sin):
            b, t, d = x.shape
            hd = d // self.h
            h = self.rms(x, self.n1)
            q = self.q(h).view(b, t, self.h, hd).transpose(1, 2)
            k = self.k(h).view(b, t, self.hk, hd).transpose(1, 2)
            v = self.v(h).view(b, t, self.hk, hd).transpose(1, 2)
            rot = lambda z: torch.cat([-z[..., hd // 2:], z[..., : hd // 2]], dim=-1)
            q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
            k, v = (z.repeat_interleave(self.h // self.hk, dim=1) for z in (k, v))
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
            att = att.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
            x = x + self.o((F.softmax(att, dim=-1) @ v).transpose(1, 2).reshape(b, t, d))
            h = self.rms(x, self.n2)
            return x + self.down(F.silu(self.gate(h)) * self.up(h))

    class Llama(nn.Module):
        """LlamaForCausalLM: token embedding, the blocks, final RMSNorm, an untied LM head."""

        def __init__(self, c):
            super().__init__()
            self.embed = nn.Embedding(c["vocab"], c["d"])
            self.layers = nn.ModuleList(LlamaBlock(c) for _ in range(c["layers"]))
            self.norm = nn.Parameter(torch.ones(c["d"]))
            self.head = nn.Linear(c["d"], c["vocab"], bias=False)
            hd = c["d"] // c["heads"]
            inv = 1.0 / (10000.0 ** (torch.arange(0, hd, 2).float() / hd))
            ang = torch.outer(torch.arange(c["ctx"]).float(), inv)
            self.register_buffer("cos", torch.cat([ang, ang], dim=-1).cos())
            self.register_buffer("sin", torch.cat([ang, ang], dim=-1).sin())

        def loss(self, batch):
            ids = batch["input_ids"]
            t = ids.shape[1]
            x = self.embed(ids)
            for layer in self.layers:
                x = layer(x, self.cos[:t], self.sin[:t])
            logits = self.head(LlamaBlock.rms(x, self.norm))
            return F.cross_entropy(logits.view(-1, logits.shape[-1]), batch["targets"].view(-1))

        lookup_only = ("embed.weight",)

    def init_02(module):
        """GPT-2 / BERT initialisation: normal(0, 0.02) matrices and tables, zero biases."""
        for m in module.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
            if isinstance(m, nn.MultiheadAttention):
                nn.init.normal_(m.in_proj_weight, 0.0, 0.02)
                nn.init.zeros_(m.in_proj_bias)
        return module

    return {"gpt2": lambda c: init_02(GPT(c)), "bert": lambda c: init_02(BERT(c)), "encdec": EncDec,
            "llama": lambda c: init_02(Llama(c))}


def make_batch(c, g):
    import torch
    B, T, V = c["batch"], c["t"], c["vocab"]
    r = lambda lo, hi, shape: torch.randint(lo, hi, shape, generator=g)
    if c["arch"] in ("gpt2", "llama"):
        return {"input_ids": r(0, V, (B, T)), "targets": r(0, V, (B, T))}
    if c["arch"] == "bert":
        labels = torch.where(torch.rand(B, T, generator=g) < 0.15, r(0, V, (B, T)), torch.full((B, T), -100))
        return {"input_ids": r(0, V, (B, T)), "token_type_ids": (torch.arange(T) >= T // 2).long().expand(B, T),
                "attention_mask": torch.ones(B, T, dtype=torch.long), "labels": labels,
                "next_sentence_label": r(0, 2, (B,))}
    S = c["s"]
    return {"src": r(3, V, (B, S)), "src_mask": torch.ones(B, S, dtype=torch.long), "tgt_in": r(3, V, (B, T)),
            "tgt_out": r(3, V, (B, T))}


def step_flops(c, model):
    """(6*N + 12*d*sum_attn(keys)) * tokens, N = parameters used in matmuls (as cgrad bench)."""
    n = sum(p.numel() for name, p in model.named_parameters() if name not in model.lookup_only)
    # key length summed over attention blocks: encoder self (S), decoder self (T) and cross (S)
    attn = c["layers"] * (2 * c["s"] + c["t"]) if c["arch"] == "encdec" else c["layers"] * c["t"]
    return (6.0 * n + 12.0 * c["d"] * attn) * c["batch"] * c["t"], n


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def sgemm_gflops(torch):
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    a @ b
    best = math.inf
    for _ in range(3):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2.0 * 2048 ** 3 / best / 1e9


def child_train(name, steps, warmup, threads, blas_threads, with_sgemm, bf16):
    import contextlib
    import torch
    cast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext
    torch.set_num_threads(threads)
    torch.manual_seed(1234)
    c = CONFIGS[name]
    base_rss = peak_rss_mb()
    model = models()[c["arch"]](c)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    g = torch.Generator().manual_seed(42)
    batch = make_batch(c, g)
    times, cpu, losses = [], [], []
    for k in range(warmup + steps):
        t0, c0 = time.perf_counter(), time.process_time()
        opt.zero_grad()
        with cast():
            loss = model.loss(batch)
        loss.backward()
        opt.step()
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        losses.append(loss.item())
        if k >= warmup:
            times.append(dt)
            cpu.append(dc)
    med = statistics.median(times)
    flops, n = step_flops(c, model)
    rss = peak_rss_mb()
    sg = sgemm_gflops(torch) if with_sgemm else float("nan")
    gf = flops / med / 1e9
    tokens = c["batch"] * c["t"]
    print(f"# torch {name}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params ({n / 1e6:.2f}M in matmuls), "
          f"loss {losses[0]:.4f} -> {losses[-1]:.4f}, median {med * 1e3:.1f} ms (min {min(times) * 1e3:.1f}, "
          f"max {max(times) * 1e3:.1f}), rss after import {base_rss:.0f} MB, blas {blas_library()}", file=sys.stderr)
    print(json.dumps({"config": name, "framework": "pytorch", "threads": threads, "blas_threads": blas_threads,
                      "precision": "bf16" if bf16 else "fp32", "blas": blas_library(), "ms_per_step": round(med * 1e3, 3), "cpu_ms_per_step": round(statistics.median(cpu) * 1e3, 3), "tokens_per_s": round(tokens / med, 1),
                      "gflops": round(gf, 3), "sgemm_fraction": round(gf / sg, 4) if sg == sg else None,
                      "peak_rss_mb": round(rss, 1), "sgemm_gflops": round(sg, 2) if sg == sg else None}))


GEN_REPS = 5


def child_gen(threads, blas_threads, bf16):
    import contextlib
    import torch
    cast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext
    torch.set_num_threads(threads)
    torch.manual_seed(1234)
    c = CONFIGS["gpt-tiny"]
    model = models()["gpt2"](c).eval()
    g = torch.Generator().manual_seed(42)
    prompt = torch.randint(0, c["vocab"], (1, 16), generator=g)

    def generate(n_new, cache):
        ids, past = prompt, None
        with torch.no_grad(), cast():
            for _ in range(n_new):
                if cache:
                    logits, past = model(ids if past is None else ids[:, -1:], past)
                else:
                    logits, _ = model(ids)
                ids = torch.cat([ids, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        return ids

    tps, outs = {}, {}
    for cache in (True, False):
        generate(8, cache)  # warm-up
        secs = []
        # the cached run is short, so a busy machine moves it most: the median of GEN_REPS, as cgrad bench
        for _ in range(GEN_REPS if cache else 1):
            t0 = time.perf_counter()
            outs[cache] = generate(200, cache)
            secs.append(time.perf_counter() - t0)
        tps[cache] = 200 / statistics.median(secs)
    if not torch.equal(outs[True], outs[False]):
        print("# torch gpt-tiny-gen WARNING: cached and uncached generation differ", file=sys.stderr)
    print(json.dumps({"config": "gpt-tiny-gen", "framework": "pytorch", "threads": threads,
                      "blas_threads": blas_threads, "tokens_per_s": round(tps[True], 1),
                      "tokens_per_s_nocache": round(tps[False], 1)}))


def run_child(args, threads, blas_threads, variant="fp32 default", policy=None):
    """Runs this script as a child: BLAS library, kernel set, BLAS threads and OpenMP wait policy
    in its environment. variant: "fp32 openblas", "fp32 blis", "bf16" or "fp32 default". Returns
    the child's JSON line as a dict, with "variant" and "policy" added."""
    env = dict(os.environ)
    prec, _, blas = variant.partition(" ")
    if blas in BLAS_DIRS:
        env["LD_LIBRARY_PATH"] = BLAS_DIRS[blas] + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    if blas == "blis" and BLIS_KERNELS and "BLIS_ARCH_TYPE" not in os.environ:
        i = blis_arch_id(BLIS_KERNELS)
        if i is not None:
            env["BLIS_ARCH_TYPE"] = str(i)
    # Whichever library libblas.so.3 is, it reads its thread count from its own variable when it
    # loads; set both. torch.set_num_threads decides the OpenMP pool.
    env["OPENBLAS_NUM_THREADS"] = env["BLIS_NUM_THREADS"] = str(blas_threads)
    env.pop("OMP_NUM_THREADS", None)
    env.pop("OMP_WAIT_POLICY", None)
    if policy:
        env["OMP_WAIT_POLICY"] = policy
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--threads", str(threads),
           "--blas-threads", str(blas_threads)] + (["--mlm-full"] if MLM_FULL else []) + \
          (["--bf16"] if prec == "bf16" else []) + args
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sys.stderr.write("".join(l + "\n" for l in p.stderr.splitlines() if l.startswith("#")))
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if p.returncode != 0 or not lines:
        err = [l for l in p.stderr.splitlines() if l.strip()]
        return {"error": f"n/a ({err[-1][:120] if err else 'exit status %d' % p.returncode})", "args": args,
                "variant": variant, "policy": policy or "unset"}
    return dict(json.loads(lines[-1]), variant=variant, policy=policy or "unset")


def label(r):
    return f"{r['variant']} {r.get('threads')}+{r.get('blas_threads')} {r.get('policy', 'unset')}"


def splits(budget):
    """(torch threads, BLAS threads) pairs within a budget of cores."""
    return [(t, b) for t in range(1, budget + 1) for b in range(1, budget + 1) if max(t, b) == budget] or [(1, 1)]


def sweep(variants, budget, fixed):
    """The fastest (threads, BLAS threads, policy) per variant for a budget, on short gpt-tiny runs."""
    best = {}
    for v in variants:
        if fixed:
            best[v] = (fixed[0], fixed[1], None)
            continue
        tried = []
        for t, b in splits(budget):
            r = run_child(["--config", "gpt-tiny", "--steps", "2", "--warmup", "1", "--no-sgemm"], t, b, v)
            tried.append((r.get("ms_per_step", math.inf), t, b, None))
        ms, t, b, _ = min(tried)
        r = run_child(["--config", "gpt-tiny", "--steps", "2", "--warmup", "1", "--no-sgemm"], t, b, v, "passive")
        tried.append((r.get("ms_per_step", math.inf), t, b, "passive"))
        for ms, t, b, pol in tried:
            print(f"# torch sweep ({budget} cores): {v}, torch threads {t}, BLAS threads {b}, OMP_WAIT_POLICY "
                  f"{pol or 'unset'}: gpt-tiny {ms:.1f} ms/step", flush=True)
        best[v] = min(tried, key=lambda x: x[0])[1:]
        print(f"# torch sweep ({budget} cores): {v} fastest at {best[v][0]}+{best[v][1]} {best[v][2] or 'unset'}",
              flush=True)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", help="NAME or all (default: all, or none with --gen, as cgrad bench)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--gen", action="store_true")
    ap.add_argument("--budgets", default="2", help="thread budgets (cores) to report, e.g. 1,2")
    ap.add_argument("--blis-kernels", help="BLIS kernel set for the BLIS variant (cgrad --version names cgrad's)")
    ap.add_argument("--settings", help="JSON file of the sweep's winners: read if it exists, else written")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--blas-threads", type=int)
    ap.add_argument("--mlm-full", action="store_true", help="BERT MLM head on every position (Hugging Face)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--bf16", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--no-sgemm", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    global MLM_FULL, BLIS_KERNELS
    MLM_FULL, BLIS_KERNELS = a.mlm_full, a.blis_kernels
    if a.child:
        if a.gen:
            child_gen(a.threads, a.blas_threads, a.bf16)
        else:
            child_train(a.config, a.steps, a.warmup, a.threads, a.blas_threads, not a.no_sgemm, a.bf16)
        return
    if a.config is None:
        a.config = "none" if a.gen else "all"
    names = list(CONFIGS) if a.config == "all" else [] if a.config == "none" else [a.config]
    if a.config not in ("all", "none") and a.config not in CONFIGS:
        sys.exit(f"unknown config {a.config} (all, {', '.join(CONFIGS)})")
    fixed = (a.threads, a.blas_threads) if a.threads and a.blas_threads else None
    variants = [f"fp32 {b}" for b in BLAS_DIRS if os.path.isdir(BLAS_DIRS[b])] + ["bf16"]
    for b in BLAS_DIRS:  # a BLAS that is not installed is not PyTorch's best: say so, loudly
        if not os.path.isdir(BLAS_DIRS[b]):
            print(f"# WARNING: {b} is not installed ({BLAS_DIRS[b]} missing), so PyTorch is not measured on it; "
                  f"apt-get install -y {'libopenblas0-pthread' if b == 'openblas' else 'libblis4-openmp'}",
                  file=sys.stderr, flush=True)
    import torch
    print(f"# torch {torch.__version__}; variants {', '.join(variants)}; BLIS kernels "
          f"{BLIS_KERNELS or 'BLIS own choice'}; {a.warmup} warm-up + {a.steps} timed steps, median"
          f"{', MLM head on every position' if MLM_FULL else ''}", flush=True)
    for budget in [int(x) for x in a.budgets.split(",")]:
        saved = json.load(open(a.settings)) if a.settings and os.path.exists(a.settings) else {}
        if str(budget) in saved:
            best = {v: tuple(x) for v, x in saved[str(budget)].items()}
        else:
            best = sweep(variants, budget, fixed) if names else {}
            if a.settings and best:
                saved[str(budget)] = best
                json.dump(saved, open(a.settings, "w"))
        for name in names:
            rs = []
            for v in variants:
                t, b, pol = best[v]
                rs.append(run_child(["--config", name, "--steps", str(a.steps), "--warmup", str(a.warmup)], t, b, v,
                                    pol))
            ok32 = [r for r in rs if r["variant"].startswith("fp32") and "ms_per_step" in r]
            ok16 = [r for r in rs if r["variant"] == "bf16" and "ms_per_step" in r]
            out = dict(min(ok32, key=lambda r: r["ms_per_step"])) if ok32 else {"config": name, "error": "failed"}
            out.update(framework="pytorch", budget=budget, fp32_variant=label(out) if ok32 else None,
                       variants={label(r): r.get("ms_per_step", r.get("error")) for r in rs})
            if ok16:
                out.update(bf16_ms_per_step=ok16[0]["ms_per_step"], bf16_variant=label(ok16[0]),
                           bf16_peak_rss_mb=ok16[0]["peak_rss_mb"])
            else:
                out.update(bf16_ms_per_step=None, bf16_error=next((r["error"] for r in rs if r["variant"] == "bf16"),
                                                                   "n/a"))
            out.pop("args", None)
            print(json.dumps(out), flush=True)
        if a.gen:
            # Decoding one token at a time favours other settings than training: every split of the
            # budget for every variant, the fastest with and without cache apart.
            rs = []
            for v in variants:
                for t, b in ([fixed] if fixed else splits(budget)):
                    r = run_child(["--gen"], t, b, v)
                    if "error" in r:
                        print(f"# torch gen: {v} {t}+{b}: {r['error']}", flush=True)
                        continue
                    print(f"# torch gen: {label(r)}: {r['tokens_per_s']} tokens/s cached, "
                          f"{r['tokens_per_s_nocache']} uncached", flush=True)
                    rs.append(r)
            out = {"config": "gpt-tiny-gen", "framework": "pytorch", "budget": budget}
            for key in ("tokens_per_s", "tokens_per_s_nocache"):
                for prec in ("fp32", "bf16"):
                    cand = [r for r in rs if r["variant"].startswith(prec)]
                    if cand:
                        r = max(cand, key=lambda r: r[key])
                        out[(key if prec == "fp32" else "bf16_" + key)] = r[key]
                        out[(key if prec == "fp32" else "bf16_" + key) + "_variant"] = label(r)
            print(json.dumps(out), flush=True)


BLIS_KERNELS = None

if __name__ == "__main__":
    main()
