"""The conformance cases of tests/cases/attention_cases.txt (its header states the format): the one list that the
reference crosscheck, the cpu backend on every ISA and the ring under MPI run in C++ (tests/cases/
conformance_cases.h reads the same file), and test_contract.py runs through attn.attention.

    CASES: list of Case(name, spec, seed), in the file's order
    Case.inputs(convert): q, k, v in the case's memory layout and the options (attn.attention's keywords), drawn
        from the case's seed with NumPy (the same options as the C++ runners, not the same values); `convert` makes
        the array type and dtype from float64 NumPy (np.float32, a torch bfloat16 converter, ...)
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import NamedTuple

import numpy as np

CASES_FILE = Path(__file__).resolve().parents[2] / "tests" / "cases" / "attention_cases.txt"

# conformance_default_spec() of conformance_cases.h.
DEFAULTS = {
    "batch": (2,),
    "hq": 4,
    "hkv": 2,
    "lq": 13,
    "lk": 21,
    "d": 16,
    "dv": 12,
    "dtype": "f32",
    "layout": "contiguous",
    "causal": False,
    "align": "bottom-right",
    "window": None,
    "mask": None,
    "mask_shape": None,
    "key_lengths": False,
    "block": None,
    "alibi": None,
    "softcap": None,
    "scale": None,
    "dropout": 0.0,
}


def _shape(v):
    return () if v == "none" else tuple(int(x) for x in v.split("x"))


def _pair(v):
    a, b = v.split(",")
    return int(a), int(b)


def _flag(v):
    if v not in ("0", "1"):
        raise ValueError(f"expected 0 or 1, got {v!r}")
    return v == "1"


def _one_of(*names):
    def parse(v):
        if v not in names:
            raise ValueError(f"expected one of {names}, got {v!r}")
        return v

    return parse


_PARSERS = {
    "batch": _shape,
    "hq": int,
    "hkv": int,
    "lq": int,
    "lk": int,
    "d": int,
    "dv": int,
    "dtype": _one_of("f32", "bf16"),
    "layout": _one_of("contiguous", "padded", "transposed", "strided"),
    "causal": _flag,
    "align": _one_of("bottom-right", "top-left"),
    "window": _pair,
    "mask": _one_of("keep", "drop", "add"),
    "mask_shape": _shape,
    "key_lengths": _flag,
    "block": _pair,
    "alibi": float,
    "softcap": float,
    "scale": float,
    "dropout": float,
}


def _fnv1a(name):
    h = 0xCBF29CE484222325
    for ch in name.encode():
        h = ((h ^ ch) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


class Case(NamedTuple):
    name: str
    spec: dict
    seed: int  # conformance_cases.h's: FNV-1a of the name

    def describe(self):
        return " ".join(f"{k}={v}" for k, v in self.spec.items() if v != DEFAULTS[k]) or "defaults"

    def inputs(self, convert):
        """q, k, v (converted by `convert` from float64 NumPy, laid out as the case says) and the options."""
        s = self.spec
        rng = np.random.default_rng(self.seed)
        batch = s["batch"]
        shapes = (
            batch + (s["hq"], s["lq"], s["d"]),
            batch + (s["hkv"], s["lk"], s["d"]),
            batch + (s["hkv"], s["lk"], s["dv"]),
        )
        q, k, v = (_laid_out(rng.uniform(-1, 1, sh), s["layout"], convert) for sh in shapes)
        o = {
            "causal": s["causal"],
            "align": s["align"],
            "dropout_p": s["dropout"],
            "seed": self.seed,
        }
        if s["window"] is not None:
            o["window"] = tuple(None if w == -1 else w for w in s["window"])
        for key in ("scale", "softcap"):
            if s[key] is not None:
                o[key] = s[key]
        if s["mask"] is not None:
            shape = s["mask_shape"] or batch + (s["hq"], s["lq"], s["lk"])
            if s["mask"] == "add":  # finite biases with about one key in five removed by -inf
                m = rng.uniform(-2, 2, shape)
                m[rng.random(shape) < 0.2] = -np.inf
            else:
                m = rng.random(shape) < (0.8 if s["mask"] == "keep" else 0.2)
            o["mask"], o["mask_type"] = m, s["mask"]
        if s["key_lengths"]:
            o["key_lengths"] = rng.integers(0, s["lk"] + 1, size=batch)
        if s["block"] is not None:
            bq, bk = s["block"]
            tiles = batch + (s["hq"], math.ceil(s["lq"] / bq), math.ceil(s["lk"] / bk))
            o["block_layout"], o["block_size"] = rng.random(tiles) < 0.7, (bq, bk)
        if s["alibi"] is not None:
            o["alibi_slopes"] = rng.uniform(0, s["alibi"], s["hq"])
        return q, k, v, o


def _laid_out(x, layout, convert):
    """x (float64 [..., L, D]) converted, in memory as the layout says (the values are x's in every layout)."""
    if layout == "contiguous":
        return convert(x)
    if layout == "padded":  # rows padded: stride(-2) > size(-1)
        big = np.zeros(x.shape[:-1] + (x.shape[-1] + 3,))
        big[..., : x.shape[-1]] = x
        return convert(big)[..., : x.shape[-1]]
    if layout == "transposed":  # [..., L, H, D] in memory, viewed as [..., H, L, D]
        return convert(np.ascontiguousarray(np.swapaxes(x, -3, -2))).swapaxes(-3, -2)
    big = np.zeros(x.shape[:-1] + (2 * x.shape[-1],))  # strided: last-dim stride 2
    big[..., ::2] = x
    return convert(big)[..., ::2]


def load(path=CASES_FILE):
    """Every case of the file, in its order; ValueError naming the line of a malformed one."""
    cases, names = [], set()
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        name, where = words[0], f"{path}:{n}"
        if not re.fullmatch(r"[a-z0-9_]+", name) or name in names:
            raise ValueError(f"{where}: bad or repeated name {name!r}")
        names.add(name)
        spec = dict(DEFAULTS)
        for kv in words[1:]:
            key, eq, value = kv.partition("=")
            if not eq or key not in _PARSERS:
                raise ValueError(f"{where}: expected key=value with a known key, got {kv!r}")
            try:
                spec[key] = _PARSERS[key](value)
            except ValueError as e:
                raise ValueError(f"{where}: {key}: {e}") from None
        cases.append(Case(name, spec, _fnv1a(name) % 1000003 + 1))
    if not cases:
        raise ValueError(f"no case in {path}")
    return cases


CASES = load()
