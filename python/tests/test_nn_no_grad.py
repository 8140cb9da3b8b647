"""attn.nn.no_grad (and is_grad_enabled / set_grad_enabled): inference that keeps nothing for backward().

Under it a stack's output is bitwise the one with gradients, every module's backward() raises naming the mode
(never a stale or identity gradient), the mode comes back when the block or decorated function ends (also on an
exception, and nested blocks restore the outer mode), and it belongs to the thread that set it. That nothing is
kept is measured in the C++ tests (tests/nn/no_grad_test.cc, through the buffer cache)."""

import threading

import numpy as np
import pytest

ann = pytest.importorskip("attn.nn", reason="this build of attn has no nn module")


def _stack():
    layer = ann.TransformerEncoderLayer(32, 4, 64, dropout=0.1, activation="gelu", batch_first=True)
    return ann.TransformerEncoder(layer, 2, norm=ann.LayerNorm(32))


def test_outputs_are_the_same_bits_and_backward_refuses():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 9, 32), dtype=np.float32)
    enc = _stack()
    enc.eval()
    expect = enc(x)
    with ann.no_grad():
        assert not ann.is_grad_enabled()
        got = enc(x)
    assert ann.is_grad_enabled()
    np.testing.assert_array_equal(got, expect)
    with pytest.raises(Exception, match="gradients disabled"):
        enc.backward(np.ones_like(x))
    enc(x)  # gradients on again: the backward has its forward
    grads = enc.backward(np.ones_like(x))
    assert grads["src"].shape == x.shape


@pytest.mark.parametrize(
    "make, x",
    [
        (lambda: ann.Linear(8, 4), np.ones((3, 8), np.float32)),
        (lambda: ann.LayerNorm(8), np.ones((3, 8), np.float32)),
        (lambda: ann.GELU(), np.ones((3, 8), np.float32)),
        (
            lambda: ann.Dropout(0.5),
            np.ones((3, 8), np.float32),
        ),  # training: the identity gradient would be wrong
        (lambda: ann.MultiheadAttention(8, 2, batch_first=True), np.ones((1, 3, 8), np.float32)),
    ],
)
def test_every_module_refuses_its_backward(make, x):
    m = make()
    with ann.no_grad():
        out = m(x, x, x)[0] if isinstance(m, ann.MultiheadAttention) else m(x)
    with pytest.raises(Exception, match="gradients disabled"):
        m.backward(np.ones_like(out))


def test_decorator_nesting_and_exceptions_restore_the_mode():
    @ann.no_grad()
    def inner():
        return ann.is_grad_enabled()

    assert inner() is False and ann.is_grad_enabled()
    guard = ann.no_grad()
    with guard:
        with guard:  # one object entered twice, as torch allows
            pass
        assert not ann.is_grad_enabled()  # the inner exit restored the outer block's mode
    assert ann.is_grad_enabled()
    with pytest.raises(KeyError):
        with ann.no_grad():
            raise KeyError("x")
    assert ann.is_grad_enabled()
    ann.set_grad_enabled(False)
    try:
        assert not ann.is_grad_enabled()
    finally:
        ann.set_grad_enabled(True)


def test_a_decorated_generator_runs_its_body_without_grad():
    @ann.no_grad()
    def modes(n):
        for _ in range(n):
            received = yield ann.is_grad_enabled()
            assert received is None
        return "done"

    gen = modes(2)
    seen = []
    for mode in gen:  # the caller's code between items keeps gradients on
        seen.append((mode, ann.is_grad_enabled()))
    assert seen == [(False, True), (False, True)]
    gen = modes(3)
    next(gen)
    with pytest.raises(KeyError):
        gen.throw(KeyError("x"))
    assert ann.is_grad_enabled()


def test_the_mode_is_per_thread():
    seen = []
    with ann.no_grad():
        t = threading.Thread(target=lambda: seen.append(ann.is_grad_enabled()))
        t.start()
        t.join()
    assert seen == [True]
