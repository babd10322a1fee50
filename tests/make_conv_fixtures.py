#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Makes tests/fixtures/conv/conv.txt: torch's conv1d, conv2d, max_pool2d and avg_pool2d, forward
and backward, in float64, for tests/test_ops_extra.c to replay through cgrad's ops. Run with
/usr/bin/python3 (torch 1.13); the settings of each case are repeated in the C test.

Format: one tensor a line, whitespace-separated: NAME NDIM DIMS... VALUES... (row-major, %.17g).
For each case C: C.x (input), C.w and C.b (weights and bias, if any), C.r (the weights of the loss
sum(y * r)), C.y (output), C.dx, C.dw, C.db (gradients of that loss).
"""
import os

import torch
import torch.nn.functional as F

torch.manual_seed(32)
torch.set_default_dtype(torch.float64)
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "conv", "conv.txt")
lines = []


def put(name, t):
    t = t.detach().contiguous()
    vals = " ".join("%.17g" % v for v in t.reshape(-1).tolist())
    lines.append("%s %d %s %s" % (name, t.dim(), " ".join(str(d) for d in t.shape), vals))


def case(name, fn, x_shape, w_shape=None, bias=False):
    x = torch.randn(x_shape, requires_grad=True)
    w = torch.randn(w_shape, requires_grad=True) if w_shape else None
    b = torch.randn(w_shape[0], requires_grad=True) if bias else None
    y = fn(x, w, b)
    r = torch.randn(y.shape)
    (y * r).sum().backward()
    put(name + ".x", x)
    if w is not None:
        put(name + ".w", w)
        put(name + ".dw", w.grad)
    if b is not None:
        put(name + ".b", b)
        put(name + ".db", b.grad)
    put(name + ".r", r)
    put(name + ".y", y)
    put(name + ".dx", x.grad)


case("conv2d", lambda x, w, b: F.conv2d(x, w, b, stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2),
     (2, 4, 6, 5), (6, 2, 3, 3), bias=True)
case("conv2d_patch", lambda x, w, b: F.conv2d(x, w, b, stride=4), (2, 3, 8, 8), (5, 3, 4, 4), bias=True)
case("conv1d", lambda x, w, b: F.conv1d(x, w, b, padding=2, dilation=2), (2, 3, 10), (4, 3, 3), bias=True)
# causal: dilation * (k - 1) zeros on the left only, as Mamba and WaveNet pad
case("conv1d_causal", lambda x, w, b: F.conv1d(F.pad(x, (2 * 3, 0)), w, b, dilation=2), (2, 3, 9), (3, 3, 4),
     bias=True)
case("conv1d_depthwise", lambda x, w, b: F.conv1d(x, w, b, stride=2, padding=1, groups=4), (2, 4, 9), (8, 1, 3),
     bias=True)
case("max_pool2d", lambda x, w, b: F.max_pool2d(x, (3, 2), stride=(2, 2), padding=(1, 1)), (2, 3, 7, 6))
case("avg_pool2d", lambda x, w, b: F.avg_pool2d(x, (3, 2), stride=(2, 1), padding=(1, 1), count_include_pad=True),
     (2, 3, 7, 6))

os.makedirs(os.path.dirname(OUT), exist_ok=True)
with open(OUT, "w") as f:
    f.write("\n".join(lines) + "\n")
print("wrote", OUT, len(lines), "tensors")
