"""attn.nn: attn's C++ Transformer modules with PyTorch's constructors, forward arguments and state-dict names.

No autograd: each module has an explicit backward(grad_output) for its last forward, returning a dict of
gradients keyed by input name ("query", "key", "value" / "src" / "tgt", "memory") and parameter name.
Arrays are NumPy arrays or PyTorch CPU tensors; outputs follow the inputs' type.

    mha = attn.nn.MultiheadAttention(16, 4, dtype="float64")
    mha.load_state_dict(torch_mha.state_dict())        # arrays or tensors with PyTorch's names
    out, weights = mha(query, key, value, key_padding_mask=kpm)
    grads = mha.backward(dout)                          # {"query": ..., "in_proj_weight": ..., ...}
    with attn.nn.no_grad():                             # inference: nothing kept for a backward
        out, _ = mha(query, key, value, need_weights=False)

Shapes are torch's: [L, N, E] (batch_first=False, the default) or [N, L, E]; unbatched [L, E] is accepted by
MultiheadAttention. Masks as torch.nn.MultiheadAttention: bool True = masked, float added. dtype is a
string ("float32", "float64", "bfloat16", "float16"), a NumPy dtype or a torch dtype (default float32).
"""

from __future__ import annotations

from typing import Any

from . import _core
from ._grad_mode import autocast, is_autocast_enabled, is_grad_enabled, no_grad, set_grad_enabled
from ._layers import (
    GELU,
    Dropout,
    Embedding,
    FeedForward,
    LayerNorm,
    LearnedPositionalEmbedding,
    Linear,
    ReLU,
    SiLU,
    SinusoidalPositionalEncoding,
    _activation,
    _dtype_name,
    _Module,
)
from ._training import SGD, AdamW, WarmupCosine, clip_grad_norm_, cross_entropy

_nn = _core.nn

__all__ = [
    "AdamW",
    "Dropout",
    "Embedding",
    "FeedForward",
    "GELU",
    "LayerNorm",
    "LearnedPositionalEmbedding",
    "Linear",
    "MultiheadAttention",
    "ReLU",
    "SGD",
    "SiLU",
    "SinusoidalPositionalEncoding",
    "TransformerDecoder",
    "TransformerDecoderLayer",
    "TransformerEncoder",
    "TransformerEncoderLayer",
    "WarmupCosine",
    "autocast",
    "clip_grad_norm_",
    "cross_entropy",
    "is_autocast_enabled",
    "is_grad_enabled",
    "no_grad",
    "set_grad_enabled",
]

# The single layers are written in _layers.py (this file's size) but are attn.nn's: repr and help() say so.
for _layer in (
    Dropout,
    Embedding,
    FeedForward,
    GELU,
    LayerNorm,
    LearnedPositionalEmbedding,
    Linear,
    ReLU,
    SiLU,
    SinusoidalPositionalEncoding,
):
    _layer.__module__ = __name__
del _layer


def _unbatched(x: Any, batch_first: bool) -> tuple[Any, bool]:
    if x is None or getattr(x, "ndim", 3) != 2:
        return x, False
    return (x[None] if batch_first else x[:, None]), True


class MultiheadAttention(_Module):
    """torch.nn.MultiheadAttention over attn::nn::MultiHeadAttention.

    MultiheadAttention(embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False, add_zero_attn=False,
                       kdim=None, vdim=None, batch_first=False, device=None, dtype=None, *, num_kv_heads=None,
                       position='none', max_distance=None, num_buckets=32, rope_base=10000.0, backend='auto',
                       kind='softmax')
    forward(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
            average_attn_weights=True, is_causal=False, *, position_offset=0) -> (output, weights or None)
        query [L, N, E], key [S, N, kdim], value [S, N, vdim] (or [N, L, E] with batch_first, or unbatched
        [L, E]); key_padding_mask [N, S]; attn_mask [L, S] or [N * num_heads, L, S]; is_causal: query i sees
        keys j <= i (top-left). Weights [N, L, S] (head average) or [N, num_heads, L, S], before dropout.
    backward(grad_output) -> {"query", "key", "value", "in_proj_weight", ..., "out_proj.bias"}

    attn's extensions (keyword-only): num_kv_heads: key/value heads (GQA; query head h reads kv head
    h // (num_heads // num_kv_heads)); position: 'none', 'rope' (GPT-NeoX half-split pairs), 'rope_interleaved'
    (adjacent pairs), 'alibi' (the paper's slopes), 'shaw' (relative_key.weight [2 max_distance + 1, head_dim],
    key side, clipped at max_distance), 't5' (relative_attention_bias.weight [num_buckets, num_heads], T5's
    bidirectional log buckets up to max_distance); max_distance: None = 16 for shaw, 128 for t5 (T5's
    relative_attention_max_distance; t5 needs max_distance >= num_buckets >= 4); rope_base: RoPE's base.
    kind: 'softmax' (scaled dot-product attention) or 'linear' (Katharopoulos et al.: phi = elu + 1 applied to
    q and k after the positions, out_i = phi(q_i) . sum_j phi(k_j) v_j / (phi(q_i) . sum_j phi(k_j)) over the
    visible keys, 0 where none is; O(L) memory). 'linear' takes position 'none', 'rope' or 'rope_interleaved',
    dropout 0, backend 'auto', and in forward need_weights=False, a bool key_padding_mask and is_causal only
    (no attn_mask); anything else is refused.
    forward's position_offset (keyword-only, default 0) is the position of query 0 AND key 0: RoPE rotates query
    i at position_offset + i and key j at position_offset + j. It shifts queries and keys together (a chunk
    offset), it is not a KV-cache decode offset (queries placed after the keys): softmax attention's output
    depends on i - j only, so there it changes nothing but rounding (alibi, shaw, t5 and 'none' ignore it); it
    changes linear attention with RoPE, whose feature map is applied after the rotation.
    """

    _input_names = ("query", "key", "value")

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        add_bias_kv: bool = False,
        add_zero_attn: bool = False,
        kdim: int | None = None,
        vdim: int | None = None,
        batch_first: bool = False,
        device: Any = None,
        dtype: Any = None,
        *,
        num_kv_heads: int | None = None,
        position: str = "none",
        max_distance: int | None = None,
        num_buckets: int = 32,
        rope_base: float = 10000.0,
        backend: str = "auto",
        kind: str = "softmax",
    ):
        fn = "attn.nn.MultiheadAttention"
        if kind not in ("softmax", "linear"):
            raise ValueError(f"{fn}: kind must be 'softmax' or 'linear', got {kind!r}")
        if kind == "linear" and (
            dropout != 0
            or backend != "auto"
            or position not in ("none", "rope", "rope_interleaved")
        ):
            raise ValueError(
                f"{fn}: kind='linear' takes dropout=0, backend='auto' and position 'none', 'rope' or "
                f"'rope_interleaved'; got dropout={dropout!r}, backend={backend!r}, position={position!r}"
            )
        if add_bias_kv or add_zero_attn:
            raise ValueError(
                "attn.nn.MultiheadAttention: add_bias_kv and add_zero_attn are not supported "
                "(attn.torch.MultiheadAttention supports them)"
            )
        if device is not None and str(device) != "cpu":
            raise ValueError(
                f"attn.nn.MultiheadAttention: attn runs on the CPU, got device {device}"
            )
        if not isinstance(position, str):
            raise ValueError(
                f"attn.nn.MultiheadAttention: position must be a str, got {position!r}"
            )
        self.embed_dim, self.num_heads, self.batch_first = embed_dim, num_heads, batch_first
        self.position, self.kind = position, kind
        if max_distance is None:
            max_distance = 128 if position == "t5" else 16
        # position's strings map onto attn::nn::PositionScheme in the binding (position_arg), which names them.
        self._m = _nn.MultiheadAttention(
            embed_dim,
            num_heads,
            dropout,
            bias,
            kdim or 0,
            vdim or 0,
            batch_first,
            _dtype_name(dtype),
            num_kv_heads or 0,
            backend,
            position,
            max_distance,
            num_buckets,
            float(rope_base),
            kind,
        )
        self._squeeze = False

    def forward(
        self,
        query,
        key,
        value,
        key_padding_mask=None,
        need_weights: bool = True,
        attn_mask=None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
        *,
        position_offset: int = 0,
    ):
        if self.kind == "linear" and need_weights:
            raise ValueError(
                "attn.nn.MultiheadAttention.forward: kind='linear' computes no attention weights; "
                "pass need_weights=False"
            )
        query, squeeze = _unbatched(query, self.batch_first)
        if squeeze:
            key, _ = _unbatched(key, self.batch_first)
            value, _ = _unbatched(value, self.batch_first)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask[None]
        self._squeeze = squeeze
        out, weights = self._m.forward(
            query,
            key,
            value,
            key_padding_mask,
            need_weights,
            attn_mask,
            average_attn_weights,
            is_causal,
            int(position_offset),
        )
        if squeeze:
            out = out[0] if self.batch_first else out[:, 0]
            weights = None if weights is None else weights[0]
        return out, (weights if need_weights else None)

    def backward(self, grad_output) -> dict:
        """Gradients of the last forward given d(output): inputs and parameters (this backward's only)."""
        if self._squeeze:
            grad_output, _ = _unbatched(grad_output, self.batch_first)
        self._m.zero_grad()
        dq, dk, dv = self._m.backward(grad_output)
        if self._squeeze:
            dq, dk, dv = ((g[0] if self.batch_first else g[:, 0]) for g in (dq, dk, dv))
        return self._grads({"query": dq, "key": dk, "value": dv})


class TransformerEncoderLayer(_Module):
    """torch.nn.TransformerEncoderLayer over attn::nn::TransformerEncoderLayer.

    TransformerEncoderLayer(d_model, nhead, dim_feedforward=2048, dropout=0.1, activation='relu',
                            layer_norm_eps=1e-5, batch_first=False, norm_first=False, bias=True, device=None,
                            dtype=None, *, num_kv_heads=None, backend='auto', checkpoint=False, <dropout sites>)
    forward(src, src_mask=None, src_key_padding_mask=None, is_causal=False) -> output (src's shape)
        src [L, N, d_model] (or [N, L, d_model] with batch_first); src_mask [L, L] or [N * nhead, L, L];
        src_key_padding_mask [N, L].
    backward(grad_output) -> {"src", "self_attn.in_proj_weight", ..., "norm2.bias"}
    activation: 'relu', 'gelu', 'gelu_tanh', 'silu', or the torch function / module computing one of them
    (F.relu, F.gelu, F.silu, nn.ReLU(), nn.GELU(approximate='tanh'), nn.SiLU(), ...); anything else is a ValueError.
    bias=False: no bias anywhere (attention projections, linear1, linear2, norm1/norm2 keep only weight), as torch.
    checkpoint (attn's; also a settable property): activation checkpointing in training mode: the forward keeps
    only src (and the masks and dropout seed) and backward recomputes the layer first, with the same dropout
    patterns, so outputs and gradients are bitwise those without it, for one more forward's work.
    Dropout sites (attn's, keyword-only, None = dropout): attention_dropout (attention weights), activation_dropout
    (after the activation), attention_output_dropout / ffn_output_dropout (each sublayer's output before its add).
    """

    def __init__(
        self,
        d_model: int,
        nhead: int,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        activation: Any = "relu",
        layer_norm_eps: float = 1e-5,
        batch_first: bool = False,
        norm_first: bool = False,
        bias: bool = True,
        device: Any = None,
        dtype: Any = None,
        *,
        num_kv_heads: int | None = None,
        backend: str = "auto",
        checkpoint: bool = False,
        **dropout_sites: float | None,
    ):
        if device is not None and str(device) != "cpu":
            raise ValueError(
                f"attn.nn.TransformerEncoderLayer: attn runs on the CPU, got device {device}"
            )
        act = _activation(activation, "attn.nn.TransformerEncoderLayer")
        # What TransformerEncoder needs to build its copies of this layer.
        self._config = dict(
            d_model=d_model,
            nhead=nhead,
            dim_feedforward=dim_feedforward,
            dropout=dropout,
            activation=act,
            layer_norm_eps=layer_norm_eps,
            batch_first=batch_first,
            norm_first=norm_first,
            bias=bias,
            dtype=_dtype_name(dtype),
            num_kv_heads=num_kv_heads or 0,
            backend=backend,
            checkpoint=bool(checkpoint),
            **_dropout_sites(dropout_sites, "attn.nn.TransformerEncoderLayer"),
        )
        self._m = _nn.TransformerEncoderLayer(**self._config)

    @property
    def checkpoint(self) -> bool:
        """Activation checkpointing (see the class): read, or set for the next forward."""
        return self._config["checkpoint"]

    @checkpoint.setter
    def checkpoint(self, on: bool) -> None:
        self._m.set_checkpoint(bool(on))
        self._config["checkpoint"] = bool(on)

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal: bool = False):
        return self._m.forward(src, src_mask, src_key_padding_mask, is_causal)

    def backward(self, grad_output) -> dict:
        self._m.zero_grad()
        return self._grads({"src": self._m.backward(grad_output)})


class TransformerDecoderLayer(_Module):
    """torch.nn.TransformerDecoderLayer over attn::nn::TransformerDecoderLayer.

    TransformerDecoderLayer(d_model, nhead, dim_feedforward=2048, dropout=0.1, activation='relu',
                            layer_norm_eps=1e-5, batch_first=False, norm_first=False, bias=True, device=None,
                            dtype=None, *, num_kv_heads=None, backend='auto', <dropout sites>)
    forward(tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
            memory_key_padding_mask=None, tgt_is_causal=False, memory_is_causal=False) -> output (tgt's shape)
        tgt [T, N, d_model], memory [S, N, d_model] (batch first with batch_first); tgt_mask [T, T],
        memory_mask [T, S] (or per batch x head); key padding masks [N, T] and [N, S].
    backward(grad_output) -> {"tgt", "memory", "self_attn.in_proj_weight", ..., "norm3.bias"}
    activation, bias and the dropout sites as TransformerEncoderLayer.
    """

    def __init__(
        self,
        d_model: int,
        nhead: int,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        activation: Any = "relu",
        layer_norm_eps: float = 1e-5,
        batch_first: bool = False,
        norm_first: bool = False,
        bias: bool = True,
        device: Any = None,
        dtype: Any = None,
        *,
        num_kv_heads: int | None = None,
        backend: str = "auto",
        **dropout_sites: float | None,
    ):
        if device is not None and str(device) != "cpu":
            raise ValueError(
                f"attn.nn.TransformerDecoderLayer: attn runs on the CPU, got device {device}"
            )
        act = _activation(activation, "attn.nn.TransformerDecoderLayer")
        # What TransformerDecoder needs to build its copies of this layer.
        self._config = dict(
            d_model=d_model,
            nhead=nhead,
            dim_feedforward=dim_feedforward,
            dropout=dropout,
            activation=act,
            layer_norm_eps=layer_norm_eps,
            batch_first=batch_first,
            norm_first=norm_first,
            bias=bias,
            dtype=_dtype_name(dtype),
            num_kv_heads=num_kv_heads or 0,
            backend=backend,
            **_dropout_sites(dropout_sites, "attn.nn.TransformerDecoderLayer"),
        )
        self._m = _nn.TransformerDecoderLayer(**self._config)

    def forward(
        self,
        tgt,
        memory,
        tgt_mask=None,
        memory_mask=None,
        tgt_key_padding_mask=None,
        memory_key_padding_mask=None,
        tgt_is_causal: bool = False,
        memory_is_causal: bool = False,
    ):
        return self._m.forward(
            tgt,
            memory,
            tgt_mask,
            memory_mask,
            tgt_key_padding_mask,
            memory_key_padding_mask,
            tgt_is_causal,
            memory_is_causal,
        )

    def backward(self, grad_output) -> dict:
        self._m.zero_grad()
        dtgt, dmemory = self._m.backward(grad_output)
        return self._grads({"tgt": dtgt, "memory": dmemory})


def _dropout_sites(sites: dict, fn: str) -> dict:
    unknown = set(sites) - {
        "attention_dropout",
        "activation_dropout",
        "attention_output_dropout",
        "ffn_output_dropout",
    }
    if unknown:
        raise TypeError(f"{fn}: unexpected keyword argument(s) {', '.join(sorted(unknown))}")
    return sites


def _torch_layer_config(layer: Any, fn: str) -> dict:
    """The layer's arguments read back from a torch.nn.TransformerEncoderLayer or TransformerDecoderLayer."""
    act = _activation(layer.activation, fn)
    return dict(
        d_model=layer.self_attn.embed_dim,
        nhead=layer.self_attn.num_heads,
        dim_feedforward=layer.linear1.out_features,
        dropout=layer.dropout.p,
        activation=act,
        layer_norm_eps=layer.norm1.eps,
        batch_first=layer.self_attn.batch_first,
        norm_first=layer.norm_first,
        bias=layer.linear1.bias is not None,
        dtype=_dtype_name(layer.linear1.weight.dtype),
        num_kv_heads=0,
        backend="auto",
    )


def _stack(
    layer: Any,
    attn_class: type,
    torch_name: str,
    num_layers: int,
    norm: Any,
    core_class: Any,
    fn: str,
    **extra: Any,
) -> Any:
    """The C++ stack of num_layers copies of layer (attn's or torch's) and norm, with their weights, as torch.
    extra: the stack's own arguments, overriding the layer's."""
    if isinstance(layer, attn_class):
        config = dict(layer._config)
    elif type(layer).__name__ == torch_name and hasattr(layer, "self_attn"):
        config = _torch_layer_config(layer, fn)
    else:
        arg = "encoder_layer" if torch_name.startswith("TransformerEncoder") else "decoder_layer"
        raise TypeError(
            f"{fn}: {arg} must be an attn.nn or torch.nn {torch_name}, got {type(layer).__name__}"
        )
    config.update(extra)
    # None or the layer's dtype: no rounding (attn::nn's f32 default)
    if "activation_dtype" in extra:
        a = extra["activation_dtype"]
        if a not in (None, config["dtype"], "bfloat16"):
            raise ValueError(
                f"{fn}: activation_dtype must be None, the layer's dtype ({config['dtype']}) or "
                f"'bfloat16', got {a!r}"
            )
        config["activation_dtype"] = "bfloat16" if a == "bfloat16" else "float32"
    if norm is not None:
        shape = tuple(getattr(norm, "normalized_shape", ()))
        eps = getattr(norm, "eps", None)
        norm_state = norm.state_dict()
        if (
            shape != (config["d_model"],)
            or eps != config["layer_norm_eps"]
            or (norm_state.get("bias") is not None) != config["bias"]
            or "weight" not in norm_state
        ):
            raise ValueError(
                f"{fn}: norm must be a LayerNorm({config['d_model']}) with the layer's "
                f"layer_norm_eps ({config['layer_norm_eps']}), elementwise_affine and "
                f"bias={config['bias']}; got normalized_shape {shape}, eps {eps}"
            )
    m = core_class(num_layers, norm is not None, **config)
    layer_state = layer.state_dict()
    state = {f"layers.{i}.{k}": v for i in range(num_layers) for k, v in layer_state.items()}
    if norm is not None:
        state.update({f"norm.{k}": v for k, v in norm.state_dict().items()})
    m.load_state_dict(
        {k: (v.detach() if hasattr(v, "detach") else v) for k, v in state.items()}, True
    )
    return m


class TransformerEncoder(_Module):
    """torch.nn.TransformerEncoder over attn::nn::TransformerEncoder: num_layers copies of encoder_layer, then norm.

    TransformerEncoder(encoder_layer, num_layers, norm=None, enable_nested_tensor=True, mask_check=True)
    encoder_layer: an attn.nn.TransformerEncoderLayer or a torch.nn.TransformerEncoderLayer; as torch, every layer
    starts as a copy of it (its configuration and its current weights). norm: None or a LayerNorm (attn's or
    torch's) over d_model with the layer's layer_norm_eps and bias; its weights are copied too.
    enable_nested_tensor and mask_check are accepted for torch's signature (attn has no nested tensors).
    attn's keywords: checkpoint: None = the layer's (False for a torch layer), else every layer's (a settable
    property too; see TransformerEncoderLayer); activation_dtype: None (or the layer's dtype) = activations stay
    in the layer's dtype, 'bfloat16' (or torch.bfloat16) = each layer's output is rounded to bf16 before the
    next layer (which computes in its dtype), checkpointed layers keep their input in bf16; weights and gradients
    keep the layer's dtype. Without a final norm the output is then bf16 too (a torch bf16 tensor; NumPy, which
    has no bf16, gets it as float32).
    forward(src, mask=None, src_key_padding_mask=None, is_causal=None) -> output (src's shape)
        src [L, N, d_model] (or [N, L, d_model] with the layer's batch_first); mask [L, L] or [N * nhead, L, L];
        src_key_padding_mask [N, L].
    backward(grad_output) -> {"src", "layers.0.self_attn.in_proj_weight", ..., "norm.bias"}
    """

    def __init__(
        self,
        encoder_layer: Any,
        num_layers: int,
        norm: Any = None,
        enable_nested_tensor: bool = True,
        mask_check: bool = True,
        *,
        checkpoint: bool | None = None,
        activation_dtype: Any = None,
    ):
        self.num_layers = num_layers
        if checkpoint is None:
            checkpoint = (
                encoder_layer.checkpoint
                if isinstance(encoder_layer, TransformerEncoderLayer)
                else False
            )
        self._checkpoint = bool(checkpoint)
        act_dtype = None if activation_dtype is None else _dtype_name(activation_dtype)
        self._m = _stack(
            encoder_layer,
            TransformerEncoderLayer,
            "TransformerEncoderLayer",
            num_layers,
            norm,
            _nn.TransformerEncoder,
            "attn.nn.TransformerEncoder",
            checkpoint=self._checkpoint,
            activation_dtype=act_dtype,
        )
        self.activation_dtype = "bfloat16" if act_dtype == "bfloat16" else None

    @property
    def checkpoint(self) -> bool:
        """Activation checkpointing of every layer: read, or set for the next forward."""
        return self._checkpoint

    @checkpoint.setter
    def checkpoint(self, on: bool) -> None:
        self._m.set_checkpoint(bool(on))
        self._checkpoint = bool(on)

    def forward(self, src, mask=None, src_key_padding_mask=None, is_causal: bool | None = None):
        return self._m.forward(src, mask, src_key_padding_mask, bool(is_causal))

    def backward(self, grad_output) -> dict:
        self._m.zero_grad()
        return self._grads({"src": self._m.backward(grad_output)})


class TransformerDecoder(_Module):
    """torch.nn.TransformerDecoder over attn::nn::TransformerDecoder: num_layers copies of decoder_layer, then norm.

    TransformerDecoder(decoder_layer, num_layers, norm=None)
    decoder_layer: an attn.nn.TransformerDecoderLayer or a torch.nn.TransformerDecoderLayer; as torch, every layer
    starts as a copy of it (configuration and current weights). norm: None or a LayerNorm as TransformerEncoder's.
    forward(tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None, memory_key_padding_mask=None,
            tgt_is_causal=None, memory_is_causal=False) -> output (tgt's shape)
        tgt [T, N, d_model], memory [S, N, d_model] (batch first with the layer's batch_first); tgt_mask [T, T],
        memory_mask [T, S] (or per batch x head); key padding masks [N, T] and [N, S].
    backward(grad_output) -> {"tgt", "memory" (summed over the layers), "layers.0.self_attn.in_proj_weight", ...,
                              "norm.bias"}
    """

    def __init__(self, decoder_layer: Any, num_layers: int, norm: Any = None):
        self.num_layers = num_layers
        self._m = _stack(
            decoder_layer,
            TransformerDecoderLayer,
            "TransformerDecoderLayer",
            num_layers,
            norm,
            _nn.TransformerDecoder,
            "attn.nn.TransformerDecoder",
        )

    def forward(
        self,
        tgt,
        memory,
        tgt_mask=None,
        memory_mask=None,
        tgt_key_padding_mask=None,
        memory_key_padding_mask=None,
        tgt_is_causal: bool | None = None,
        memory_is_causal: bool = False,
    ):
        return self._m.forward(
            tgt,
            memory,
            tgt_mask,
            memory_mask,
            tgt_key_padding_mask,
            memory_key_padding_mask,
            bool(tgt_is_causal),
            memory_is_causal,
        )

    def backward(self, grad_output) -> dict:
        self._m.zero_grad()
        dtgt, dmemory = self._m.backward(grad_output)
        return self._grads({"tgt": dtgt, "memory": dmemory})
