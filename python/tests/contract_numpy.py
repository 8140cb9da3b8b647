"""An independent NumPy float64 implementation of the attn attention contract (docs/semantics.md).

Written the way the tutorials write attention: dense scores, explicit boolean masks, a max-subtracted softmax,
and the backward by hand from the same formulas. It shares no code with the C++ library and is what the CLI and
Python tests compare against.

    q [..., Hq, Lq, D], k [..., Hkv, Lk, D], v [..., Hkv, Lk, Dv]
    attention(q, k, v, **options)              -> Forward(out [..., Hq, Lq, Dv], lse [..., Hq, Lq],
                                                          weights [..., Hq, Lq, Lk])
    attention_backward(dout, q, k, v, *, dweights=None, **options) -> Grads(dq, dk, dv, dmask)
        (dweights: dL/dweights [..., Hq, Lq, Lk] when the loss also reads the weights)

Options (keyword-only, names as in attn::AttentionOptions):
    scale=None (1/sqrt(D)), softcap=None, causal=False, align="bottom-right" | "top-left",
    position_offset=None (overrides align: p(i) = i + position_offset), window=(-1, -1),
    mask=None, mask_type="keep" | "drop" | "add", key_lengths=None, block_layout=None, block_q=0, block_k=0,
    alibi_slopes=None, dropout_p=0.0, seed=0

Dropout is reproduced bit for bit: Philox4x32-10 with key (seed low 32, seed high 32) and counter
(j // 4, i, head, batch), draw word j % 4, keep when draw >= floor(p * 2^32) (src/contract/dropout.h), where
`batch` is the flat index over the leading batch dims and `head` the query head.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

__all__ = [
    "Forward",
    "Grads",
    "attention",
    "attention_backward",
    "allowed_keys",
    "dropout_keep",
    "philox4x32_10",
]

# ---------------------------------------------------------------------------------------------------------------
# Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011), vectorised over arrays.

_PHILOX_M0 = np.uint64(0xD2511F53)
_PHILOX_M1 = np.uint64(0xCD9E8D57)
_PHILOX_W0 = 0x9E3779B9
_PHILOX_W1 = 0xBB67AE85
_MASK32 = np.uint64(0xFFFFFFFF)


def philox4x32_10(counter, key):
    """counter: 4 arrays (broadcastable, values < 2^32); key: 2 ints. Returns 4 uint64 arrays of 32-bit words."""
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) & _MASK32 for c in counter)
    c0, c1, c2, c3 = np.broadcast_arrays(c0, c1, c2, c3)
    k0, k1 = int(key[0]) & 0xFFFFFFFF, int(key[1]) & 0xFFFFFFFF
    for r in range(10):
        if r > 0:  # the key is bumped before every round but the first
            k0 = (k0 + _PHILOX_W0) & 0xFFFFFFFF
            k1 = (k1 + _PHILOX_W1) & 0xFFFFFFFF
        p0 = _PHILOX_M0 * c0  # < 2^64: exact in uint64
        p1 = _PHILOX_M1 * c2
        hi0, lo0 = p0 >> np.uint64(32), p0 & _MASK32
        hi1, lo1 = p1 >> np.uint64(32), p1 & _MASK32
        c0, c1, c2, c3 = hi1 ^ c1 ^ np.uint64(k0), lo1, hi0 ^ c3 ^ np.uint64(k1), lo0
    return c0, c1, c2, c3


def dropout_keep(p, seed, B, H, Lq, Lk):
    """Boolean keep-pattern [B, H, Lq, Lk] of dropout probability p (all True when p == 0)."""
    if p <= 0.0:
        return np.ones((B, H, Lq, Lk), dtype=bool)
    t = math.floor(p * 4294967296.0)
    threshold = 0xFFFFFFFF if t >= 4294967295 else int(t)
    b = np.arange(B, dtype=np.uint64)[:, None, None, None]
    h = np.arange(H, dtype=np.uint64)[None, :, None, None]
    i = np.arange(Lq, dtype=np.uint64)[None, None, :, None]
    j = np.arange(Lk, dtype=np.uint64)[None, None, None, :]
    words = philox4x32_10(
        (j >> np.uint64(2), i, h, b), (seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF)
    )
    lane = np.broadcast_to(j & np.uint64(3), (B, H, Lq, Lk))
    draw = np.choose(lane.astype(np.intp), [np.broadcast_to(w, (B, H, Lq, Lk)) for w in words])
    return draw >= np.uint64(threshold)


# ---------------------------------------------------------------------------------------------------------------
# The contract.


class Forward(NamedTuple):
    out: np.ndarray  # [..., Hq, Lq, Dv]
    lse: np.ndarray  # [..., Hq, Lq]; -inf on rows with no allowed key
    weights: np.ndarray  # [..., Hq, Lq, Lk]; probabilities before dropout


class Grads(NamedTuple):
    dq: np.ndarray
    dk: np.ndarray
    dv: np.ndarray
    dmask: np.ndarray | None  # d(add mask) in the mask's shape; None without an add mask


def _positions(Lq, Lk, align, position_offset=None):
    """p(i) for every query i: position_offset overrides align."""
    if position_offset is not None:
        return np.arange(Lq) + int(position_offset)
    if align in ("bottom-right", "bottom_right"):
        return np.arange(Lq) + (Lk - Lq)
    if align in ("top-left", "top_left"):
        return np.arange(Lq)
    raise ValueError(f"unknown align {align!r}")


def _to_4d(x, batch_shape):
    """[..., H, L, X] -> [B, H, L, X] with B = prod(batch_shape)."""
    B = int(np.prod(batch_shape, dtype=np.int64))
    return np.asarray(x).reshape((B,) + np.shape(x)[len(batch_shape) :])


def _broadcast_4d(m, full_shape, batch_shape):
    """Broadcasts m to full_shape = [..., H, R, C] and flattens the batch dims: [B, H, R, C]."""
    m = np.broadcast_to(np.asarray(m), full_shape)
    return _to_4d(m, batch_shape)


def _sum_to_shape(x, shape):
    """Sums x over the axes that broadcasting `shape` to x.shape expanded (the adjoint of broadcasting)."""
    shape = tuple(shape)
    lead = x.ndim - len(shape)
    if lead > 0:
        x = x.sum(axis=tuple(range(lead)))
    axes = tuple(d for d, s in enumerate(shape) if s == 1 and x.shape[d] != 1)
    if axes:
        x = x.sum(axis=axes, keepdims=True)
    return x.reshape(shape)


def _masked_matmul(a, b, allowed):
    """sum_j a[..., i, j] * b[..., j, :] over allowed (i, j) only, so that a non-finite b[j] of a removed key never
    reaches row i (0 * NaN is NaN: multiplying by zero is not masking). a is already 0 where not allowed."""
    if np.all(np.isfinite(b)):
        return a @ b
    with np.errstate(invalid="ignore"):
        prod = a[..., :, :, None] * b[..., None, :, :]
    return np.where(allowed[..., :, :, None], prod, 0.0).sum(axis=-2)


class _Problem:
    """Everything the forward and backward share, in canonical 4-D form [B, H, L, X], float64."""

    def __init__(
        self,
        q,
        k,
        v,
        scale,
        softcap,
        causal,
        align,
        position_offset,
        window,
        mask,
        mask_type,
        key_lengths,
        block_layout,
        block_q,
        block_k,
        alibi_slopes,
        dropout_p,
        seed,
    ):
        q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
        if q.ndim < 3 or k.ndim != q.ndim or v.ndim != q.ndim:
            raise ValueError(f"q, k, v must share a rank >= 3, got {q.shape}, {k.shape}, {v.shape}")
        self.batch_shape = q.shape[:-3]
        if k.shape[:-3] != self.batch_shape or v.shape[:-3] != self.batch_shape:
            raise ValueError(f"batch dims differ: {q.shape}, {k.shape}, {v.shape}")
        Hq, Lq, D = q.shape[-3:]
        Hkv, Lk, Dk = k.shape[-3:]
        if Dk != D or v.shape[-3] != Hkv or v.shape[-2] != Lk or Hkv == 0 or Hq % Hkv:
            raise ValueError(f"incompatible shapes q {q.shape}, k {k.shape}, v {v.shape}")
        self.Hq, self.Hkv, self.Lq, self.Lk, self.D, self.Dv = Hq, Hkv, Lq, Lk, D, v.shape[-1]
        self.group = Hq // Hkv
        self.B = int(np.prod(self.batch_shape, dtype=np.int64))
        self.q_shape, self.k_shape, self.v_shape = q.shape, k.shape, v.shape
        self.q = _to_4d(q, self.batch_shape)
        # GQA: query head h reads kv head h // group; repeating K/V is the tutorial's way to say it.
        self.k = np.repeat(_to_4d(k, self.batch_shape), self.group, axis=1)  # [B, Hq, Lk, D]
        self.v = np.repeat(_to_4d(v, self.batch_shape), self.group, axis=1)  # [B, Hq, Lk, Dv]
        self.scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
        self.softcap = None if softcap is None else float(softcap)
        full = self.batch_shape + (Hq, Lq, Lk)
        self.full_shape = full

        # Which keys each query may use: [B, Hq, Lq, Lk] (or broadcastable).
        pos = _positions(Lq, Lk, align, position_offset)[:, None]  # p(i)
        j = np.arange(Lk)[None, :]
        left, right = int(window[0]), int(window[1])
        if causal:
            right = 0 if right < 0 else min(right, 0)
        allowed = np.ones((Lq, Lk), dtype=bool)
        if left >= 0:
            allowed &= j >= pos - left
        if right >= 0:
            allowed &= j <= pos + right
        allowed = np.broadcast_to(allowed, (self.B, Hq, Lq, Lk)).copy()
        if key_lengths is not None:
            lens = np.asarray(key_lengths).reshape(-1).astype(np.int64)
            if lens.size != self.B:
                raise ValueError(
                    f"key_lengths of shape {np.shape(key_lengths)} for batch {self.batch_shape}"
                )
            allowed &= np.arange(Lk)[None, None, None, :] < lens[:, None, None, None]
        self.mask_type = mask_type
        self.mask_shape = None
        self.add = np.zeros((1, 1, 1, 1))
        if mask is not None:
            m = np.asarray(mask)
            self.mask_shape = m.shape
            m4 = _broadcast_4d(m, full, self.batch_shape)
            if mask_type == "keep":
                allowed &= m4.astype(bool)
            elif mask_type == "drop":
                allowed &= ~m4.astype(bool)
            elif mask_type == "add":
                self.add = m4.astype(np.float64)
                allowed &= ~(self.add == -np.inf)  # -inf removes the key
            else:
                raise ValueError(f"unknown mask_type {mask_type!r}")
        if block_layout is not None:
            nq, nk = -(-Lq // block_q), -(-Lk // block_k)
            lay = _broadcast_4d(
                np.asarray(block_layout, dtype=bool),
                self.batch_shape + (Hq, nq, nk),
                self.batch_shape,
            )
            ti = (np.arange(Lq) // block_q)[:, None]
            tj = (np.arange(Lk) // block_k)[None, :]
            allowed &= lay[:, :, ti, tj]
        self.allowed = allowed

        # ALiBi distance term, [1, Hq, Lq, Lk] or 0.
        self.alibi = 0.0
        if alibi_slopes is not None:
            slopes = np.asarray(alibi_slopes, dtype=np.float64).reshape(Hq)
            self.alibi = slopes[None, :, None, None] * np.abs(pos - j)[None, None, :, :]

        self.dropout_p = float(dropout_p)
        keep = dropout_keep(self.dropout_p, int(seed), self.B, Hq, Lq, Lk)
        # keep / (1 - p), [B, Hq, Lq, Lk]; p = 1 drops every weight (no 1 / 0)
        p = self.dropout_p
        self.drop_factor = keep / (1.0 - p) if p < 1.0 else np.zeros(keep.shape)

    def scores(self):
        """Returns (s_raw = scale q.k, s_capped, s_final) as [B, Hq, Lq, Lk]; removed keys are -inf in s_final."""
        with np.errstate(invalid="ignore", over="ignore"):
            s_raw = self.scale * np.einsum("bhid,bhjd->bhij", self.q, self.k)
        s_capped = s_raw if self.softcap is None else self.softcap * np.tanh(s_raw / self.softcap)
        s = s_capped - self.alibi + self.add
        return s_raw, s_capped, np.where(self.allowed, s, -np.inf)

    def softmax(self, s):
        """Max-subtracted softmax over allowed keys: (P [B, Hq, Lq, Lk], lse [B, Hq, Lq])."""
        row_max = s.max(axis=-1, keepdims=True, initial=-np.inf)  # Lk == 0: every row has no key
        # A row with no allowed key has max -inf; use 0 there so that -inf - -inf never happens: its exp is 0.
        has_key = np.isfinite(row_max)
        safe_max = np.where(has_key, row_max, 0.0)
        e = np.where(self.allowed, np.exp(s - safe_max), 0.0)
        total = e.sum(axis=-1, keepdims=True)
        P = np.where(has_key, e / np.where(has_key, total, 1.0), 0.0)
        with np.errstate(divide="ignore"):
            lse = np.where(has_key, safe_max + np.log(np.where(has_key, total, 1.0)), -np.inf)[
                ..., 0
            ]
        return P, lse

    def unflatten(self, x, last):
        return x.reshape(self.batch_shape + (x.shape[1], x.shape[2]) + last)

    def sum_groups(self, x):
        """[B, Hq, L, X] -> [B, Hkv, L, X]: the GQA gradient sums over the query heads of a group."""
        B, _, L, X = x.shape
        return x.reshape(B, self.Hkv, self.group, L, X).sum(axis=2)


def _problem(
    q,
    k,
    v,
    *,
    scale=None,
    softcap=None,
    causal=False,
    align="bottom-right",
    position_offset=None,
    window=(-1, -1),
    mask=None,
    mask_type="keep",
    key_lengths=None,
    block_layout=None,
    block_q=0,
    block_k=0,
    alibi_slopes=None,
    dropout_p=0.0,
    seed=0,
):
    return _Problem(
        q,
        k,
        v,
        scale,
        softcap,
        causal,
        align,
        position_offset,
        window,
        mask,
        mask_type,
        key_lengths,
        block_layout,
        block_q,
        block_k,
        alibi_slopes,
        dropout_p,
        seed,
    )


def allowed_keys(q, k, v, **options):
    """The boolean map [..., Hq, Lq, Lk] of the (query, key) pairs that the options allow."""
    pb = _problem(q, k, v, **options)
    return pb.allowed.reshape(pb.full_shape)


def attention(q, k, v, **options):
    """The forward of the contract in float64: Forward(out, lse, weights)."""
    pb = _problem(q, k, v, **options)
    _, _, s = pb.scores()
    P, lse = pb.softmax(s)
    Z = P * pb.drop_factor  # the weights after dropout
    out = _masked_matmul(Z, pb.v, pb.allowed)
    full = pb.full_shape
    return Forward(
        out=pb.unflatten(out, (pb.Dv,)), lse=lse.reshape(full[:-1]), weights=P.reshape(full)
    )


def attention_backward(dout, q, k, v, *, dweights=None, **options):
    """Gradients of attention(q, k, v, **options).out given dout, and of its weights (before dropout) given dweights
    [..., Hq, Lq, Lk] when not None: Grads(dq, dk, dv, dmask)."""
    pb = _problem(q, k, v, **options)
    dO = _to_4d(np.asarray(dout, dtype=np.float64), pb.batch_shape)  # [B, Hq, Lq, Dv]
    _, s_capped, s = pb.scores()
    P, _ = pb.softmax(s)
    Z = P * pb.drop_factor
    out = _masked_matmul(Z, pb.v, pb.allowed)  # the forward's output, recomputed in float64

    # out = Z v  =>  dv = Z^T dO, dZ = dO v^T, dP = dZ * keep / (1 - p).
    dv = _masked_matmul(np.swapaxes(Z, -1, -2), dO, np.swapaxes(pb.allowed, -1, -2))
    with np.errstate(invalid="ignore"):
        dP = np.where(pb.allowed, np.einsum("bhid,bhjd->bhij", dO, pb.v), 0.0) * pb.drop_factor
    # P = softmax(s)  =>  dS = P * (dP - D), D_i = sum_j P_ij dP_ij = dO_i . O_i.
    Di = np.einsum("bhid,bhid->bhi", dO, out)[..., None]
    dS = np.where(pb.allowed, P * (dP - Di), 0.0)  # = d(score after the add mask) = d(add mask)
    if dweights is not None:
        # The loss also reads P itself: dS += P * (dW - E_i), E_i = sum_j P_ij dW_ij (the same softmax rule).
        dW = _to_4d(np.asarray(dweights, dtype=np.float64), pb.batch_shape)
        Ei = (P * dW).sum(axis=-1, keepdims=True)
        dS = dS + np.where(pb.allowed, P * (dW - Ei), 0.0)
    # s = c tanh(s_raw / c) - alibi + add  =>  ds_raw = dS * (1 - (s_capped / c)^2).
    dS_raw = dS if pb.softcap is None else dS * (1.0 - (s_capped / pb.softcap) ** 2)
    dS_raw = np.where(pb.allowed, dS_raw, 0.0)
    # s_raw = scale q k^T  =>  dq = scale dS k, dk = scale dS^T q.
    dq = pb.scale * _masked_matmul(dS_raw, pb.k, pb.allowed)
    dk = pb.scale * _masked_matmul(
        np.swapaxes(dS_raw, -1, -2), pb.q, np.swapaxes(pb.allowed, -1, -2)
    )

    dmask = None
    if pb.mask_type == "add" and pb.mask_shape is not None:
        dmask = _sum_to_shape(dS.reshape(pb.full_shape), pb.mask_shape)
    return Grads(
        dq=dq.reshape(pb.q_shape),
        dk=pb.sum_groups(dk).reshape(pb.k_shape),
        dv=pb.sum_groups(dv).reshape(pb.v_shape),
        dmask=dmask,
    )
