#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Makes tests/fixtures/optim/optim.txt: torch 1.13 SGD / Adam / AdamW runs that tests/test_optim.c
replays through cg_optim_step.

Three parameters (a 2-D weight, a bias, a LayerNorm-like gain) with fixed values, five fixed
gradient sets, a learning rate that changes every step; for each run the parameters after every
step and the moments after the last. Run with /usr/bin/python3 (torch 1.13).

Format: whitespace-separated tokens, one record a line, floats as %.9g (exact for float32):
  param NAME NDIM DIMS... VALUES...          initial values (row-major)
  grad STEP NAME VALUES...                   gradient of step STEP (0-based)
  run LABEL KIND BETA1 BETA2 EPS WD MOMENTUM NESTEROV   starts a run; the records below belong to it
  decay NAME 0|1                             parameter group: weight decay on or off
  lr STEP VALUE                              learning rate of step STEP
  expect STEP NAME VALUES...                 parameter after step STEP
  moment1 NAME VALUES... / moment2 NAME VALUES...   optimizer state after the last step
"""
import os

import torch

STEPS = 5
LR_MULT = [1.0, 0.5, 1.5, 1.0, 0.25]

torch.manual_seed(1234)
SHAPES = [("fc.weight", (5, 4)), ("fc.bias", (5,)), ("ln.weight", (4,))]
INIT = {name: torch.randn(shape) for name, shape in SHAPES}
INIT["ln.weight"] = 1.0 + 0.1 * torch.randn(4)
GRADS = [{name: torch.randn(shape) * 0.5 for name, shape in SHAPES} for _ in range(STEPS)]

# label, kind, base lr, torch kwargs, decay per param (False: a no-decay group)
RUNS = [
    ("adamw", "adamw", 1e-3, dict(betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1),
     {"fc.weight": True, "fc.bias": False, "ln.weight": False}),
    ("adam", "adam", 1e-3, dict(betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01),
     {"fc.weight": True, "fc.bias": True, "ln.weight": True}),
    ("sgd_momentum", "sgd", 0.1, dict(momentum=0.9, weight_decay=0.0),
     {"fc.weight": True, "fc.bias": True, "ln.weight": True}),
    ("sgd_nesterov", "sgd", 0.1, dict(momentum=0.9, nesterov=True, weight_decay=0.01),
     {"fc.weight": True, "fc.bias": False, "ln.weight": True}),
    ("sgd_plain", "sgd", 0.1, dict(weight_decay=0.01),
     {"fc.weight": True, "fc.bias": True, "ln.weight": True}),
]


def vals(t):
    return " ".join("%.9g" % x for x in t.detach().reshape(-1).tolist())


def run(out, label, kind, lr, kw, decay):
    params = {name: INIT[name].clone().requires_grad_(True) for name, _ in SHAPES}
    wd = kw.get("weight_decay", 0.0)
    groups = [{"params": [params[n] for n, _ in SHAPES if decay[n]], "weight_decay": wd},
              {"params": [params[n] for n, _ in SHAPES if not decay[n]], "weight_decay": 0.0}]
    groups = [g for g in groups if g["params"]]
    cls = {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam, "sgd": torch.optim.SGD}[kind]
    opt = cls(groups, lr=lr, **{k: v for k, v in kw.items() if k != "weight_decay"})
    b1, b2 = kw.get("betas", (0.9, 0.999))
    out.write("run %s %s %r %r %r %r %r %d\n" % (label, kind, b1, b2, kw.get("eps", 1e-8), wd,
                                                kw.get("momentum", 0.0), int(kw.get("nesterov", False))))
    for n, _ in SHAPES:
        out.write("decay %s %d\n" % (n, int(decay[n])))
    for s in range(STEPS):
        step_lr = lr * LR_MULT[s]
        for g in opt.param_groups:
            g["lr"] = step_lr
        for n, _ in SHAPES:
            params[n].grad = GRADS[s][n].clone()
        opt.step()
        out.write("lr %d %r\n" % (s, step_lr))
        for n, _ in SHAPES:
            out.write("expect %d %s %s\n" % (s, n, vals(params[n])))
    for n, _ in SHAPES:
        st = opt.state[params[n]]
        if "exp_avg" in st:
            out.write("moment1 %s %s\n" % (n, vals(st["exp_avg"])))
            out.write("moment2 %s %s\n" % (n, vals(st["exp_avg_sq"])))
        elif st.get("momentum_buffer") is not None:
            out.write("moment1 %s %s\n" % (n, vals(st["momentum_buffer"])))


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    os.makedirs(os.path.join(here, "fixtures", "optim"), exist_ok=True)
    path = os.path.join(here, "fixtures", "optim", "optim.txt")
    with open(path, "w") as out:
        out.write("# made by tests/make_optim_fixtures.py with torch %s; see its docstring for the format\n"
                  % torch.__version__)
        for n, shape in SHAPES:
            out.write("param %s %d %s %s\n" % (n, len(shape), " ".join(map(str, shape)), vals(INIT[n])))
        for s in range(STEPS):
            for n, _ in SHAPES:
                out.write("grad %d %s %s\n" % (s, n, vals(GRADS[s][n])))
        for r in RUNS:
            run(out, *r)
    print("wrote", path)


if __name__ == "__main__":
    main()
