#!/usr/bin/env python3
"""Writes the checkpoint harness's seeds (tests/fuzz/corpus/checkpoint/) from valid_strict, a saved
encoder layer (d_model 8, 2 heads, feed-forward 16). Input format (checkpoint_harness.h): byte 0 bit 0
= non-strict, then the safetensors file. Every refusal seed is a well-formed safetensors file, so the
refusal comes from Module::load_state_dict (a seed the reader already rejects never reaches it).

Usage: python3 tests/fuzz/make_checkpoint_seeds.py [folder]   (default: the corpus folder)
"""

import json
import pathlib
import struct
import sys

corpus = pathlib.Path(
    sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent / "corpus" / "checkpoint"
)
base = (pathlib.Path(__file__).parent / "corpus" / "checkpoint" / "valid_strict").read_bytes()[1:]
header_len = struct.unpack("<Q", base[:8])[0]
header = json.loads(base[8 : 8 + header_len])
data = base[8 + header_len :]
metadata = header.pop("__metadata__", None)
# name -> (dtype, shape, bytes), in file order (the order of named_parameters()).
tensors = {
    n: (t["dtype"], t["shape"], data[t["data_offsets"][0] : t["data_offsets"][1]])
    for n, t in header.items()
}


def write(name, strict, entries):
    head, blob = {}, b""
    if metadata is not None:
        head["__metadata__"] = metadata
    for n, (dtype, shape, raw) in entries.items():
        head[n] = {
            "dtype": dtype,
            "shape": shape,
            "data_offsets": [len(blob), len(blob) + len(raw)],
        }
        blob += raw
    text = json.dumps(head).encode()
    (corpus / name).write_bytes(
        bytes([0 if strict else 1]) + struct.pack("<Q", len(text)) + text + blob
    )


def without(name):
    return {n: t for n, t in tensors.items() if n != name}


def replaced(name, dtype, shape, raw=None):
    out = dict(tensors)
    out[name] = (dtype, shape, tensors[name][2] if raw is None else raw)
    return out


def f32_to_half(raw, dtype):
    values = struct.unpack(f"<{len(raw) // 4}f", raw)
    if dtype == "F16":
        return struct.pack(f"<{len(values)}e", *values)
    # BF16: the top half (truncated)
    return b"".join(raw[i + 2 : i + 4] for i in range(0, len(raw), 4))


names = list(tensors)
middle = names[len(names) // 2]
write("valid_strict", True, tensors)
write("valid_nonstrict", False, tensors)
halves = ["F16", "BF16"]  # alternating, so that both conversions run (an f64 copy would pass 4 KiB)
write(
    "valid_half_strict",
    True,
    {
        n: (halves[i % 2], s, f32_to_half(r, halves[i % 2]))
        for i, (n, (d, s, r)) in enumerate(tensors.items())
    },
)
write("missing_last_strict", True, without(names[-1]))
write("missing_last_nonstrict", False, without(names[-1]))
write("missing_middle_strict", True, without(middle))
write("extra_name_strict", True, {**tensors, "extra.weight": ("F32", [1], b"\0\0\x80\x3f")})
write("extra_name_nonstrict", False, {**tensors, "extra.weight": ("F32", [1], b"\0\0\x80\x3f")})
d, s, r = tensors[names[-1]]
write("bad_shape_last", True, replaced(names[-1], d, [2, s[0] // 2]))
write("bad_shape_last_nonstrict", False, replaced(names[-1], d, [2, s[0] // 2]))
write("int_dtype_last", True, replaced(names[-1], "I32", s))
