"""attn for PyTorch: attention as torch.library custom ops with autograd, and a drop-in torch.nn.MultiheadAttention.

    attn.torch.scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                            is_causal=False, scale=None, enable_gqa=False)
    attn.torch.attention(q, k, v, *, mask=None, mask_type='keep', causal=False, ...)   (attn.attention's options)
    attn.torch.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *, max_seqlen_q=None, max_seqlen_k=None,
                                seqused_k=None, return_lse=False, ...)   packed sequences (FlashAttention's varlen)
    attn.torch.attention_paged(q, k_pages, v_pages, block_table, seqused_k, cu_seqlens_q=None, *, return_lse=False,
                               ...)   a paged KV cache (vLLM's layout); forward only, not differentiable
    attn.torch.MultiheadAttention(embed_dim, num_heads, ...)   (torch.nn.MultiheadAttention's arguments)
    attn.torch.enable()   every CPU torch.nn.functional.scaled_dot_product_attention call (forward and backward) on
                          attn's kernels until .disable(); also torch.nn.attention.activate_flash_attention_impl("attn")

Gradients flow to q, k, v, to a float mask (mask_type='add', or a float attn_mask) and from the returned attention
weights, computed by attn's backward (pure Python over the extension: no build against PyTorch). Tensors must be on
the CPU.

The computation is two custom ops, torch.ops.attn.attention and torch.ops.attn.attention_backward (schemas with
typed, flattened options, keyword-only but for the tensors; fake implementations for shapes; vmap rules), so
torch.compile(fullgraph=True) sees one op per direction, torch.vmap and torch.func.grad work, and TorchScript can call
torch.ops.attn.attention(q, k, v, causal=True, ...) directly. attention_varlen is a torch.autograd.Function over
attn._core.attention_varlen and its backward (eager autograd: gradients to q, k, v and sinks; no custom op).
attention_paged has no backward: it refuses tensors that require grad (with grad mode on).
Under CPU autocast, q, k, v and a float mask are cast to the autocast dtype (float64 stays float64), as torch does
for scaled_dot_product_attention. Second derivatives (double backward, hessians, gradgradcheck) and forward-mode AD
raise a RuntimeError that names attn: attn's backward is not itself differentiable.
"""

from __future__ import annotations

import inspect
import math
import textwrap
from typing import Any

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:  # attn itself works without torch; only this module needs it
    raise ImportError(f"attn.torch needs PyTorch (pip install torch): {e}") from e
from torch import Tensor

from . import _core, _sdpa
from ._torch_ops import _apply, _no_graph  # importing it registers torch.ops.attn.*
from ._torch_paged import attention_paged
from ._torch_provider import enable, register_with_torch
from ._torch_varlen import attention_varlen

__all__ = [
    "MultiheadAttention",
    "attention",
    "attention_paged",
    "attention_varlen",
    "enable",
    "scaled_dot_product_attention",
]

register_with_torch()  # activate_flash_attention_impl("attn") enables attn; nothing is enabled here


def _as_tensor(x: Any, name: str) -> Tensor | None:
    if x is None or isinstance(x, Tensor):
        return x
    try:
        return torch.as_tensor(x)
    except Exception as e:
        raise TypeError(
            f"attn.torch: {name} must be a tensor, got {type(x).__name__}: {e}"
        ) from None


def _sinks_tensor(options: dict) -> Tensor | None:
    """The sinks when they are a tensor (which may require grad), else None (absent, or an array without grad)."""
    sinks = options.get("sinks")
    return sinks if isinstance(sinks, Tensor) else None


def _options_as_given(options: dict) -> bool:
    """Whether attention's options mean the same to attn._core.attention as they are: no dropout (whose seed
    attn.torch draws from torch's RNG when none is given) and no seed (attn.torch also takes it as a tensor)."""
    dropout_p = options.get("dropout_p", 0.0)
    return "seed" not in options and type(dropout_p) in (int, float) and dropout_p == 0


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    return_lse: bool = False,
    return_weights: bool = False,
    **options: Any,
) -> Any:
    """attn.attention with autograd: q [..., Hq, Lq, D], k [..., Hkv, Lk, D], v [..., Hkv, Lk, Dv] ->
    out [..., Hq, Lq, Dv] (and lse [..., Hq, Lq], not differentiable, and weights [..., Hq, Lq, Lk], the
    probabilities before dropout, differentiable, when asked).

    The options are attn.attention's (see its docstring for the masks and the alignment rule: bottom-right
    by default, query i at key position i + Lk - Lq; top-left puts it at i). Gradients reach q, k, v and a
    mask of type 'add' that requires grad (reduced to the mask's shape), from out and from the weights. With
    dropout and seed=None the seed is drawn from torch's RNG (seed may also be an int64 scalar tensor), and the
    backward regenerates the same keep-pattern. Under CPU autocast q, k, v and a float mask are cast to the
    autocast dtype (float64 stays float64). No second derivative: double backward raises a RuntimeError.
    """
    fn = "attn.torch.attention"
    q, k, v = _as_tensor(q, "q"), _as_tensor(k, "k"), _as_tensor(v, "v")
    if "mask" in options:
        options["mask"] = _as_tensor(options["mask"], "mask")
    if (
        not return_weights
        and _options_as_given(options)
        and _no_graph(q, k, v, options.get("mask"), _sinks_tensor(options))
    ):
        try:  # nothing for autograd, autocast or compile to see: one call to the extension (~8 us less)
            return _core.attention(q, k, v, return_lse=return_lse, **options)
        except (TypeError, ValueError):
            pass  # the checked path below raises the error again, naming attn.torch.attention
    out, lse, weights = _apply(q, k, v, fn, return_weights, **options)
    if not return_lse and not return_weights:
        return out
    return (out,) + ((lse,) if return_lse else ()) + ((weights,) if return_weights else ())


# The annotation attention's signature shows for an option, by its kind (the op's arguments say how it is passed).
_ANNOTATIONS = {
    "optional real": "Optional[float]",
    "real": "float",
    "bool": "bool",
    "optional int": "Optional[int]",
    "int": "Optional[int]",
    "seed": "Any",
    "enum": "str",
    "window": "Optional[tuple]",
    "tensor": "Optional[Tensor]",
    "block layout": "Optional[Tensor]",
    "block size": "Any",
}


def _signature() -> inspect.Signature:
    """attention's signature as help() and inspect show it: every keyword of attn._core.attention, by name."""
    params = [
        inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation="Tensor")
        for n in "qkv"
    ]
    for name, _, kind, default in _core.option_keywords("forward"):
        params.append(
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=_ANNOTATIONS[kind]
            )
        )
    return inspect.Signature(params, return_annotation="Any")


attention.__signature__ = _signature()
# The options section, from the option table as attn.attention's (indented as the docstring is, for help()).
attention.__doc__ = (
    (attention.__doc__ or "") + "\n" + textwrap.indent(_core.options_doc("forward"), "    ")
)


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Tensor:
    """Drop-in for torch.nn.functional.scaled_dot_product_attention, with gradients (q, k, v and a float
    attn_mask). Same shapes and semantics as attn.scaled_dot_product_attention: query [..., Hq, L, E],
    key [..., Hkv, S, E], value [..., Hkv, S, Ev] -> [..., Hq, L, Ev]; bool mask True = may attend, float mask
    added; is_causal is top-left (query i sees keys j <= i); rows with no allowed key give zeros. Under CPU
    autocast the result has the autocast dtype, as torch's (float64 inputs stay float64).
    """
    fn = "attn.torch.scaled_dot_product_attention"
    query, key, value = (
        _as_tensor(query, "query"),
        _as_tensor(key, "key"),
        _as_tensor(value, "value"),
    )
    attn_mask = _as_tensor(attn_mask, "attn_mask")
    q, k, v, options, squeeze = _sdpa.prepare(
        query, key, value, attn_mask, 0.0, is_causal, scale, enable_gqa
    )
    if dropout_p == 0.0 and _no_graph(q, k, v, options.get("mask")):
        try:  # nothing for autograd, autocast or compile to see: one call to the extension
            out = _core.attention(q, k, v, **options)
        except TypeError as e:
            raise _sdpa.argument_error(e, _core.attention, fn, {"scale": scale}) from None
        return out[0] if squeeze else out
    # The dropout seed is drawn by _apply as a tensor (not by prepare, as an int), so that torch.compile keeps it
    # in the graph.
    options.pop("seed", None)
    options["dropout_p"] = dropout_p
    out, _, _ = _apply(q, k, v, fn, **options)
    return out[0] if squeeze else out


def _float_mask(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """torch's canonical mask: bool True (= masked) becomes -inf, floats are cast to the compute dtype."""
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype).masked_fill_(mask, float("-inf"))
    return mask.to(dtype)


def _in_projections(mha: Any, query: Tensor, key: Tensor, value: Tensor, embed_dim: int) -> tuple:
    """q, k, v [L or S, N, E] from the module's input projections, grouped as torch groups them (one GEMM for
    self-attention) so the round-off matches."""
    if mha._qkv_same_embed_dim:
        w, b = mha.in_proj_weight, mha.in_proj_bias
        if key is value:
            if query is key:
                q, k, v = (
                    F.linear(query, w, b)
                    .unflatten(-1, (3, embed_dim))
                    .unsqueeze(0)
                    .transpose(0, -2)
                )
                q, k, v = q.squeeze(-2), k.squeeze(-2), v.squeeze(-2)
            else:
                w_q, w_kv = w.split([embed_dim, embed_dim * 2])
                b_q, b_kv = (None, None) if b is None else b.split([embed_dim, embed_dim * 2])
                q = F.linear(query, w_q, b_q)
                k, v = (
                    F.linear(key, w_kv, b_kv)
                    .unflatten(-1, (2, embed_dim))
                    .unsqueeze(0)
                    .transpose(0, -2)
                )
                k, v = k.squeeze(-2), v.squeeze(-2)
        else:
            w_q, w_k, w_v = w.chunk(3)
            b_q, b_k, b_v = (None, None, None) if b is None else b.chunk(3)
            q, k, v = (
                F.linear(query, w_q, b_q),
                F.linear(key, w_k, b_k),
                F.linear(value, w_v, b_v),
            )
    else:
        b_q, b_k, b_v = (
            (None, None, None) if mha.in_proj_bias is None else mha.in_proj_bias.chunk(3)
        )
        q = F.linear(query, mha.q_proj_weight, b_q)
        k = F.linear(key, mha.k_proj_weight, b_k)
        v = F.linear(value, mha.v_proj_weight, b_v)
    return q, k, v


def _check_masks(
    fn: str,
    attn_mask: Tensor | None,
    key_padding_mask: Tensor | None,
    bsz: int,
    H: int,
    tgt_len: int,
    src_len: int,
) -> Tensor | None:
    """attn_mask as [1 or N * H, L, S] (2-D [L, S] gets a leading 1) after checking both masks' shapes, as torch
    checks them; src_len: the keys before bias_k and add_zero_attn."""
    if attn_mask is not None:
        if attn_mask.dim() == 2:
            if tuple(attn_mask.shape) != (tgt_len, src_len):
                raise RuntimeError(
                    f"{fn}: 2-D attn_mask must be {(tgt_len, src_len)}, got {tuple(attn_mask.shape)}"
                )
            attn_mask = attn_mask.unsqueeze(0)
        elif attn_mask.dim() == 3:
            if tuple(attn_mask.shape) != (bsz * H, tgt_len, src_len):
                raise RuntimeError(
                    f"{fn}: 3-D attn_mask must be {(bsz * H, tgt_len, src_len)}, got {tuple(attn_mask.shape)}"
                )
        else:
            raise RuntimeError(f"{fn}: attn_mask of rank {attn_mask.dim()} is not supported")
    if key_padding_mask is not None and tuple(key_padding_mask.shape) != (bsz, src_len):
        raise RuntimeError(
            f"{fn}: key_padding_mask must be {(bsz, src_len)}, got {tuple(key_padding_mask.shape)}"
        )
    return attn_mask


def _combined_mask(
    attn_mask: Tensor | None,
    key_padding_mask: Tensor | None,
    bsz: int,
    H: int,
    tgt_len: int,
    src_len: int,
    dtype: torch.dtype,
) -> tuple[Tensor | None, str]:
    """(mask, mask_type) for attention over [N, H, L, S]: both masks broadcast together as torch builds them; bool
    stays bool (drop) unless a float mask joins."""
    mask, mask_type = None, "drop"
    masks = []
    if attn_mask is not None:
        masks.append(
            attn_mask.reshape(-1, H, tgt_len, src_len) if attn_mask.shape[0] > 1 else attn_mask
        )
    if key_padding_mask is not None:
        masks.append(key_padding_mask.view(bsz, 1, 1, src_len))
    if masks:
        if all(m.dtype == torch.bool for m in masks):
            mask = masks[0] if len(masks) == 1 else masks[0] | masks[1]
        else:
            mask_type = "add"
            # In the input's dtype, as torch's _canonical_mask (under autocast the op then casts the sum).
            mask = _float_mask(masks[0], dtype)
            if len(masks) == 2:
                mask = mask + _float_mask(masks[1], dtype)
    return mask, mask_type


class MultiheadAttention(torch.nn.MultiheadAttention):
    """Drop-in for torch.nn.MultiheadAttention: the same constructor, parameters, state_dict names and forward,
    with the attention itself computed by attn (projections stay in torch).

    forward(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
            average_attn_weights=True, is_causal=False) -> (attn_output, attn_output_weights or None)
    Shapes (batch_first=False): query [L, N, E], key [S, N, kdim], value [S, N, vdim] (or [L, E] unbatched);
    key_padding_mask [N, S] and attn_mask [L, S] or [N * num_heads, L, S], bool True = masked, or float
    added. Differences from torch: a query whose keys are all masked gives zeros (torch: NaN), and under
    training-mode dropout the returned weights are those before dropout (torch returns them after).
    """

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = True,
        attn_mask: Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        fn = "attn.torch.MultiheadAttention"
        if query.dim() not in (2, 3):
            raise ValueError(
                f"{fn}: query must be [L, E] or a batch of them (3-D), got {tuple(query.shape)}"
            )
        is_batched = query.dim() == 3
        if key.dim() != query.dim() or value.dim() != query.dim():
            raise ValueError(
                f"{fn}: query, key and value must have one rank, got {tuple(query.shape)}, {tuple(key.shape)}, "
                f"{tuple(value.shape)}"
            )
        if is_causal and attn_mask is None:
            raise RuntimeError(f"{fn}: is_causal is a hint and needs attn_mask (as in torch)")
        if self.batch_first and is_batched:
            # Keep `query is key is value` true for self-attention: it selects the projection grouping below.
            same_kv, same_qk = key is value, query is key
            query = query.transpose(0, 1)
            key = query if same_qk else key.transpose(0, 1)
            value = key if same_kv else value.transpose(0, 1)
        if not is_batched:
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        tgt_len, bsz, embed_dim = query.shape
        if embed_dim != self.embed_dim:
            raise ValueError(
                f"{fn}: expected embedding dim {self.embed_dim}, got query {tuple(query.shape)}"
            )
        H, hd = self.num_heads, self.head_dim

        q, k, v = _in_projections(self, query, key, value, embed_dim)
        attn_mask = _check_masks(fn, attn_mask, key_padding_mask, bsz, H, tgt_len, key.shape[0])

        if self.bias_k is not None and self.bias_v is not None:
            k = torch.cat([k, self.bias_k.repeat(1, bsz, 1)])
            v = torch.cat([v, self.bias_v.repeat(1, bsz, 1)])
            if attn_mask is not None:
                attn_mask = F.pad(attn_mask, (0, 1))
            if key_padding_mask is not None:
                key_padding_mask = F.pad(key_padding_mask, (0, 1))

        # [L, N, E] -> [N, H, L, hd]
        q = q.reshape(tgt_len, bsz, H, hd).permute(1, 2, 0, 3)
        k = k.reshape(k.shape[0], bsz, H, hd).permute(1, 2, 0, 3)
        v = v.reshape(v.shape[0], bsz, H, hd).permute(1, 2, 0, 3)
        if self.add_zero_attn:
            k = torch.cat([k, k.new_zeros(bsz, H, 1, hd)], dim=2)
            v = torch.cat([v, v.new_zeros(bsz, H, 1, hd)], dim=2)
            if attn_mask is not None:
                attn_mask = F.pad(attn_mask, (0, 1))
            if key_padding_mask is not None:
                key_padding_mask = F.pad(key_padding_mask, (0, 1))
        src_len = k.shape[2]

        mask, mask_type = _combined_mask(
            attn_mask, key_padding_mask, bsz, H, tgt_len, src_len, query.dtype
        )

        dropout_p = self.dropout if self.training else 0.0
        result = attention(
            q,
            k,
            v,
            mask=mask,
            mask_type=mask_type,
            scale=1.0 / math.sqrt(hd),
            dropout_p=dropout_p,
            return_weights=need_weights,
        )
        out, weights = result if need_weights else (result, None)
        # [N, H, L, hd] -> [L * N, E]: the heads side by side, as torch concatenates them.
        out = out.permute(2, 0, 1, 3).reshape(tgt_len * bsz, embed_dim)
        out = F.linear(out, self.out_proj.weight, self.out_proj.bias).view(tgt_len, bsz, -1)
        if weights is not None and average_attn_weights:
            weights = weights.mean(dim=1)
        if not is_batched:
            out = out.squeeze(1)
            if weights is not None:
                weights = weights.squeeze(0)
        elif self.batch_first:
            out = out.transpose(0, 1)
        return out, weights
