#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Makes tests/fixtures/ops/ops.txt: torch's outputs and gradients for the ops that masks, scans,
scatters, mixtures of experts and broadcasts need (topk, one_hot, the comparisons, the casts, cumsum,
scatter_add, index_add, gather, index_select, bmm, the grouped and segment linears, expand feeding
other ops), in float64, for tests/test_op_fixtures.c to replay through cgrad's ops. Run with
/usr/bin/python3 (torch 1.13); the op behind each case is repeated in the C test.

Format (as tests/make_conv_fixtures.py): one tensor a line, whitespace-separated:
NAME NDIM DIMS... VALUES... (row-major, %.17g; int32 tensors hold integers, NaN is "nan").
For each case C: C.<input> for each input, C.y0, C.y1, ... the outputs, C.r<k> the weights of the
loss sum_k sum(y<k> * r<k>) for each output that carries a gradient, and C.d<input> the gradient of
that loss for each input that takes one.

Every real input and weight is rounded to float32 first, so the float32 build reads the same numbers.
topk's inputs have no ties: torch's CPU kernel returns equal values in no documented order (cgrad
puts the lower index first), so a tie would test torch's partial sort, not the op.
"""
import os

import torch
import torch.nn.functional as F

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "ops", "ops.txt")
lines = []


def put(name, t):
    t = t.detach().contiguous()
    vals = " ".join(("%d" % v) if isinstance(v, int) else ("%.17g" % v) for v in t.reshape(-1).tolist())
    lines.append("%s %d %s %s" % (name, t.dim(), " ".join(str(d) for d in t.shape), vals))


def real(*shape):
    """Normal numbers exact in float32, which take a gradient."""
    return torch.randn(shape).float().double().requires_grad_()


def const(values):
    """Fixed real numbers that take no gradient."""
    return torch.tensor(values, dtype=torch.float64)


def distinct(*shape):
    """Reals without ties (a shuffled ramp of multiples of 0.375), exact in float32."""
    n = 1
    for s in shape:
        n *= s
    return ((torch.randperm(n).double() - n / 2) * 0.375).reshape(shape).requires_grad_()


def ids(high, *shape):
    """int32 ids in [0, high), repeats likely."""
    return torch.randint(0, high, shape, dtype=torch.int32)


def case(name, fn, **inputs):
    """Runs fn on the inputs, weighs each real output that carries a gradient by a random r, and
    writes the inputs, outputs, weights and the loss's gradient for each input that takes one."""
    outs = fn(**inputs)
    outs = outs if isinstance(outs, (list, tuple)) else [outs]
    for k, y in enumerate(outs):
        put("%s.y%d" % (name, k), y)
    loss = 0
    for k, y in enumerate(outs):
        if y.requires_grad:
            r = torch.randn(y.shape).float().double()
            put("%s.r%d" % (name, k), r)
            loss = loss + (y * r).sum()
    if torch.is_tensor(loss):
        loss.backward()
    for key, t in inputs.items():
        put("%s.%s" % (name, key), t)
        if t.requires_grad:
            put("%s.d%s" % (name, key), t.grad if t.grad is not None else torch.zeros_like(t))


def topk(x, k, dim, largest):
    v, i = torch.topk(x, k, dim=dim, largest=largest, sorted=True)
    return [v, i.int()]


def comparisons(a, b):
    return [torch.eq(a, b).int(), torch.ne(a, b).int(), torch.lt(a, b).int(), torch.le(a, b).int(),
            torch.gt(a, b).int(), torch.ge(a, b).int()]


def segment_linear(x, w, ends):
    """torch._grouped_mm's semantics (not in torch 1.13) as a loop: rows [ends[e-1], ends[e]) times
    w[e]^T, rows past the last end 0."""
    parts, start = [], 0
    for e in range(w.shape[0]):
        end = int(ends[e])
        parts.append(x[start:end] @ w[e].t())
        start = end
    parts.append(torch.zeros(x.shape[0] - start, w.shape[1]))
    return torch.cat(parts, 0)


def main():
    torch.manual_seed(32)
    torch.set_default_dtype(torch.float64)
    nan = float("nan")

    # ---- topk: values (gradient through them) and int32 indices ----
    case("topk_last", lambda x: topk(x, 3, -1, True), x=distinct(3, 7))
    case("topk_axis0_smallest", lambda x: topk(x, 2, 0, False), x=distinct(6, 4))
    case("topk_mid", lambda x: topk(x, 4, 1, True), x=distinct(2, 5, 3))
    case("topk_all_smallest", lambda x: topk(x, 5, 2, False), x=distinct(2, 3, 5))
    # NaN ranks above every number in both directions: first for largest, last for smallest
    nan_x = const([[3, 1, nan, 2, -1, 0.5], [0.25, nan, -2, 4, 1.5, -0.75]]).requires_grad_()
    case("topk_nan_largest", lambda x: topk(x, 3, 1, True), x=nan_x)
    case("topk_nan_smallest", lambda x: topk(x, 6, 1, False), x=nan_x.detach().clone().requires_grad_())

    # ---- one_hot, comparisons, casts (no gradients) ----
    case("one_hot", lambda i: F.one_hot(i.long(), 5).int(), i=ids(5, 2, 3))
    # values from a small set, so eq, le and ge meet equal pairs; NaN in both operands
    grid = [-1, -0.5, 0, 0.5, 1]
    a = const([grid[int(v)] for v in torch.randint(0, 5, (12,))]).reshape(3, 4)
    a[1, 2] = nan
    b = const([0.5, -0.5, 0, nan])
    case("compare_row", comparisons, a=a, b=b)
    a = const([grid[int(v)] for v in torch.randint(0, 5, (6,))]).reshape(2, 1, 3)
    b = const([grid[int(v)] for v in torch.randint(0, 5, (4,))]).reshape(4, 1)
    case("compare_both", comparisons, a=a, b=b)
    case("compare_int", comparisons, a=torch.randint(-2, 3, (3, 4), dtype=torch.int32),
         b=torch.randint(-2, 3, (3, 1), dtype=torch.int32))
    # cg_to_int truncates toward zero, which is x.to(torch.int32): halves go toward zero, both signs
    case("to_int", lambda x: x.to(torch.int32),
         x=const([2.5, -2.5, 0.5, -0.5, 1.5, -1.5, 2.7, -2.7, 0.4999999701976776, -0.9999999403953552, 3, -3,
                  1e6 + 0.5, -1e6 - 0.5, 2147483520.0, -2147483648.0]))
    case("to_real", lambda i: i.double(), i=torch.tensor([[0, -1, 7], [2147483647, -2147483648, 16777217]],
                                                         dtype=torch.int32))

    # ---- cumsum: forward and reverse, every axis ----
    for axis, rev in [(0, False), (1, True), (2, False), (-1, True), (0, True)]:
        case("cumsum_%s%s" % (str(axis).replace("-", "m"), "_reverse" if rev else ""),
             lambda x, axis=axis, rev=rev: x.flip(axis).cumsum(axis).flip(axis) if rev else x.cumsum(axis),
             x=real(3, 4, 5))
    case("cumsum_transposed", lambda x: x.t().cumsum(1), x=real(4, 3))

    # ---- scatter_add, index_add (repeated indices) and their adjoints gather, index_select ----
    case("scatter_add_0", lambda x, i, s: torch.scatter_add(x, 0, i.long(), s), x=real(4, 3), i=ids(4, 5, 3),
         s=real(5, 3))
    case("scatter_add_1", lambda x, i, s: torch.scatter_add(x, 1, i.long(), s), x=real(3, 5), i=ids(5, 3, 4),
         s=real(3, 4))
    case("scatter_add_last", lambda x, i, s: torch.scatter_add(x, -1, i.long(), s), x=real(2, 3, 4),
         i=ids(4, 2, 3, 6), s=real(2, 3, 6))
    case("index_add_0", lambda x, i, s: torch.index_add(x, 0, i.long(), s), x=real(4, 3),
         i=torch.tensor([1, 3, 1, 0, 1, 3], dtype=torch.int32), s=real(6, 3))
    case("index_add_1", lambda x, i, s: torch.index_add(x, 1, i.long(), s), x=real(2, 5, 3), i=ids(5, 7),
         s=real(2, 7, 3))
    case("gather_1", lambda x, i: torch.gather(x, 1, i.long()), x=real(3, 5), i=ids(5, 3, 6))
    case("gather_0", lambda x, i: torch.gather(x, 0, i.long()), x=real(4, 2, 3), i=ids(4, 5, 2, 3))
    case("index_select_0", lambda x, i: torch.index_select(x, 0, i.long()), x=real(4, 3),
         i=torch.tensor([2, 0, 2, 3, 2], dtype=torch.int32))
    case("index_select_2", lambda x, i: torch.index_select(x, 2, i.long()), x=real(2, 3, 4), i=ids(4, 6))

    # ---- batched products ----
    case("bmm", lambda a, b: torch.bmm(a, b), a=real(3, 2, 4), b=real(3, 4, 5))
    case("bmm_transposed", lambda a, b: torch.bmm(a.transpose(1, 2), b), a=real(3, 4, 2), b=real(3, 4, 5))
    case("grouped_linear", lambda x, w, bias: torch.baddbmm(bias.unsqueeze(1), x, w.transpose(1, 2)),
         x=real(3, 4, 5), w=real(3, 6, 5), bias=real(3, 6))
    case("grouped_linear_nobias", lambda x, w: torch.einsum("etj,eoj->eto", x, w), x=real(2, 3, 4), w=real(2, 5, 4))
    # an empty segment (rows 2..2) and rows past the last end (6) that no expert takes
    case("segment_linear", segment_linear, x=real(7, 5), w=real(3, 4, 5),
         ends=torch.tensor([2, 2, 6], dtype=torch.int32))

    # ---- expand: a zero-stride view read in place, copied for the ops that need contiguous data ----
    case("expand_mul", lambda x, z: x.expand(2, 3, 5, 4) * z, x=real(3, 1, 4), z=real(2, 3, 5, 4))
    case("expand_add", lambda x, b: x.expand(2, -1, 5, -1) + b, x=real(3, 1, 4), b=real(5, 4))
    case("expand_matmul", lambda x, m: torch.matmul(x.expand(2, 3, 5, 4), m), x=real(3, 1, 4), m=real(4, 2))
    case("expand_sum", lambda x: x.expand(2, 3, 5, 4).sum(2), x=real(3, 1, 4))
    # one expand feeding a broadcasting product and a matmul: both gradients summed over the repeats
    case("expand_two_ops", lambda x, z, m: [x.expand(2, 3, 5, 4) * z, torch.matmul(x.expand(2, 3, 5, 4), m)],
         x=real(3, 1, 4), z=real(5, 4), m=real(4, 2))

    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("wrote", OUT, len(lines), "tensors")


if __name__ == "__main__":
    main()
