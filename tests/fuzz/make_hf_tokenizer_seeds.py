# SPDX-License-Identifier: MIT
# Seeds for fuzz_hf_tokenizer (tests/fuzz/corpus/hf_tokenizer): LLaMA-2's, LLaMA-3's and Qwen3's
# tokenizer.json (from ./setup.sh's data/) cut down to their first 400 ids and the merges among them,
# every other part kept as it is, each followed by "\n@@TEXT@@\n" and a short text.
#   python3 tests/fuzz/make_hf_tokenizer_seeds.py
import json
import os

here = os.path.dirname(os.path.abspath(__file__))
repo = os.path.dirname(os.path.dirname(here))
out = os.path.join(here, "corpus", "hf_tokenizer")
text = "Hello  world! It's 1234 naïve 中文 😀\n<s>x</s>"
for name in ("llama2", "llama3", "qwen3"):
    with open(os.path.join(repo, "data", name, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    keep = 400
    vocab = {k: v for k, v in tj["model"]["vocab"].items() if v < keep}
    merges = []
    for m in tj["model"]["merges"]:
        a, b = m if isinstance(m, list) else m.split(" ", 1)
        if a in vocab and b in vocab and a + b in vocab:
            merges.append(m)
    tj["model"]["vocab"] = vocab
    tj["model"]["merges"] = merges
    tj["added_tokens"] = [dict(a, id=keep + i) for i, a in enumerate(tj["added_tokens"][:3])]
    pp = tj.get("post_processor") or {}
    for st in (pp.get("special_tokens") or {}).values():
        st["ids"] = [next(a["id"] for a in tj["added_tokens"] if a["content"] == st["id"])]
    with open(os.path.join(out, name + ".json"), "w", encoding="utf-8") as f:
        f.write(json.dumps(tj, ensure_ascii=False) + "\n@@TEXT@@\n" + text)
