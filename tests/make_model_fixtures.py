#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Parity fixtures for the cgrad model zoo (gpt2, bert, encdec, classifier).

Rerun:  /usr/bin/python3 tests/make_model_fixtures.py      (from the repository root or anywhere)
Needs torch (1.13 tested) and numpy only; it does not use `transformers` or `safetensors`: the
reference models are written out below and the safetensors files are written (and re-read, as a
check) by hand. Output is deterministic: fixed seeds, CPU, float64 arithmetic.

Every family gets tests/fixtures/models/<arch>/ holding
  config.json          the model config in the family's own field names, plus fields the C loader
                       must ignore ("architectures", "model_type", dropout probabilities, ...).
                       The fixtures are computed WITHOUT dropout whatever those fields say.
  weights.safetensors  the parameters (F32) under the names listed in each family's section.
  batch.safetensors    the batch (I64), with padding and ignored (-100) targets.
  expected.safetensors `logits` (every position, padded ones included), `loss` [1] and
                       `grad.<name>` for every parameter (a tied weight is one parameter whose
                       gradient holds both uses); bert also has `seq_relationship_logits`,
                       `mlm_loss` [1] and `nsp_loss` [1].
  adamw.json           the optimizer hyperparameters {"lr","beta1","beta2","eps","weight_decay","steps"}.
  adamw.safetensors    `losses` [steps] (the loss before each step) and every parameter, under its
                       own name, after `steps` steps of torch.optim.AdamW on the same batch (weight
                       decay on every parameter).
Extra weight files for the loader tests:
  gpt2/weights_hf_prefixed.safetensors  "transformer." before every name, plus lm_head.weight (equal
                       to wte) and the buffers transformer.h.{i}.attn.bias ([1,1,P,P] causal mask) and
                       transformer.h.{i}.attn.masked_bias (scalar -1e4), as real HF GPT-2 files have.
  gpt2/weights_bad_tied.safetensors     the same, except that lm_head.weight differs from
                       transformer.wte.weight in one element (by +0.25): a loader must reject it.
  bert/weights_hf_tied.safetensors      weights.safetensors plus cls.predictions.decoder.weight (equal
                       to the word embeddings) and cls.predictions.decoder.bias (equal to
                       cls.predictions.bias), as real HF BERT checkpoints have.

Batches (all I64; -100 = ignored target):
  gpt2       input_ids [2,9], targets [2,9] (next token; row 1 is 6 tokens then pad id 0, its
             targets from position 5 on are -100; targets[0,3] and the last column are -100).
  bert       input_ids, token_type_ids, attention_mask (1 keep, 0 pad; row 1 has 2 pad), labels
             [2,8] (3 MLM targets), next_sentence_label [2]. logits = prediction_logits [2,8,89];
             loss = mlm_loss + nsp_loss.
  encdec     src [2,9] (row 1: 3 pad), src_mask [2,9], tgt_in [2,8] (bos-shifted; row 1 padded
             from 5), tgt_out [2,8] (-100 where tgt_in is padding). logits [2,8,67].
  classifier input_ids [2,9], attention_mask [2,9] (row 1: 4 pad), labels [2]. logits [2,3].

Numerics: weights are drawn in float32 (so the stored F32 values are exact), then every model runs
in float64 and results are rounded to F32 once when written. The references are thus the exact
values to float32 rounding; a float32 C implementation should match logits/loss to ~1e-5 relative
and gradients to ~1e-5 of the largest |grad| (compare gradients against that global scale, not
per element: some are exactly 0 in exact arithmetic, see below). The script reruns everything in
torch float32 and prints how far that lands from the references, a floor for C tolerances.
Key-projection biases (bert ...self.key.bias, classifier ...attn.k.bias, the middle third of gpt2
c_attn.bias and of encdec in_proj_bias) have an exact gradient of 0 (softmax is shift-invariant);
float32 gives noise of ~1e-9 there, and AdamW turns that into moves of up to lr*noise/(noise+eps)
per step (torch float32 itself lands ~2e-3 away after 3 steps), so compare those entries with an
absolute tolerance of a few lr, the rest of the AdamW parameters with ~1e-4.

safetensors layout written here: u64 LE header length N, JSON header with "__metadata__" first
then tensors sorted by name, space-padded to a multiple of 8, then the tensors' LE bytes in the
same order.
"""

import copy
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures", "models")

ADAMW = {"lr": 1e-2, "beta1": 0.9, "beta2": 0.98, "eps": 1e-8, "weight_decay": 0.1, "steps": 3}

torch.set_default_dtype(torch.float64)


# ----------------------------------------------------------------------------- safetensors

_DT = {"F32": ("<f4", 4), "I64": ("<i8", 8)}


def _as_array(t):
    a = t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
    # np.array, not np.ascontiguousarray: the latter turns a 0-d scalar into shape [1]
    if a.dtype.kind == "f":
        return np.array(a, dtype="<f4", order="C"), "F32"
    if a.dtype.kind in "iub":
        return np.array(a, dtype="<i8", order="C"), "I64"
    raise TypeError("unsupported dtype %s" % a.dtype)


def st_write(path, tensors, metadata=None):
    """Writes {name: tensor} as safetensors; returns {name: (dtype, array)} as written."""
    written = {name: _as_array(t) for name, t in tensors.items()}
    header = {"__metadata__": dict(metadata or {})}
    blobs, off = [], 0
    for name in sorted(written):
        arr, dt = written[name]
        b = arr.tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    hj = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hj += b" " * ((-len(hj)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for b in blobs:
            f.write(b)
    return {name: (dt, arr) for name, (arr, dt) in written.items()}


def st_read_check(path, expect):
    """Independent reader: parses the file from scratch, checks the header and offsets, and that
    every tensor equals what was meant to be written (expect: {name: (dtype, array)})."""
    with open(path, "rb") as f:
        raw = f.read()
    assert len(raw) >= 8, path
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0 and 8 + n <= len(raw), (path, n, len(raw))
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    buf = raw[8 + n:]
    meta = header.pop("__metadata__", {})
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()), path
    names = sorted(header)
    assert set(names) == set(expect), (path, set(names) ^ set(expect))
    spans = sorted((header[k]["data_offsets"][0], header[k]["data_offsets"][1], k) for k in names)
    pos = 0
    for b, e, k in spans:  # contiguous, no gaps or overlaps, covering the whole buffer
        assert b == pos and e >= b, (path, k, b, e, pos)
        pos = e
    assert pos == len(buf), (path, pos, len(buf))
    for k in names:
        h = header[k]
        npdt, size = _DT[h["dtype"]]
        b, e = h["data_offsets"]
        numel = int(np.prod(h["shape"])) if h["shape"] else 1
        assert e - b == numel * size, (path, k)
        got = np.frombuffer(buf[b:e], dtype=npdt).reshape(h["shape"])
        dt, want = expect[k]
        assert dt == h["dtype"] and list(want.shape) == h["shape"], (path, k)
        assert np.array_equal(got, want), (path, k)
        if dt == "F32":
            assert np.all(np.isfinite(got)), (path, k)
    return len(raw)


WRITTEN = []  # (path, size) for the report


def save_st(path, tensors, metadata=None):
    meta = {"format": "pt", "generator": "tests/make_model_fixtures.py"}
    meta.update(metadata or {})
    expect = st_write(path, tensors, meta)
    WRITTEN.append((path, st_read_check(path, expect)))


def save_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
    WRITTEN.append((path, os.path.getsize(path)))


# ----------------------------------------------------------------------------- shared helpers

def init_params(model, seed):
    """LayerNorm gains 1+0.1*randn and biases 0.1*randn; embeddings 0.1*randn; other matrices
    0.08*randn; other biases 0.05*randn. Drawn in float32 from a seeded generator, in the model's
    named_parameters order."""
    g = torch.Generator().manual_seed(seed)
    ln, emb_ids = {}, set()
    for m in model.modules():
        if isinstance(m, nn.LayerNorm):
            ln[id(m.weight)], ln[id(m.bias)] = "g", "b"
        if isinstance(m, nn.Embedding):
            emb_ids.add(id(m.weight))
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g, dtype=torch.float32)
            kind = ln.get(id(p))
            if kind == "g":
                v = 1.0 + 0.1 * r
            elif kind == "b":
                v = 0.1 * r
            elif id(p) in emb_ids:
                v = 0.1 * r
            elif p.dim() >= 2:
                v = 0.08 * r
            else:
                v = 0.05 * r
            p.copy_(v.to(torch.float32).to(p.dtype))


def params_of(model):
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def gelu_erf(x):
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def run_family(arch, model, batch, forward, config, seed, extra_expected_keys=(), init=None):
    """forward(model, batch) -> dict with 'logits', 'loss' (+extras). Writes all five files.
    init(model, seed) replaces init_params (families whose norms are not nn.LayerNorm)."""
    d = os.path.join(OUT, arch)
    os.makedirs(d, exist_ok=True)
    (init or init_params)(model, seed)
    model.train()  # no dropout anywhere, but training mode (and no torch fast paths)
    w0 = params_of(model)
    shadow = copy.deepcopy(model).float()  # the same run in float32, to size the C side's tolerances

    save_json(os.path.join(d, "config.json"), config)
    save_st(os.path.join(d, "weights.safetensors"), w0)
    save_st(os.path.join(d, "batch.safetensors"), batch)

    model.zero_grad()
    out = forward(model, batch)
    out["loss"].backward()
    exp = {"logits": out["logits"], "loss": out["loss"].reshape(1)}
    for k in extra_expected_keys:
        v = out[k]
        exp[k] = v.reshape(1) if v.dim() == 0 else v
    for name, p in model.named_parameters():
        assert p.grad is not None, (arch, name)
        exp["grad." + name] = p.grad.detach().clone()  # zero_grad() later zeroes p.grad in place
    for k, v in exp.items():
        assert torch.isfinite(v).all(), (arch, k)
    save_st(os.path.join(d, "expected.safetensors"), exp)

    # AdamW from the same starting weights (the forward/backward above changed nothing).
    model.zero_grad()
    opt = torch.optim.AdamW(model.parameters(), lr=ADAMW["lr"], betas=(ADAMW["beta1"], ADAMW["beta2"]),
                            eps=ADAMW["eps"], weight_decay=ADAMW["weight_decay"])
    losses = []
    for _ in range(ADAMW["steps"]):
        opt.zero_grad()
        loss = forward(model, batch)["loss"]
        losses.append(float(loss))
        loss.backward()
        opt.step()
    after = params_of(model)
    after["losses"] = torch.tensor(losses)
    save_json(os.path.join(d, "adamw.json"), ADAMW)
    save_st(os.path.join(d, "adamw.safetensors"), after)
    return float(out["loss"]), losses, float32_gap(shadow, forward, batch, exp, after), out


def key_bias_part(name, shape):
    """Boolean mask of the key-projection bias entries: their exact gradient is 0 (softmax ignores a
    shift shared by a query's scores), so what any implementation computes there is rounding noise,
    which AdamW's first steps blow up to about lr * noise / (noise + eps)."""
    m = torch.zeros(shape, dtype=torch.bool)
    if name.endswith(("self.key.bias", "attn.k.bias")):
        m[:] = True
    elif name.endswith(("c_attn.bias", "in_proj_bias")):
        d = shape[0] // 3
        m[d:2 * d] = True
    return m


def float32_gap(m, forward, batch, exp, after):
    """Runs the float32 copy m through the same forward/backward and AdamW steps and returns how far
    torch's own float32 results land from the float64 references (a floor for the C tolerances):
    (max |dlogits|, max |dgrad| / max |grad| over all parameters, max |dparam| after AdamW outside
    the key biases, max |dparam| on the key biases)."""
    m.zero_grad()
    out = forward(m, batch)
    out["loss"].backward()
    dlog = float((out["logits"].double() - exp["logits"]).abs().max())
    gscale = max(float(v.abs().max()) for k, v in exp.items() if k.startswith("grad."))
    gerr = max(float((p.grad.double() - exp["grad." + n]).abs().max()) for n, p in m.named_parameters()) / gscale
    m.zero_grad()
    opt = torch.optim.AdamW(m.parameters(), lr=ADAMW["lr"], betas=(ADAMW["beta1"], ADAMW["beta2"]),
                            eps=ADAMW["eps"], weight_decay=ADAMW["weight_decay"])
    for _ in range(ADAMW["steps"]):
        opt.zero_grad()
        forward(m, batch)["loss"].backward()
        opt.step()
    perr, kerr = 0.0, 0.0
    for name, p in m.named_parameters():
        diff = (p.detach().double() - after[name]).abs()
        kb = key_bias_part(name, diff.shape)
        perr = max(perr, float(diff[~kb].max()) if (~kb).any() else 0.0)
        kerr = max(kerr, float(diff[kb].max()) if kb.any() else 0.0)
    return dlog, gerr, perr, kerr


def ce(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)


# ----------------------------------------------------------------------------- 1. gpt2

class Conv1D(nn.Module):
    """HF GPT-2 Conv1D: weight [in, out], y = x @ W + b."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out))
        self.bias = nn.Parameter(torch.empty(n_out))

    def forward(self, x):
        return x @ self.weight + self.bias


class GPT2Attn(nn.Module):
    def __init__(self, d, nh):
        super().__init__()
        self.nh = nh
        self.c_attn = Conv1D(d, 3 * d)
        self.c_proj = Conv1D(d, d)

    def forward(self, x):
        B, T, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        sh = lambda t: t.view(B, T, self.nh, d // self.nh).transpose(1, 2)
        q, k, v = sh(q), sh(k), sh(v)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(d // self.nh)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        s = s.masked_fill(~causal, float("-inf"))
        y = torch.softmax(s, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).reshape(B, T, d))


class GPT2MLP(nn.Module):
    def __init__(self, d, ff):
        super().__init__()
        self.c_fc = Conv1D(d, ff)
        self.c_proj = Conv1D(ff, d)

    def forward(self, x):
        return self.c_proj(gelu_tanh(self.c_fc(x)))


class GPT2Block(nn.Module):
    def __init__(self, d, nh, ff, eps):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d, eps=eps)
        self.attn = GPT2Attn(d, nh)
        self.ln_2 = nn.LayerNorm(d, eps=eps)
        self.mlp = GPT2MLP(d, ff)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, ff = c["n_embd"], c["n_inner"] or 4 * c["n_embd"]
        self.wte = nn.Embedding(c["vocab_size"], d)
        self.wpe = nn.Embedding(c["n_positions"], d)
        self.h = nn.ModuleList(GPT2Block(d, c["n_head"], ff, c["layer_norm_epsilon"]) for _ in range(c["n_layer"]))
        self.ln_f = nn.LayerNorm(d, eps=c["layer_norm_epsilon"])

    def forward(self, ids):
        T = ids.shape[1]
        x = self.wte(ids) + self.wpe(torch.arange(T))
        for blk in self.h:
            x = blk(x)
        return self.ln_f(x) @ self.wte.weight.t()


def gpt2_config(vocab, positions, embd, layers, heads, dropout):
    """A GPT-2 config.json as transformers writes it, with these sizes (bos = eos = the last id)."""
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "activation_function": "gelu_new",
            "vocab_size": vocab, "n_positions": positions, "n_ctx": positions, "n_embd": embd,
            "n_layer": layers, "n_head": heads, "n_inner": None, "layer_norm_epsilon": 1e-5,
            "resid_pdrop": dropout, "embd_pdrop": dropout, "attn_pdrop": dropout, "initializer_range": 0.02,
            "bos_token_id": vocab - 1, "eos_token_id": vocab - 1, "scale_attn_weights": True, "use_cache": True,
            "torch_dtype": "float32"}


def gpt2_fixture():
    c = gpt2_config(vocab=97, positions=16, embd=32, layers=2, heads=4, dropout=0.1)
    g = torch.Generator().manual_seed(1001)
    B, T, V = 2, 9, c["vocab_size"]
    ids = torch.randint(1, V, (B, T), generator=g)
    ids[1, 6:] = 0                      # row 1: 6 real tokens, then padding (token 0)
    tgt = torch.full((B, T), -100, dtype=torch.long)
    tgt[:, :-1] = ids[:, 1:]
    tgt[1, 5:] = -100                   # no target predicts padding
    tgt[0, 3] = -100                    # an ignored target in the middle of a full row
    batch = {"input_ids": ids, "targets": tgt}
    model = GPT2(c)

    def fwd(m, b):
        logits = m(b["input_ids"])
        return {"logits": logits, "loss": ce(logits, b["targets"])}

    loss, losses, gap, out = run_family("gpt2", model, batch, fwd, c, seed=1)

    # causality: changing a later token leaves earlier logits alone
    d = os.path.join(OUT, "gpt2")
    w = read_back(os.path.join(d, "weights.safetensors"))
    with torch.no_grad():
        m2 = GPT2(c)
        m2.load_state_dict({k: torch.from_numpy(v).double() for k, v in w.items()})
        ids2 = ids.clone()
        ids2[0, 6] = (ids2[0, 6] + 1) % V
        a, b2 = m2(ids), m2(ids2)
        assert torch.equal(a[0, :6], b2[0, :6]) and not torch.allclose(a[0, 6:], b2[0, 6:])

    # loader-test weight files
    P = c["n_positions"]
    hf = {"transformer." + k: v for k, v in w.items()}
    hf["lm_head.weight"] = w["wte.weight"].copy()
    for i in range(c["n_layer"]):
        hf["transformer.h.%d.attn.bias" % i] = np.tril(np.ones((P, P), np.float32)).reshape(1, 1, P, P)
        hf["transformer.h.%d.attn.masked_bias" % i] = np.array(-1e4, np.float32)
        assert hf["transformer.h.%d.attn.masked_bias" % i].shape == ()
    save_st(os.path.join(d, "weights_hf_prefixed.safetensors"), hf)
    bad = dict(hf)
    bad["lm_head.weight"] = w["wte.weight"].copy()
    bad["lm_head.weight"][-1, -1] += 0.25
    save_st(os.path.join(d, "weights_bad_tied.safetensors"), bad)
    return loss, losses, gap


def read_back(path):
    """Tensors of a file written here, as float32/int64 arrays (via the independent parser)."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    h = json.loads(raw[8:8 + n])
    h.pop("__metadata__", None)
    buf = raw[8 + n:]
    return {k: np.frombuffer(buf[v["data_offsets"][0]:v["data_offsets"][1]], _DT[v["dtype"]][0])
            .reshape(v["shape"]).copy() for k, v in h.items()}


# ----------------------------------------------------------------------------- 2. bert

class Lin(nn.Module):
    """Plain container so the names come out as <prefix>.dense.weight etc."""


class BertLayer(nn.Module):
    def __init__(self, d, nh, ff, eps):
        super().__init__()
        self.nh = nh
        self.attention = Lin()
        self.attention.self = Lin()
        self.attention.self.query = nn.Linear(d, d)
        self.attention.self.key = nn.Linear(d, d)
        self.attention.self.value = nn.Linear(d, d)
        self.attention.output = Lin()
        self.attention.output.dense = nn.Linear(d, d)
        self.attention.output.LayerNorm = nn.LayerNorm(d, eps=eps)
        self.intermediate = Lin()
        self.intermediate.dense = nn.Linear(d, ff)
        self.output = Lin()
        self.output.dense = nn.Linear(ff, d)
        self.output.LayerNorm = nn.LayerNorm(d, eps=eps)

    def forward(self, x, add_mask):
        B, T, d = x.shape
        s_ = self.attention.self
        sh = lambda t: t.view(B, T, self.nh, d // self.nh).transpose(1, 2)
        q, k, v = sh(s_.query(x)), sh(s_.key(x)), sh(s_.value(x))
        s = (q @ k.transpose(-1, -2)) / math.sqrt(d // self.nh) + add_mask
        y = (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(B, T, d)
        a = self.attention.output.LayerNorm(x + self.attention.output.dense(y))
        h = self.output.dense(gelu_erf(self.intermediate.dense(a)))
        return self.output.LayerNorm(a + h)


class Bert(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, eps, V = c["hidden_size"], c["layer_norm_eps"], c["vocab_size"]
        self.bert = Lin()
        e = self.bert.embeddings = Lin()
        e.word_embeddings = nn.Embedding(V, d)
        e.position_embeddings = nn.Embedding(c["max_position_embeddings"], d)
        e.token_type_embeddings = nn.Embedding(c["type_vocab_size"], d)
        e.LayerNorm = nn.LayerNorm(d, eps=eps)
        self.bert.encoder = Lin()
        self.bert.encoder.layer = nn.ModuleList(
            BertLayer(d, c["num_attention_heads"], c["intermediate_size"], eps) for _ in range(c["num_hidden_layers"]))
        self.bert.pooler = Lin()
        self.bert.pooler.dense = nn.Linear(d, d)
        self.cls = Lin()
        self.cls.predictions = Lin()
        self.cls.predictions.transform = Lin()
        self.cls.predictions.transform.dense = nn.Linear(d, d)
        self.cls.predictions.transform.LayerNorm = nn.LayerNorm(d, eps=eps)
        self.cls.predictions.bias = nn.Parameter(torch.empty(V))
        self.cls.seq_relationship = nn.Linear(d, 2)

    def forward(self, ids, tt, mask):
        T = ids.shape[1]
        e = self.bert.embeddings
        x = e.LayerNorm(e.word_embeddings(ids) + e.position_embeddings(torch.arange(T)) + e.token_type_embeddings(tt))
        # HF: (1 - mask) * finfo.min added to the scores of padded keys
        add = (1.0 - mask.to(x.dtype))[:, None, None, :] * torch.finfo(x.dtype).min
        for layer in self.bert.encoder.layer:
            x = layer(x, add)
        p = self.cls.predictions
        h = p.transform.LayerNorm(gelu_erf(p.transform.dense(x)))
        logits = h @ e.word_embeddings.weight.t() + p.bias
        pooled = torch.tanh(self.bert.pooler.dense(x[:, 0]))
        return logits, self.cls.seq_relationship(pooled)


def bert_fixture():
    c = {"architectures": ["BertForPreTraining"], "model_type": "bert", "vocab_size": 89, "hidden_size": 32,
         "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64,
         "max_position_embeddings": 16, "type_vocab_size": 2, "layer_norm_eps": 1e-12, "hidden_act": "gelu",
         "pad_token_id": 0, "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
         "initializer_range": 0.02, "position_embedding_type": "absolute", "use_cache": True,
         "torch_dtype": "float32"}
    g = torch.Generator().manual_seed(2002)
    B, T, V = 2, 8, c["vocab_size"]
    PAD, CLS, SEP, MASK = 0, 1, 2, 3
    ids = torch.randint(4, V, (B, T), generator=g)
    # row 0: [CLS] a a a [SEP] b b [SEP]          row 1: [CLS] a a [SEP] b [SEP] pad pad
    ids[0, 0], ids[0, 4], ids[0, 7] = CLS, SEP, SEP
    ids[1, 0], ids[1, 3], ids[1, 5] = CLS, SEP, SEP
    ids[1, 6:] = PAD
    tt = torch.tensor([[0, 0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 1, 1, 0, 0]])
    mask = torch.tensor([[1] * 8, [1] * 6 + [0] * 2])
    labels = torch.full((B, T), -100, dtype=torch.long)
    for (r, t) in [(0, 2), (0, 5), (1, 4)]:       # 3 of 14 real tokens (~20%)
        labels[r, t] = ids[r, t]
    ids[0, 2] = MASK                              # 80/10/10 style: masked, random, kept
    ids[0, 5] = 57
    nsl = torch.tensor([0, 1])
    batch = {"input_ids": ids, "token_type_ids": tt, "attention_mask": mask, "labels": labels,
             "next_sentence_label": nsl}
    model = Bert(c)

    def fwd(m, b):
        logits, srl = m(b["input_ids"], b["token_type_ids"], b["attention_mask"])
        mlm = ce(logits, b["labels"])
        nsp = F.cross_entropy(srl, b["next_sentence_label"])
        return {"logits": logits, "seq_relationship_logits": srl, "mlm_loss": mlm, "nsp_loss": nsp,
                "loss": mlm + nsp}

    loss, losses, gap, out = run_family("bert", model, batch, fwd, c, seed=2,
                                             extra_expected_keys=("seq_relationship_logits", "mlm_loss", "nsp_loss"))
    print("  bert mlm_loss %.6f nsp_loss %.6f" % (float(out["mlm_loss"]), float(out["nsp_loss"])))

    # key padding: padded tokens do not affect the real positions of their row
    d = os.path.join(OUT, "bert")
    w = read_back(os.path.join(d, "weights.safetensors"))
    with torch.no_grad():
        m2 = Bert(c)
        m2.load_state_dict({k: torch.from_numpy(v).double() for k, v in w.items()})
        ids2 = ids.clone()
        ids2[1, 6:] = 40
        a, _ = m2(ids, tt, mask)
        b2, _ = m2(ids2, tt, mask)
        assert torch.allclose(a[1, :6], b2[1, :6], rtol=0, atol=1e-12) and not torch.allclose(a[1, 6:], b2[1, 6:])

    hf = dict(w)
    hf["cls.predictions.decoder.weight"] = w["bert.embeddings.word_embeddings.weight"].copy()
    hf["cls.predictions.decoder.bias"] = w["cls.predictions.bias"].copy()
    save_st(os.path.join(d, "weights_hf_tied.safetensors"), hf)
    return loss, losses, gap


# ----------------------------------------------------------------------------- 3. encdec

def sinusoid_pe(n, d):
    pos = torch.arange(n, dtype=torch.float64)[:, None]
    i2 = torch.arange(0, d, 2, dtype=torch.float64)
    ang = pos / torch.pow(10000.0, i2 / d)
    pe = torch.zeros(n, d)
    pe[:, 0::2] = torch.sin(ang)
    pe[:, 1::2] = torch.cos(ang)
    return pe


class EncDec(nn.Module):
    def __init__(self, c):
        super().__init__()
        d = c["d_model"]
        self.d = d
        self.src_emb = nn.Embedding(c["src_vocab_size"], d)
        self.tgt_emb = nn.Embedding(c["tgt_vocab_size"], d)
        self.transformer = nn.Transformer(d_model=d, nhead=c["n_head"], num_encoder_layers=c["num_encoder_layers"],
                                          num_decoder_layers=c["num_decoder_layers"],
                                          dim_feedforward=c["dim_feedforward"], dropout=0.0, activation="relu",
                                          batch_first=True, norm_first=False, layer_norm_eps=c["layer_norm_eps"])
        self.generator = nn.Linear(d, c["tgt_vocab_size"])
        self.register_buffer("pe", sinusoid_pe(c["max_len"], d), persistent=False)

    def forward(self, src, src_mask, tgt_in):
        S, T = src.shape[1], tgt_in.shape[1]
        sx = self.src_emb(src) * math.sqrt(self.d) + self.pe[:S]
        tx = self.tgt_emb(tgt_in) * math.sqrt(self.d) + self.pe[:T]
        causal = torch.triu(torch.full((T, T), float("-inf"), dtype=sx.dtype), diagonal=1)
        pad = src_mask == 0
        out = self.transformer(sx, tx, tgt_mask=causal, src_key_padding_mask=pad, memory_key_padding_mask=pad)
        return self.generator(out)


def encdec_manual(sd, c, src, src_mask, tgt_in):
    """Independent re-implementation from the state dict, to pin nn.Transformer's semantics."""
    d, nh, eps = c["d_model"], c["n_head"], c["layer_norm_eps"]
    ln = lambda x, p: F.layer_norm(x, (d,), sd[p + ".weight"], sd[p + ".bias"], eps)
    lin = lambda x, p: x @ sd[p + ".weight"].t() + sd[p + ".bias"]

    def mha(xq, xkv, p, add):
        B, Tq, _ = xq.shape
        Tk = xkv.shape[1]
        W, bb = sd[p + ".in_proj_weight"], sd[p + ".in_proj_bias"]
        q = xq @ W[:d].t() + bb[:d]
        k = xkv @ W[d:2 * d].t() + bb[d:2 * d]
        v = xkv @ W[2 * d:].t() + bb[2 * d:]
        sh = lambda t, n: t.view(B, n, nh, d // nh).transpose(1, 2)
        s = sh(q, Tq) @ sh(k, Tk).transpose(-1, -2) / math.sqrt(d // nh) + add
        y = (torch.softmax(s, -1) @ sh(v, Tk)).transpose(1, 2).reshape(B, Tq, d)
        return lin(y, p + ".out_proj")

    S, T = src.shape[1], tgt_in.shape[1]
    pe = sinusoid_pe(c["max_len"], d)
    x = F.embedding(src, sd["src_emb.weight"]) * math.sqrt(d) + pe[:S]
    y = F.embedding(tgt_in, sd["tgt_emb.weight"]) * math.sqrt(d) + pe[:T]
    kpad = torch.zeros(src.shape, dtype=torch.float64).masked_fill(src_mask == 0, float("-inf"))[:, None, None, :]
    causal = torch.triu(torch.full((T, T), float("-inf")), diagonal=1)
    for i in range(c["num_encoder_layers"]):
        p = "transformer.encoder.layers.%d" % i
        x = ln(x + mha(x, x, p + ".self_attn", kpad), p + ".norm1")
        x = ln(x + lin(F.relu(lin(x, p + ".linear1")), p + ".linear2"), p + ".norm2")
    mem = ln(x, "transformer.encoder.norm")
    for i in range(c["num_decoder_layers"]):
        p = "transformer.decoder.layers.%d" % i
        y = ln(y + mha(y, y, p + ".self_attn", causal), p + ".norm1")
        y = ln(y + mha(y, mem, p + ".multihead_attn", kpad), p + ".norm2")
        y = ln(y + lin(F.relu(lin(y, p + ".linear1")), p + ".linear2"), p + ".norm3")
    y = ln(y, "transformer.decoder.norm")
    return lin(y, "generator")


def encdec_fixture():
    c = {"architectures": ["TorchTransformerSeq2Seq"], "model_type": "encdec", "src_vocab_size": 61,
         "tgt_vocab_size": 67, "d_model": 32, "n_head": 4, "num_encoder_layers": 2, "num_decoder_layers": 2,
         "dim_feedforward": 64, "layer_norm_eps": 1e-5, "max_len": 16, "pad_id": 0, "bos_id": 1, "eos_id": 2,
         "dropout": 0.1, "activation": "relu", "norm_first": False}
    g = torch.Generator().manual_seed(3003)
    B, S, T = 2, 9, 8
    src = torch.randint(3, c["src_vocab_size"], (B, S), generator=g)
    src[0, -1] = c["eos_id"]
    src[1, 5] = c["eos_id"]
    src[1, 6:] = c["pad_id"]                       # row 1: 6 real source tokens, 3 pad
    src_mask = (src != c["pad_id"]).long()
    y = torch.randint(3, c["tgt_vocab_size"], (B, T), generator=g)
    tgt_in = torch.cat([torch.full((B, 1), c["bos_id"]), y[:, :-1]], 1)
    tgt_out = y.clone()
    tgt_out[0, -1] = c["eos_id"]
    tgt_out[1, 4] = c["eos_id"]                     # row 1: 5 real target steps
    tgt_in[1, 5:] = c["pad_id"]
    tgt_out[1, 5:] = -100
    batch = {"src": src, "src_mask": src_mask, "tgt_in": tgt_in, "tgt_out": tgt_out}
    model = EncDec(c)
    model.double()

    def fwd(m, b):
        logits = m(b["src"], b["src_mask"], b["tgt_in"])
        return {"logits": logits, "loss": ce(logits, b["tgt_out"])}

    # the state-dict names must be exactly the parameter names (no buffers, no duplicates)
    assert [n for n, _ in model.named_parameters()] == list(model.state_dict().keys())
    loss, losses, gap, out = run_family("encdec", model, batch, fwd, c, seed=3)

    w = read_back(os.path.join(OUT, "encdec", "weights.safetensors"))
    sd = {k: torch.from_numpy(v).double() for k, v in w.items()}
    with torch.no_grad():
        ref = encdec_manual(sd, c, src, src_mask, tgt_in)
        m2 = EncDec(c).double()
        m2.load_state_dict(sd)
        m2.train()
        again = m2(src, src_mask, tgt_in)
    err = float((ref - out["logits"]).abs().max())
    assert torch.isfinite(out["logits"]).all() and err < 1e-10, err
    # in training mode with grad disabled torch 1.13 still takes the slow path, so equal
    assert torch.equal(again, out["logits"].detach())
    print("  encdec nn.Transformer vs manual reference: max |diff| %.2e" % err)
    return loss, losses, gap


# ----------------------------------------------------------------------------- 4. classifier

class ClsAttn(nn.Module):
    def __init__(self, d, nh):
        super().__init__()
        self.nh = nh
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x, mask):
        B, T, d = x.shape
        sh = lambda t: t.view(B, T, self.nh, d // self.nh).transpose(1, 2)
        s = sh(self.q(x)) @ sh(self.k(x)).transpose(-1, -2) / math.sqrt(d // self.nh)
        s = s.masked_fill((mask == 0)[:, None, None, :], float("-inf"))
        y = (torch.softmax(s, -1) @ sh(self.v(x))).transpose(1, 2).reshape(B, T, d)
        return self.o(y)


class ClsBlock(nn.Module):
    def __init__(self, d, nh, ff, eps):
        super().__init__()
        self.attn = ClsAttn(d, nh)
        self.norm1 = nn.LayerNorm(d, eps=eps)
        self.ff = nn.Sequential(nn.Linear(d, ff), nn.ReLU(), nn.Linear(ff, d))
        self.norm2 = nn.LayerNorm(d, eps=eps)

    def forward(self, x, mask):
        x = self.norm1(x + self.attn(x, mask))
        return self.norm2(x + self.ff(x))


class Classifier(nn.Module):
    def __init__(self, c):
        super().__init__()
        d = c["d_model"]
        self.token_emb = nn.Embedding(c["vocab_size"], d)
        self.pos_emb = nn.Embedding(c["max_len"], d)
        self.blocks = nn.ModuleList(ClsBlock(d, c["n_head"], c["dim_feedforward"], c["layer_norm_eps"])
                                    for _ in range(c["n_layer"]))
        self.toprobs = nn.Linear(d, c["num_classes"])

    def forward(self, ids, mask):
        x = self.token_emb(ids) + self.pos_emb(torch.arange(ids.shape[1]))
        for b in self.blocks:
            x = b(x, mask)
        m = mask.to(x.dtype)[:, :, None]
        pooled = (x * m).sum(1) / m.sum(1)
        return self.toprobs(pooled)


def classifier_fixture():
    c = {"architectures": ["BloemCTransformer"], "model_type": "classifier", "vocab_size": 71, "d_model": 32,
         "n_head": 4, "n_layer": 2, "dim_feedforward": 64, "max_len": 16, "num_classes": 3,
         "layer_norm_eps": 1e-5, "pool": "mean", "dropout": 0.1}
    g = torch.Generator().manual_seed(4004)
    B, T = 2, 9
    ids = torch.randint(1, c["vocab_size"], (B, T), generator=g)
    ids[1, 5:] = 0
    mask = torch.tensor([[1] * 9, [1] * 5 + [0] * 4])
    labels = torch.tensor([2, 0])
    batch = {"input_ids": ids, "attention_mask": mask, "labels": labels}
    model = Classifier(c)

    def fwd(m, b):
        logits = m(b["input_ids"], b["attention_mask"])
        return {"logits": logits, "loss": F.cross_entropy(logits, b["labels"])}

    loss, losses, gap, out = run_family("classifier", model, batch, fwd, c, seed=4)
    w = read_back(os.path.join(OUT, "classifier", "weights.safetensors"))
    with torch.no_grad():
        m2 = Classifier(c)
        m2.load_state_dict({k: torch.from_numpy(v).double() for k, v in w.items()})
        ids2 = ids.clone()
        ids2[1, 5:] = 33
        assert torch.equal(m2(ids, mask), m2(ids2, mask))
    return loss, losses, gap


# ----------------------------------------------------------------------------- main

def main():
    torch.manual_seed(0)
    os.makedirs(OUT, exist_ok=True)
    results = {}
    for name, fn in [("gpt2", gpt2_fixture), ("bert", bert_fixture), ("encdec", encdec_fixture),
                     ("classifier", classifier_fixture)]:
        results[name] = fn()
        loss, losses, (dlog, gerr, perr, kerr) = results[name]
        print("%-10s loss %.6f  adamw losses %s" % (name, loss, " ".join("%.6f" % l for l in losses)))
        print("  torch float32 vs these references: logits %.1e, grads %.1e of the largest |grad|, "
              "params after AdamW %.1e (key biases %.1e)" % (dlog, gerr, perr, kerr))
    total = 0
    for path, size in WRITTEN:
        print("  %7d  %s" % (size, os.path.relpath(path, os.path.dirname(HERE))))
        total += size
    print("total %d bytes in %d files" % (total, len(WRITTEN)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
