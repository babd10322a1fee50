#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""nanoGPT's CPU recipe for tiny-shakespeare (character level) in PyTorch, to time beside
examples/shakespeare_char.sh: 4 layers, 4 heads, d 128, context 64, batch 12, 2000 iterations,
AdamW lr 1e-3 (betas 0.9/0.99, weight decay 0.1 on matrices), 100 warmup steps then cosine to
1e-4, clip 1.0, dropout 0; held-out = the last 10% of the text; final held-out loss over 200
batches. The model follows nanoGPT's model.py (pre-LN, tanh-free exact GELU, tied head).

    /usr/bin/python3 bench/nanogpt_shakespeare.py PATH/tinyshakespeare.txt [--threads T]
    /usr/bin/python3 bench/nanogpt_shakespeare.py data/moby-dick.txt --preset cgrad-default [--threads T]

--preset cgrad-default is the run of `cgrad train` without arguments instead: context 128, batch 16,
1500 iterations, and its 7 held-out evaluations of 20 batches (steps 0, 250, ..., 1500), so both sides
do the same work; the wall time then includes those evaluations.
"""
import argparse, math, time
import torch
import torch.nn as nn
import torch.nn.functional as F

ap = argparse.ArgumentParser()
ap.add_argument("path")
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--preset", choices=["nanogpt", "cgrad-default"], default="nanogpt")
args = ap.parse_args()
threads = args.threads
torch.set_num_threads(threads)
torch.manual_seed(1337)
text = open(args.path, encoding="utf-8").read()
chars = sorted(set(text))
stoi = {c: i for i, c in enumerate(chars)}
data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
n = int(0.9 * len(data))
train, val = data[:n], data[n:]
V, L, H, D = len(chars), 4, 4, 128
if args.preset == "nanogpt":
    T, B, ITERS, EVAL_EVERY, EVAL_BATCHES = 64, 12, 2000, 0, 200  # one evaluation, after training
else:
    T, B, ITERS, EVAL_EVERY, EVAL_BATCHES = 128, 16, 1500, 250, 20


def batch(split):
    d = train if split == "train" else val
    ix = torch.randint(len(d) - T, (B,))
    return torch.stack([d[i:i + T] for i in ix]), torch.stack([d[i + 1:i + T + 1] for i in ix])


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.c_attn, self.c_proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.c_fc, self.mlp_proj = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)
        self.register_buffer("mask", torch.tril(torch.ones(T, T)).view(1, 1, T, T))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(D, dim=2)
        q, k, v = (z.view(b, t, H, c // H).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = F.softmax(att.masked_fill(self.mask[:, :, :t, :t] == 0, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, D), nn.Embedding(T, D)
        self.h = nn.ModuleList([Block() for _ in range(L)])
        self.ln_f = nn.LayerNorm(D)
        self.lm_head = nn.Linear(D, V, bias=False)
        self.wte.weight = self.lm_head.weight
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * L) if name.endswith("proj.weight") else 0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1)))
        for blk in self.h:
            x = blk(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, V), targets.view(-1))


model = GPT()
decay = [p for p in model.parameters() if p.dim() >= 2]
no_decay = [p for p in model.parameters() if p.dim() < 2]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                        lr=1e-3, betas=(0.9, 0.99))


def lr_at(it):
    if it < 100:
        return 1e-3 * it / 100
    ratio = (it - 100) / (ITERS - 100)
    return 1e-4 + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (1e-3 - 1e-4)


def held_out():
    model.eval()
    with torch.no_grad():
        v = sum(model(*batch("val")).item() for _ in range(EVAL_BATCHES)) / EVAL_BATCHES
    model.train()
    return v


start = time.time()
eval_s = 0.0
for it in range(ITERS):
    if EVAL_EVERY and it % EVAL_EVERY == 0:
        t0 = time.time()
        print(f"step {it}: held-out {held_out():.4f}", flush=True)
        eval_s += time.time() - t0
    for g in opt.param_groups:
        g["lr"] = lr_at(it)
    x, y = batch("train")
    loss = model(x, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
train_s = time.time() - start - eval_s
t0 = time.time()
val_loss = held_out()
eval_s += time.time() - t0
print(f"pytorch {torch.__version__} threads={threads} preset={args.preset}: train {train_s:.1f} s for {ITERS} "
      f"iterations, evaluations {eval_s:.1f} s, wall {time.time() - start:.1f} s, "
      f"held-out loss {val_loss:.4f} over {EVAL_BATCHES} batches")
