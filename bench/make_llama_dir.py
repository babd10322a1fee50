#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Writes a LLaMA-shaped Hugging Face model directory with random weights from a fixed seed:
config.json as transformers writes it, weights in bf16 (or f32/f16) split over N shards with
model.safetensors.index.json (one file, model.safetensors, when --shards 1), and a tokenizer:
LLaMA-2's 32k tokenizer.json (with its tokenizer_config.json) when --tokenizer-json names one and the
vocabulary is 32000 (./setup.sh fetches it into data/llama2), else cg_tokenizer.json, a character
tokenizer over the text given, padded with unused code points to the model's vocabulary. The
default shape is TinyLlama-1.1B's.

    /usr/bin/python3 bench/make_llama_dir.py OUT_DIR [--layers 22] [--shards 2] [--dtype bf16]
        [--hidden 2048] [--intermediate 5632] [--heads 32] [--kv-heads 4] [--vocab 32000]
        [--text data/tinyshakespeare.txt] [--seed 0] [--max-positions 2048]
        [--tokenizer-json data/llama2/tokenizer.json]

Values are normal(0, 0.02) (norm weights 1), drawn tensor by tensor, so peak memory is one tensor.
"""
import argparse
import json
import os
import shutil
import struct

import torch

DTYPES = {"bf16": (torch.bfloat16, "BF16", "bfloat16"), "f16": (torch.float16, "F16", "float16"),
          "f32": (torch.float32, "F32", "float32")}


def tensors(a):
    """(name, shape) of every parameter, in the order transformers lists them."""
    h, f, hd = a.hidden, a.intermediate, a.hidden // a.heads
    out = [("model.embed_tokens.weight", (a.vocab, h))]
    for i in range(a.layers):
        p = f"model.layers.{i}."
        out += [(p + "self_attn.q_proj.weight", (a.heads * hd, h)), (p + "self_attn.k_proj.weight", (a.kv_heads * hd, h)),
                (p + "self_attn.v_proj.weight", (a.kv_heads * hd, h)), (p + "self_attn.o_proj.weight", (h, a.heads * hd)),
                (p + "mlp.gate_proj.weight", (f, h)), (p + "mlp.up_proj.weight", (f, h)),
                (p + "mlp.down_proj.weight", (h, f)), (p + "input_layernorm.weight", (h,)),
                (p + "post_attention_layernorm.weight", (h,))]
    out += [("model.norm.weight", (h,)), ("lm_head.weight", (a.vocab, h))]
    return out


def write_shard(path, items, a, gen):
    """items: [(name, shape)]; writes them in this order, values drawn now; returns their bytes."""
    dt, st_name, _ = DTYPES[a.dtype]
    size = torch.tensor([], dtype=dt).element_size()
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in items:
        n = 1
        for s in shape:
            n *= s
        header[name] = {"dtype": st_name, "shape": list(shape), "data_offsets": [off, off + n * size]}
        off += n * size
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(hb)))
        out.write(hb)
        for name, shape in items:
            if name.endswith("norm.weight"):
                t = torch.ones(shape, dtype=torch.float32)
            else:
                t = torch.empty(shape, dtype=torch.float32).normal_(0, 0.02, generator=gen)
            out.write(t.to(dt).contiguous().numpy().view("uint8").tobytes() if dt != torch.bfloat16
                      else t.to(dt).view(torch.int16).numpy().tobytes())
    return off


def write_tokenizer(a):
    """LLaMA-2's tokenizer.json and tokenizer_config.json when given and the vocabulary is theirs; else
    the character tokenizer. Returns a description."""
    src = a.tokenizer_json
    if src and os.path.isfile(src) and a.vocab == 32000:
        shutil.copy(src, os.path.join(a.out, "tokenizer.json"))
        cfg = os.path.join(os.path.dirname(src), "tokenizer_config.json")
        if os.path.isfile(cfg):
            shutil.copy(cfg, os.path.join(a.out, "tokenizer_config.json"))
        stale = os.path.join(a.out, "cg_tokenizer.json")
        if os.path.exists(stale):
            os.remove(stale)
        return f"the tokenizer of {src}"
    return f"a character tokenizer of {len(write_char_tokenizer(a))} ids"


def write_char_tokenizer(a):
    """cg_tokenizer.json: a character tokenizer with exactly the model's vocabulary (cgrad checks the
    two agree): the text's characters, then CJK and Hangul code points the text does not use."""
    text = open(a.text, encoding="utf-8").read()
    cps = sorted({ord(c) for c in text})[: a.vocab]
    used = set(cps)
    for c in list(range(0x4E00, 0xA000)) + list(range(0xAC00, 0xD7A4)):
        if len(cps) >= a.vocab:
            break
        if c not in used:
            cps.append(c)
    with open(os.path.join(a.out, "cg_tokenizer.json"), "w") as f:
        json.dump({"kind": "char", "codepoints": cps}, f)
    return cps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=22)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=5632)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--text", default="data/tinyshakespeare.txt")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-positions", type=int, default=2048)
    ap.add_argument("--tokenizer-json", default="", help="a 32k tokenizer.json to copy (LLaMA-2's)")
    ap.add_argument("--tokenizer-only", action="store_true", help="rewrite the tokenizer alone")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    if a.tokenizer_only:
        write_tokenizer(a)
        return
    gen = torch.Generator().manual_seed(a.seed)
    items = tensors(a)
    # shards cut by bytes, in order, as transformers' save_pretrained(max_shard_size) does
    sizes = [1 for _ in items]
    for k, (_, shape) in enumerate(items):
        for s in shape:
            sizes[k] *= s
    total, per, cut, acc = sum(sizes), sum(sizes) / a.shards, [[]], 0
    for k, item in enumerate(items):
        if acc >= per * len(cut) and len(cut) < a.shards:
            cut.append([])
        cut[-1].append(item)
        acc += sizes[k]
    weight_map, nbytes = {}, 0
    for i, part in enumerate(cut):
        fname = "model.safetensors" if a.shards == 1 else f"model-{i + 1:05d}-of-{a.shards:05d}.safetensors"
        nbytes += write_shard(os.path.join(a.out, fname), part, a, gen)
        for name, _ in part:
            weight_map[name] = fname
    if a.shards > 1:
        with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": nbytes}, "weight_map": weight_map}, f, indent=2)
    config = {"architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
              "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": a.hidden,
              "initializer_range": 0.02, "intermediate_size": a.intermediate, "max_position_embeddings": a.max_positions,
              "model_type": "llama", "num_attention_heads": a.heads, "num_hidden_layers": a.layers,
              "num_key_value_heads": a.kv_heads, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None,
              "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": DTYPES[a.dtype][2],
              "transformers_version": "4.35.0", "use_cache": True, "vocab_size": a.vocab}
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    tok = write_tokenizer(a)
    print(f"{a.out}: {a.layers} layers, {total / 1e9:.3f}B parameters, {nbytes / 2**30:.2f} GiB of {a.dtype} "
          f"in {len(cut)} file(s), {tok}")


if __name__ == "__main__":
    main()
