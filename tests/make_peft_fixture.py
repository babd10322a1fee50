#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Writes tests/fixtures/peft/: a LoRA adapter directory as PEFT's save_pretrained lays it out
(adapter_model.safetensors with "base_model.model.<module>.lora_A.weight" / ".lora_B.weight",
adapter_config.json with PEFT's LoraConfig fields), for two nn.Linear modules of a LLaMA-named
model, and base.safetensors with their weights, an input for each and PyTorch's outputs of the
adapted layers, y = x W^T + (lora_alpha / r) (x A^T) B^T, as PEFT's lora.Linear computes (dropout 0).
PEFT itself is not installable here: its naming and arithmetic are mirrored from its documentation
and source (tuners/lora/layer.py). Run: /usr/bin/python3 tests/make_peft_fixture.py"""
import json
import math
import os
import struct

import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "peft")


def save(path, tensors, meta=None):
    header, blobs, off = {}, [], 0
    if meta:
        header["__metadata__"] = meta
    for name in sorted(tensors):
        b = tensors[name].contiguous().to(torch.float32).numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def main():
    torch.manual_seed(0)
    r, alpha = 2, 6  # scaling alpha / r = 3
    modules = {"model.layers.0.self_attn.q_proj": (6, 8), "model.layers.0.mlp.down_proj": (8, 5)}
    adapter, base = {}, {}
    for m, (out, inp) in modules.items():
        w = torch.randn(out, inp) * 0.3
        a = torch.empty(r, inp)
        torch.nn.init.kaiming_uniform_(a, a=math.sqrt(5))  # PEFT's init of lora_A
        b = torch.randn(out, r) * 0.2  # trained: nonzero (PEFT starts it at zero)
        x = torch.randn(3, inp)
        y = x @ w.T + (alpha / r) * ((x @ a.T) @ b.T)
        adapter[f"base_model.model.{m}.lora_A.weight"] = a
        adapter[f"base_model.model.{m}.lora_B.weight"] = b
        base[m + ".weight"], base[m + ".x"], base[m + ".y"] = w, x, y
    os.makedirs(os.path.join(OUT, "adapter"), exist_ok=True)
    save(os.path.join(OUT, "adapter", "adapter_model.safetensors"), adapter, {"format": "pt"})
    save(os.path.join(OUT, "base.safetensors"), base)
    config = {"alpha_pattern": {}, "auto_mapping": None, "base_model_name_or_path": "tiny-llama-test", "bias": "none",
              "fan_in_fan_out": False, "inference_mode": True, "init_lora_weights": True, "layer_replication": None,
              "layers_pattern": None, "layers_to_transform": None, "loftq_config": {}, "lora_alpha": alpha,
              "lora_dropout": 0.0, "megatron_config": None, "megatron_core": "megatron.core", "modules_to_save": None,
              "peft_type": "LORA", "r": r, "rank_pattern": {}, "revision": None,
              "target_modules": ["q_proj", "down_proj"], "task_type": "CAUSAL_LM", "use_dora": False,
              "use_rslora": False}
    with open(os.path.join(OUT, "adapter", "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
