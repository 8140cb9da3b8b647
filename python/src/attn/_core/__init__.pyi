"""
The compiled half of attn: its C++ library bound with nanobind; use it through the attn package (attn.nn, attn.models and attn.viz wrap the submodules _core.nn, _core.models and _core.viz).
"""

from collections.abc import Iterator

from attn._core import models as models, nn as nn, viz as viz


from typing import Any

from numpy.typing import ArrayLike  # NumPy arrays, PyTorch CPU tensors, nested lists

def attention(q: ArrayLike, k: ArrayLike, v: ArrayLike, *, mask: ArrayLike | None = None, mask_type: str = 'keep', causal: bool = False, align: str = 'bottom-right', position_offset: int | None = None, window: tuple[int | None, int | None] | None = None, scale: float | None = None, softcap: float | None = None, alibi_slopes: ArrayLike | None = None, key_lengths: ArrayLike | None = None, block_layout: ArrayLike | None = None, block_size: int | tuple[int, int] | None = None, dropout_p: float = 0.0, seed: int | None = None, sinks: ArrayLike | None = None, return_lse: bool = False, return_weights: bool = False, backend: str = 'auto', threads: int | None = None) -> Any:
    """
    Exact scaled dot-product attention: softmax(scale * q k^T + bias) v under the masks below.

    Returns out, or a tuple (out[, lse][, weights]) with the ones asked for by return_lse and
    return_weights (weights are the probabilities before dropout).

    Options (keyword-only), from attn/options.h's table: each one's text is its row's, as `attn sdpa --help` shows it.
        mask: ArrayLike | None = None  (attn sdpa --mask)
            dense mask .npy broadcastable to [..., Hq, Lq, Lk]
        mask_type: str = 'keep'  (attn sdpa --mask-type)
            keep (bool, true = may attend) | drop (bool, true = masked) | add (float added to the scores)
        causal: bool = False  (attn sdpa --causal)
            query i attends to keys j <= p(i)
        align: str = 'bottom-right'  (attn sdpa --align)
            bottom-right (p(i) = i + Lk - Lq, default) | top-left (p(i) = i)
        position_offset: int | None = None
            p(i) = i + offset, overriding align (chunked prefill, ring attention)
        window: tuple[int | None, int | None] | None = None  (attn sdpa --window)
            LEFT,RIGHT: keys p(i)-LEFT <= j <= p(i)+RIGHT (-1 = unbounded); window bounds must be >= -1 (-1 = unbounded)
        scale: float | None = None  (attn sdpa --scale)
            score scale (default 1/sqrt(D)); scale must be finite
        softcap: float | None = None  (attn sdpa --softcap)
            s = C * tanh(s / C); softcap must be finite and > 0
        alibi_slopes: ArrayLike | None = None  (attn sdpa --alibi)
            ALiBi slopes .npy [Hq]: s -= slope * |p(i) - j|
        key_lengths: ArrayLike | None = None  (attn sdpa --key-lengths)
            int .npy of the batch dims' shape: keys j >= len are padding
        block_layout: ArrayLike | None = None
            bool map over (query tile, key tile), with block_size
        block_size: int | tuple[int, int] | None = None
            block_layout's tiles: bq or (bq, bk) (needed by block_layout, refused without it)
        dropout_p: float = 0.0  (attn sdpa --dropout)
            dropout probability in [0, 1] (needs --seed); dropout_p must be in [0, 1]
        seed: int | None = None  (attn sdpa --seed)
            dropout seed (the keep-pattern is a function of seed, batch, head, i, j)
        sinks: ArrayLike | None = None  (attn sdpa --sinks)
            sink logits .npy [Hq]: one per head in every row's softmax, no value
        return_lse: bool = False
            also return lse [..., Hq, Lq] (natural log of each row's softmax sum; attention_backward takes it)
        return_weights: bool = False  (attn sdpa --weights)
            also write the attention weights [..., Hq, Lq, Lk] (before dropout); attention's output request
        backend: str = 'auto'  (attn sdpa --backend)
            auto | reference | cpu (default auto)
        threads: int | None = None  (attn sdpa --threads)
            threads (0 = the default)

    Shapes (any number of leading batch dims "...", equal across q, k and v):
        q [..., Hq, Lq, D], k [..., Hkv, Lk, D], v [..., Hkv, Lk, Dv]  ->  out [..., Hq, Lq, Dv]
        lse [..., Hq, Lq] (float64 for float64 inputs, else float32), weights [..., Hq, Lq, Lk].
        Hq % Hkv == 0; query head h reads key/value head h // (Hq // Hkv) (GQA / MQA without copies).
    q, k and v share one dtype (float64, float32, float16, or bfloat16 for torch tensors), which is the
    compute type (float64 computes in double, the others accumulate in float32 or better). Arrays are
    NumPy arrays or PyTorch CPU tensors; they are read without a copy when their last dim is contiguous.
    Results are NumPy arrays, or torch tensors when any input is a torch tensor.

    Alignment: query i sits at key position p(i) = i + Lk - Lq with align='bottom-right' (the default,
    FlashAttention's causal) and p(i) = i with align='top-left' (PyTorch's is_causal);
    position_offset=n overrides both: p(i) = i + n (chunked prefill, ring attention).
    Key j is used by query i only when every rule allows it:
        causal: j <= p(i); window=(left, right): p(i) - left <= j <= p(i) + right (None or -1 = unbounded);
        mask: broadcastable to [..., Hq, Lq, Lk], with mask_type 'keep' (bool, True = may attend, as
        torch's scaled_dot_product_attention), 'drop' (bool, True = masked, as nn.MultiheadAttention) or
        'add' (float added to the scores, -inf removes the key);
        key_lengths [...] (int): keys j >= key_lengths[b] are padding;
        block_layout [..., Hq, ceil(Lq / bq), ceil(Lk / bk)] (bool) with block_size bq or (bq, bk).
    Score s = scale * q.k (scale defaults to 1/sqrt(D)); softcap c: s = c * tanh(s / c); ALiBi slopes [Hq]:
    s -= slope[h] * |p(i) - j|; then an 'add' mask is added. Softmax over the allowed keys only; a row
    with no allowed key gives out = 0, weights = 0, lse = -inf (never NaN).
    Dropout p drops weights with probability p and scales the rest by 1/(1 - p); the keep-pattern is a
    function of (seed, batch, head, i, j): seed=None draws a fresh seed, pass one to reproduce it.
    backend: 'auto', 'reference' (double precision, defines the contract) or 'cpu'; threads=None uses
    attn.set_num_threads, ATTN_NUM_THREADS or all cores. Raises ValueError (bad shapes or options) or
    TypeError (not an array, unsupported dtype); the GIL is released while computing.
    """

def attention_backward(dout: ArrayLike, q: ArrayLike, k: ArrayLike, v: ArrayLike, out: ArrayLike, lse: ArrayLike, *, dweights: ArrayLike | None = None, mask: ArrayLike | None = None, mask_type: str = 'keep', causal: bool = False, align: str = 'bottom-right', position_offset: int | None = None, window: tuple[int | None, int | None] | None = None, scale: float | None = None, softcap: float | None = None, alibi_slopes: ArrayLike | None = None, key_lengths: ArrayLike | None = None, block_layout: ArrayLike | None = None, block_size: int | tuple[int, int] | None = None, dropout_p: float = 0.0, seed: int | None = None, sinks: ArrayLike | None = None, mask_grad: bool = False, backend: str = 'auto', threads: int | None = None) -> tuple[Any, ...]:
    """
    Gradients of attention(q, k, v, **options)[0] given dout = dL/dout.

    out and lse are that forward call's results (the backward recomputes the weights from lse);
    the options, seed included, must be the forward's. Returns (dq, dk, dv) with the shapes and
    dtypes of q, k and v (GQA: dk, dv summed over the query heads of a group), and d(mask) in the
    mask's shape as a fourth element when mask_grad=True (mask_type='add' only).

    dweights: ArrayLike | None = None
        dL/dweights [..., Hq, Lq, Lk] (any floating dtype) when the forward's weights (return_weights:
        the probabilities before dropout) were used too: their part, dS += P (dW - rowsum(P dW)) through
        softcap, is folded into dq, dk and d(mask). Such a call runs on the reference backend (double,
        exact) whatever backend says.

    Options (keyword-only), from attn/options.h's table: each one's text is its row's, as `attn sdpa --help` shows it.
        mask: ArrayLike | None = None  (attn sdpa --mask)
            dense mask .npy broadcastable to [..., Hq, Lq, Lk]
        mask_type: str = 'keep'  (attn sdpa --mask-type)
            keep (bool, true = may attend) | drop (bool, true = masked) | add (float added to the scores)
        causal: bool = False  (attn sdpa --causal)
            query i attends to keys j <= p(i)
        align: str = 'bottom-right'  (attn sdpa --align)
            bottom-right (p(i) = i + Lk - Lq, default) | top-left (p(i) = i)
        position_offset: int | None = None
            p(i) = i + offset, overriding align (chunked prefill, ring attention)
        window: tuple[int | None, int | None] | None = None  (attn sdpa --window)
            LEFT,RIGHT: keys p(i)-LEFT <= j <= p(i)+RIGHT (-1 = unbounded); window bounds must be >= -1 (-1 = unbounded)
        scale: float | None = None  (attn sdpa --scale)
            score scale (default 1/sqrt(D)); scale must be finite
        softcap: float | None = None  (attn sdpa --softcap)
            s = C * tanh(s / C); softcap must be finite and > 0
        alibi_slopes: ArrayLike | None = None  (attn sdpa --alibi)
            ALiBi slopes .npy [Hq]: s -= slope * |p(i) - j|
        key_lengths: ArrayLike | None = None  (attn sdpa --key-lengths)
            int .npy of the batch dims' shape: keys j >= len are padding
        block_layout: ArrayLike | None = None
            bool map over (query tile, key tile), with block_size
        block_size: int | tuple[int, int] | None = None
            block_layout's tiles: bq or (bq, bk) (needed by block_layout, refused without it)
        dropout_p: float = 0.0  (attn sdpa --dropout)
            dropout probability in [0, 1] (needs --seed); dropout_p must be in [0, 1]
        seed: int | None = None  (attn sdpa --seed)
            dropout seed (the keep-pattern is a function of seed, batch, head, i, j)
        sinks: ArrayLike | None = None  (attn sdpa --sinks)
            sink logits .npy [Hq]: one per head in every row's softmax, no value
        mask_grad: bool = False
            the backward also returns d(add mask); attention_backward's output request
        backend: str = 'auto'  (attn sdpa --backend)
            auto | reference | cpu (default auto)
        threads: int | None = None  (attn sdpa --threads)
            threads (0 = the default)

    Shapes (any number of leading batch dims "...", equal across q, k and v):
        q [..., Hq, Lq, D], k [..., Hkv, Lk, D], v [..., Hkv, Lk, Dv]  ->  out [..., Hq, Lq, Dv]
        lse [..., Hq, Lq] (float64 for float64 inputs, else float32), weights [..., Hq, Lq, Lk].
        Hq % Hkv == 0; query head h reads key/value head h // (Hq // Hkv) (GQA / MQA without copies).
    q, k and v share one dtype (float64, float32, float16, or bfloat16 for torch tensors), which is the
    compute type (float64 computes in double, the others accumulate in float32 or better). Arrays are
    NumPy arrays or PyTorch CPU tensors; they are read without a copy when their last dim is contiguous.
    Results are NumPy arrays, or torch tensors when any input is a torch tensor.

    Alignment: query i sits at key position p(i) = i + Lk - Lq with align='bottom-right' (the default,
    FlashAttention's causal) and p(i) = i with align='top-left' (PyTorch's is_causal);
    position_offset=n overrides both: p(i) = i + n (chunked prefill, ring attention).
    Key j is used by query i only when every rule allows it:
        causal: j <= p(i); window=(left, right): p(i) - left <= j <= p(i) + right (None or -1 = unbounded);
        mask: broadcastable to [..., Hq, Lq, Lk], with mask_type 'keep' (bool, True = may attend, as
        torch's scaled_dot_product_attention), 'drop' (bool, True = masked, as nn.MultiheadAttention) or
        'add' (float added to the scores, -inf removes the key);
        key_lengths [...] (int): keys j >= key_lengths[b] are padding;
        block_layout [..., Hq, ceil(Lq / bq), ceil(Lk / bk)] (bool) with block_size bq or (bq, bk).
    Score s = scale * q.k (scale defaults to 1/sqrt(D)); softcap c: s = c * tanh(s / c); ALiBi slopes [Hq]:
    s -= slope[h] * |p(i) - j|; then an 'add' mask is added. Softmax over the allowed keys only; a row
    with no allowed key gives out = 0, weights = 0, lse = -inf (never NaN).
    Dropout p drops weights with probability p and scales the rest by 1/(1 - p); the keep-pattern is a
    function of (seed, batch, head, i, j): seed=None draws a fresh seed, pass one to reproduce it.
    backend: 'auto', 'reference' (double precision, defines the contract) or 'cpu'; threads=None uses
    attn.set_num_threads, ATTN_NUM_THREADS or all cores. Raises ValueError (bad shapes or options) or
    TypeError (not an array, unsupported dtype); the GIL is released while computing.
    """

def option_keywords(direction: str) -> list[tuple[str, str, str, Any]]:
    """
    [(name, Python type, kind, default)] of attention's keywords (direction 'forward') or attention_backward's ('backward')
    after the arrays, in order: attn.torch builds its op schema from them.
    """

def options_doc(direction: str) -> str:
    """
    The options section of attention's docstring (direction 'forward') or attention_backward's ('backward'),
    built from attn/options.h's table: attn.torch's docstrings show it too.
    """

def set_num_threads(n: int) -> None:
    """
    Threads used by calls that pass threads=None; n <= 0 restores the default (ATTN_NUM_THREADS, else all cores).
    """

def get_num_threads() -> int:
    """Threads a call with threads=None uses."""

def cached_memory_bytes() -> int:
    """Bytes attn holds in freed tensor buffers (>= 256 KiB each) for reuse."""

def release_cached_memory() -> int:
    """
    Gives every buffer attn holds for reuse back to the C library; returns the bytes released.
    """

def set_cached_memory_limit(bytes: int) -> None:
    """
    The most bytes attn holds in freed buffers (0: none); default ATTN_CACHE_MB MiB, else 1024 MiB.
    """

def cached_memory_limit() -> int:
    """The budget of freed buffers held for reuse, in bytes."""

def resolve_backend(backend: str, dtype: str) -> str:
    """
    The backend ('reference' or 'cpu') that `backend` ('auto', 'reference', 'cpu') runs for inputs of `dtype` ('float64', 'float32', 'float16', 'bfloat16') on this machine.
    """

def attention_varlen(q: ArrayLike, k: ArrayLike, v: ArrayLike, cu_seqlens_q: ArrayLike, cu_seqlens_k: ArrayLike, *, max_seqlen_q: int | None = None, max_seqlen_k: int | None = None, seqused_k: ArrayLike | None = None, mask: ArrayLike | None = None, mask_type: str = 'keep', causal: bool = False, align: str = 'bottom-right', position_offset: int | None = None, window: tuple[int | None, int | None] | None = None, scale: float | None = None, softcap: float | None = None, alibi_slopes: ArrayLike | None = None, key_lengths: ArrayLike | None = None, block_layout: ArrayLike | None = None, block_size: int | tuple[int, int] | None = None, dropout_p: float = 0.0, seed: int | None = None, sinks: ArrayLike | None = None, return_weights: bool = False, backend: str = 'auto', threads: int | None = None) -> tuple[Any, Any]:
    """
    Packed variable-length attention (FlashAttention's varlen form): B sequences of different lengths,
    their tokens packed one after the other, each attending to its own keys only.

    Returns (out, lse) (attention_varlen_backward takes lse).

    Of attention's keywords, these have no meaning on a packed batch and raise ValueError when used:
    key_lengths (pass seqused_k), mask, block_layout (and so block_size), return_weights, mask_grad.
    return_lse is no keyword of attn._core.attention_varlen (TypeError): it always returns lse.

    Options (keyword-only), from attn/options.h's table: each one's text is its row's, as `attn sdpa --help` shows it.
        mask: ArrayLike | None = None  (attn sdpa --mask)
            dense mask .npy broadcastable to [..., Hq, Lq, Lk]
        mask_type: str = 'keep'  (attn sdpa --mask-type)
            keep (bool, true = may attend) | drop (bool, true = masked) | add (float added to the scores)
        causal: bool = False  (attn sdpa --causal)
            query i attends to keys j <= p(i)
        align: str = 'bottom-right'  (attn sdpa --align)
            bottom-right (p(i) = i + Lk - Lq, default) | top-left (p(i) = i)
        position_offset: int | None = None
            p(i) = i + offset, overriding align (chunked prefill, ring attention)
        window: tuple[int | None, int | None] | None = None  (attn sdpa --window)
            LEFT,RIGHT: keys p(i)-LEFT <= j <= p(i)+RIGHT (-1 = unbounded); window bounds must be >= -1 (-1 = unbounded)
        scale: float | None = None  (attn sdpa --scale)
            score scale (default 1/sqrt(D)); scale must be finite
        softcap: float | None = None  (attn sdpa --softcap)
            s = C * tanh(s / C); softcap must be finite and > 0
        alibi_slopes: ArrayLike | None = None  (attn sdpa --alibi)
            ALiBi slopes .npy [Hq]: s -= slope * |p(i) - j|
        key_lengths: ArrayLike | None = None  (attn sdpa --key-lengths)
            int .npy of the batch dims' shape: keys j >= len are padding
        block_layout: ArrayLike | None = None
            bool map over (query tile, key tile), with block_size
        block_size: int | tuple[int, int] | None = None
            block_layout's tiles: bq or (bq, bk) (needed by block_layout, refused without it)
        dropout_p: float = 0.0  (attn sdpa --dropout)
            dropout probability in [0, 1] (needs --seed); dropout_p must be in [0, 1]
        seed: int | None = None  (attn sdpa --seed)
            dropout seed (the keep-pattern is a function of seed, batch, head, i, j)
        sinks: ArrayLike | None = None  (attn sdpa --sinks)
            sink logits .npy [Hq]: one per head in every row's softmax, no value
        return_weights: bool = False  (attn sdpa --weights)
            also write the attention weights [..., Hq, Lq, Lk] (before dropout); attention's output request
        backend: str = 'auto'  (attn sdpa --backend)
            auto | reference | cpu (default auto)
        threads: int | None = None  (attn sdpa --threads)
            threads (0 = the default)

    Shapes (the tokens of B sequences packed one after the other, no padding):
        q [total_q, Hq, D], k [total_k, Hkv, D], v [total_k, Hkv, Dv]  ->  out [total_q, Hq, Dv] (q's
        dtype), lse [Hq, total_q] (float64 for float64 inputs, else float32; the natural log of each row's
        softmax sum, sinks included, -inf for a row with no allowed key).
        Hq % Hkv == 0; query head h reads key/value head h // (Hq // Hkv) (GQA / MQA without copies).
    cu_seqlens_q, cu_seqlens_k: int32 [B + 1], FlashAttention's cumulative offsets: 0, then
        non-decreasing, the last equal to total_q (total_k). Sequence b owns rows
        cu_seqlens_q[b]:cu_seqlens_q[b + 1] of q (its Lq_b queries) and rows
        cu_seqlens_k[b]:cu_seqlens_k[b + 1] of k and v (its Lk_b keys); equal offsets make an empty
        sequence (Lq_b = 0: nothing to compute; Lk_b = 0: its queries see no key, out = 0).
    seqused_k: int32 [B] or None: sequence b reads only its first seqused_k[b] <= Lk_b keys (the rest of
        its rows, a cache's capacity, are never read): key_lengths of that sequence alone.
    max_seqlen_q, max_seqlen_k: optional bounds (FlashAttention's arguments): when given, every Lq_b
        (Lk_b) must be <= them. Not needed for anything else.
    Each sequence attends to its own keys only, exactly as attention(q_b, k_b, v_b, **options) on its rows
    alone would (the same bits: the kernels read the packed rows in place). Every option applies per
    sequence, its alignment against Lq_b and Lk_b: query i of sequence b sits at key position
    p(i) = i + Lk_b - Lq_b with align='bottom-right' (the default, FlashAttention's varlen causal: the
    queries are the last Lq_b of the keys), p(i) = i with 'top-left', p(i) = i + position_offset when
    given. alibi_slopes may be [Hq] or [B, Hq] (a row per sequence); sinks [Hq] join every row's softmax;
    dropout's keep-pattern is that of batch entry b with the sequence's local i and j.
    q, k and v share one dtype (float64, float32, float16, or bfloat16 for torch tensors). Arrays are
    NumPy arrays or PyTorch CPU tensors; results are NumPy arrays, or torch tensors when any input is a
    torch tensor. Raises ValueError naming the argument for bad offsets, shapes or options (the offsets
    are checked before any read: "cu_seqlens_q[2] = 1 is below cu_seqlens_q[1] = 3 ..."), TypeError for
    an unsupported dtype; the GIL is released while computing.
    """

def attention_varlen_backward(dout: ArrayLike, q: ArrayLike, k: ArrayLike, v: ArrayLike, out: ArrayLike, lse: ArrayLike, cu_seqlens_q: ArrayLike, cu_seqlens_k: ArrayLike, *, max_seqlen_q: int | None = None, max_seqlen_k: int | None = None, seqused_k: ArrayLike | None = None, mask: ArrayLike | None = None, mask_type: str = 'keep', causal: bool = False, align: str = 'bottom-right', position_offset: int | None = None, window: tuple[int | None, int | None] | None = None, scale: float | None = None, softcap: float | None = None, alibi_slopes: ArrayLike | None = None, key_lengths: ArrayLike | None = None, block_layout: ArrayLike | None = None, block_size: int | tuple[int, int] | None = None, dropout_p: float = 0.0, seed: int | None = None, sinks: ArrayLike | None = None, mask_grad: bool = False, backend: str = 'auto', threads: int | None = None) -> tuple[Any, ...]:
    """
    Gradients of attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, ...)[0] given dout = dL/dout
    [total_q, Hq, Dv].

    out and lse are that forward call's results; the offsets, seqused_k and the options, seed
    included, must be the forward's. Returns (dq, dk, dv), packed like q, k and v (GQA: dk, dv summed
    over the query heads of a group; key rows no sequence reads get 0), and dsinks [Hq] (summed over the
    sequences) as a fourth element when sinks is given. Deterministic: the same bits for any thread count.

    Of attention's keywords, these have no meaning on a packed batch and raise ValueError when used:
    key_lengths (pass seqused_k), mask, block_layout (and so block_size), return_weights, mask_grad.
    return_lse is no keyword of attn._core.attention_varlen (TypeError): it always returns lse.

    Options (keyword-only), from attn/options.h's table: each one's text is its row's, as `attn sdpa --help` shows it.
        mask: ArrayLike | None = None  (attn sdpa --mask)
            dense mask .npy broadcastable to [..., Hq, Lq, Lk]
        mask_type: str = 'keep'  (attn sdpa --mask-type)
            keep (bool, true = may attend) | drop (bool, true = masked) | add (float added to the scores)
        causal: bool = False  (attn sdpa --causal)
            query i attends to keys j <= p(i)
        align: str = 'bottom-right'  (attn sdpa --align)
            bottom-right (p(i) = i + Lk - Lq, default) | top-left (p(i) = i)
        position_offset: int | None = None
            p(i) = i + offset, overriding align (chunked prefill, ring attention)
        window: tuple[int | None, int | None] | None = None  (attn sdpa --window)
            LEFT,RIGHT: keys p(i)-LEFT <= j <= p(i)+RIGHT (-1 = unbounded); window bounds must be >= -1 (-1 = unbounded)
        scale: float | None = None  (attn sdpa --scale)
            score scale (default 1/sqrt(D)); scale must be finite
        softcap: float | None = None  (attn sdpa --softcap)
            s = C * tanh(s / C); softcap must be finite and > 0
        alibi_slopes: ArrayLike | None = None  (attn sdpa --alibi)
            ALiBi slopes .npy [Hq]: s -= slope * |p(i) - j|
        key_lengths: ArrayLike | None = None  (attn sdpa --key-lengths)
            int .npy of the batch dims' shape: keys j >= len are padding
        block_layout: ArrayLike | None = None
            bool map over (query tile, key tile), with block_size
        block_size: int | tuple[int, int] | None = None
            block_layout's tiles: bq or (bq, bk) (needed by block_layout, refused without it)
        dropout_p: float = 0.0  (attn sdpa --dropout)
            dropout probability in [0, 1] (needs --seed); dropout_p must be in [0, 1]
        seed: int | None = None  (attn sdpa --seed)
            dropout seed (the keep-pattern is a function of seed, batch, head, i, j)
        sinks: ArrayLike | None = None  (attn sdpa --sinks)
            sink logits .npy [Hq]: one per head in every row's softmax, no value
        mask_grad: bool = False
            the backward also returns d(add mask); attention_backward's output request
        backend: str = 'auto'  (attn sdpa --backend)
            auto | reference | cpu (default auto)
        threads: int | None = None  (attn sdpa --threads)
            threads (0 = the default)

    Shapes (the tokens of B sequences packed one after the other, no padding):
        q [total_q, Hq, D], k [total_k, Hkv, D], v [total_k, Hkv, Dv]  ->  out [total_q, Hq, Dv] (q's
        dtype), lse [Hq, total_q] (float64 for float64 inputs, else float32; the natural log of each row's
        softmax sum, sinks included, -inf for a row with no allowed key).
        Hq % Hkv == 0; query head h reads key/value head h // (Hq // Hkv) (GQA / MQA without copies).
    cu_seqlens_q, cu_seqlens_k: int32 [B + 1], FlashAttention's cumulative offsets: 0, then
        non-decreasing, the last equal to total_q (total_k). Sequence b owns rows
        cu_seqlens_q[b]:cu_seqlens_q[b + 1] of q (its Lq_b queries) and rows
        cu_seqlens_k[b]:cu_seqlens_k[b + 1] of k and v (its Lk_b keys); equal offsets make an empty
        sequence (Lq_b = 0: nothing to compute; Lk_b = 0: its queries see no key, out = 0).
    seqused_k: int32 [B] or None: sequence b reads only its first seqused_k[b] <= Lk_b keys (the rest of
        its rows, a cache's capacity, are never read): key_lengths of that sequence alone.
    max_seqlen_q, max_seqlen_k: optional bounds (FlashAttention's arguments): when given, every Lq_b
        (Lk_b) must be <= them. Not needed for anything else.
    Each sequence attends to its own keys only, exactly as attention(q_b, k_b, v_b, **options) on its rows
    alone would (the same bits: the kernels read the packed rows in place). Every option applies per
    sequence, its alignment against Lq_b and Lk_b: query i of sequence b sits at key position
    p(i) = i + Lk_b - Lq_b with align='bottom-right' (the default, FlashAttention's varlen causal: the
    queries are the last Lq_b of the keys), p(i) = i with 'top-left', p(i) = i + position_offset when
    given. alibi_slopes may be [Hq] or [B, Hq] (a row per sequence); sinks [Hq] join every row's softmax;
    dropout's keep-pattern is that of batch entry b with the sequence's local i and j.
    q, k and v share one dtype (float64, float32, float16, or bfloat16 for torch tensors). Arrays are
    NumPy arrays or PyTorch CPU tensors; results are NumPy arrays, or torch tensors when any input is a
    torch tensor. Raises ValueError naming the argument for bad offsets, shapes or options (the offsets
    are checked before any read: "cu_seqlens_q[2] = 1 is below cu_seqlens_q[1] = 3 ..."), TypeError for
    an unsupported dtype; the GIL is released while computing.
    """

def attention_paged(q: ArrayLike, k_pages: ArrayLike, v_pages: ArrayLike, block_table: ArrayLike, seqused_k: ArrayLike, cu_seqlens_q: ArrayLike | None = None, *, k_scales: ArrayLike | None = None, v_scales: ArrayLike | None = None, mask: ArrayLike | None = None, mask_type: str = 'keep', causal: bool = False, align: str = 'bottom-right', position_offset: int | None = None, window: tuple[int | None, int | None] | None = None, scale: float | None = None, softcap: float | None = None, alibi_slopes: ArrayLike | None = None, key_lengths: ArrayLike | None = None, block_layout: ArrayLike | None = None, block_size: int | tuple[int, int] | None = None, dropout_p: float = 0.0, seed: int | None = None, sinks: ArrayLike | None = None, return_weights: bool = False, backend: str = 'auto', threads: int | None = None) -> tuple[Any, Any]:
    """
    Attention over a paged KV cache (vLLM's and FlashAttention's layout): the queries of B sequences
    against their keys and values in a pool of fixed-size blocks, listed by a block table.

    Returns (out, lse) (attn.attention_paged returns out unless return_lse=True).

    Of attention's keywords, these have no meaning on a paged batch and raise ValueError when used:
    key_lengths (seqused_k is each sequence's), mask, block_layout (and so block_size),
    return_weights, mask_grad.

    Options (keyword-only), from attn/options.h's table: each one's text is its row's, as `attn sdpa --help` shows it.
        mask: ArrayLike | None = None  (attn sdpa --mask)
            dense mask .npy broadcastable to [..., Hq, Lq, Lk]
        mask_type: str = 'keep'  (attn sdpa --mask-type)
            keep (bool, true = may attend) | drop (bool, true = masked) | add (float added to the scores)
        causal: bool = False  (attn sdpa --causal)
            query i attends to keys j <= p(i)
        align: str = 'bottom-right'  (attn sdpa --align)
            bottom-right (p(i) = i + Lk - Lq, default) | top-left (p(i) = i)
        position_offset: int | None = None
            p(i) = i + offset, overriding align (chunked prefill, ring attention)
        window: tuple[int | None, int | None] | None = None  (attn sdpa --window)
            LEFT,RIGHT: keys p(i)-LEFT <= j <= p(i)+RIGHT (-1 = unbounded); window bounds must be >= -1 (-1 = unbounded)
        scale: float | None = None  (attn sdpa --scale)
            score scale (default 1/sqrt(D)); scale must be finite
        softcap: float | None = None  (attn sdpa --softcap)
            s = C * tanh(s / C); softcap must be finite and > 0
        alibi_slopes: ArrayLike | None = None  (attn sdpa --alibi)
            ALiBi slopes .npy [Hq]: s -= slope * |p(i) - j|
        key_lengths: ArrayLike | None = None  (attn sdpa --key-lengths)
            int .npy of the batch dims' shape: keys j >= len are padding
        block_layout: ArrayLike | None = None
            bool map over (query tile, key tile), with block_size
        block_size: int | tuple[int, int] | None = None
            block_layout's tiles: bq or (bq, bk) (needed by block_layout, refused without it)
        dropout_p: float = 0.0  (attn sdpa --dropout)
            dropout probability in [0, 1] (needs --seed); dropout_p must be in [0, 1]
        seed: int | None = None  (attn sdpa --seed)
            dropout seed (the keep-pattern is a function of seed, batch, head, i, j)
        sinks: ArrayLike | None = None  (attn sdpa --sinks)
            sink logits .npy [Hq]: one per head in every row's softmax, no value
        return_weights: bool = False  (attn sdpa --weights)
            also write the attention weights [..., Hq, Lq, Lk] (before dropout); attention's output request
        backend: str = 'auto'  (attn sdpa --backend)
            auto | reference | cpu (default auto)
        threads: int | None = None  (attn sdpa --threads)
            threads (0 = the default)

    Shapes (B sequences; their keys and values in a pool of blocks, vLLM's and FlashAttention's layout):
        q [total_q, Hq, D] with cu_seqlens_q int32 [B + 1] (the queries of each sequence packed, as
            attention_varlen's), or q [B, Hq, D] and cu_seqlens_q None (one query per sequence: decode)
        k_pages [num_blocks, block_size, Hkv, D], v_pages [num_blocks, block_size, Hkv, Dv]
        block_table int32 [B, max_blocks]: key j of sequence b is row j % block_size of block
            block_table[b, j // block_size] (entries past a sequence's keys are not read)
        seqused_k int32 [B]: sequence b's keys are 0 .. seqused_k[b] - 1 (<= max_blocks * block_size)
        ->  out [total_q, Hq, Dv] (q's dtype), lse [Hq, total_q] (float64 for float64 inputs, else
        float32; -inf for a row with no allowed key).
        Hq % Hkv == 0; query head h reads key/value head h // (Hq // Hkv).
    Sequence b's queries attend to its seqused_k[b] keys exactly as attention() does on those keys
    gathered into one array (the same bits), every option applied per sequence, aligned against Lq_b
    and Lk_b = seqused_k[b]: with align='bottom-right' (the default) query i sits at key position
    i + Lk_b - Lq_b, so the Lq_b queries are the last Lq_b keys (append a step's keys before the call:
    decode, speculative steps, chunked prefill); 'top-left' puts it at i, position_offset=n at i + n.
    alibi_slopes may be [Hq] or [B, Hq]; sinks [Hq] join every row's softmax.
    q and the pools share one dtype (float64, float32, float16, or bfloat16 for torch tensors), or the
    pools are int8 with k_scales and v_scales float32 [num_blocks, block_size, Hkv] (keywords; one scale
    per token and kv head: element x scale in float32 is the value, attn.quantize_int8's form), read
    inside the kernel and never dequantized into memory for decode; the result is attention() over the
    dequantized values to the contract's tolerance for q's dtype (docs/semantics.md). Arrays
    are NumPy arrays or PyTorch CPU tensors, read in place; results are NumPy arrays, or torch tensors
    when any input is one. Every index is checked before any read: ValueError naming it ("block_table[0,
    1] = 40 is outside [0, num_blocks = 32)", "seqused_k[1] = 90 is outside [0, 64]"), TypeError for an
    unsupported dtype (block_table, seqused_k and cu_seqlens_q are int32). Forward only (no gradient);
    the GIL is released while computing.
    """

def quantize_int8(x: ArrayLike) -> tuple[Any, Any]:
    """
    Symmetric int8 quantization of x [n, H, X] (float32, bfloat16 or float16, finite), the form of an int8 KVCache's
    keys and values: one scale per (row, head), scale = max |x| / 127 in float32 (1 for a head of zeros), values = x / scale
    rounded to nearest (ties to even). Returns (values int8 [n, H, X], scales float32 [n, H]); values * scales is within
    scale / 2 of x.
    """

def write_kv_slots(k_pages: ArrayLike, v_pages: ArrayLike, k: ArrayLike, v: ArrayLike, slot_mapping: ArrayLike, k_scales: ArrayLike | None = None, v_scales: ArrayLike | None = None) -> None:
    """
    vLLM's reshape_and_cache: token t's key k[t] [Hkv, D] and value v[t] [Hkv, Dv] into slot slot_mapping[t] = block * block_size +
    offset of the pools k_pages [num_blocks, block_size, Hkv, D] and v_pages [.., Dv], in place: they are the caller's
    arrays (contiguous, writable NumPy arrays or torch CPU tensors that do not require grad), never a copy. k and v have
    the pools' dtype; slot_mapping is int32 or int64 [n], -1 skips a token (padding). Every slot is checked before any
    write: ValueError "slot_mapping[3] = 99 is outside [0, num_blocks x block_size = 64)". int8 pools take float k and v,
    quantized (attn.quantize_int8) into them and into k_scales and v_scales [num_blocks, block_size, Hkv] (in place, as
    the pools). The GIL is released while writing.
    """

class PagedKV:
    """
    What attn.attention_paged reads for some sequences of a KVCache (KVCache.view): k_pages, v_pages, block_table [n, max_blocks] and seqused_k [n], int32; unpacks as a 4-tuple.
    """

    @property
    def k_pages(self) -> Any: ...

    @property
    def v_pages(self) -> Any: ...

    @property
    def block_table(self) -> Any: ...

    @property
    def seqused_k(self) -> Any: ...

    @property
    def k_scales(self) -> Any:
        """
        An int8 cache's key scales [num_blocks, block_size, Hkv] (pass k_scales=view.k_scales to attention_paged); None for a floating cache.
        """

    @property
    def v_scales(self) -> Any:
        """An int8 cache's value scales; None for a floating cache."""

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator: ...

    def __getitem__(self, i: int) -> Any: ...

class KVCache:
    """
    A paged KV cache: a pool of blocks of keys and values, and the sequences that own them.

    KVCache(num_blocks, block_size, num_kv_heads, head_dim, head_dim_v=None, dtype='float32') owns a
    zero-filled pool: k_pages [num_blocks, block_size, num_kv_heads, head_dim] and v_pages [..,
    head_dim_v (default head_dim)]; dtype 'float32', 'bfloat16', 'float16', 'float64' or a NumPy /
    torch dtype, or 'int8': int8 pools with a float32 scale per token and kv head (k_scales, v_scales),
    appends quantized by attn.quantize_int8's rule. KVCache.over(k_pages, v_pages) works in the caller's own arrays (NumPy arrays or torch
    CPU tensors, contiguous, writable), without a copy: appends write into them, and the cache keeps
    them alive as long as it lives.

    Sequences grow by append(ids, k, v, cu_seqlens), taking blocks from the pool as theirs fill;
    fork(parent) starts a sequence that shares the parent's blocks (a common prefix; holders(block)
    counts the sequences holding a block), and a shared block is copied only when one of them writes
    into it; free_sequence(id) gives a sequence's blocks back once no other sequence holds them. An
    append that the pool cannot hold, or with a bad argument, raises ValueError and changes nothing.
    view(ids) is what attention_paged reads for those sequences (attn.attention_paged(q, *view));
    attention(q, ids, ...) runs it.

    Arrays come back as torch tensors when the cache was made over torch tensors or with a torch
    dtype, else as NumPy arrays (a bfloat16 pool then shows as a float32 copy). Its methods run with the GIL
    held, which keeps two threads from changing a cache at once; attention releases it while computing
    (its pools stay alive meanwhile).
    """

    def __init__(self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, head_dim_v: int | None = None, dtype: Any = 'float32') -> None: ...

    @staticmethod
    def over(k_pages: ArrayLike, v_pages: ArrayLike, k_scales: ArrayLike | None = None, v_scales: ArrayLike | None = None) -> KVCache:
        """
        A cache over the caller's pools k_pages [num_blocks, block_size, Hkv, D] and v_pages [.., Dv] (one floating dtype, or int8
        with k_scales and v_scales float32 [num_blocks, block_size, Hkv]; contiguous, writable NumPy arrays or torch
        CPU tensors that do not require grad), without a copy: appends write into them, and the cache keeps them
        alive. Every block starts free.
        """

    def add_sequence(self) -> int:
        """A new empty sequence: its id."""

    def fork(self, parent: int) -> int:
        """
        A new sequence holding parent's keys, its blocks shared (none copied): its id.
        """

    def free_sequence(self, id: int) -> None:
        """
        The sequence's blocks go back to the pool once no other sequence holds them; the id is retired.
        """

    def append(self, ids: list[int], k: ArrayLike, v: ArrayLike, cu_seqlens: ArrayLike) -> None:
        """
        Appends rows cu_seqlens[i]:cu_seqlens[i + 1] of k [total, Hkv, D] and v [total, Hkv, Dv] (the cache's dtype; for an int8
        cache float32, bfloat16 or float16, quantized as attn.quantize_int8 does) to sequence ids[i]; cu_seqlens int32
        [len(ids) + 1]. Every argument and the pool's capacity are checked first: on an error (ValueError) the cache
        is as it was.
        """

    def view(self, ids: list[int]) -> PagedKV:
        """
        What attention_paged reads for these sequences, in this order: (k_pages, v_pages, block_table int32 [n, max_blocks],
        seqused_k int32 [n]); the pools are not copied.
        """

    def length(self, id: int) -> int:
        """The keys of the sequence."""

    def blocks(self, id: int) -> list[int]:
        """The sequence's blocks, in order."""

    def holders(self, block: int) -> int:
        """How many sequences hold the block (0: free)."""

    @property
    def free_blocks(self) -> int:
        """Blocks no sequence holds."""

    @property
    def block_size(self) -> int:
        """Keys per block."""

    @property
    def num_blocks(self) -> int:
        """Blocks of the pool."""

    @property
    def k_pages(self) -> Any:
        """
        The key pool [num_blocks, block_size, Hkv, D], not copied (over(): the caller's array itself).
        """

    @property
    def v_pages(self) -> Any:
        """
        The value pool [num_blocks, block_size, Hkv, Dv], not copied (over(): the caller's array itself).
        """

    @property
    def k_scales(self) -> Any:
        """
        An int8 cache's key scales float32 [num_blocks, block_size, Hkv], not copied; None for a floating cache.
        """

    @property
    def v_scales(self) -> Any:
        """An int8 cache's value scales, as k_scales."""

    def __repr__(self) -> str: ...

    def attention(self, q: ArrayLike, ids: list[int], cu_seqlens_q: ArrayLike | None = None, *, return_lse: bool = False, mask: ArrayLike | None = None, mask_type: str = 'keep', causal: bool = False, align: str = 'bottom-right', position_offset: int | None = None, window: tuple[int | None, int | None] | None = None, scale: float | None = None, softcap: float | None = None, alibi_slopes: ArrayLike | None = None, key_lengths: ArrayLike | None = None, block_layout: ArrayLike | None = None, block_size: int | tuple[int, int] | None = None, dropout_p: float = 0.0, seed: int | None = None, sinks: ArrayLike | None = None, return_weights: bool = False, backend: str = 'auto', threads: int | None = None) -> Any:
        """
        attn.attention_paged(q, *self.view(ids), cu_seqlens_q, **options): sequence ids[b]'s queries (rows
        cu_seqlens_q[b]:cu_seqlens_q[b + 1] of q [total_q, Hq, D], or row b of q [len(ids), Hq, D] when
        cu_seqlens_q is None) against its keys (an int8 cache's scales included). Returns out [total_q, Hq, Dv], or
        (out, lse) with return_lse=True. The options, shapes and errors are attn.attention_paged's (see its docstring).
        """

def linear_attention(q: ArrayLike, k: ArrayLike, v: ArrayLike, *, causal: bool = False, align: str = 'bottom-right', key_lengths: ArrayLike | None = None, key_keep: ArrayLike | None = None, threads: int | None = None) -> Any:
    """
    Linear attention: returns out.

    Linear attention (Katharopoulos et al. 2020), phi(x) = elu(x) + 1:
        out_i = sum_{j in K(i)} (phi(q_i) . phi(k_j)) v_j / sum_{j in K(i)} phi(q_i) . phi(k_j)
    No scale and no softmax; O(L D Dv) time per head. docs/semantics.md "Linear attention".
    Shapes: q [B, Hq, Lq, D], k [B, Hkv, Lk, D], v [B, Hkv, Lk, Dv] -> out [B, Hq, Lq, Dv]; exactly
    4-D, one dtype (float32 or float64, computed in double), Hq % Hkv == 0 (query head h reads
    key/value head h // (Hq // Hkv)).
    Options (keyword-only):
        causal: only keys j <= p(i), with p(i) = i + Lk - Lq for align='bottom-right' (the default, as
            attn.attention) and p(i) = i for align='top-left' (PyTorch's is_causal).
        key_lengths [B] (int): keys j >= key_lengths[b] are padding.
        key_keep [B, Lk] (bool): True = use the key. With both, a key is used when both keep it.
        threads: None uses attn.set_num_threads, ATTN_NUM_THREADS or all cores.
    A query with no usable key gets out = 0 and zero gradients. Results are NumPy arrays, or torch
    tensors (outside autograd) when any input is one. Raises ValueError (bad shapes or options) or
    TypeError (not an array, unsupported dtype).
    """

def linear_attention_backward(dout: ArrayLike, q: ArrayLike, k: ArrayLike, v: ArrayLike, *, causal: bool = False, align: str = 'bottom-right', key_lengths: ArrayLike | None = None, key_keep: ArrayLike | None = None, threads: int | None = None) -> tuple[Any, Any, Any]:
    """
    Gradients of linear_attention(q, k, v, **options) given dout = dL/dout [B, Hq, Lq, Dv] (q's dtype):
    (dq, dk, dv) with the shapes and dtypes of q, k and v (dk, dv summed over the query heads of a group).

    Linear attention (Katharopoulos et al. 2020), phi(x) = elu(x) + 1:
        out_i = sum_{j in K(i)} (phi(q_i) . phi(k_j)) v_j / sum_{j in K(i)} phi(q_i) . phi(k_j)
    No scale and no softmax; O(L D Dv) time per head. docs/semantics.md "Linear attention".
    Shapes: q [B, Hq, Lq, D], k [B, Hkv, Lk, D], v [B, Hkv, Lk, Dv] -> out [B, Hq, Lq, Dv]; exactly
    4-D, one dtype (float32 or float64, computed in double), Hq % Hkv == 0 (query head h reads
    key/value head h // (Hq // Hkv)).
    Options (keyword-only):
        causal: only keys j <= p(i), with p(i) = i + Lk - Lq for align='bottom-right' (the default, as
            attn.attention) and p(i) = i for align='top-left' (PyTorch's is_causal).
        key_lengths [B] (int): keys j >= key_lengths[b] are padding.
        key_keep [B, Lk] (bool): True = use the key. With both, a key is used when both keep it.
        threads: None uses attn.set_num_threads, ATTN_NUM_THREADS or all cores.
    A query with no usable key gets out = 0 and zero gradients. Results are NumPy arrays, or torch
    tensors (outside autograd) when any input is one. Raises ValueError (bad shapes or options) or
    TypeError (not an array, unsupported dtype).
    """

def build_info() -> dict[str, Any]:
    """
    This build of attn and the kernels it runs here: {version, cpu, available (the instruction sets this CPU runs), isa (the one every kernel family follows), isa_source ('best available', 'ATTN_CPU_ISA' or 'forced'), attention_f32, attention_bf16, elementwise, gemm (the nn layers' product routing), bf16_gemm_native}. Raises ValueError when ATTN_CPU_ISA names a target this CPU cannot run.
    """
