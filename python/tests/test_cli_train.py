"""End-to-end tests of `attn train`, `attn eval` and `attn demo` (the binary: minilm.attn_binary, $ATTN_BIN).

Small configurations only: each run trains for seconds. What must hold:
- a tiny model learns the reversal task (held-out exact-sequence accuracy well above chance);
- a run resumed from a checkpoint is bitwise the same as an uninterrupted one (batches are a function of
  (seed, step), and the checkpoint carries the weights and the optimizer's moments);
- `attn eval` on a checkpoint reproduces the accuracy `attn train` printed;
- bad options fail with one line and a non-zero exit;
- `attn demo --steps N` writes the heatmaps and a self-contained report.
"""

from __future__ import annotations

import re
import subprocess

import pytest
from minilm import attn_binary  # this folder's helper (pytest puts the folder on sys.path)

TINY = [
    "--task",
    "reverse",
    "--length",
    "4",
    "--d-model",
    "32",
    "--heads",
    "2",
    "--layers",
    "1",
    "--d-ff",
    "64",
    "--batch",
    "32",
    "--lr",
    "0.005",
    "--warmup",
    "10",
    "--eval-samples",
    "300",
    "--quiet",
    "--threads",
    "1",
]


def attn(*args, timeout=300, cwd=None):
    return subprocess.run(
        [attn_binary(), *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=cwd
    )


def accuracy(stdout: str) -> float:
    found = re.findall(r"^held-out accuracy: ([0-9.]+)$", stdout, flags=re.M)
    assert found, stdout
    return float(found[-1])


def test_tiny_model_learns_reversal(tmp_path):
    r = attn("train", *TINY, "--steps", "250", "--checkpoint", tmp_path / "m.safetensors")
    assert r.returncode == 0, r.stderr
    acc = accuracy(r.stdout)
    assert acc >= 0.9, r.stdout  # chance is 16^-4
    # The last stdout line is the accuracy, in the documented form.
    assert re.fullmatch(r"held-out accuracy: \d\.\d{3}", r.stdout.strip().splitlines()[-1])
    e = attn("eval", tmp_path / "m.safetensors", "--samples", "300", "--threads", "1")
    assert e.returncode == 0, e.stderr
    assert accuracy(e.stdout) == pytest.approx(acc, abs=1e-9)


def test_autocast_training_learns_reversal_too(tmp_path):
    """--autocast (bf16 products, f32 weights): the tiny model still learns, its checkpoint holds f32 weights and
    says how it was trained, and the run is not the f32 run (the bf16 rounding happened)."""
    path = tmp_path / "m.safetensors"
    r = attn("train", *TINY, "--steps", "250", "--autocast", "--checkpoint", path)
    assert r.returncode == 0, r.stderr
    assert accuracy(r.stdout) >= 0.9, r.stdout
    import json
    import struct

    raw = path.read_bytes()
    header = json.loads(raw[8 : 8 + struct.unpack("<Q", raw[:8])[0]])
    assert header["__metadata__"]["autocast"] == "bf16"
    weights = {
        k: v for k, v in header.items() if k != "__metadata__" and not k.startswith("optimizer.")
    }
    assert {v["dtype"] for v in weights.values()} == {"F32"}  # master weights
    f32 = attn("train", *TINY, "--steps", "40")
    mixed = attn("train", *TINY, "--steps", "40", "--autocast")
    assert f32.returncode == 0 and mixed.returncode == 0
    loss = [
        re.findall(r"^held-out loss: ([0-9.]+)$", out.stdout, flags=re.M)[-1]
        for out in (f32, mixed)
    ]
    assert abs(float(loss[0]) - float(loss[1])) < 0.1 * float(loss[0]), loss


def test_resume_is_bitwise_identical(tmp_path):
    straight = tmp_path / "straight.safetensors"
    r = attn("train", *TINY, "--steps", "40", "--checkpoint", straight)
    assert r.returncode == 0, r.stderr
    # The same 40-step run interrupted after step 20, then resumed to the end.
    at20 = tmp_path / "at20.safetensors"
    r = attn("train", *TINY, "--steps", "40", "--checkpoint", at20, "--stop-after", "20")
    assert r.returncode == 0, r.stderr
    resumed = tmp_path / "resumed.safetensors"
    r = attn("train", *TINY, "--steps", "40", "--resume", at20, "--checkpoint", resumed)
    assert r.returncode == 0, r.stderr
    assert at20.read_bytes() != straight.read_bytes()
    assert resumed.read_bytes() == straight.read_bytes()
    # Resuming with another model shape is refused.
    r = attn("train", *TINY[:4], "--d-model", "16", *TINY[6:], "--steps", "40", "--resume", at20)
    assert r.returncode != 0 and "d_model" in r.stderr


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--task", "juggle"], "unknown task"),
        (["--length", "0"], "--length"),
        (["--heads", "3"], "multiple of heads"),
        (["--lr", "-1"], "--lr"),
        (["--eval-every", "0"], "--eval-every"),
    ],
)
def test_bad_options_fail_cleanly(args, needle):
    r = attn("train", "--steps", "1", "--quiet", *args)
    assert r.returncode != 0
    assert needle in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "args, needle",
    [
        (["train", "--steps", "1", "--quiet", "--warmup", "-5"], "--warmup: must be >= 0, got -5"),
        (["eval", "m.safetensors", "--samples", "0"], "--samples: must be >= 1, got 0"),
        (["eval", "m.safetensors", "--samples", "-5"], "--samples: must be >= 1, got -5"),
        (["demo", "--steps", "0"], "--steps: must be >= 1, got 0"),
        (["demo", "--steps", "-1"], "--steps: must be >= 1, got -1"),
        (
            ["tokenize", "--model", "m", "--text", "a", "--max-length", "-1"],
            "--max-length: must be >= 0, got -1",
        ),
        (["sdpa", "--example", "ex", "--scale", ""], "--scale: needs a value, got an empty string"),
        (
            ["sdpa", "--example", "ex", "--window", ""],
            "--window: needs a value, got an empty string",
        ),
        (
            ["viz", "--weights", "w.npy", "--out", "w.png", "--vmin", "nan"],
            "--vmin: must be a finite number, got nan",
        ),
        (
            ["viz", "--weights", "w.npy", "--out", "w.png", "--vmax", "-inf"],
            "--vmax: must be a finite number, got -inf",
        ),
    ],
)
def test_out_of_range_counts_are_refused_not_replaced(args, needle, tmp_path):
    """These ran before: eval printed a score of 0 samples, demo ran its preset's 300 steps, train shifted its
    schedule by a negative warm-up, tokenize took -1 for the model's length, sdpa read an empty --scale or --window
    as "not given" (the default), viz read --vmin nan as "not given" (the automatic range)."""
    r = attn(*args, cwd=tmp_path)  # nothing is written there: each is refused before any work
    assert r.returncode != 0 and needle in r.stderr, r.stderr


def test_eval_refuses_a_file_that_is_not_a_checkpoint(tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{}   ")
    r = attn("eval", bad)
    assert r.returncode != 0 and r.stderr.strip()


def test_demo_writes_pictures_and_report(tmp_path):
    out = tmp_path / "demo"
    r = attn("demo", "--out", out, "--steps", "30", "--threads", "1")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert re.fullmatch(r"held-out accuracy: \d\.\d{3}", lines[-1])
    for name in [
        "attention_layer0.png",
        "attention_layer0.svg",
        "attention_layer1.png",
        "report.html",
        "model.safetensors",
    ]:
        assert (out / name).is_file(), name
        assert f"wrote {out / name}" in r.stdout
    assert (out / "attention_layer0.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    html = (out / "report.html").read_text()
    assert "http://" not in html and "https://" not in html
    assert html.count("data:image/png;base64,") >= 2
