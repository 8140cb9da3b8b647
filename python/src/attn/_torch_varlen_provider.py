"""attn._torch_varlen_provider (enabled by attn.torch.enable()): torch.nn.attention.varlen.varlen_attn on CPU tensors,
computed by attn's kernels.

PyTorch's varlen_attn (and varlen_attn_out) is a custom op, torch_attn::_varlen_attn, whose forward calls
aten::_flash_attention_forward (varlen_attn_out: aten::_flash_attention_forward_no_dropout_inplace) and whose
autograd backward calls aten::_flash_attention_backward. Those aten ops have CUDA kernels only, so on CPU tensors
varlen_attn raises NotImplementedError. enable() registers CPU kernels for the three ops with torch's dispatcher
(torch.library.Library("aten", "IMPL"), dispatch key CPU) that compute with attn._core.attention_varlen,
attention_varlen_backward and attention_paged; torch's own autograd formula (the custom op's, or the aten op's for
direct calls) calls the backward op, so gradients need nothing more here. disable() destroys that Library, which
deregisters the kernels: the ops are again without a CPU kernel, as before.

Python kernels: every call goes through torch's boxed Python dispatch (argument parsing, a few small tensors for the
offsets and rng_state) before attn's C++ kernel runs, tens of microseconds per call. That is noise next to a prefill
chunk, not next to a single decode step; a C++ registration would remove it.

FlashAttention's conventions, which these ops carry, and attn's (docs/semantics.md), side by side:
- Packed form: query [total_q, Hq, D], key [total_k, Hkv, D], value [total_k, Hkv, Dv], int32 cum_seq_q / cum_seq_k
  [B + 1]; out [total_q, Hq, Dv], logsumexp [Hq, total_q]: attn's varlen shapes. Hkv dividing Hq is GQA in both.
  Dense form (cum_seq_q None, what CUDA SDPA passes): query [B, Lq, Hq, D], key/value [B, Lk, Hkv, D], logsumexp
  [B, Hq, Lq]: computed as a packed batch of B equal lengths.
- Alignment: bottom-right per sequence (query i at key position i + Lk_b - Lq_b) in both.
- Window: (window_size_left, window_size_right), a negative bound or None unbounded; is_causal sets the right bound
  to 0 (FlashAttention's rule; causal is the window (-1, 0), intersected with a left bound given). attn's window
  (left, right) has the same meaning with -1 for unbounded.
- seqused_k [B]: sequence b uses its first seqused_k[b] keys and FlashAttention aligns against that count. attn's
  attention_varlen aligns against Lk_b (seqused_k there is a key padding mask), so with a bounded window and some
  seqused_k[b] < Lk_b the kernel calls attention_paged over one-key blocks of the packed keys (a view, no copy of
  K/V), which aligns against seqused_k[b].
- block_table [B, max_blocks]: key and value are pools [num_blocks, block_size, Hkv, D]; Lk_b is seqused_k[b], or
  cum_seq_k's difference without seqused_k: attention_paged's layout.
- scale: None is 1/sqrt(D) in both.
- A row with no allowed key: out 0 and logsumexp -inf (attn's contract; FlashAttention's CUDA kernel writes +inf).
- num_splits (split-KV count; 1 asks for batch invariance) is a scheduling hint and ignored: attn's result for a
  sequence is that of the sequence alone, the same bits whatever else is in the batch, and attn picks its own split.
- dropout_p > 0 (direct calls; varlen_attn passes 0): attn's dropout with a seed drawn from torch's RNG, returned in
  rng_state[0] (FlashAttention's slot for its Philox seed) so that the backward regenerates the same keep-pattern.
  The pattern is attn's, not FlashAttention's.
- float64 inputs (FlashAttention takes none) give a float64 logsumexp, attn's.

Refused: alibi_slopes (NotImplementedError: the backward op takes no slopes, so a gradient would miss them, and
FlashAttention's causal ALiBi adds +slope * j, which gives the same output as attn's -slope * |p(i) - j| but another
logsumexp; attn.torch.attention_varlen takes slopes), return_debug_mask=True (NotImplementedError: the debug mask is
FlashAttention's internal score tile), seqused_k or block_table on inputs that require grad with grad mode on
(RuntimeError: the backward op takes neither; varlen_attn itself refuses them under autograd), and the fp8 overload
aten::_flash_attention_forward.quantized (no kernel registered).
"""

from __future__ import annotations

import threading
from typing import Any

import torch
from torch import Tensor

from . import _core

__all__ = ["VarlenProvider", "enable", "is_enabled"]

_FORWARD = "aten::_flash_attention_forward"
_INPLACE = "aten::_flash_attention_forward_no_dropout_inplace"
_BACKWARD = "aten::_flash_attention_backward"


def _window(is_causal: bool, left: int | None, right: int | None) -> tuple[int, int] | None:
    """FlashAttention's (window_size_left, window_size_right) as attn's window option: a negative bound or None is
    unbounded (-1), is_causal sets the right bound to 0. None when both sides are unbounded."""
    left = -1 if left is None or left < 0 else int(left)
    right = 0 if is_causal else (-1 if right is None or right < 0 else int(right))
    return None if (left, right) == (-1, -1) else (left, right)


def _offsets(n: int, length: int) -> Tensor:
    """int32 [n + 1]: 0, length, 2 * length, ... (the dense form's sequences as packed offsets)."""
    return torch.arange(n + 1, dtype=torch.int32) * length


def _packed(
    op: str, query: Tensor, key: Tensor, value: Tensor, cu_q: Any, cu_k: Any, paged: bool
) -> tuple:
    """(q, k, v, cu_q, cu_k, dense): the op's tensors in attn's packed form. The dense form (cum_seq_q None) query
    [B, Lq, Hq, D] becomes [B * Lq, Hq, D] with offsets 0, Lq, 2 Lq, ... (likewise key and value unless they are
    block_table's pools); dense is (B, Lq) then, else None."""
    if cu_q is not None:
        if query.dim() != 3:
            raise ValueError(
                f"{op}: with cum_seq_q, query must be packed [total_q, Hq, D], got {tuple(query.shape)}"
            )
        if cu_k is None and not paged:
            raise ValueError(
                f"{op}: cum_seq_k is required with cum_seq_q (None only with block_table)"
            )
        return query, key, value, cu_q, cu_k, None
    if cu_k is not None:
        raise ValueError(f"{op}: cum_seq_k was given without cum_seq_q")
    if query.dim() != 4:
        raise ValueError(
            f"{op}: without cum_seq_q, query must be [B, Lq, Hq, D], got {tuple(query.shape)}"
        )
    b, lq = query.shape[:2]
    q = query.reshape(b * lq, *query.shape[2:])
    if paged:
        return q, key, value, _offsets(b, lq), None, (b, lq)
    if key.dim() != 4 or value.dim() != 4 or key.shape[0] != b or value.shape[:2] != key.shape[:2]:
        raise ValueError(
            f"{op}: without cum_seq_q, key and value must be [B, Lk, Hkv, D] with query's B = {b}, got "
            f"{tuple(key.shape)} and {tuple(value.shape)}"
        )
    lk = key.shape[1]
    k, v = (x.reshape(b * lk, *x.shape[2:]) for x in (key, value))
    return q, k, v, _offsets(b, lq), _offsets(b, lk), (b, lq)


def _check_used(op: str, cu_k: Tensor, total_k: int, used: Tensor) -> None:
    """seqused_k[b] in [0, Lk_b] and cum_seq_k well formed, checked before the one-key-block route reads anything
    (attention_varlen checks these itself; attention_paged sees only the block table built from them)."""
    if cu_k.dim() != 1 or cu_k.numel() < 1 or int(cu_k[0]) != 0 or int(cu_k[-1]) != total_k:
        raise ValueError(f"{op}: cum_seq_k must be int32 [B + 1] from 0 to total_k = {total_k}")
    lengths = cu_k[1:] - cu_k[:-1]
    if (lengths < 0).any():
        b = int((lengths < 0).nonzero()[0, 0])
        raise ValueError(
            f"{op}: cum_seq_k[{b + 1}] = {int(cu_k[b + 1])} is below cum_seq_k[{b}] = {int(cu_k[b])}"
        )
    if used.shape != lengths.shape:
        raise ValueError(
            f"{op}: seqused_k must be [B] = [{lengths.numel()}], got {tuple(used.shape)}"
        )
    bad = (used < 0) | (used > lengths)
    if bad.any():
        b = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"{op}: seqused_k[{b}] = {int(used[b])} is outside [0, {int(lengths[b])}] (Lk_{b})"
        )


def _used_prefixes(
    op: str, q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor, cu_k: Tensor, used: Tensor, options
):
    """FlashAttention's seqused_k under a bounded window: sequence b is attention over its first used[b] keys,
    aligned against used[b]. attention_paged over blocks of one key (k [total_k, 1, Hkv, D], a view) whose table
    row b lists cu_k[b], cu_k[b] + 1, ... does exactly that (rows past used[b] are never read)."""
    _check_used(op, cu_k, k.shape[0], used)
    width = max(int(used.max()), 1) if used.numel() else 1
    table = torch.arange(width, dtype=torch.int32)[None] + cu_k[:-1, None]
    table = table.clamp_(0, max(k.shape[0] - 1, 0)).to(torch.int32)
    return _core.attention_paged(q, k.unsqueeze(1), v.unsqueeze(1), table, used, cu_q, **options)


def _compute(op: str, q, k, v, cu_q, cu_k, bounds: tuple, used, table, options: dict) -> tuple:
    """(out [total_q, Hq, Dv], lse [Hq, total_q]) through the attn entry that keeps FlashAttention's meaning:
    attention_paged for block_table, the one-key-block route for seqused_k under a bounded window (when some
    seqused_k[b] < Lk_b), else attention_varlen (bounds: max_q, max_k, checked by attn against every length)."""
    if table is not None:
        if used is None:
            if cu_k is None:
                raise ValueError(
                    f"{op}: block_table needs seqused_k or cum_seq_k (the keys of each sequence)"
                )
            used = (cu_k[1:] - cu_k[:-1]).to(torch.int32)
        return _core.attention_paged(q, k, v, table, used, cu_q, **options)
    if used is not None and options["window"] is not None:
        if not torch.equal(used, (cu_k[1:] - cu_k[:-1]).to(used.dtype)):
            return _used_prefixes(op, q, k, v, cu_q, cu_k, used, options)
    max_q, max_k = bounds
    return _core.attention_varlen(
        q, k, v, cu_q, cu_k, max_seqlen_q=max_q, max_seqlen_k=max_k, seqused_k=used, **options
    )


def _refuse(op: str, q, k, v, return_debug_mask: bool, alibi_slopes, used, table) -> None:
    """The arguments attn cannot take, each named (see the module docstring for why)."""
    if return_debug_mask:
        raise NotImplementedError(
            f"{op} on CPU (attn): return_debug_mask=True is not supported (FlashAttention's debug mask is its "
            "CUDA kernel's internal score tile; attn has no such tensor)"
        )
    if alibi_slopes is not None:
        raise NotImplementedError(
            f"{op} on CPU (attn): alibi_slopes is not supported: {_BACKWARD} takes no slopes (a gradient would "
            "miss them) and FlashAttention's causal ALiBi (+slope * j) gives another logsumexp than attn's "
            "(-slope * |p(i) - j|); use attn.torch.attention_varlen(..., alibi_slopes=...)"
        )
    if torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v)):
        for name, x in (("block_table", table), ("seqused_k", used)):
            if x is not None:
                raise RuntimeError(
                    f"{op} on CPU (attn): {name} is forward only ({_BACKWARD} takes no {name}, so a gradient "
                    "would be another problem's); call it under torch.no_grad() or pass detached tensors"
                )


def _forward(
    op: str, query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, debug, kw
):
    """The forward kernel: (out, logsumexp, rng_state, unused, debug_attn_mask) as FlashAttention returns them for
    the packed form (out [total_q, Hq, Dv], logsumexp [Hq, total_q]) and the dense form (out [B, Lq, Hq, Dv],
    logsumexp [B, Hq, Lq]); rng_state uint64 [2] = (seed, 0), unused uint64 [], debug_attn_mask empty."""
    used, table = kw.get("seqused_k"), kw.get("block_table")
    _refuse(op, query, key, value, debug, kw.get("alibi_slopes"), used, table)
    q, k, v, cu_q, cu_k, dense = _packed(
        op, query, key, value, cum_seq_q, cum_seq_k, table is not None
    )
    seed = int(torch.randint(0, 2**62, ()).item()) if dropout_p > 0 else None
    options = {
        "window": _window(is_causal, kw.get("window_size_left"), kw.get("window_size_right")),
        "scale": kw.get("scale"),
        "dropout_p": float(dropout_p),
        "seed": seed,
    }
    bounds = (None, None) if dense else (int(max_q), int(max_k))
    out, lse = _compute(op, q, k, v, cu_q, cu_k, bounds, used, table, options)
    if dense:
        b, lq = dense
        out = out.view(b, lq, *out.shape[1:])
        lse = lse.view(lse.shape[0], b, lq).transpose(0, 1).contiguous()
    rng_state = torch.tensor([seed or 0, 0], dtype=torch.uint64)
    unused = torch.zeros((), dtype=torch.uint64)
    return out, lse, rng_state, unused, torch.empty(0, dtype=query.dtype)


def _forward_kernel(*args: Any, **kw: Any) -> tuple:
    """CPU kernel of aten::_flash_attention_forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k,
    dropout_p, is_causal, return_debug_mask, *, scale, window_size_left, window_size_right, seqused_k, alibi_slopes,
    block_table, num_splits): the dispatcher passes the keyword-only arguments that differ from None in kw."""
    return _forward(_FORWARD, *args, kw)


def _forward_inplace_kernel(out: Tensor, *args: Any, **kw: Any) -> Tensor:
    """CPU kernel of aten::_flash_attention_forward_no_dropout_inplace(out, <the forward's arguments>)
    (varlen_attn_out): the forward written into out (the forward output's shape), returning logsumexp."""
    dropout_p = args[7]
    if dropout_p != 0:
        raise ValueError(
            f"{_INPLACE}: dropout_p must be 0 (the op has no rng_state to return), got {dropout_p}"
        )
    result, lse, *_ = _forward(_INPLACE, *args, kw)
    if out.shape != result.shape:
        raise ValueError(f"{_INPLACE}: out must be {tuple(result.shape)}, got {tuple(out.shape)}")
    out.copy_(result)
    return lse


def _backward_kernel(
    grad_out,
    query,
    key,
    value,
    out,
    logsumexp,
    cum_seq_q,
    cum_seq_k,
    max_q,
    max_k,
    dropout_p,
    is_causal,
    rng_state,
    unused,
    **kw,
):
    """CPU kernel of aten::_flash_attention_backward: (dq, dk, dv) shaped like query, key and value, from the
    forward's out and logsumexp (the packed or the dense form, as the forward had them) and kw: scale,
    window_size_left, window_size_right. With dropout_p > 0 the seed is rng_state[0], the forward's."""
    q, k, v, cu_q, cu_k, dense = _packed(_BACKWARD, query, key, value, cum_seq_q, cum_seq_k, False)
    dout, o, lse = grad_out, out, logsumexp
    if dense:
        dout, o = (x.reshape(q.shape[0], *x.shape[2:]) for x in (grad_out, out))
        lse = logsumexp.transpose(0, 1).reshape(logsumexp.shape[1], -1)
    options = {
        "window": _window(is_causal, kw.get("window_size_left"), kw.get("window_size_right")),
        "scale": kw.get("scale"),
        "dropout_p": float(dropout_p),
        "seed": int(rng_state.reshape(-1)[0].item()) if dropout_p > 0 else None,
    }
    bounds = {} if dense else {"max_seqlen_q": int(max_q), "max_seqlen_k": int(max_k)}
    # (strided rows, an expanded dout among them, are made unit-stride by attn itself)
    dq, dk, dv = _core.attention_varlen_backward(
        dout, q, k, v, o, lse, cu_q, cu_k, **bounds, **options
    )
    return dq.reshape(query.shape), dk.reshape(key.shape), dv.reshape(value.shape)


_lock = threading.Lock()
_library: torch.library.Library | None = None
_holders = 0


def _register() -> torch.library.Library:
    """A Library holding the three CPU kernels; destroying it deregisters them."""
    lib = torch.library.Library("aten", "IMPL")
    kernels = {
        "_flash_attention_forward": _forward_kernel,
        "_flash_attention_forward_no_dropout_inplace": _forward_inplace_kernel,
        "_flash_attention_backward": _backward_kernel,
    }
    try:
        for name, fn in kernels.items():
            lib.impl(name, fn, "CPU")
    except Exception as e:
        lib._destroy()
        raise RuntimeError(
            f"attn.torch_varlen_provider.enable: could not register the CPU kernel of aten::{name} "
            f"(another Python kernel for it may be registered): {e}"
        ) from e
    return lib


class VarlenProvider:
    """The handle enable() returns. disable() (also remove(), torch.nn.attention's registry protocol, and leaving a
    with-block) gives up this handle's hold; when no handle holds the kernels any more they are deregistered and
    aten::_flash_attention_forward/_backward have no CPU kernel again. Calling it again does nothing."""

    def __init__(self) -> None:
        self._held = True

    @property
    def enabled(self) -> bool:
        """True until this handle's disable()."""
        return self._held

    def disable(self) -> None:
        global _library, _holders
        with _lock:
            if not self._held:
                return
            self._held = False
            _holders -= 1
            if _holders == 0 and _library is not None:
                _library._destroy()
                _library = None

    remove = disable

    def __enter__(self) -> VarlenProvider:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.disable()

    def __repr__(self) -> str:
        return f"<attn varlen_attn provider {'enabled' if self._held else 'disabled'}>"


def enable() -> VarlenProvider:
    """Register attn's CPU kernels for aten::_flash_attention_forward, _flash_attention_forward_no_dropout_inplace
    and _flash_attention_backward, so that torch.nn.attention.varlen.varlen_attn (and varlen_attn_out) run on CPU
    tensors, forward and backward, through attn. Returns a handle: handle.disable() (or `with enable():`) restores
    torch. Handles nest: the kernels stay registered while any handle is enabled. Raises RuntimeError when another
    Python kernel already holds one of these ops' CPU slot."""
    global _library, _holders
    with _lock:
        if _holders == 0:
            _library = _register()
        _holders += 1
    return VarlenProvider()


def is_enabled() -> bool:
    """Whether attn's kernels are registered (some handle from enable() is enabled)."""
    return _holders > 0
