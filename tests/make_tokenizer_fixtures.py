#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Writes tests/fixtures/tokenizer/*: run from anywhere with /usr/bin/python3 after ./setup.sh.

1. Runs tests/make_tokenizer_fixtures.js (node), which writes sample.txt and the GPT-2 ids that the
   npm package gpt-3-encoder@1.1.4 gives for it and for a prefix of data/moby-dick.txt.
2. Tokenizes sample.txt with bert-base-uncased's vocab (data/bert/vocab.txt) using the reference
   below, a transcription of google-research/bert tokenization.py (BasicTokenizer with
   do_lower_case=True, WordpieceTokenizer) onto Python's own unicodedata, and writes the ids,
   the tokens and BERT's " ".join(tokens).replace(" ##", "") decoding.
(node tests/make_tokenizer_fixtures.js tables regenerates io/tokenizer_unicode.c and
io/tokenizer_casefold.c; not run here.)
"""
import os
import subprocess
import unicodedata

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
FIX = os.path.join(HERE, "fixtures", "tokenizer")


# ---- google-research/bert tokenization.py, uncased ----
def load_vocab(path):
    vocab = {}
    with open(path, encoding="utf-8") as f:
        for index, line in enumerate(f):
            vocab[line.strip()] = index
    return vocab


def _is_whitespace(ch):
    if ch in (" ", "\t", "\n", "\r"):
        return True
    return unicodedata.category(ch) == "Zs"


def _is_control(ch):
    if ch in ("\t", "\n", "\r"):
        return False
    return unicodedata.category(ch) in ("Cc", "Cf")


def _is_punctuation(ch):
    cp = ord(ch)
    if (33 <= cp <= 47) or (58 <= cp <= 64) or (91 <= cp <= 96) or (123 <= cp <= 126):
        return True
    return unicodedata.category(ch).startswith("P")


def _is_chinese_char(cp):
    return ((0x4E00 <= cp <= 0x9FFF) or (0x3400 <= cp <= 0x4DBF) or (0x20000 <= cp <= 0x2A6DF)
            or (0x2A700 <= cp <= 0x2B73F) or (0x2B740 <= cp <= 0x2B81F) or (0x2B820 <= cp <= 0x2CEAF)
            or (0xF900 <= cp <= 0xFAFF) or (0x2F800 <= cp <= 0x2FA1F))


def basic_tokenize(text):
    out = []
    for ch in text:
        cp = ord(ch)
        if cp == 0 or cp == 0xFFFD or _is_control(ch):
            continue
        out.append(" " if _is_whitespace(ch) else ch)
    text = "".join(out)
    out = []
    for ch in text:
        out.append(" " + ch + " " if _is_chinese_char(ord(ch)) else ch)
    text = "".join(out)
    split = []
    for token in text.strip().split():
        token = token.lower()
        token = "".join(c for c in unicodedata.normalize("NFD", token) if unicodedata.category(c) != "Mn")
        pieces, start_new = [], True
        for ch in token:
            if _is_punctuation(ch):
                pieces.append([ch])
                start_new = True
            else:
                if start_new:
                    pieces.append([])
                start_new = False
                pieces[-1].append(ch)
        split.extend("".join(p) for p in pieces)
    return " ".join(split).strip().split()


def wordpiece_tokenize(vocab, text, unk="[UNK]", max_chars=100):
    out = []
    for token in basic_tokenize(text):
        chars = list(token)
        if len(chars) > max_chars:
            out.append(unk)
            continue
        bad, start, subs = False, 0, []
        while start < len(chars):
            end, cur = len(chars), None
            while start < end:
                sub = "".join(chars[start:end])
                if start > 0:
                    sub = "##" + sub
                if sub in vocab:
                    cur = sub
                    break
                end -= 1
            if cur is None:
                bad = True
                break
            subs.append(cur)
            start = end
        out.extend([unk] if bad else subs)
    return out


def random_texts(count, seed):
    """Random strings over characters whose Unicode properties are the same in Python's
    unicodedata and in the newer tables of io/tokenizer_unicode.c and io/tokenizer_casefold.c:
    controls, accents, many scripts, compatibility ideographs, punctuation and spaces of every
    kind. No capital sigma: Python lower-cases a word-final one to ς, io/ lower-cases per code
    point (documented)."""
    import random
    rng = random.Random(seed)
    ranges = [(0x20, 0x7E), (0x20, 0x7E), (0x20, 0x7E), (0x00, 0x1F), (0x7F, 0x9F), (0xA0, 0x24F),
              (0x300, 0x36F), (0x370, 0x3FF), (0x400, 0x4FF), (0x600, 0x6FF), (0x900, 0x97F),
              (0xE00, 0xE7F), (0xAC00, 0xD7A3), (0x4E00, 0x9FEF), (0x3000, 0x30FF), (0xFF00, 0xFFEF),
              (0x2000, 0x206F), (0x2190, 0x22FF), (0x1F300, 0x1F64F), (0xF900, 0xFAD9), (0xFFFD, 0xFFFD)]
    words = ["unaffable", "running", "Ahab", "WHALE", "naïve", "Æsir", "İstanbul", "[MASK]", "x" * 101]
    out = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randrange(30)):
            if rng.random() < 0.15:
                parts.append(rng.choice(words))
            elif rng.random() < 0.2:
                parts.append(rng.choice([" ", "  ", "\n", "\t", "\u3000", "\u00a0", "\u2028"]))
            else:
                lo, hi = rng.choice(ranges)
                cp = rng.randint(lo, hi)
                if cp != 0x3A3:
                    parts.append(chr(cp))
        out.append("".join(parts))
    return out


def main():
    subprocess.run(["node", os.path.join(HERE, "make_tokenizer_fixtures.js"), "fixtures"], check=True)
    vocab_path = os.path.join(REPO, "data", "bert", "vocab.txt")
    if not os.path.exists(vocab_path):
        raise SystemExit("data/bert/vocab.txt is missing: run ./setup.sh")
    vocab = load_vocab(vocab_path)
    with open(os.path.join(FIX, "sample.txt"), encoding="utf-8", newline="") as f:
        sample = f.read()
    tokens = wordpiece_tokenize(vocab, sample)
    ids = [vocab[t] for t in tokens]
    with open(os.path.join(FIX, "bert_sample.ids"), "w") as f:
        f.write("# google-research/bert tokenization.py (uncased) ids of sample.txt, bert-base-uncased vocab\n")
        f.write(" ".join(map(str, ids)) + "\n")
    with open(os.path.join(FIX, "bert_sample.tokens"), "w", encoding="utf-8") as f:
        f.write("\n".join(tokens) + "\n")
    with open(os.path.join(FIX, "bert_sample.decoded"), "w", encoding="utf-8") as f:
        f.write(" ".join(tokens).replace(" ##", ""))
    print(f"wrote tests/fixtures/tokenizer/bert_sample.* ({len(ids)} ids, unicodedata {unicodedata.unidata_version})")
    with open(os.path.join(FIX, "bert_random.tsv"), "w") as f:  # text as UTF-8 hex, tab, ids
        for text in random_texts(400, 2024):
            ids = [vocab[t] for t in wordpiece_tokenize(vocab, text)]
            f.write(text.encode("utf-8").hex() + "\t" + " ".join(map(str, ids)) + "\n")
    print("wrote tests/fixtures/tokenizer/bert_random.tsv (400 random texts)")


if __name__ == "__main__":
    main()
