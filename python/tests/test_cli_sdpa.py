"""End-to-end tests of `attn sdpa` against the independent NumPy contract (contract_numpy.py).

The binary is the attn_bin fixture (conftest.py: $ATTN_BIN, else build/release/attn). Each case writes .npy inputs,
runs the forward and the backward in one call, and compares out, lse, weights, dq, dk, dv with the float64 NumPy
implementation: ~1e-12 relative with --dtype f64, 1e-6 (forward) / 1e-5 (gradients) with f32 (on the f32-rounded
inputs). Bad input must exit non-zero with one line on stderr and leave no output file behind.
"""

from __future__ import annotations

import os
import subprocess
import zlib

import contract_numpy as cn  # this folder's helper (pytest puts the folder on sys.path)
import numpy as np
import pytest

# Relative tolerances by compute dtype: (forward, gradients).
TOL = {"f64": (1e-12, 1e-12), "f32": (1e-6, 1e-5), "f16": (3e-3, 1e-2), "bf16": (2e-2, 6e-2)}


def run(attn_bin, args, cwd=None):
    return subprocess.run(
        [attn_bin, "sdpa", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
        env={**os.environ, "ATTN_NUM_THREADS": os.environ.get("ATTN_NUM_THREADS", "2")},
    )


def round_to(x, dtype):
    """The values the binary computes on after converting f32 inputs to `dtype` (round to nearest even)."""
    x = np.asarray(x, dtype=np.float32)
    if dtype == "f16":
        return x.astype(np.float16).astype(np.float64)
    if dtype == "bf16":
        u = x.view(np.uint32).astype(np.uint64)
        u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
        return u.astype(np.uint32).view(np.float32).astype(np.float64)
    return x.astype(np.float64)


def rel_err(got, want):
    """max |got - want| / max |want| with infinities required to agree exactly (same positions and sign)."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    inf = np.isinf(want)
    assert np.array_equal(np.isinf(got), inf) and np.array_equal(got[inf], want[inf]), (
        "infinities differ"
    )
    assert not np.isnan(got).any(), "NaN in the output"
    fin = ~inf
    if not fin.any():
        return 0.0
    scale = max(np.abs(want[fin]).max(), 1e-300)
    return float(np.abs(got[fin] - want[fin]).max() / scale)


# ------------------------------------------------------------------------------------------------------------
# The option matrix. Each case: shapes and the contract options (contract_numpy names); `cli` flags derive
# from them.

CASES = {
    "plain": dict(batch=(2,), Hq=2, Hkv=2, Lq=5, Lk=7, D=8, Dv=8),
    "gqa_lq_ne_lk_dv_ne_d": dict(batch=(2,), Hq=6, Hkv=2, Lq=6, Lk=11, D=5, Dv=3),
    "mqa_two_batch_dims": dict(batch=(2, 3), Hq=3, Hkv=1, Lq=4, Lk=6, D=4, Dv=5),
    "no_batch_dims": dict(batch=(), Hq=2, Hkv=1, Lq=7, Lk=7, D=6, Dv=4),
    "mask_keep_broadcast": dict(
        batch=(2,), Hq=2, Hkv=2, Lq=6, Lk=9, D=4, Dv=4, mask=("keep", (6, 9))
    ),
    "mask_drop_per_batch": dict(
        batch=(2,), Hq=4, Hkv=2, Lq=5, Lk=8, D=4, Dv=6, mask=("drop", (2, 1, 5, 8))
    ),
    "mask_add_with_neg_inf": dict(
        batch=(2,), Hq=2, Hkv=1, Lq=5, Lk=7, D=4, Dv=4, mask=("add", (2, 5, 7))
    ),
    "key_lengths_with_empty_rows": dict(
        batch=(2, 2), Hq=2, Hkv=2, Lq=4, Lk=6, D=4, Dv=3, key_lengths=[[6, 3], [0, 1]]
    ),
    "causal_bottom_right_lq_lt_lk": dict(
        batch=(1,), Hq=2, Hkv=1, Lq=4, Lk=9, D=4, Dv=4, causal=True
    ),
    "causal_bottom_right_lq_gt_lk": dict(
        batch=(2,), Hq=2, Hkv=2, Lq=9, Lk=4, D=4, Dv=4, causal=True
    ),
    "causal_top_left": dict(
        batch=(2,), Hq=2, Hkv=2, Lq=9, Lk=5, D=4, Dv=4, causal=True, align="top-left"
    ),
    "window_2_1": dict(batch=(2,), Hq=2, Hkv=1, Lq=8, Lk=8, D=4, Dv=4, window=(2, 1)),
    "window_left_only_top_left": dict(
        batch=(1,), Hq=2, Hkv=2, Lq=6, Lk=10, D=4, Dv=4, window=(3, -1), align="top-left"
    ),
    "window_causal": dict(
        batch=(2,), Hq=2, Hkv=2, Lq=7, Lk=7, D=4, Dv=4, window=(2, 3), causal=True
    ),
    "scale": dict(batch=(2,), Hq=2, Hkv=2, Lq=5, Lk=6, D=4, Dv=4, scale=0.3),
    "softcap": dict(batch=(2,), Hq=2, Hkv=1, Lq=5, Lk=6, D=8, Dv=4, scale=1.5, softcap=2.0),
    "alibi": dict(batch=(2,), Hq=4, Hkv=2, Lq=6, Lk=9, D=4, Dv=4, alibi=True, causal=True),
    "dropout": dict(
        batch=(2, 2), Hq=4, Hkv=2, Lq=9, Lk=13, D=4, Dv=5, dropout_p=0.3, seed=123456789012345
    ),
    "everything": dict(
        batch=(2,),
        Hq=4,
        Hkv=2,
        Lq=7,
        Lk=10,
        D=6,
        Dv=5,
        mask=("add", (4, 7, 10)),
        key_lengths=[10, 6],
        causal=True,
        align="top-left",
        window=(4, -1),
        scale=0.8,
        softcap=3.0,
        alibi=True,
        dropout_p=0.2,
        seed=7,
    ),
}


def make_case(spec, seed=0):
    """Inputs (float64 numbers that are exact in f32), contract options, and CLI flags for one case."""
    rng = np.random.default_rng(seed)
    b = tuple(spec["batch"])

    def f32(shape, s=1.0):
        return (s * rng.standard_normal(shape)).astype(np.float32).astype(np.float64)

    q = f32(b + (spec["Hq"], spec["Lq"], spec["D"]))
    k = f32(b + (spec["Hkv"], spec["Lk"], spec["D"]))
    v = f32(b + (spec["Hkv"], spec["Lk"], spec["Dv"]))
    dout = f32(b + (spec["Hq"], spec["Lq"], spec["Dv"]))
    opts, flags, files = {}, [], {}
    if "mask" in spec:
        kind, shape = spec["mask"]
        if kind == "add":
            m = f32(shape, 2.0)
            m[rng.random(shape) < 0.25] = -np.inf
            files["mask"] = m
        else:
            files["mask"] = rng.random(shape) < 0.7
        opts.update(mask=files["mask"], mask_type=kind)
        flags += ["--mask-type", kind]
    if "key_lengths" in spec:
        opts["key_lengths"] = files["key_lengths"] = np.asarray(spec["key_lengths"], dtype=np.int64)
    if spec.get("causal"):
        opts["causal"] = True
        flags.append("--causal")
    if "align" in spec:
        opts["align"] = spec["align"]
        flags += ["--align", spec["align"]]
    if "window" in spec:
        opts["window"] = spec["window"]
        flags.append("--window={},{}".format(*spec["window"]))
    for name in ("scale", "softcap"):
        if name in spec:
            opts[name] = spec[name]
            flags += [f"--{name}", repr(spec[name])]
    if spec.get("alibi"):
        opts["alibi_slopes"] = files["alibi"] = f32((spec["Hq"],), 0.3) ** 2
    if "dropout_p" in spec:
        opts.update(dropout_p=spec["dropout_p"], seed=spec["seed"])
        flags += ["--dropout", repr(spec["dropout_p"]), "--seed", str(spec["seed"])]
    return dict(q=q, k=k, v=v, dout=dout), files, opts, flags


def run_case(
    attn_bin, tmp_path, tensors, files, flags, dtype, on_disk=np.float32, backward=True, extra=()
):
    for name, x in tensors.items():
        np.save(tmp_path / f"{name}.npy", x.astype(on_disk))
    args = [
        "--q",
        tmp_path / "q.npy",
        "--k",
        tmp_path / "k.npy",
        "--v",
        tmp_path / "v.npy",
        "--out",
        tmp_path / "out.npy",
        "--lse",
        tmp_path / "lse.npy",
        "--weights",
        tmp_path / "w.npy",
        "--dtype",
        dtype,
        *flags,
        *extra,
    ]
    for name, x in files.items():
        if name == "mask" and x.dtype != bool:
            x = x.astype(on_disk)
        np.save(tmp_path / f"{name}.npy", x)
        args += [f"--{'key-lengths' if name == 'key_lengths' else name}", tmp_path / f"{name}.npy"]
    if backward:
        args += [
            "--dout",
            tmp_path / "dout.npy",
            "--dq",
            tmp_path / "dq.npy",
            "--dk",
            tmp_path / "dk.npy",
            "--dv",
            tmp_path / "dv.npy",
        ]
    r = run(attn_bin, args)
    assert r.returncode == 0, r.stderr
    names = ["out", "lse", "w"] + (["dq", "dk", "dv"] if backward else [])
    return {n: np.load(tmp_path / f"{n}.npy") for n in names}, r


def check_against_numpy(got, tensors, opts, dtype, backward=True):
    fwd_tol, grad_tol = TOL[dtype]
    want_dtype = np.float64 if dtype == "f64" else np.float32
    ins = {n: round_to(x, dtype) for n, x in tensors.items()}
    if dtype in ("f16", "bf16") and opts.get("mask_type") == "add":
        opts = dict(opts, mask=round_to(opts["mask"], "f32"))
    ref = cn.attention(ins["q"], ins["k"], ins["v"], **opts)
    for name, want in (("out", ref.out), ("lse", ref.lse), ("w", ref.weights)):
        assert got[name].dtype == want_dtype, (name, got[name].dtype)
        err = rel_err(got[name], want)
        assert err <= fwd_tol, f"{name}: relative error {err:.3g} > {fwd_tol:g} ({dtype})"
    if backward:
        g = cn.attention_backward(
            round_to(tensors["dout"], dtype), ins["q"], ins["k"], ins["v"], **opts
        )
        for name, want in (("dq", g.dq), ("dk", g.dk), ("dv", g.dv)):
            assert got[name].dtype == want_dtype
            err = rel_err(got[name], want)
            assert err <= grad_tol, f"{name}: relative error {err:.3g} > {grad_tol:g} ({dtype})"


@pytest.mark.parametrize("dtype", ["f64", "f32"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_numpy_contract(attn_bin, tmp_path, case, dtype):
    tensors, files, opts, flags = make_case(CASES[case], seed=zlib.crc32(case.encode()))
    got, _ = run_case(
        attn_bin,
        tmp_path,
        tensors,
        files,
        flags,
        dtype,
        on_disk=np.float64 if dtype == "f64" else np.float32,
    )
    check_against_numpy(got, tensors, opts, dtype)


@pytest.mark.parametrize(
    "case", ["gqa_lq_ne_lk_dv_ne_d", "everything", "dropout", "key_lengths_with_empty_rows"]
)
def test_reference_backend_f32(attn_bin, tmp_path, case):
    tensors, files, opts, flags = make_case(CASES[case], seed=1)
    got, r = run_case(
        attn_bin, tmp_path, tensors, files, flags, "f32", extra=["--backend", "reference"]
    )
    assert "backend reference" in r.stdout
    check_against_numpy(got, tensors, opts, "f32")


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_half_precision_compute(attn_bin, tmp_path, dtype):
    tensors, files, opts, flags = make_case(CASES["gqa_lq_ne_lk_dv_ne_d"], seed=3)
    got, _ = run_case(attn_bin, tmp_path, tensors, files, flags, dtype)
    check_against_numpy(got, tensors, opts, dtype)


def test_thread_count_does_not_change_the_result(attn_bin, tmp_path):
    """Forward and backward are bitwise the same with 1 and 2 threads (and match NumPy)."""
    tensors, files, opts, flags = make_case(CASES["everything"], seed=11)
    one, _ = run_case(attn_bin, tmp_path, tensors, files, flags, "f32", extra=["--threads", "1"])
    two, _ = run_case(attn_bin, tmp_path, tensors, files, flags, "f32", extra=["--threads", "2"])
    check_against_numpy(two, tensors, opts, "f32")
    for name in one:
        assert np.array_equal(one[name], two[name]), name


def test_f64_inputs_with_f32_compute_are_rounded_once(attn_bin, tmp_path):
    """f64 files with --dtype f32: the inputs are rounded to f32, the outputs are f32."""
    rng = np.random.default_rng(5)
    tensors = dict(
        q=rng.standard_normal((1, 2, 4, 3)),
        k=rng.standard_normal((1, 2, 5, 3)),
        v=rng.standard_normal((1, 2, 5, 3)),
        dout=rng.standard_normal((1, 2, 4, 3)),
    )
    got, _ = run_case(attn_bin, tmp_path, tensors, {}, [], "f32", on_disk=np.float64)
    check_against_numpy(got, tensors, {}, "f32")


def test_big_endian_and_fortran_order_inputs(attn_bin, tmp_path):
    """NumPy files in other layouts (big-endian, Fortran order) give bit-identical results."""
    tensors, files, opts, flags = make_case(CASES["plain"], seed=9)
    base, _ = run_case(
        attn_bin, tmp_path, tensors, files, flags, "f64", on_disk=np.float64, backward=False
    )
    np.save(tmp_path / "q.npy", np.asfortranarray(tensors["q"]).astype(">f8"))
    np.save(tmp_path / "k.npy", np.asfortranarray(tensors["k"]))
    np.save(tmp_path / "v.npy", tensors["v"].astype(">f8"))
    r = run(
        attn_bin,
        [
            "--q",
            tmp_path / "q.npy",
            "--k",
            tmp_path / "k.npy",
            "--v",
            tmp_path / "v.npy",
            "--out",
            tmp_path / "out2.npy",
            "--dtype",
            "f64",
        ],
    )
    assert r.returncode == 0, r.stderr
    assert np.array_equal(np.load(tmp_path / "out2.npy"), base["out"])


def test_dropout_depends_on_the_seed_and_drops_about_p(attn_bin, tmp_path):
    """A test that the seed reaches the generator: two seeds give different outputs, each matching NumPy."""
    spec = dict(CASES["dropout"], Lq=16, Lk=32)
    outs = []
    for seed in (1, 2**40 + 1):
        tensors, files, opts, flags = make_case(dict(spec, seed=seed), seed=4)
        got, _ = run_case(
            attn_bin, tmp_path, tensors, files, flags, "f64", on_disk=np.float64, backward=False
        )
        check_against_numpy(got, tensors, opts, "f64", backward=False)
        outs.append(got["out"])
    assert not np.allclose(outs[0], outs[1])
    keep = cn.dropout_keep(0.3, 2**40 + 1, 4, 4, 16, 32)
    assert abs(keep.mean() - 0.7) < 0.05


# ------------------------------------------------------------------------------------------------------------
# `attn sdpa --example DIR`


def test_example_writes_inputs_and_runs(attn_bin, tmp_path):
    d = tmp_path / "example"
    r = run(attn_bin, ["--example", d])
    assert r.returncode == 0, r.stderr
    for name in ("q", "k", "v", "mask", "out", "lse"):
        assert (d / f"{name}.npy").is_file(), name
        assert f"{name}.npy" in r.stdout
    q, k, v, m = (np.load(d / f"{n}.npy") for n in ("q", "k", "v", "mask"))
    assert m.dtype == bool and q.dtype == np.float32
    ref = cn.attention(q, k, v, mask=m, mask_type="keep")
    assert rel_err(np.load(d / "out.npy"), ref.out) <= 1e-6
    assert rel_err(np.load(d / "lse.npy"), ref.lse) <= 1e-6
    assert not [p.name for p in d.iterdir() if "tmp" in p.name]


def test_example_refuses_explicit_inputs(attn_bin, tmp_path):
    r = run(attn_bin, ["--example", tmp_path / "ex", "--q", tmp_path / "q.npy"])
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1


# ------------------------------------------------------------------------------------------------------------
# Failures: non-zero exit, one line on stderr, no output file.


@pytest.fixture
def inputs(tmp_path):
    rng = np.random.default_rng(0)
    np.save(tmp_path / "q.npy", rng.standard_normal((2, 2, 4, 3)).astype(np.float32))
    np.save(tmp_path / "k.npy", rng.standard_normal((2, 1, 5, 3)).astype(np.float32))
    np.save(tmp_path / "v.npy", rng.standard_normal((2, 1, 5, 3)).astype(np.float32))
    np.save(tmp_path / "dout.npy", rng.standard_normal((2, 2, 4, 3)).astype(np.float32))
    np.save(tmp_path / "kbad.npy", rng.standard_normal((2, 1, 5, 4)).astype(np.float32))
    np.save(tmp_path / "keep.npy", rng.random((4, 5)) < 0.5)
    np.save(tmp_path / "fmask.npy", rng.random((4, 5)).astype(np.float32))
    np.save(tmp_path / "int.npy", np.ones((2, 2, 4, 3), dtype=np.int32))
    np.save(tmp_path / "lens.npy", np.array([5, 9]))
    np.save(tmp_path / "c64.npy", np.ones((2, 2, 4, 3), dtype=np.complex64))
    (tmp_path / "garbage.npy").write_bytes(b"\x93NUMPY\x01\x00\xff\x00{'descr'")
    (tmp_path / "existing_out.npy").write_bytes(b"keep me")
    return tmp_path


BASE = ["--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--out", "out.npy"]
ALL_OUT = ["--lse", "lse.npy", "--weights", "w.npy"]
BWD = ["--dout", "dout.npy", "--dq", "dq.npy", "--dk", "dk.npy", "--dv", "dv.npy"]


def replace(args, flag, value):
    args = list(args)
    args[args.index(flag) + 1] = value
    return args


FAILURES = {
    "missing q file": (replace(BASE, "--q", "nope.npy"), "nope.npy"),
    "malformed npy": (replace(BASE, "--k", "garbage.npy"), "garbage.npy"),
    "unsupported dtype file": (replace(BASE, "--q", "c64.npy"), "c64.npy"),
    "int inputs": (replace(BASE, "--q", "int.npy"), "f32 or f64"),
    "head dim mismatch": (replace(BASE, "--k", "kbad.npy"), "head dim"),
    "missing --out": (BASE[:-2], "--out"),
    "missing --v": (BASE[:4] + BASE[6:], "--v"),
    "--dout without --dq": (
        BASE + ["--dout", "dout.npy", "--dk", "dk.npy", "--dv", "dv.npy"],
        "--dq",
    ),
    "--dq without --dout": (BASE + ["--dq", "dq.npy"], "--dout"),
    "--mask without --mask-type": (BASE + ["--mask", "keep.npy"], "--mask-type"),
    "--mask-type without --mask": (BASE + ["--mask-type", "keep"], "--mask"),
    "bad --mask-type": (BASE + ["--mask", "keep.npy", "--mask-type", "maybe"], "maybe"),
    "float mask for keep": (BASE + ["--mask", "fmask.npy", "--mask-type", "keep"], "bool"),
    "bool mask for add": (BASE + ["--mask", "keep.npy", "--mask-type", "add"], "f32 or f64"),
    "bad --window (one number)": (BASE + ["--window", "3"], "LEFT,RIGHT"),
    "bad --window (words)": (BASE + ["--window", "a,b"], "--window"),
    "bad --window (below -1)": (BASE + ["--window=-2,0"], ">= -1"),
    "bad --align": (BASE + ["--align", "middle"], "middle"),
    "bad --dtype": (BASE + ["--dtype", "f8"], "f8"),
    "bad --backend": (BASE + ["--backend", "gpu"], "gpu"),
    "bad --scale (infinite)": (BASE + ["--scale=inf"], "--scale"),
    "bad --scale (text)": (BASE + ["--scale", "abc"], "--scale"),
    "bad --softcap": (BASE + ["--softcap", "0"], "--softcap"),
    "bad --dropout": (BASE + ["--dropout", "1.5", "--seed", "1"], "--dropout"),
    "--dropout without --seed": (BASE + ["--dropout", "0.1"], "--seed"),
    "bad --seed": (BASE + ["--dropout", "0.1", "--seed=-3"], "--seed"),
    "bad --threads": (BASE + ["--threads=-1"], "--threads"),
    "key length beyond Lk": (BASE + ["--key-lengths", "lens.npy"], "key_lengths"),
    "dout of the wrong shape": (BASE + replace(BWD, "--dout", "kbad.npy"), "dout"),
    "two outputs, one file": (BASE + ["--lse", "out.npy"], "same file"),
    "an output folder that does not exist": (
        BASE + ALL_OUT[:2] + ["--weights", "no/such/dir/w.npy"] + BWD,
        "no/such/dir",
    ),
    "an existing output is left alone": (
        replace(replace(BASE, "--out", "existing_out.npy"), "--q", "nope.npy"),
        "nope.npy",
    ),
}


@pytest.mark.parametrize("name", sorted(FAILURES))
def test_bad_input_fails_cleanly(attn_bin, inputs, name):
    args, says = FAILURES[name]
    before = {p.name: p.read_bytes() for p in inputs.iterdir()}
    r = run(attn_bin, args, cwd=inputs)
    assert r.returncode != 0, r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert says in lines[0], lines[0]
    after = {p.name: p.read_bytes() for p in inputs.iterdir()}
    assert after == before, f"files changed: {sorted(set(after) ^ set(before))}"
