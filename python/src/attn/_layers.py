"""attn.nn's base class and its single layers (Linear, LayerNorm, Embedding, the positions, FeedForward, the
activations, Dropout), and the activation names the Transformer layers accept. attn.nn exports them; the
attention modules and the Transformer stacks are in nn.py.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from . import _core

_nn = _core.nn  # imported by attn.nn only, after it checked that this build has the nn module


def _dtype_name(dtype: Any) -> str:
    if dtype is None or isinstance(dtype, str):
        return "float32" if dtype is None else dtype
    name = str(dtype)
    return name[len("torch.") :] if name.startswith("torch.") else np.dtype(dtype).name


class _Module:
    """What every attn.nn module shares: state dicts, train/eval, gradients."""

    _m: Any
    _input_names: tuple

    def state_dict(self) -> dict:
        """Parameters by PyTorch's state-dict names (arrays that share the module's memory)."""
        return self._m.state_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> None:
        """Copies values by name (a dict of NumPy arrays or torch tensors, e.g. a torch module's state_dict()),
        converting dtype. strict: every parameter must be present and no extra name."""
        self._m.load_state_dict(
            {str(k): (v.detach() if hasattr(v, "detach") else v) for k, v in state_dict.items()},
            strict,
        )

    def train(self, mode: bool = True):
        self._m.train(mode)
        return self

    def eval(self):
        return self.train(False)

    @property
    def training(self) -> bool:
        return self._m.training

    def manual_seed(self, seed: int) -> None:
        """Re-seeds the module's dropouts: the same seed gives the same patterns on the next forward."""
        self._m.manual_seed(seed)

    def num_parameters(self) -> int:
        return self._m.num_parameters()

    def parameters(self, prefix: str = "") -> Any:
        """The parameters, for an optimizer or clip_grad_norm_: they share the module's memory, so opt.step()
        updates the module in place. + (or a list of them) joins several modules'; prefix puts 'prefix.' before
        the names (an optimizer's state is keyed by name, so two modules' names must differ)."""
        return self._m.parameters(str(prefix))

    def save(self, path: Any, metadata: Mapping[str, str] | None = None) -> None:
        """Writes the state dict (PyTorch's names, the module's dtype) to a safetensors file at path, with optional
        str -> str metadata; safetensors.torch.load_file reads it back as the torch module's state dict."""
        self._m.save(str(path), {str(k): str(v) for k, v in (metadata or {}).items()})

    def load(self, path: Any, strict: bool = True) -> None:
        """Reads a safetensors file (e.g. one written by save or safetensors.torch.save_file) by name, converting
        dtype; strict as load_state_dict."""
        self._m.load(str(path), strict)

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def _grads(self, inputs: dict) -> dict:
        grads = dict(inputs)
        grads.update(self._m.grads())
        return grads


def _check_device(device: Any, fn: str) -> None:
    if device is not None and str(device) != "cpu":
        raise ValueError(f"{fn}: attn runs on the CPU, got device {device}")


class Linear(_Module):
    """torch.nn.Linear over attn::nn::Linear: y = x W^T + b.

    Linear(in_features, out_features, bias=True, device=None, dtype=None)
    forward(input) -> output: input [..., in_features] -> [..., out_features]
    backward(grad_output) -> {"input" [..., in_features], "weight" [out_features, in_features], "bias" [out_features]}
    State: weight [out_features, in_features], bias [out_features] (absent with bias=False); torch's initialisation
    U(-1/sqrt(in_features), 1/sqrt(in_features)) from attn's generator (load a torch state dict for torch's values).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device: Any = None,
        dtype: Any = None,
    ):
        _check_device(device, "attn.nn.Linear")
        self.in_features, self.out_features = in_features, out_features
        self._m = _nn.Linear(in_features, out_features, bias, _dtype_name(dtype))

    def forward(self, input):
        return self._m.forward(input)

    def backward(self, grad_output) -> dict:
        """Gradients of the last forward given d(output): input and parameters (this backward's only)."""
        self._m.zero_grad()
        return self._grads({"input": self._m.backward(grad_output)})


class LayerNorm(_Module):
    """torch.nn.LayerNorm over attn::nn::LayerNorm, over the last dim (biased variance, as torch).

    LayerNorm(normalized_shape, eps=1e-5, elementwise_affine=True, bias=True, device=None, dtype=None)
    normalized_shape: an int d or a one-element sequence (d,); attn normalises over the last dim only.
    forward(input) -> output: input [..., d] -> [..., d]
    backward(grad_output) -> {"input" [..., d], "weight" [d], "bias" [d]} (no parameters without
    elementwise_affine; no bias with bias=False).
    """

    def __init__(
        self,
        normalized_shape: Any,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        device: Any = None,
        dtype: Any = None,
    ):
        _check_device(device, "attn.nn.LayerNorm")
        if not isinstance(normalized_shape, int):
            shape = tuple(normalized_shape)
            if len(shape) != 1:
                raise ValueError(
                    "attn.nn.LayerNorm: normalized_shape must be an int or a one-element sequence "
                    f"(attn normalises over the last dim only), got {normalized_shape!r}"
                )
            normalized_shape = int(shape[0])
        self.normalized_shape, self.eps = (normalized_shape,), eps
        self.elementwise_affine, self._bias = elementwise_affine, bias
        self._m = _nn.LayerNorm(normalized_shape, eps, elementwise_affine, bias, _dtype_name(dtype))

    def forward(self, input):
        return self._m.forward(input)

    def backward(self, grad_output) -> dict:
        """Gradients of the last forward given d(output): input and parameters (this backward's only)."""
        self._m.zero_grad()
        return self._grads({"input": self._m.backward(grad_output)})


class Embedding(_Module):
    """torch.nn.Embedding over attn::nn::Embedding: a lookup of rows of weight.

    Embedding(num_embeddings, embedding_dim, padding_idx=None, device=None, dtype=None)
    forward(input) -> output: input int32/int64 ids [...] -> [..., embedding_dim]
    backward(grad_output) -> {"weight" [num_embeddings, embedding_dim]} (ids have no gradient; the padding_idx row
    gets none, as torch). State: weight ~ N(0, 1) with the padding_idx row zero; padding_idx < 0 counts from the end.
    """

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        padding_idx: int | None = None,
        device: Any = None,
        dtype: Any = None,
    ):
        _check_device(device, "attn.nn.Embedding")
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise ValueError(
                    f"attn.nn.Embedding: padding_idx must be within num_embeddings "
                    f"({num_embeddings}), got {padding_idx}"
                )
            padding_idx = padding_idx + num_embeddings if padding_idx < 0 else padding_idx
        self.num_embeddings, self.embedding_dim, self.padding_idx = (
            num_embeddings,
            embedding_dim,
            padding_idx,
        )
        self._m = _nn.Embedding(
            num_embeddings,
            embedding_dim,
            -1 if padding_idx is None else padding_idx,
            _dtype_name(dtype),
        )

    def forward(self, input):
        return self._m.forward(input)

    def backward(self, grad_output) -> dict:
        """Gradient of weight from the last forward given d(output) (this backward's only)."""
        self._m.zero_grad()
        self._m.backward(grad_output)
        return self._grads({})


class SinusoidalPositionalEncoding(_Module):
    """attn::nn::SinusoidalPositionalEncoding: y = x * scale + pe[offset + l], pe[p, 2i] = sin(p / 10000^(2i/d_model)),
    pe[p, 2i + 1] = cos(p / 10000^(2i/d_model)) (Vaswani et al.). No parameters.

    SinusoidalPositionalEncoding(d_model, max_len=4096, batch_first=False, scale=1.0)
    forward(input, offset=0) -> output: input [L, N, d_model] (or [N, L, d_model] with batch_first), positions
    offset .. offset + L - 1 (< max_len). backward(grad_output) -> {"input"} (grad_output * scale).
    """

    def __init__(
        self, d_model: int, max_len: int = 4096, batch_first: bool = False, scale: float = 1.0
    ):
        self.d_model, self.max_len, self.batch_first, self.scale = (
            d_model,
            max_len,
            batch_first,
            scale,
        )
        self._m = _nn.SinusoidalPositionalEncoding(d_model, max_len, batch_first, float(scale))

    def forward(self, input, offset: int = 0):
        return self._m.forward(input, offset)

    def backward(self, grad_output) -> dict:
        return {"input": self._m.backward(grad_output)}


class LearnedPositionalEmbedding(_Module):
    """attn::nn::LearnedPositionalEmbedding: y = x * scale + weight[offset + l] (an nn.Embedding of positions added
    to x).

    LearnedPositionalEmbedding(max_len, d_model, batch_first=False, scale=1.0, device=None, dtype=None,
                               init_std=1.0)
    forward(input, offset=0) -> output: input [L, N, d_model] (or [N, L, d_model] with batch_first).
    backward(grad_output) -> {"input", "weight" [max_len, d_model]}. State: weight ~ N(0, init_std^2).
    """

    def __init__(
        self,
        max_len: int,
        d_model: int,
        batch_first: bool = False,
        scale: float = 1.0,
        device: Any = None,
        dtype: Any = None,
        init_std: float = 1.0,
    ):
        _check_device(device, "attn.nn.LearnedPositionalEmbedding")
        self.max_len, self.d_model, self.batch_first, self.scale = (
            max_len,
            d_model,
            batch_first,
            scale,
        )
        self._m = _nn.LearnedPositionalEmbedding(
            max_len, d_model, batch_first, float(scale), _dtype_name(dtype), float(init_std)
        )

    def forward(self, input, offset: int = 0):
        return self._m.forward(input, offset)

    def backward(self, grad_output) -> dict:
        self._m.zero_grad()
        return self._grads({"input": self._m.backward(grad_output)})


class FeedForward(_Module):
    """attn::nn::FeedForward: linear2(dropout(activation(linear1(x)))), the Transformer layers' feed-forward block
    (torch: Sequential(Linear(d_model, dim_feedforward), activation, Dropout(dropout), Linear(dim_feedforward,
    d_model))).

    FeedForward(d_model, dim_feedforward, activation='relu', dropout=0.0, bias=True, device=None, dtype=None)
    activation as TransformerEncoderLayer's. forward(input) -> output: [..., d_model] -> [..., d_model].
    backward(grad_output) -> {"input", "linear1.weight", "linear1.bias", "linear2.weight", "linear2.bias"}
    """

    def __init__(
        self,
        d_model: int,
        dim_feedforward: int,
        activation: Any = "relu",
        dropout: float = 0.0,
        bias: bool = True,
        device: Any = None,
        dtype: Any = None,
    ):
        _check_device(device, "attn.nn.FeedForward")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"attn.nn.FeedForward: dropout must be in [0, 1), got {dropout}")
        act = _activation(activation, "attn.nn.FeedForward")
        self.d_model, self.dim_feedforward = d_model, dim_feedforward
        self._m = _nn.FeedForward(
            d_model, dim_feedforward, act, float(dropout), bias, _dtype_name(dtype)
        )

    def forward(self, input):
        return self._m.forward(input)

    def backward(self, grad_output) -> dict:
        self._m.zero_grad()
        return self._grads({"input": self._m.backward(grad_output)})


class _Elementwise(_Module):
    def forward(self, input):
        return self._m.forward(input)

    def backward(self, grad_output) -> dict:
        """{"input": d(input)} of the last forward given d(output)."""
        return {"input": self._m.backward(grad_output)}


class ReLU(_Elementwise):
    """torch.nn.ReLU: max(x, 0), any shape, the input's dtype. inplace is accepted and ignored (attn never writes
    its input). backward(grad_output) -> {"input"}."""

    def __init__(self, inplace: bool = False):
        self._m = _nn.Activation("relu")


class GELU(_Elementwise):
    """torch.nn.GELU: x * Phi(x) (approximate='none') or its tanh approximation (approximate='tanh').
    backward(grad_output) -> {"input"}."""

    def __init__(self, approximate: str = "none"):
        kinds = {"none": "gelu", "tanh": "gelu_tanh"}
        if approximate not in kinds:
            raise ValueError(
                f"attn.nn.GELU: approximate must be 'none' or 'tanh', got {approximate!r}"
            )
        self.approximate = approximate
        self._m = _nn.Activation(kinds[approximate])


class SiLU(_Elementwise):
    """torch.nn.SiLU: x * sigmoid(x). inplace is accepted and ignored. backward(grad_output) -> {"input"}."""

    def __init__(self, inplace: bool = False):
        self._m = _nn.Activation("silu")


class Dropout(_Elementwise):
    """torch.nn.Dropout: in training mode (the default) each element is zeroed with probability p and the rest
    scaled by 1 / (1 - p); the identity after eval(). The pattern is attn's (Philox, reproducible with
    manual_seed), not torch's. inplace is accepted and ignored. backward(grad_output) -> {"input"} (the same
    pattern)."""

    def __init__(self, p: float = 0.5, inplace: bool = False):
        if not 0.0 <= p < 1.0:
            raise ValueError(f"attn.nn.Dropout: p must be in [0, 1) (attn has no p = 1), got {p}")
        self.p = p
        self._m = _nn.Dropout(p)


# attn's activation names (attn::nn::parse_activation) by the strings attn.nn accepts: torch's 'relu' and 'gelu',
# and attn's extensions 'gelu_tanh' (GELU's tanh approximation) and 'silu' (x * sigmoid(x)).
_ACTIVATION_NAMES = {"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_tanh", "silu": "silu"}


def _torch_activation(activation: Any, torch: Any) -> str | None:
    """attn's name for a torch function or module that computes exactly one of attn's activations, else None."""
    F = torch.nn.functional
    if activation is F.relu or activation is torch.relu:
        return "relu"
    if activation is F.silu:
        return "silu"
    if activation is F.gelu:
        return "gelu"
    # Modules of exactly these classes (a subclass may override forward); ReLU(inplace=True) computes the same.
    kind = type(activation)
    if kind is torch.nn.ReLU:
        return "relu"
    if kind is torch.nn.SiLU:
        return "silu"
    if kind is torch.nn.GELU:
        return {"none": "gelu", "tanh": "gelu_tanh"}.get(activation.approximate)
    # functools.partial(F.gelu, approximate='tanh' | 'none'), keyword only.
    if (
        isinstance(activation, functools.partial)
        and activation.func is F.gelu
        and not activation.args
    ):
        keywords = dict(activation.keywords)
        approximate = keywords.pop("approximate", "none")
        if not keywords:
            return {"none": "gelu", "tanh": "gelu_tanh"}.get(approximate)
    return None


def _activation(activation: Any, fn: str) -> str:
    """attn's activation name for what torch's Transformer layers take as `activation`.

    Strings: 'relu', 'gelu' (torch's), 'gelu_tanh', 'silu' (attn's extensions). Callables: torch.nn.functional.relu,
    torch.relu, F.gelu, F.silu, functools.partial(F.gelu, approximate='tanh'); modules nn.ReLU(), nn.GELU(),
    nn.GELU(approximate='tanh'), nn.SiLU(). attn runs its own C++ activation, so any other callable is refused
    (running something else than the caller's function would be a silently wrong number).
    """
    if isinstance(activation, str):
        name = _ACTIVATION_NAMES.get(activation)
    else:
        # a torch function or module exists only when torch is loaded
        torch = sys.modules.get("torch")
        name = _torch_activation(activation, torch) if torch is not None else None
    if name is None:
        raise ValueError(
            f"{fn}: activation must be 'relu', 'gelu', 'gelu_tanh' or 'silu', or the torch function or module "
            f"computing one of them (F.relu, torch.relu, F.gelu, F.silu, functools.partial(F.gelu, "
            f"approximate='tanh'), nn.ReLU(), nn.GELU(approximate='none' | 'tanh'), nn.SiLU()); got {activation!r}"
        )
    return name
