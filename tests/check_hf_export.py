#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Checks a directory written by `cgrad export` against the torch reference models of
tests/make_model_fixtures.py, tests/make_llama_fixtures.py and tests/make_family_fixtures.py (Mistral,
Qwen2, Qwen3), the way transformers' from_pretrained would read it:

  - model.safetensors has "format": "pt" metadata (from_pretrained refuses a file without it);
  - config.json names the class (architectures) and model_type, and the reference model built from
    config.json alone has exactly the file's tensors, shape for shape, with the tied ones left out
    as save_pretrained leaves them out (GPT2LMHeadModel: every name under "transformer.", no
    lm_head.weight; BertForPreTraining: no cls.predictions.decoder.*);
  - that model's logits on a batch equal cgrad's own (`cgrad step` on the exported files).

Usage: check_hf_export.py CGRAD DIR [DIR ...]   (exit 0 when every check holds)
"""

import json
import os
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_model_fixtures as ref  # noqa: E402  (torch, numpy and the reference models)
import make_llama_fixtures as llama_ref  # noqa: E402  (the LlamaForCausalLM reference)
import make_family_fixtures as family_ref  # noqa: E402  (Mistral, Qwen2, Qwen3, LLaMA's optional fields)

torch, np = ref.torch, ref.np


def read_st(path):
    """(metadata, {name: float64 array}) of an F32/F64 safetensors file, parsed here."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    h = json.loads(raw[8:8 + n])
    meta = h.pop("__metadata__", {})
    buf = raw[8 + n:]
    dt = {"F32": "<f4", "F64": "<f8"}
    return meta, {k: np.frombuffer(buf[v["data_offsets"][0]:v["data_offsets"][1]], dt[v["dtype"]])
                  .reshape(v["shape"]).astype(np.float64) for k, v in h.items()}


class BertSeqCls(torch.nn.Module):
    """transformers' BertForSequenceClassification: the reference BERT's encoder and pooler (the
    names bert.*), a linear head classifier.* on the pooled [CLS]; no pretraining heads."""

    def __init__(self, c):
        super().__init__()
        full = ref.Bert(c)
        self.bert = full.bert
        self.classifier = torch.nn.Linear(c["hidden_size"], c["num_labels"])

    def forward(self, ids, mask):
        e, T = self.bert.embeddings, ids.shape[1]
        x = e.LayerNorm(e.word_embeddings(ids) + e.position_embeddings(torch.arange(T)) +
                        e.token_type_embeddings(torch.zeros_like(ids)))
        add = (1.0 - mask.to(x.dtype))[:, None, None, :] * torch.finfo(x.dtype).min
        for layer in self.bert.encoder.layer:
            x = layer(x, add)
        return self.classifier(torch.tanh(self.bert.pooler.dense(x[:, 0])))


# model_type -> the transformers class of the LLaMA-style families
FAMILIES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
            "qwen3": "Qwen3ForCausalLM", "mixtral": "MixtralForCausalLM"}


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what)
    return bool(cond)


def reference(d):
    """The torch side of a directory written by `cgrad export`: (ok, ref) where ref holds the
    reference model built from config.json alone and loaded with the file's tensors (model), the
    file's tensors (sd), a batch, the `cgrad step --arch` to run and the torch outputs on the batch
    (outputs: logits, and the next-sentence logits for BertForPreTraining). ref is None when the
    file's tensors are not the reference model's."""
    cfg = json.load(open(os.path.join(d, "config.json")))
    meta, w = read_st(os.path.join(d, "model.safetensors"))
    ok = check(meta.get("format") == "pt", "%s: metadata format = pt (%s)" % (d, meta))
    mt, arch = cfg.get("model_type"), (cfg.get("architectures") or ["?"])[0]
    rng = np.random.default_rng(5)
    if mt == "gpt2":
        ok &= check(arch == "GPT2LMHeadModel", "%s: architectures %s" % (d, arch))
        ok &= check(all(k.startswith("transformer.") for k in w) and "lm_head.weight" not in w,
                    "%s: every name under transformer., the tied lm_head.weight left out" % d)
        model = ref.GPT2(cfg).double()
        sd = {k[len("transformer."):]: v for k, v in w.items()}
        t = min(cfg["n_positions"], 12)
        ids = rng.integers(0, cfg["vocab_size"], size=(2, t))
        batch = {"input_ids": ids, "targets": np.roll(ids, -1, axis=1)}
    elif mt in FAMILIES:
        ok &= check(arch == FAMILIES[mt], "%s: architectures %s" % (d, arch))
        ok &= check(("lm_head.weight" in w) == (not cfg.get("tie_word_embeddings")),
                    "%s: lm_head.weight stored exactly when the head is untied" % d)
        plain = mt == "llama" and not (cfg.get("tie_word_embeddings") or cfg.get("attention_bias") or cfg.get("mlp_bias"))
        model = (llama_ref.LlamaForCausalLM(cfg) if plain else family_ref.ForCausalLM(cfg)).double()
        sd = dict(w)
        t = min(cfg["max_position_embeddings"], 12)
        ids = rng.integers(0, cfg["vocab_size"], size=(2, t))
        batch = {"input_ids": ids, "targets": np.roll(ids, -1, axis=1)}
    elif mt == "bert" and arch == "BertForSequenceClassification":
        model = BertSeqCls(cfg).double()
        sd = dict(w)
        t = min(cfg["max_position_embeddings"], 12)
        ids = rng.integers(0, cfg["vocab_size"], size=(2, t))
        mask = np.ones((2, t), dtype=np.int64)
        mask[1, t - 3:] = 0
        batch = {"input_ids": ids, "attention_mask": mask, "labels": np.array([0, cfg["num_labels"] - 1])}
    elif mt == "bert":
        ok &= check(arch == "BertForPreTraining", "%s: architectures %s" % (d, arch))
        ok &= check(not any(k.startswith("cls.predictions.decoder") for k in w),
                    "%s: the tied decoder weight and bias left out" % d)
        model = ref.Bert(cfg).double()
        sd = dict(w)
        t = min(cfg["max_position_embeddings"], 12)
        ids = rng.integers(0, cfg["vocab_size"], size=(2, t))
        mask = np.ones((2, t), dtype=np.int64)
        mask[1, t - 3:] = 0
        labels = np.full((2, t), -100)
        labels[:, 2] = ids[:, 2]
        batch = {"input_ids": ids, "token_type_ids": np.zeros((2, t), dtype=np.int64), "attention_mask": mask,
                 "labels": labels, "next_sentence_label": np.array([0, 1])}
    else:
        return check(False, "%s: model_type %s has no transformers class to check" % (d, mt)), None
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in sd.items()}
    ok &= check(want == got, "%s: the file's %d tensors are the reference model's, shape for shape%s" % (
        d, len(got), "" if want == got else " (differ: %s)" % sorted(set(want.items()) ^ set(got.items()))[:6]))
    if want != got:
        return False, None
    model.load_state_dict({k: torch.from_numpy(v) for k, v in sd.items()}, strict=True)
    tb = {k: torch.from_numpy(np.asarray(v)) for k, v in batch.items()}
    outputs = {}
    with torch.no_grad():
        if mt == "gpt2" or mt in FAMILIES:
            outputs["logits"] = model(tb["input_ids"]).numpy()
        elif arch == "BertForSequenceClassification":
            outputs["logits"] = model(tb["input_ids"], tb["attention_mask"]).numpy()
        else:
            logits, nsp = model(tb["input_ids"], tb["token_type_ids"], tb["attention_mask"])
            outputs["logits"], outputs["nsp"] = logits.numpy(), nsp.numpy()
    step_arch = "llama" if mt in FAMILIES else mt
    return ok, {"model": model, "sd": sd, "batch": batch, "arch": step_arch, "outputs": outputs}


def cgrad_step(cgrad, d, arch, batch, tmp):
    """cgrad's own outputs ({name: float64 array}) on the batch, through `cgrad step` on the
    exported files; None (with a FAIL line) when the command fails."""
    bp, op = os.path.join(tmp, "batch.safetensors"), os.path.join(tmp, "out.safetensors")
    ref.st_write(bp, batch)
    r = subprocess.run([cgrad, "step", "--arch", arch, "--config", os.path.join(d, "config.json"), "--weights",
                        os.path.join(d, "model.safetensors"), "--batch", bp, "--out", op, "--threads", "1"],
                       capture_output=True, text=True)
    if not check(r.returncode == 0, "%s: cgrad step on the exported files %s" % (d, r.stderr.strip())):
        return None
    return read_st(op)[1]


def check_dir(cgrad, d):
    ok, r = reference(d)
    if r is None:
        return False
    with tempfile.TemporaryDirectory() as tmp:
        out = cgrad_step(cgrad, d, r["arch"], r["batch"], tmp)
    if out is None:
        return False
    if "nsp" in r["outputs"]:
        gap = np.abs(out["nsp_logits" if "nsp_logits" in out else "seq_relationship_logits"] - r["outputs"]["nsp"]).max()
        ok &= check(gap < 1e-4, "%s: next-sentence logits equal torch's (max gap %.1e)" % (d, gap))
    logits = r["outputs"]["logits"]
    gap = np.abs(out["logits"] - logits).max() / max(1.0, np.abs(logits).max())
    ok &= check(gap < 1e-4, "%s: logits equal the torch reference's on the exported weights (max gap %.1e)" % (d, gap))
    return ok


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    ok = True
    for d in sys.argv[2:]:
        ok &= check_dir(sys.argv[1], d)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
