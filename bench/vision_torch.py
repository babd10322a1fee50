#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""cgrad's image models against the same models in PyTorch, on Fashion-MNIST, epoch by epoch.

For each model (cnn, vit) and each epoch, one epoch of `cgrad train` (resumed from the previous
epoch's checkpoint) and then one epoch of the PyTorch model run in turn, so both see the same load;
each epoch ends with the test accuracy over all 10,000 test images. The two use the same
architecture, initialisation scheme, data order rule (a shuffle per epoch), normalisation, AdamW
(decay on matrices only), warmup + cosine schedule, gradient clipping, batch and threads. Prints a
Markdown table: wall and CPU seconds per epoch (cgrad: the whole process, with start-up, data
loading, the evaluation and the checkpoint; PyTorch: the epoch's training and its evaluation) and
test accuracies. On a loaded machine the CPU seconds (all threads) compare the work done; the wall
seconds what a user waits.

Usage: /usr/bin/python3 bench/vision_torch.py [--cgrad build/cgrad] [--models cnn,vit]
                                               [--epochs-cnn 3] [--epochs-vit 10] [--threads 2]
The defaults are `cgrad train --arch cnn|vit`'s (docs/vision.md).
"""
import argparse
import gzip
import math
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import make_vision_fixtures as ref  # noqa: E402  (the reference ViT and CNN)

DATA = "/usr/share/datasets/fashion-mnist"
MEAN, STD = 0.2860, 0.3530
STEPS_PER_EPOCH = 469  # ceil(60000 / 128): cgrad's epochs are measured in steps of 128 images

# The hyperparameters of `cgrad train --arch ...` by default (cli/train_opts.c).
HP = {
    "cnn": dict(channels=32, layers=2, hidden=128, lr=2e-3, warmup=100, wd=0.01, epochs=3),
    "vit": dict(dim=64, layers=4, heads=4, mlp=128, patch=7, lr=2e-3, warmup=200, wd=0.05, epochs=10),
}
BATCH, BETAS, EPS, CLIP = 128, (0.9, 0.99), 1e-8, 1.0


def read_idx(path):
    with gzip.open(path, "rb") as f:
        b = f.read()
    nd = b[3]
    dims = [int.from_bytes(b[4 + 4 * i:8 + 4 * i], "big") for i in range(nd)]
    return np.frombuffer(b, dtype=np.uint8, offset=4 + 4 * nd).reshape(dims)


def make_model(arch, h):
    """The reference models of tests/make_vision_fixtures.py (models/vit.c, models/cnn.c) at the
    bench's hyperparameters, initialised as cgrad initialises them."""
    if arch == "vit":
        model = ref.ViT({"image_size": 28, "num_channels": 1, "patch_size": h["patch"], "d_model": h["dim"],
                         "n_head": h["heads"], "n_layer": h["layers"], "mlp_dim": h["mlp"], "num_classes": 10,
                         "cls_token": 1, "layer_norm_eps": 1e-6})
    else:
        model = ref.CNN({"image_size": 28, "num_channels": 1, "channels": h["channels"], "n_layer": h["layers"],
                         "hidden": h["hidden"], "num_classes": 10})
    for name, prm in model.named_parameters():
        if name.endswith("bias"):
            nn.init.zeros_(prm)
        elif name in ("cls_token", "pos_embed"):  # vit: normal(0, 0.02)
            nn.init.normal_(prm, 0, 0.02)
        elif arch == "vit":  # normal(0, 1/sqrt(fan_in))
            nn.init.normal_(prm, 0, 1 / math.sqrt(prm[0].numel()))
        else:  # cnn: He-normal, the head at gain 1
            nn.init.normal_(prm, 0, math.sqrt((1.0 if name.startswith("head") else 2.0) / prm[0].numel()))
    return model


def lr_at(step, h, total):
    """cgrad's cosine schedule: linear warmup to lr, then cosine to lr / 100 at total."""
    lr, lo = h["lr"], h["lr"] / 100
    if step < h["warmup"]:
        return lr * (step + 1) / h["warmup"]
    t = min(1.0, (step - h["warmup"]) / max(1, total - h["warmup"]))
    return lo + 0.5 * (lr - lo) * (1 + math.cos(math.pi * t))


class TorchRun:
    def __init__(self, arch, h, total, data):
        torch.manual_seed(1337)
        self.h, self.total, self.step = h, total, 0
        self.model = make_model(arch, h)
        decay = [p for p in self.model.parameters() if p.dim() >= 2]
        rest = [p for p in self.model.parameters() if p.dim() < 2]
        self.opt = torch.optim.AdamW([{"params": decay, "weight_decay": h["wd"]}, {"params": rest, "weight_decay": 0.0}],
                                     lr=h["lr"], betas=BETAS, eps=EPS)
        self.xtr, self.ytr, self.xte, self.yte = data
        self.gen = torch.Generator().manual_seed(1337)

    def epoch(self):
        t0, c0 = time.perf_counter(), time.process_time()
        self.model.train()
        perm = torch.randperm(len(self.ytr), generator=self.gen)
        for i in range(STEPS_PER_EPOCH):
            idx = perm[(i * BATCH) % len(perm):][:BATCH]
            if len(idx) < BATCH:  # the epoch's tail wraps into the next shuffle, as cgrad's cursor does
                idx = torch.cat([idx, perm[:BATCH - len(idx)]])
            for g in self.opt.param_groups:
                g["lr"] = lr_at(self.step, self.h, self.total)
            loss = F.cross_entropy(self.model(self.xtr[idx]), self.ytr[idx])
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), CLIP)
            self.opt.step()
            self.step += 1
        self.model.eval()
        right = 0
        with torch.no_grad():
            for i in range(0, len(self.yte), 1000):
                right += int((self.model(self.xte[i:i + 1000]).argmax(1) == self.yte[i:i + 1000]).sum())
        return time.perf_counter() - t0, time.process_time() - c0, right / len(self.yte)


def cgrad_epoch(cgrad, arch, h, k, total, out, threads):
    """Epoch k (1-based) of `cgrad train`: a new run for k = 1, else resumed; returns (wall s, CPU s, accuracy)."""
    if k == 1:
        model = ["--dim", str(h["channels"]), "--layers", str(h["layers"]), "--ffn", str(h["hidden"])] if arch == "cnn" else \
            ["--dim", str(h["dim"]), "--layers", str(h["layers"]), "--heads", str(h["heads"]), "--ffn", str(h["mlp"]),
             "--patch", str(h["patch"])]
        cmd = [cgrad, "train", "--arch", arch, "--out", out, "--threads", str(threads), "--samples", "0",
               "--steps", str(STEPS_PER_EPOCH), "--decay-steps", str(total), "--save-every", "0", "--batch", str(BATCH),
               "--lr", repr(h["lr"]), "--min-lr", repr(h["lr"] / 100), "--warmup", str(h["warmup"]),
               "--weight-decay", repr(h["wd"]), "--beta1", repr(BETAS[0]), "--beta2", repr(BETAS[1]), "--eps", repr(EPS),
               "--clip", repr(CLIP)] + model
    else:
        cmd = [cgrad, "train", "--resume", os.path.join(out, "model.ckpt"), "--steps", str(k * STEPS_PER_EPOCH),
               "--threads", str(threads), "--samples", "0"]
    t0, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run(cmd, capture_output=True, text=True)
    dt, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    if p.returncode:
        raise SystemExit("cgrad failed (%s):\n%s%s" % (" ".join(cmd), p.stdout, p.stderr))
    acc = re.findall(r"accuracy ([0-9.]+)", p.stdout)
    return dt, cpu, float(acc[-1]) if acc else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cgrad", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "cgrad"))
    ap.add_argument("--models", default="cnn,vit")
    ap.add_argument("--epochs-cnn", type=int, default=HP["cnn"]["epochs"])
    ap.add_argument("--epochs-vit", type=int, default=HP["vit"]["epochs"])
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    xtr = torch.from_numpy(read_idx(DATA + "/train-images-idx3-ubyte.gz").copy()).float().div(255).sub(MEAN).div(STD)
    xte = torch.from_numpy(read_idx(DATA + "/t10k-images-idx3-ubyte.gz").copy()).float().div(255).sub(MEAN).div(STD)
    ytr = torch.from_numpy(read_idx(DATA + "/train-labels-idx1-ubyte.gz").astype(np.int64))
    yte = torch.from_numpy(read_idx(DATA + "/t10k-labels-idx1-ubyte.gz").astype(np.int64))
    data = (xtr[:, None], ytr, xte[:, None], yte)
    print("load average before: %s" % " ".join("%.2f" % v for v in os.getloadavg()))
    rows = []
    for arch in a.models.split(","):
        h = HP[arch]
        epochs = a.epochs_cnn if arch == "cnn" else a.epochs_vit
        total = h["epochs"] * STEPS_PER_EPOCH  # the schedule of the default run, cut short if epochs is smaller
        tr = TorchRun(arch, h, total, data)
        out = tempfile.mkdtemp(prefix="cgrad-vision-")
        try:
            for k in range(1, epochs + 1):
                cs, cc, ca = cgrad_epoch(a.cgrad, arch, h, k, total, out, a.threads)
                ts, tc, ta = tr.epoch()
                rows.append((arch, k, cs, cc, ca, ts, tc, ta))
                print("  %s epoch %d: cgrad %.1f s (CPU %.1f s) acc %.4f | torch %.1f s (CPU %.1f s) acc %.4f"
                      % (arch, k, cs, cc, ca, ts, tc, ta), flush=True)
        finally:
            shutil.rmtree(out, ignore_errors=True)
    print("load average after: %s\n" % " ".join("%.2f" % v for v in os.getloadavg()))
    print("| model | epoch | cgrad s | cgrad CPU s | cgrad test acc | PyTorch s | PyTorch CPU s | PyTorch test acc "
          "| PyTorch / cgrad wall | PyTorch / cgrad CPU |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for arch, k, cs, cc, ca, ts, tc, ta in rows:
        print("| %s | %d | %.1f | %.1f | %.4f | %.1f | %.1f | %.4f | %.2f | %.2f |"
              % (arch, k, cs, cc, ca, ts, tc, ta, ts / cs, tc / cc))
    for arch in a.models.split(","):
        r = [x for x in rows if x[0] == arch]
        if r:
            cs, ts = sorted(x[2] for x in r), sorted(x[5] for x in r)
            print("\n%s: median wall s/epoch cgrad %.1f [%.1f, %.1f], PyTorch %.1f [%.1f, %.1f]; final accuracy cgrad %.4f, "
                  "PyTorch %.4f" % (arch, cs[len(cs) // 2], cs[0], cs[-1], ts[len(ts) // 2], ts[0], ts[-1], r[-1][4], r[-1][7]))


if __name__ == "__main__":
    main()
