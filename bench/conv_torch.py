#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""The shapes of bench_conv in PyTorch: forward + backward of sum(op(x) * R), median [min, max] ms
over interleaved repetitions. Usage: conv_torch.py [reps] [threads]."""
import sys
import time

import torch
import torch.nn.functional as F

reps = int(sys.argv[1]) if len(sys.argv) > 1 else 11
torch.set_num_threads(int(sys.argv[2]) if len(sys.argv) > 2 else 2)
torch.manual_seed(1)


def leaf(*shape):
    return (torch.rand(shape) * 2 - 1).requires_grad_()


variants = [
    ("conv2d 3x3 [32,16,28,28] -> 32", leaf(32, 16, 28, 28), leaf(32, 16, 3, 3), leaf(32),
     lambda x, w, b: F.conv2d(x, w, b, padding=1)),
    ("conv2d patch 4x4/4 [32,1,28,28] -> 64", leaf(32, 1, 28, 28), leaf(64, 1, 4, 4), leaf(64),
     lambda x, w, b: F.conv2d(x, w, b, stride=4)),
    ("conv1d causal depthwise k4 [8,256,512]", leaf(8, 256, 512), leaf(256, 1, 4), leaf(256),
     lambda x, w, b: F.conv1d(F.pad(x, (3, 0)), w, b, groups=256)),
    ("max_pool2d 2x2 [32,32,28,28]", leaf(32, 32, 28, 28), None, None, lambda x, w, b: F.max_pool2d(x, 2)),
]
ups = [torch.rand(fn(x, w, b).shape) * 2 - 1 for _, x, w, b, fn in variants]
times = [[] for _ in variants]
for _ in range(reps):
    for i, (name, x, w, b, fn) in enumerate(variants):
        t0 = time.perf_counter()
        (fn(x, w, b) * ups[i]).sum().backward()
        times[i].append((time.perf_counter() - t0) * 1e3)
print("# torch %s, %d thread(s), %d interleaved repetitions, ms: median [min, max]" % (torch.__version__,
      torch.get_num_threads(), reps))
for (name, *_), t in zip(variants, times):
    t.sort()
    print("%-42s %8.2f [%7.2f, %7.2f] ms" % (name, t[len(t) // 2], t[0], t[-1]))
