"""Shared test helpers: the NumPy float64 contract (tests/python/contract_numpy.py) and random inputs."""

import pathlib
import sys

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "python"))

import contract_numpy  # noqa: E402  (the independent float64 implementation of the contract)

import attn  # noqa: E402

# The Python tests check bindings and semantics on tiny problems, where thread start-up costs more than the work
# (badly so on a loaded 2-core machine); tests that are about threads pass threads= explicitly.
attn.set_num_threads(1)


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
