#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Writes tests/fixtures/export/: what transformers' reference models make of directories written by
`cgrad export`, so that CI checks exports against them without torch (tests/hf_export_fixtures.sh).

For each of GPT-2 (GPT2LMHeadModel), BERT (BertForPreTraining), a BERT classifier
(BertForSequenceClassification) and LLaMA (LlamaForCausalLM), a tiny model is trained two steps with
the cgrad command; its checkpoint is kept (NAME.ckpt) and exported, and the exported directory is
read by the torch reference models of tests/check_hf_export.py. Kept for each:
  - NAME.ckpt             the checkpoint that `cgrad export` turns into the directory;
  - NAME.names.safetensors the reference model's own tensors under the file's names (so the names and
                           shapes are torch's, the values those it loaded from the export);
  - NAME.batch.safetensors a batch, and NAME.out.safetensors the reference model's logits on it (and
                           BERT's next-sentence logits) in float32.

Usage: make_export_fixtures.py CGRAD   (needs torch and numpy; run from anywhere)
"""

import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check_hf_export as chk  # noqa: E402  (the torch side of an exported directory)

np = chk.np
OUT = os.path.join(HERE, "fixtures", "export")
SMALL = ["--layers", "1", "--dim", "16", "--heads", "2", "--batch", "2", "--eval-every", "2", "--eval-batches", "1",
         "--samples", "0", "--threads", "1", "--decay-steps", "4", "--warmup", "1", "--steps", "2", "--context", "8"]


def run(args, cwd):
    r = subprocess.run(args, cwd=cwd, capture_output=True, text=True)
    if r.returncode:
        sys.exit("failed: %s\n%s%s" % (" ".join(args), r.stdout, r.stderr))


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    cgrad = os.path.abspath(sys.argv[1])
    os.makedirs(OUT, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "text.txt"), "w") as f:
            for i in range(1, 121):
                f.write("line %d: the whale %d swims past ship %d at dawn.\n" % (i, i * 7 % 13, i * 3 % 11))
        with open(os.path.join(tmp, "vocab.txt"), "w") as f:
            f.write("".join(w + "\n" for w in ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ":"] +
                            [str(i) for i in range(0, 130)] + "line the whale swims past ship at dawn".split()))
        with open(os.path.join(tmp, "cls.tsv"), "w") as f:
            for i in range(1, 41):
                f.write("pos\tline %d: the whale swims at dawn.\nneg\tthe ship %d: past line.\n" % (i, i))
        models = {
            "gpt2": ["--data", "text.txt", "--tokenizer", "bpe", "--vocab-size", "270"],
            "bert": ["--arch", "bert", "--data", "text.txt", "--tokenizer-path", "vocab.txt"],
            "bertcls": ["--arch", "bert", "--head", "classify", "--data", "cls.tsv", "--tokenizer-path", "vocab.txt"],
            "llama": ["--arch", "llama", "--data", "text.txt", "--tokenizer", "bpe", "--vocab-size", "270"],
        }
        for name, args in models.items():
            ckpt = os.path.join(tmp, name + ".ckpt")
            run([cgrad, "train"] + SMALL + args + ["--checkpoint", ckpt], tmp)
            shutil.copyfile(ckpt, os.path.join(OUT, name + ".ckpt"))
            d = os.path.join(tmp, name)
            run([cgrad, "export", ckpt, d], tmp)
            ok, r = chk.reference(d)
            if not ok or r is None:
                sys.exit("%s: the export does not read as its reference model" % name)
            out = chk.cgrad_step(cgrad, d, r["arch"], r["batch"], tmp)
            gap = np.abs(out["logits"] - r["outputs"]["logits"]).max()
            if gap > 1e-4:
                sys.exit("%s: cgrad's logits are %.1e from torch's" % (name, gap))
            prefix = "transformer." if name == "gpt2" else ""
            names = {prefix + k: v.float() for k, v in r["model"].state_dict().items()}
            chk.ref.st_write(os.path.join(OUT, name + ".names.safetensors"), names)
            chk.ref.st_write(os.path.join(OUT, name + ".batch.safetensors"), r["batch"])
            outs = {"logits": r["outputs"]["logits"].astype(np.float32)}
            if "nsp" in r["outputs"]:
                outs["seq_relationship_logits"] = r["outputs"]["nsp"].astype(np.float32)
            chk.ref.st_write(os.path.join(OUT, name + ".out.safetensors"), outs)
            print("%s: %d tensors, logits gap %.1e" % (name, len(names), gap))
    return 0


if __name__ == "__main__":
    sys.exit(main())
