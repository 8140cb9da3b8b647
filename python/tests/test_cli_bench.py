"""`attn bench`'s Linear rows (modes linear and linear-bwd): one row per encoder layer shape and token count, whose
time and GFLOP/s agree with the product's FLOPs (2 M N K forward, 3x that with the backward), and bad flags refused
with a message naming them. The binary is the attn_bin fixture (conftest.py: $ATTN_BIN, else build/release/attn)."""

from __future__ import annotations

import subprocess

import pytest

# [out, in] of the products of a MiniLM and a BERT-base encoder layer, as the tool names them.
SHAPES = {
    "minilm qkv": (1152, 384),
    "minilm out": (384, 384),
    "minilm ffn1": (1536, 384),
    "minilm ffn2": (384, 1536),
    "bert-base qkv": (2304, 768),
    "bert-base out": (768, 768),
    "bert-base ffn1": (3072, 768),
    "bert-base ffn2": (768, 3072),
}


def bench(attn_bin, *args):
    return subprocess.run(
        [
            attn_bin,
            "bench",
            "--threads",
            "1",
            "--reps",
            "1",
            "--no-probes",
            "--no-decode",
            *map(str, args),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )


def linear_rows(stdout):
    """(mode, dtype, layer, M, N, K, time ms, GFLOP/s) of each Linear row."""
    rows = []
    for line in stdout.splitlines():
        parts = line.split()
        if parts and parts[0] in ("linear", "linear-bwd") and parts[2] != "skipped:":
            mode, dtype, family, kind = parts[:4]
            m, n, k, ms, gf = parts[4:9]
            rows.append(
                (mode, dtype, f"{family} {kind}", int(m), int(n), int(k), float(ms), float(gf))
            )
    return rows


def test_linear_rows_cover_every_shape_with_consistent_rates(attn_bin):
    r = bench(
        attn_bin, "--modes", "linear,linear-bwd", "--dtypes", "f32,bf16", "--linear-m", "64,96"
    )
    assert r.returncode == 0, r.stderr
    assert "causal" not in r.stdout  # no attention grid was asked for
    rows = linear_rows(r.stdout)
    expected = {
        (mode, dt, name, m)
        for mode, dts in (("linear", ("f32", "bf16")), ("linear-bwd", ("f32",)))
        for dt in dts
        for name in SHAPES
        for m in (64, 96)
    }
    assert {(mode, dt, name, m) for mode, dt, name, m, *_ in rows} == expected
    assert len(rows) == len(expected)
    for mode, _dt, name, m, n, k, ms, gf in rows:
        assert (n, k) == SHAPES[name]
        flops = (6 if mode == "linear-bwd" else 2) * m * n * k
        assert ms > 0 and gf > 0
        # the printed rate is the FLOPs over the printed time, to their printed digits
        assert flops / (ms * 1e-3) * 1e-9 == pytest.approx(gf, rel=0.05, abs=0.06)
    assert "linear-bwd bf16  skipped: nn modules train in f32" in r.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ("--modes", "linaer"),
            "unknown mode 'linaer' (fwd, fwdbwd, linear, linear-bwd, varlen, paged)",
        ),
        (
            ("--modes", "linear", "--linear-m", "0"),
            "--linear-m takes positive integers separated by commas, got '0'",
        ),
        (
            ("--modes", "linear", "--linear-m", "64,x"),
            "--linear-m takes positive integers separated by commas, got '64,x'",
        ),
    ],
)
def test_bad_flags_are_refused_by_name(attn_bin, args, message):
    r = bench(attn_bin, *args)
    assert r.returncode != 0
    assert message in r.stderr
    assert "attn bench:" not in r.stdout  # refused before anything ran


def rounds_won(line):
    """N of a line's "fastest in N of M ..." (the settings of a call-by-call comparison), with M."""
    won, _, total = line.split("fastest in ")[1].split()[:3]
    return int(won), int(total)


def decode_run(attn_bin, levels, *extra):
    return subprocess.run(
        [
            attn_bin,
            "bench",
            "--threads",
            "1",
            "--reps",
            "3",
            "--no-probes",
            "--modes",
            "fwd",
            "--dtypes",
            "bf16",
            "--bh",
            "1",
            "--L",
            "16",
            "--D",
            "64",
            "--causal",
            "no",
            "--decode-prefetch",
            levels,
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_decode_prefetch_levels_alternate_call_by_call(attn_bin):
    """--decode-prefetch l1,l2 times the levels call by call in one process: one decode line per level, naming it,
    with the rounds it was the fastest in; every round has exactly one fastest level."""
    r = decode_run(attn_bin, "l1,l2")
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stdout.splitlines() if line.startswith("decode bf16")]
    assert len(lines) == 2, r.stdout
    assert "prefetch to l1)" in lines[0] and "prefetch to l2)" in lines[1]
    assert all(line.endswith("alternating rounds") for line in lines)
    assert sum(rounds_won(line)[0] for line in lines) == 3


def test_decode_prefetch_refuses_an_unknown_level(attn_bin):
    r = decode_run(attn_bin, "l1,l3")
    assert r.returncode != 0
    assert "decode prefetch level must be l1, l2 or none" in r.stderr and "got 'l3'" in r.stderr
    assert "attn bench:" not in r.stdout  # refused before the probes and the grid ran


def test_decode_rows_take_their_key_lengths_and_no_prefetch(attn_bin):
    """--decode-lk sets the decode rows' key lengths (K and V in the caches at a few hundred keys); none times the
    hardware prefetchers alone: one line per key length and level, in the order given."""
    r = decode_run(attn_bin, "l2,none", "--decode-lk", "64,256")
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stdout.splitlines() if line.startswith("decode bf16")]
    assert [line.split(":")[0] for line in lines] == ["decode bf16 H 32 Lq 1 Lk 64 D 128"] * 2 + [
        "decode bf16 H 32 Lq 1 Lk 256 D 128"
    ] * 2, r.stdout
    assert ["prefetch to l2)" in line for line in lines] == [True, False, True, False]
    assert ["prefetch to none)" in line for line in lines] == [False, True, False, True]


def test_decode_lk_refuses_what_is_not_a_key_length(attn_bin):
    r = decode_run(attn_bin, "l2", "--decode-lk", "64,0")
    assert r.returncode != 0
    assert "--decode-lk takes positive integers" in r.stderr and "'64,0'" in r.stderr
    assert "attn bench:" not in r.stdout  # refused before the probes and the grid ran


def pipeline_run(attn_bin, settings, *extra):
    return subprocess.run(
        [
            attn_bin,
            "bench",
            "--threads",
            "1",
            "--reps",
            "3",
            "--no-probes",
            "--no-decode",
            "--modes",
            "fwd",
            "--dtypes",
            "bf16",
            "--bh",
            "1",
            "--L",
            "48",
            "--D",
            "32",
            "--causal",
            "both",
            "--amx-pipeline",
            settings,
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_amx_pipeline_settings_alternate_call_by_call_on_every_grid_row(attn_bin):
    """--amx-pipeline on,off times both settings call by call in one process: each grid row twice, naming the setting
    with the rounds it was the fastest in (3 in all per row). On the emulated tiles, so any CPU with AVX2 runs it."""
    r = pipeline_run(attn_bin, "on,off", "--isa", "amx-emulated")
    if r.returncode != 0 and "cannot run the amx-emulated target" in r.stderr:
        pytest.skip("no AVX2: no emulated tiles")
    assert r.returncode == 0, r.stderr
    assert "changes nothing here" not in r.stdout  # the emulated tiles run it
    rows = [line for line in r.stdout.splitlines() if line.startswith("fwd ")]
    assert len(rows) == 4, r.stdout  # causal no and yes, each under both settings
    for pair in (rows[0:2], rows[2:4]):
        assert pair[0].split()[:6] == pair[1].split()[:6]  # the same grid row
        assert "amx pipeline on," in pair[0] and "amx pipeline off," in pair[1]
        assert [rounds_won(line)[1] for line in pair] == [3, 3]
        assert sum(rounds_won(line)[0] for line in pair) == 3


def test_amx_pipeline_refuses_an_unknown_setting(attn_bin):
    r = pipeline_run(attn_bin, "on,of")
    assert r.returncode != 0
    assert "AMX pipeline setting must be on or off" in r.stderr and "got 'of'" in r.stderr
    assert "attn bench:" not in r.stdout  # refused before anything ran


def test_amx_pipeline_says_when_it_changes_nothing(attn_bin):
    """Where bf16 does not run on AMX tiles (the portable target never does), the comparison would time the same
    code twice: the bench says so before the rows."""
    r = pipeline_run(attn_bin, "on,off", "--isa", "portable")
    assert r.returncode == 0, r.stderr
    assert "note: --amx-pipeline changes nothing here: bf16 runs on portable" in r.stdout
