#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Parity fixtures for the image models of the zoo (vit, cnn), read by tests/test_vision.c.

Rerun:  /usr/bin/python3 tests/make_vision_fixtures.py      (torch 1.13 tested; CPU, float64)
The reference models are written out below from torch.nn layers. For each case NAME (vit: [CLS]
token, vit_mean: mean pooling, cnn) tests/fixtures/vision/NAME/ holds
  config.json          the config cgrad reads (models/vit.h, models/cnn.h)
  weights.safetensors  the parameters (F32) under cgrad's names
  expected.safetensors pixel_values [B, C, H, W] (F32), labels [B] (F32; -100 = ignored),
                       logits [B, classes], loss [1] (mean cross-entropy over the labelled rows)
                       and grad.<name> for every parameter, all computed in float64 from the F32 values.
"""
import json
import math
import os
import struct

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "vision")


def st_write(path, tensors):
    """A safetensors file of F32 tensors, in the given order."""
    header, blobs, off = {"__metadata__": {"generator": "tests/make_vision_fixtures.py"}}, [], 0
    for name, t in tensors.items():
        a = np.ascontiguousarray(t.detach().cpu().numpy().astype("<f4"))
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        blobs.append(a.tobytes())
        off += a.nbytes
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


class Attn(nn.Module):
    def __init__(self, d, nh):
        super().__init__()
        self.nh = nh
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x):
        B, T, d = x.shape
        sh = lambda t: t.view(B, T, self.nh, d // self.nh).transpose(1, 2)
        q, k, v = sh(self.q(x)), sh(self.k(x)), sh(self.v(x))
        y = F.scaled_dot_product_attention(q, k, v) if hasattr(F, "scaled_dot_product_attention") else \
            torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d // self.nh), -1) @ v
        return self.o(y.transpose(1, 2).reshape(B, T, d))


class Mlp(nn.Module):
    def __init__(self, d, f):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, f), nn.Linear(f, d)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, d, nh, f, eps):
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(d, eps=eps), Attn(d, nh)
        self.norm2, self.mlp = nn.LayerNorm(d, eps=eps), Mlp(d, f)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, p = c["d_model"], c["patch_size"]
        n = (c["image_size"] // p) ** 2 + c["cls_token"]
        self.use_cls = c["cls_token"]
        self.patch_embed = nn.Conv2d(c["num_channels"], d, p, stride=p)
        if self.use_cls:
            self.cls_token = nn.Parameter(torch.randn(1, 1, d))
        self.pos_embed = nn.Parameter(torch.randn(1, n, d))
        self.blocks = nn.ModuleList(Block(d, c["n_head"], c["mlp_dim"], c["layer_norm_eps"]) for _ in range(c["n_layer"]))
        self.norm = nn.LayerNorm(d, eps=c["layer_norm_eps"])
        self.head = nn.Linear(d, c["num_classes"])

    def forward(self, px):
        x = self.patch_embed(px).flatten(2).transpose(1, 2)
        if self.use_cls:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], 1)
        x = x + self.pos_embed
        for b in self.blocks:
            x = b(x)
        x = self.norm(x)
        return self.head(x[:, 0] if self.use_cls else x.mean(1))


class CNN(nn.Module):
    def __init__(self, c):
        super().__init__()
        chans, convs = c["channels"], []
        cin = c["num_channels"]
        for _ in range(c["n_layer"]):
            convs.append(nn.Conv2d(cin, chans, 3, padding=1))
            cin, chans = chans, chans * 2
        self.convs = nn.ModuleList(convs)
        side = c["image_size"] >> c["n_layer"]
        self.fc = nn.Linear(cin * side * side, c["hidden"])
        self.head = nn.Linear(c["hidden"], c["num_classes"])

    def forward(self, x):
        for conv in self.convs:
            x = F.max_pool2d(F.relu(conv(x)), 2)
        return self.head(F.relu(self.fc(x.flatten(1))))


def make(name, model, c, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # F32-representable values, so cgrad reads exactly what torch used
        for _, p in model.named_parameters():
            p.copy_((torch.randn(p.shape, generator=g) * 0.3).float().double())
    model.double()
    B = 3
    px = torch.randn(B, c["num_channels"], c["image_size"], c["image_size"], generator=g).float().double()
    labels = torch.tensor([1, -100, c["num_classes"] - 1])
    logits = model(px)
    loss = F.cross_entropy(logits, labels, ignore_index=-100)
    loss.backward()
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
        f.write("\n")
    st_write(os.path.join(d, "weights.safetensors"), dict(model.named_parameters()))
    exp = {"pixel_values": px, "labels": labels.double(), "logits": logits, "loss": loss.reshape(1)}
    for n, p in model.named_parameters():
        exp["grad." + n] = p.grad
    st_write(os.path.join(d, "expected.safetensors"), exp)
    print("%s: %d parameters, loss %.6f" % (name, sum(p.numel() for p in model.parameters()), loss.item()))


def main():
    vit = {"model_type": "vit", "image_size": 8, "num_channels": 2, "patch_size": 4, "d_model": 16, "n_head": 2,
           "n_layer": 2, "mlp_dim": 24, "num_classes": 5, "cls_token": 1, "layer_norm_eps": 1e-6}
    make("vit", ViT(vit), vit, 3201)
    vit_mean = dict(vit, cls_token=0)
    make("vit_mean", ViT(vit_mean), vit_mean, 3202)
    cnn = {"model_type": "cnn", "image_size": 8, "num_channels": 2, "channels": 3, "n_layer": 2, "hidden": 10,
           "num_classes": 5}
    make("cnn", CNN(cnn), cnn, 3203)


if __name__ == "__main__":
    main()
