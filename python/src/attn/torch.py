"""attn for PyTorch: attention as torch.autograd.Functions, and a drop-in torch.nn.MultiheadAttention.

    attn.torch.scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                            is_causal=False, scale=None, enable_gqa=False)
    attn.torch.attention(q, k, v, *, mask=None, mask_type='keep', causal=False, ...)   (attn.attention's options)
    attn.torch.MultiheadAttention(embed_dim, num_heads, ...)   (torch.nn.MultiheadAttention's arguments)

Gradients flow to q, k, v and to a float mask (mask_type='add', or a float attn_mask), computed by attn's
backward (pure Python over the extension: no build against PyTorch). Tensors must be on the CPU.
"""

from __future__ import annotations

import math
from typing import Any, Optional

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:  # attn itself works without torch; only this module needs it
    raise ImportError(f"attn.torch needs PyTorch (pip install torch): {e}") from e
from torch import Tensor

from . import _core, _sdpa

__all__ = ["MultiheadAttention", "attention", "scaled_dot_product_attention"]


class _AttentionFunction(torch.autograd.Function):
    """out = attention(q, k, v, mask, **options); backward: (dq, dk, dv, d(mask) when it is a float mask that
    requires grad). lse and weights, when returned, are not differentiable."""

    @staticmethod
    def forward(ctx, q, k, v, mask, options, return_lse, return_weights):
        mask_grad = mask is not None and mask.requires_grad and options.get("mask_type", "keep") == "add"
        result = _core.attention(q, k, v, mask=mask, return_lse=True, return_weights=return_weights, **options)
        out, lse = result[0], result[1]
        ctx.save_for_backward(q, k, v, mask, out, lse)
        ctx.options = options
        ctx.mask_grad = mask_grad
        outputs = [out]
        if return_lse:
            outputs.append(lse)
        if return_weights:
            outputs.append(result[2])
        ctx.mark_non_differentiable(*outputs[1:])
        return tuple(outputs) if len(outputs) > 1 else out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout, *_unused):
        q, k, v, mask, out, lse = ctx.saved_tensors
        grads = _core.attention_backward(dout, q, k, v, out, lse, mask=mask, mask_grad=ctx.mask_grad, **ctx.options)
        dmask = grads[3] if ctx.mask_grad else None
        return grads[0], grads[1], grads[2], dmask, None, None, None


def _as_tensor(x: Any, name: str) -> Optional[Tensor]:
    if x is None or isinstance(x, Tensor):
        return x
    try:
        return torch.as_tensor(x)
    except Exception as e:
        raise TypeError(f"attn.torch: {name} must be a tensor, got {type(x).__name__}: {e}") from None


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Optional[Tensor] = None,
    mask_type: str = "keep",
    causal: bool = False,
    align: str = "bottom-right",
    position_offset: Optional[int] = None,
    window: Optional[tuple] = None,
    scale: Optional[float] = None,
    softcap: Optional[float] = None,
    alibi_slopes: Optional[Tensor] = None,
    key_lengths: Optional[Tensor] = None,
    block_layout: Optional[Tensor] = None,
    block_size: Any = None,
    dropout_p: float = 0.0,
    seed: Optional[int] = None,
    return_lse: bool = False,
    return_weights: bool = False,
    backend: str = "auto",
    threads: Optional[int] = None,
) -> Any:
    """attn.attention with autograd: q [..., Hq, Lq, D], k [..., Hkv, Lk, D], v [..., Hkv, Lk, Dv] ->
    out [..., Hq, Lq, Dv] (and lse [..., Hq, Lq], weights [..., Hq, Lq, Lk] when asked, not differentiable).

    The options are attn.attention's (see its docstring for the masks and the alignment rule: bottom-right
    by default, query i at key position i + Lk - Lq; top-left puts it at i). Gradients reach q, k, v and a
    mask of type 'add' that requires grad (reduced to the mask's shape). With dropout and seed=None the seed
    is drawn from torch's RNG, and the backward regenerates the same keep-pattern.
    """
    q, k, v = _as_tensor(q, "q"), _as_tensor(k, "k"), _as_tensor(v, "v")
    mask = _as_tensor(mask, "mask")
    if dropout_p > 0.0 and seed is None:
        seed = _sdpa.random_seed(True)
    options = dict(
        mask_type=mask_type,
        causal=causal,
        align=align,
        position_offset=position_offset,
        window=window,
        scale=scale,
        softcap=softcap,
        alibi_slopes=alibi_slopes,
        key_lengths=key_lengths,
        block_layout=block_layout,
        block_size=block_size,
        dropout_p=dropout_p,
        seed=seed,
        backend=backend,
        threads=threads,
    )
    return _AttentionFunction.apply(q, k, v, mask, options, return_lse, return_weights)


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Optional[Tensor] = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: Optional[float] = None,
    enable_gqa: bool = False,
) -> Tensor:
    """Drop-in for torch.nn.functional.scaled_dot_product_attention, with gradients (q, k, v and a float
    attn_mask). Same shapes and semantics as attn.scaled_dot_product_attention: query [..., Hq, L, E],
    key [..., Hkv, S, E], value [..., Hkv, S, Ev] -> [..., Hq, L, Ev]; bool mask True = may attend, float mask
    added; is_causal is top-left (query i sees keys j <= i); rows with no allowed key give zeros.
    """
    query, key, value = _as_tensor(query, "query"), _as_tensor(key, "key"), _as_tensor(value, "value")
    attn_mask = _as_tensor(attn_mask, "attn_mask")
    q, k, v, options, squeeze = _sdpa.prepare(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    mask = options.pop("mask", None)
    out = _AttentionFunction.apply(q, k, v, mask, options, False, False)
    return out[0] if squeeze else out


def _float_mask(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """torch's canonical mask: bool True (= masked) becomes -inf, floats are cast to the compute dtype."""
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype).masked_fill_(mask, float("-inf"))
    return mask.to(dtype)


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
        key_padding_mask: Optional[Tensor] = None,
        need_weights: bool = True,
        attn_mask: Optional[Tensor] = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[Tensor, Optional[Tensor]]:
        fn = "attn.torch.MultiheadAttention"
        if query.dim() not in (2, 3):
            raise ValueError(f"{fn}: query must be [L, E] or a batch of them (3-D), got {tuple(query.shape)}")
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
            raise ValueError(f"{fn}: expected embedding dim {self.embed_dim}, got query {tuple(query.shape)}")
        H, hd = self.num_heads, self.head_dim

        # Projections, grouped as torch groups them (one GEMM for self-attention) so the round-off matches.
        if self._qkv_same_embed_dim:
            w, b = self.in_proj_weight, self.in_proj_bias
            if key is value:
                if query is key:
                    q, k, v = F.linear(query, w, b).unflatten(-1, (3, embed_dim)).unsqueeze(0).transpose(0, -2)
                    q, k, v = q.squeeze(-2), k.squeeze(-2), v.squeeze(-2)
                else:
                    w_q, w_kv = w.split([embed_dim, embed_dim * 2])
                    b_q, b_kv = (None, None) if b is None else b.split([embed_dim, embed_dim * 2])
                    q = F.linear(query, w_q, b_q)
                    k, v = F.linear(key, w_kv, b_kv).unflatten(-1, (2, embed_dim)).unsqueeze(0).transpose(0, -2)
                    k, v = k.squeeze(-2), v.squeeze(-2)
            else:
                w_q, w_k, w_v = w.chunk(3)
                b_q, b_k, b_v = (None, None, None) if b is None else b.chunk(3)
                q, k, v = F.linear(query, w_q, b_q), F.linear(key, w_k, b_k), F.linear(value, w_v, b_v)
        else:
            b_q, b_k, b_v = (None, None, None) if self.in_proj_bias is None else self.in_proj_bias.chunk(3)
            q = F.linear(query, self.q_proj_weight, b_q)
            k = F.linear(key, self.k_proj_weight, b_k)
            v = F.linear(value, self.v_proj_weight, b_v)

        # Masks over [N * H, L, S] as torch builds them; bool stays bool (drop) unless a float mask joins.
        if attn_mask is not None:
            if attn_mask.dim() == 2:
                if tuple(attn_mask.shape) != (tgt_len, key.shape[0]):
                    raise RuntimeError(f"{fn}: 2-D attn_mask must be {(tgt_len, key.shape[0])}, got {tuple(attn_mask.shape)}")
                attn_mask = attn_mask.unsqueeze(0)
            elif attn_mask.dim() == 3:
                if tuple(attn_mask.shape) != (bsz * H, tgt_len, key.shape[0]):
                    raise RuntimeError(
                        f"{fn}: 3-D attn_mask must be {(bsz * H, tgt_len, key.shape[0])}, got {tuple(attn_mask.shape)}"
                    )
            else:
                raise RuntimeError(f"{fn}: attn_mask of rank {attn_mask.dim()} is not supported")
        if key_padding_mask is not None and tuple(key_padding_mask.shape) != (bsz, key.shape[0]):
            raise RuntimeError(f"{fn}: key_padding_mask must be {(bsz, key.shape[0])}, got {tuple(key_padding_mask.shape)}")

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

        mask, mask_type = None, "drop"
        masks = []
        if attn_mask is not None:
            masks.append(attn_mask.reshape(-1, H, tgt_len, src_len) if attn_mask.shape[0] > 1 else attn_mask)
        if key_padding_mask is not None:
            masks.append(key_padding_mask.view(bsz, 1, 1, src_len))
        if masks:
            if all(m.dtype == torch.bool for m in masks):
                mask = masks[0] if len(masks) == 1 else masks[0] | masks[1]
            else:
                mask_type = "add"
                mask = _float_mask(masks[0], q.dtype)
                if len(masks) == 2:
                    mask = mask + _float_mask(masks[1], q.dtype)

        dropout_p = self.dropout if self.training else 0.0
        result = attention(
            q, k, v, mask=mask, mask_type=mask_type, scale=1.0 / math.sqrt(hd), dropout_p=dropout_p,
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
