#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Writes tests/fixtures/peft_gpt2/: a tiny GPT-2 in transformers' layout (base/config.json and
base/model.safetensors, Conv1D weights [in, out] under "transformer.") and LoRA adapters on its
c_attn, c_proj and c_fc as PEFT saves them for Conv1D (adapter/: fan_in_fan_out true, lora_A
[r, in], lora_B [out, r]), with expected.safetensors: input ids, PyTorch's logits of the adapted
model computed as PEFT's lora.Linear does on a Conv1D (y = x W + b + (alpha / r) (x A^T) B^T), and
the merged weights as PEFT's merge writes them (W + (alpha / r) (B A)^T, get_delta_weight with
fan_in_fan_out). The GPT-2 forward is tests/make_model_fixtures.py's. PEFT is not installable here:
its semantics are mirrored from its source (tuners/lora/layer.py, utils/other.py's transpose).
Run: /usr/bin/python3 tests/make_peft_gpt2_fixture.py"""
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_model_fixtures as mf  # noqa: E402  (its work runs under main(): importing writes nothing)

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "peft_gpt2")
R, ALPHA = 2, 6  # scaling alpha / r = 3
TARGETS = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")


def main():
    c = mf.gpt2_config(vocab=29, positions=8, embd=16, layers=2, heads=2, dropout=0.0)
    torch.manual_seed(0)
    model = mf.GPT2(c)
    mf.init_params(model, 7)
    model = model.double()
    g = torch.Generator().manual_seed(3)
    adapter, merged = {}, {}
    loras = {}
    for i in range(c["n_layer"]):
        for t in TARGETS:
            name = f"h.{i}.{t}"
            conv = model.get_submodule(name)
            n_in, n_out = conv.weight.shape  # Conv1D: [in, out]
            a = torch.empty(R, n_in, dtype=torch.float64)
            bound = 1 / math.sqrt(n_in)  # kaiming_uniform_(a=sqrt(5)) on [r, in]
            a.uniform_(-bound, bound, generator=g)
            b = torch.randn(n_out, R, generator=g, dtype=torch.float64) * 0.2  # trained: nonzero
            a, b = a.float().double(), b.float().double()  # the values the float32 files hold
            adapter[f"base_model.model.transformer.{name}.lora_A.weight"] = a
            adapter[f"base_model.model.transformer.{name}.lora_B.weight"] = b
            merged[f"transformer.{name}.weight"] = conv.weight.detach() + (ALPHA / R) * (b @ a).T
            loras[name] = (a, b)
    # the adapted forward: each Conv1D gains PEFT's lora path beside its product
    for name, (a, b) in loras.items():
        conv = model.get_submodule(name)
        conv.forward = (lambda cv, a, b: lambda x: x @ cv.weight + cv.bias + (ALPHA / R) * ((x @ a.T) @ b.T))(conv, a, b)
    ids = torch.tensor([[3, 17, 5, 9, 22, 1, 11], [8, 2, 27, 14, 6, 19, 4]])
    with torch.no_grad():
        logits = model(ids)
        # merged weights compute the same (PEFT's merge is exact up to rounding)
        m2 = mf.GPT2(c).double()
        sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
        for k, v in merged.items():
            sd[k[len("transformer."):]] = v
        m2.load_state_dict(sd)
        assert torch.allclose(m2(ids), logits, atol=1e-10)
    base = {"transformer." + k: v.detach() for k, v in model.state_dict().items()}
    os.makedirs(os.path.join(OUT, "base"), exist_ok=True)
    os.makedirs(os.path.join(OUT, "adapter"), exist_ok=True)
    mf.st_write(os.path.join(OUT, "base", "model.safetensors"), {k: v.float() for k, v in base.items()},
                {"format": "pt"})
    with open(os.path.join(OUT, "base", "config.json"), "w") as f:
        json.dump(c, f, indent=2)
        f.write("\n")
    mf.st_write(os.path.join(OUT, "adapter", "adapter_model.safetensors"),
                {k: v.float() for k, v in adapter.items()}, {"format": "pt"})
    config = {"alpha_pattern": {}, "auto_mapping": None, "base_model_name_or_path": "../base", "bias": "none",
              "fan_in_fan_out": True, "inference_mode": True, "init_lora_weights": True, "layer_replication": None,
              "layers_pattern": None, "layers_to_transform": None, "loftq_config": {}, "lora_alpha": ALPHA,
              "lora_dropout": 0.0, "megatron_config": None, "megatron_core": "megatron.core", "modules_to_save": None,
              "peft_type": "LORA", "r": R, "rank_pattern": {}, "revision": None,
              "target_modules": ["c_attn", "c_proj", "c_fc"], "task_type": "CAUSAL_LM", "use_dora": False,
              "use_rslora": False}
    with open(os.path.join(OUT, "adapter", "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    expected = {"input_ids": ids, "logits": logits.float()}
    expected.update({k: v.float() for k, v in merged.items()})
    mf.st_write(os.path.join(OUT, "expected.safetensors"), expected)


if __name__ == "__main__":
    main()
