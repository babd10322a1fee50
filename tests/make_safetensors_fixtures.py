#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Writes the safetensors fixtures read by tests/test_safetensors.c.

No safetensors package here, so the format is written by hand (struct + json), the way the
reference implementation lays it out: u64 little-endian header length, JSON header, byte buffer.
torch does the float16/bfloat16 rounding, so the C decoder is checked against an independent one:
each low-precision tensor "x" comes with "x_f32", torch's own conversion of it to float32.

Run: /usr/bin/python3 tests/make_safetensors_fixtures.py
"""
import json
import os
import struct

import numpy as np
import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "safetensors")


def raw(t):
    """Little-endian bytes of a tensor (bfloat16 through an int16 view: numpy has no bfloat16)."""
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().astype(t.numpy().dtype.newbyteorder("<")).tobytes()


DT = {torch.float32: "F32", torch.float64: "F64", torch.float16: "F16", torch.bfloat16: "BF16",
      torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
      torch.uint8: "U8", torch.bool: "BOOL"}


def image(tensors, metadata=None, header_override=None, pad=True):
    """tensors: list of (name, tensor) in file order. Returns the file bytes."""
    header, buf = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, t in tensors:
        b = raw(t)
        header[name] = {"dtype": DT[t.dtype], "shape": list(t.shape),
                        "data_offsets": [len(buf), len(buf) + len(b)]}
        buf += b
    h = header_override if header_override is not None else json.dumps(header, separators=(",", ":"))
    h = h.encode()
    if pad:
        h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + buf


def put(name, data):
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)


def main():
    os.makedirs(OUT, exist_ok=True)
    # float32 / float64, tensors deliberately not in name order, an empty and a scalar tensor
    w = torch.tensor([[1.5, -2.25, 3.0], [0.1, 1e-30, -7e20]], dtype=torch.float32)
    d = torch.tensor([1.0 / 3.0, -2.5e-300, 123456789.125], dtype=torch.float64)
    put("f32.safetensors", image(
        [("weight", w), ("bias", torch.tensor([0.5, -0.5], dtype=torch.float32)),
         ("scalar", torch.tensor(42.0)), ("empty", torch.zeros(2, 0)), ("double", d),
         ("double_as_f32", d.float())],
        metadata={"format": "pt", "note": "hello \"world\""}))

    # float16 and bfloat16: normals, subnormals, signed zero, inf, nan, max, rounding
    h = torch.tensor([1.0, -2.5, 65504.0, 2.0 ** -14, 2.0 ** -24, 3 * 2.0 ** -24, 1023 * 2.0 ** -24,
                      -0.0, float("inf"), float("-inf"), float("nan"), 0.1, -1e-6, 1e5],
                     dtype=torch.float32)
    x16 = h.half()
    put("f16.safetensors", image([("x", x16), ("x_f32", x16.float()), ("m", x16[:12].reshape(3, 4)),
                                  ("m_f32", x16[:12].float().reshape(3, 4))]))
    b = torch.tensor([1.0, -2.5, 3.0e38, 2.0 ** -126, 2.0 ** -133, 5 * 2.0 ** -133, -0.0,
                      float("inf"), float("-inf"), float("nan"), 0.1, 1.00390625, -1e-40],
                     dtype=torch.float32)
    xb = b.bfloat16()
    put("bf16.safetensors", image([("x", xb), ("x_f32", xb.float())]))

    # integer tensors for cg_st_read_ids, and one that does not fit int32
    put("ids.safetensors", image([
        ("ids", torch.tensor([[0, 5, 50256], [-3, 2 ** 31 - 1, -2 ** 31]], dtype=torch.int64)),
        ("i32", torch.tensor([7, -8, 9], dtype=torch.int32)),
        ("i16", torch.tensor([-32768, 32767], dtype=torch.int16)),
        ("i8", torch.tensor([-128, 127], dtype=torch.int8)),
        ("u8", torch.tensor([0, 255], dtype=torch.uint8)),
        ("mask", torch.tensor([True, False, True], dtype=torch.bool)),
        ("too_big", torch.tensor([1, 2 ** 31], dtype=torch.int64))]))

    # two tensors sharing bytes: the format allows overlap
    a = torch.arange(6, dtype=torch.float32)
    hdr = {"all": {"dtype": "F32", "shape": [6], "data_offsets": [0, 24]},
           "tail": {"dtype": "F32", "shape": [2, 2], "data_offsets": [8, 24]}}
    put("overlap.safetensors", image([("all", a)], header_override=json.dumps(hdr)))

    # ---- bad files: each one wrong in exactly one way ----
    good = image([("t", torch.tensor([1.0, 2.0], dtype=torch.float32))])
    put("bad_truncated.safetensors", good[:5])
    put("bad_header_len.safetensors", struct.pack("<Q", 1000) + good[8:])
    ent = '{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}'  # missing closing brace
    put("bad_json.safetensors", image([("t", torch.tensor([1.0, 2.0]))], header_override=ent))
    put("bad_not_object.safetensors", image([("t", torch.tensor([1.0, 2.0]))], header_override="[1,2]"))

    def one(entry, data=struct.pack("<2f", 1.0, 2.0)):
        h = ('{"t":%s}' % entry).encode()
        h += b" " * (-len(h) % 8)
        return struct.pack("<Q", len(h)) + h + data

    put("bad_offsets_past_end.safetensors", one('{"dtype":"F32","shape":[4],"data_offsets":[0,16]}'))
    put("bad_size.safetensors", one('{"dtype":"F32","shape":[3],"data_offsets":[0,8]}'))
    put("bad_dtype.safetensors", one('{"dtype":"F12","shape":[2],"data_offsets":[0,8]}'))
    put("bad_no_dtype.safetensors", one('{"shape":[2],"data_offsets":[0,8]}'))
    put("bad_no_shape.safetensors", one('{"dtype":"F32","data_offsets":[0,8]}'))
    put("bad_no_offsets.safetensors", one('{"dtype":"F32","shape":[2]}'))
    put("bad_end_before_begin.safetensors", one('{"dtype":"F32","shape":[0],"data_offsets":[8,4]}'))
    put("bad_negative_dim.safetensors", one('{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}'))
    dup = ('{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
           '"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}')
    put("bad_duplicate.safetensors", image([("t", torch.tensor([1.0, 2.0]))], header_override=dup))
    meta = '{"__metadata__":{"k":3},"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
    put("bad_metadata.safetensors", image([("t", torch.tensor([1.0, 2.0]))], header_override=meta))
    print("wrote", len(os.listdir(OUT)), "files to", OUT)


if __name__ == "__main__":
    main()
