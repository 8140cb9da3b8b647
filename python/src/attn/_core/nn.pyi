"""attn::nn modules (use attn.nn, which wraps them)."""

from collections.abc import Mapping, Sequence


class ParameterList:
    """Parameters of attn.nn modules (sharing their memory); + concatenates."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> ParameterList:
        """The one-parameter list at index (so list() and chain() work)."""

    def __add__(self, other: ParameterList) -> ParameterList: ...

    @staticmethod
    def concat(lists: Sequence[ParameterList]) -> ParameterList: ...

    def names(self) -> list[str]:
        """PyTorch's state-dict names, in order."""

    def grads(self) -> list: ...

class Optimizer:
    def step(self) -> None:
        """
        Updates the parameters in place from their gradients (the last backward's).
        """

    def zero_grad(self) -> None: ...

    @property
    def lr(self) -> float: ...

    @lr.setter
    def lr(self, arg: float, /) -> None: ...

    def state_dict(self) -> dict:
        """
        name -> array copies: '<param>.momentum_buffer' (SGD with momentum, after a step), 'step' [1] int64 and '<param>.exp_avg' / '<param>.exp_avg_sq' (AdamW).
        """

    def load_state_dict(self, state: dict) -> None:
        """
        Copies a state_dict() back; a missing name or a wrong shape raises ValueError.
        """

class SGD(Optimizer):
    def __init__(self, params: ParameterList, lr: float, momentum: float = 0.0, dampening: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False) -> None: ...

class AdamW(Optimizer):
    def __init__(self, params: ParameterList, lr: float = 0.001, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-08, weight_decay: float = 0.01) -> None: ...

    @property
    def steps(self) -> int: ...

def clip_grad_norm(params: ParameterList, max_norm: float) -> float:
    """
    Scales the gradients by max_norm / (norm + 1e-6) when their global L2 norm exceeds max_norm; returns the norm before.
    """

def grad_norm(params: ParameterList) -> float:
    """The global L2 norm of the gradients."""

def warmup_cosine(base_lr: float, warmup_steps: int, total_steps: int, min_lr: float, step: int) -> float:
    """
    lr at step (from 0): linear warm-up, cosine decay to min_lr at total_steps.
    """

def cross_entropy(logits: object, targets: object, ignore_index: int = -100, label_smoothing: float = 0.0) -> tuple:
    """
    logits [..., C], targets int [...] -> (mean loss, rows counted, dlogits [..., C] in float32 or float64).
    """

def gemm_kernels() -> str: ...

def is_grad_enabled() -> bool: ...

def set_grad_enabled(on: bool) -> None: ...

def is_autocast_enabled() -> bool: ...

def set_autocast_enabled(on: bool) -> None: ...

class MultiheadAttention:
    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True, kdim: int = 0, vdim: int = 0, batch_first: bool = False, dtype: str = 'float32', num_kv_heads: int = 0, backend: str = 'auto', position: str = 'none', max_distance: int = 16, num_buckets: int = 32, rope_base: float = 10000.0, kind: str = 'softmax') -> None: ...

    def forward(self, query: object, key: object, value: object, key_padding_mask: object | None = None, need_weights: bool = True, attn_mask: object | None = None, average_attn_weights: bool = True, is_causal: bool = False, position_offset: int = 0) -> tuple: ...

    def backward(self, grad_output: object) -> tuple: ...

    def state_dict(self) -> dict:
        """Parameters by PyTorch's names (arrays sharing the module's memory)."""

    def grads(self) -> dict:
        """Accumulated parameter gradients by name (copies)."""

    def parameters(self, prefix: str = '') -> ParameterList:
        """
        The parameters (sharing the module's memory), for an optimizer; names get 'prefix.'.
        """

    def load_state_dict(self, state_dict: dict, strict: bool = True) -> None:
        """
        Copies values by name, converting dtype; strict: every parameter present and no extra name.
        """

    def train(self, mode: bool = True) -> None: ...

    @property
    def training(self) -> bool: ...

    def zero_grad(self) -> None: ...

    def manual_seed(self, seed: int) -> None:
        """
        Re-seeds every dropout of the module: the same seed gives the same patterns on the next forward.
        """

    def num_parameters(self) -> int: ...

    def save(self, path: str, metadata: Mapping[str, str] = {}) -> None:
        """
        Writes the state dict (PyTorch's names) to a safetensors file, with str -> str metadata.
        """

    def load(self, path: str, strict: bool = True) -> None:
        """
        Reads a safetensors file by name, converting dtype; strict as load_state_dict.
        """

class TransformerEncoderLayer:
    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1, activation: str = 'relu', layer_norm_eps: float = 1e-05, batch_first: bool = False, norm_first: bool = False, bias: bool = True, dtype: str = 'float32', num_kv_heads: int = 0, backend: str = 'auto', attention_dropout: float | None = None, activation_dropout: float | None = None, attention_output_dropout: float | None = None, ffn_output_dropout: float | None = None, checkpoint: bool = False) -> None: ...

    def set_checkpoint(self, on: bool) -> None:
        """Activation checkpointing (training mode) from the next forward on."""

    def forward(self, src: object, src_mask: object | None = None, src_key_padding_mask: object | None = None, is_causal: bool = False) -> object: ...

    def backward(self, grad_output: object) -> object: ...

    def state_dict(self) -> dict:
        """Parameters by PyTorch's names (arrays sharing the module's memory)."""

    def grads(self) -> dict:
        """Accumulated parameter gradients by name (copies)."""

    def parameters(self, prefix: str = '') -> ParameterList:
        """
        The parameters (sharing the module's memory), for an optimizer; names get 'prefix.'.
        """

    def load_state_dict(self, state_dict: dict, strict: bool = True) -> None:
        """
        Copies values by name, converting dtype; strict: every parameter present and no extra name.
        """

    def train(self, mode: bool = True) -> None: ...

    @property
    def training(self) -> bool: ...

    def zero_grad(self) -> None: ...

    def manual_seed(self, seed: int) -> None:
        """
        Re-seeds every dropout of the module: the same seed gives the same patterns on the next forward.
        """

    def num_parameters(self) -> int: ...

    def save(self, path: str, metadata: Mapping[str, str] = {}) -> None:
        """
        Writes the state dict (PyTorch's names) to a safetensors file, with str -> str metadata.
        """

    def load(self, path: str, strict: bool = True) -> None:
        """
        Reads a safetensors file by name, converting dtype; strict as load_state_dict.
        """

class TransformerDecoderLayer:
    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1, activation: str = 'relu', layer_norm_eps: float = 1e-05, batch_first: bool = False, norm_first: bool = False, bias: bool = True, dtype: str = 'float32', num_kv_heads: int = 0, backend: str = 'auto', attention_dropout: float | None = None, activation_dropout: float | None = None, attention_output_dropout: float | None = None, ffn_output_dropout: float | None = None) -> None: ...

    def forward(self, tgt: object, memory: object, tgt_mask: object | None = None, memory_mask: object | None = None, tgt_key_padding_mask: object | None = None, memory_key_padding_mask: object | None = None, tgt_is_causal: bool = False, memory_is_causal: bool = False) -> object: ...

    def backward(self, grad_output: object) -> tuple: ...

    def state_dict(self) -> dict:
        """Parameters by PyTorch's names (arrays sharing the module's memory)."""

    def grads(self) -> dict:
        """Accumulated parameter gradients by name (copies)."""

    def parameters(self, prefix: str = '') -> ParameterList:
        """
        The parameters (sharing the module's memory), for an optimizer; names get 'prefix.'.
        """

    def load_state_dict(self, state_dict: dict, strict: bool = True) -> None:
        """
        Copies values by name, converting dtype; strict: every parameter present and no extra name.
        """

    def train(self, mode: bool = True) -> None: ...

    @property
    def training(self) -> bool: ...

    def zero_grad(self) -> None: ...

    def manual_seed(self, seed: int) -> None:
        """
        Re-seeds every dropout of the module: the same seed gives the same patterns on the next forward.
        """

    def num_parameters(self) -> int: ...

    def save(self, path: str, metadata: Mapping[str, str] = {}) -> None:
        """
        Writes the state dict (PyTorch's names) to a safetensors file, with str -> str metadata.
        """

    def load(self, path: str, strict: bool = True) -> None:
        """
        Reads a safetensors file by name, converting dtype; strict as load_state_dict.
        """

class TransformerEncoder:
    def __init__(self, num_layers: int, final_norm: bool, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1, activation: str = 'relu', layer_norm_eps: float = 1e-05, batch_first: bool = False, norm_first: bool = False, bias: bool = True, dtype: str = 'float32', num_kv_heads: int = 0, backend: str = 'auto', attention_dropout: float | None = None, activation_dropout: float | None = None, attention_output_dropout: float | None = None, ffn_output_dropout: float | None = None, checkpoint: bool = False, activation_dtype: str = 'float32') -> None: ...

    def set_checkpoint(self, on: bool) -> None:
        """Activation checkpointing (training mode) from the next forward on."""

    def forward(self, src: object, mask: object | None = None, src_key_padding_mask: object | None = None, is_causal: bool = False) -> object: ...

    def backward(self, grad_output: object) -> object: ...

    def state_dict(self) -> dict:
        """Parameters by PyTorch's names (arrays sharing the module's memory)."""

    def grads(self) -> dict:
        """Accumulated parameter gradients by name (copies)."""

    def parameters(self, prefix: str = '') -> ParameterList:
        """
        The parameters (sharing the module's memory), for an optimizer; names get 'prefix.'.
        """

    def load_state_dict(self, state_dict: dict, strict: bool = True) -> None:
        """
        Copies values by name, converting dtype; strict: every parameter present and no extra name.
        """

    def train(self, mode: bool = True) -> None: ...

    @property
    def training(self) -> bool: ...

    def zero_grad(self) -> None: ...

    def manual_seed(self, seed: int) -> None:
        """
        Re-seeds every dropout of the module: the same seed gives the same patterns on the next forward.
        """

    def num_parameters(self) -> int: ...

    def save(self, path: str, metadata: Mapping[str, str] = {}) -> None:
        """
        Writes the state dict (PyTorch's names) to a safetensors file, with str -> str metadata.
        """

    def load(self, path: str, strict: bool = True) -> None:
        """
        Reads a safetensors file by name, converting dtype; strict as load_state_dict.
        """

class TransformerDecoder:
    def __init__(self, num_layers: int, final_norm: bool, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1, activation: str = 'relu', layer_norm_eps: float = 1e-05, batch_first: bool = False, norm_first: bool = False, bias: bool = True, dtype: str = 'float32', num_kv_heads: int = 0, backend: str = 'auto', attention_dropout: float | None = None, activation_dropout: float | None = None, attention_output_dropout: float | None = None, ffn_output_dropout: float | None = None) -> None: ...

    def forward(self, tgt: object, memory: object, tgt_mask: object | None = None, memory_mask: object | None = None, tgt_key_padding_mask: object | None = None, memory_key_padding_mask: object | None = None, tgt_is_causal: bool = False, memory_is_causal: bool = False) -> object: ...

    def backward(self, grad_output: object) -> tuple: ...

    def state_dict(self) -> dict:
        """Parameters by PyTorch's names (arrays sharing the module's memory)."""

    def grads(self) -> dict:
        """Accumulated parameter gradients by name (copies)."""

    def parameters(self, prefix: str = '') -> ParameterList:
        """
        The parameters (sharing the module's memory), for an optimizer; names get 'prefix.'.
        """

    def load_state_dict(self, state_dict: dict, strict: bool = True) -> None:
        """
        Copies values by name, converting dtype; strict: every parameter present and no extra name.
        """

    def train(self, mode: bool = True) -> None: ...

    @property
    def training(self) -> bool: ...

    def zero_grad(self) -> None: ...

    def manual_seed(self, seed: int) -> None:
        """
        Re-seeds every dropout of the module: the same seed gives the same patterns on the next forward.
        """

    def num_parameters(self) -> int: ...

    def save(self, path: str, metadata: Mapping[str, str] = {}) -> None:
        """
        Writes the state dict (PyTorch's names) to a safetensors file, with str -> str metadata.
        """

    def load(self, path: str, strict: bool = True) -> None:
        """
        Reads a safetensors file by name, converting dtype; strict as load_state_dict.
        """

class Linear:
    def __init__(self, in_features: int, out_features: int, bias: bool = True, dtype: str = 'float32') -> None: ...

    def forward(self, input: object) -> object: ...

    def backward(self, grad_output: object) -> object: ...

    def state_dict(self) -> dict:
        """Parameters by PyTorch's names (arrays sharing the module's memory)."""

    def grads(self) -> dict:
        """Accumulated parameter gradients by name (copies)."""

    def parameters(self, prefix: str = '') -> ParameterList:
        """
        The parameters (sharing the module's memory), for an optimizer; names get 'prefix.'.
        """

    def load_state_dict(self, state_dict: dict, strict: bool = True) -> None:
        """
        Copies values by name, converting dtype; strict: every parameter present and no extra name.
        """

    def train(self, mode: bool = True) -> None: ...

    @property
    def training(self) -> bool: ...

    def zero_grad(self) -> None: ...

    def manual_seed(self, seed: int) -> None:
        """
        Re-seeds every dropout of the module: the same seed gives the same patterns on the next forward.
        """

    def num_parameters(self) -> int: ...

    def save(self, path: str, metadata: Mapping[str, str] = {}) -> None:
        """
        Writes the state dict (PyTorch's names) to a safetensors file, with str -> str metadata.
        """

    def load(self, path: str, strict: bool = True) -> None:
        """
        Reads a safetensors file by name, converting dtype; strict as load_state_dict.
        """

class LayerNorm:
    def __init__(self, normalized_shape: int, eps: float = 1e-05, elementwise_affine: bool = True, bias: bool = True, dtype: str = 'float32') -> None: ...

    def forward(self, input: object) -> object: ...

    def backward(self, grad_output: object) -> object: ...

    def state_dict(self) -> dict:
        """Parameters by PyTorch's names (arrays sharing the module's memory)."""

    def grads(self) -> dict:
        """Accumulated parameter gradients by name (copies)."""

    def parameters(self, prefix: str = '') -> ParameterList:
        """
        The parameters (sharing the module's memory), for an optimizer; names get 'prefix.'.
        """

    def load_state_dict(self, state_dict: dict, strict: bool = True) -> None:
        """
        Copies values by name, converting dtype; strict: every parameter present and no extra name.
        """

    def train(self, mode: bool = True) -> None: ...

    @property
    def training(self) -> bool: ...

    def zero_grad(self) -> None: ...

    def manual_seed(self, seed: int) -> None:
        """
        Re-seeds every dropout of the module: the same seed gives the same patterns on the next forward.
        """

    def num_parameters(self) -> int: ...

    def save(self, path: str, metadata: Mapping[str, str] = {}) -> None:
        """
        Writes the state dict (PyTorch's names) to a safetensors file, with str -> str metadata.
        """

    def load(self, path: str, strict: bool = True) -> None:
        """
        Reads a safetensors file by name, converting dtype; strict as load_state_dict.
        """

class Activation:
    def __init__(self, kind: str) -> None: ...

    def forward(self, input: object) -> object: ...

    def backward(self, grad_output: object) -> object: ...

    def state_dict(self) -> dict:
        """Parameters by PyTorch's names (arrays sharing the module's memory)."""

    def grads(self) -> dict:
        """Accumulated parameter gradients by name (copies)."""

    def parameters(self, prefix: str = '') -> ParameterList:
        """
        The parameters (sharing the module's memory), for an optimizer; names get 'prefix.'.
        """

    def load_state_dict(self, state_dict: dict, strict: bool = True) -> None:
        """
        Copies values by name, converting dtype; strict: every parameter present and no extra name.
        """

    def train(self, mode: bool = True) -> None: ...

    @property
    def training(self) -> bool: ...

    def zero_grad(self) -> None: ...

    def manual_seed(self, seed: int) -> None:
        """
        Re-seeds every dropout of the module: the same seed gives the same patterns on the next forward.
        """

    def num_parameters(self) -> int: ...

    def save(self, path: str, metadata: Mapping[str, str] = {}) -> None:
        """
        Writes the state dict (PyTorch's names) to a safetensors file, with str -> str metadata.
        """

    def load(self, path: str, strict: bool = True) -> None:
        """
        Reads a safetensors file by name, converting dtype; strict as load_state_dict.
        """

class Dropout:
    def __init__(self, p: float = 0.5) -> None: ...

    def forward(self, input: object) -> object: ...

    def backward(self, grad_output: object) -> object: ...

    def state_dict(self) -> dict:
        """Parameters by PyTorch's names (arrays sharing the module's memory)."""

    def grads(self) -> dict:
        """Accumulated parameter gradients by name (copies)."""

    def parameters(self, prefix: str = '') -> ParameterList:
        """
        The parameters (sharing the module's memory), for an optimizer; names get 'prefix.'.
        """

    def load_state_dict(self, state_dict: dict, strict: bool = True) -> None:
        """
        Copies values by name, converting dtype; strict: every parameter present and no extra name.
        """

    def train(self, mode: bool = True) -> None: ...

    @property
    def training(self) -> bool: ...

    def zero_grad(self) -> None: ...

    def manual_seed(self, seed: int) -> None:
        """
        Re-seeds every dropout of the module: the same seed gives the same patterns on the next forward.
        """

    def num_parameters(self) -> int: ...

    def save(self, path: str, metadata: Mapping[str, str] = {}) -> None:
        """
        Writes the state dict (PyTorch's names) to a safetensors file, with str -> str metadata.
        """

    def load(self, path: str, strict: bool = True) -> None:
        """
        Reads a safetensors file by name, converting dtype; strict as load_state_dict.
        """

class SinusoidalPositionalEncoding:
    def __init__(self, d_model: int, max_len: int = 4096, batch_first: bool = False, scale: float = 1.0) -> None: ...

    def forward(self, input: object, offset: int = 0) -> object: ...

    def backward(self, grad_output: object) -> object: ...

    def state_dict(self) -> dict:
        """Parameters by PyTorch's names (arrays sharing the module's memory)."""

    def grads(self) -> dict:
        """Accumulated parameter gradients by name (copies)."""

    def parameters(self, prefix: str = '') -> ParameterList:
        """
        The parameters (sharing the module's memory), for an optimizer; names get 'prefix.'.
        """

    def load_state_dict(self, state_dict: dict, strict: bool = True) -> None:
        """
        Copies values by name, converting dtype; strict: every parameter present and no extra name.
        """

    def train(self, mode: bool = True) -> None: ...

    @property
    def training(self) -> bool: ...

    def zero_grad(self) -> None: ...

    def manual_seed(self, seed: int) -> None:
        """
        Re-seeds every dropout of the module: the same seed gives the same patterns on the next forward.
        """

    def num_parameters(self) -> int: ...

    def save(self, path: str, metadata: Mapping[str, str] = {}) -> None:
        """
        Writes the state dict (PyTorch's names) to a safetensors file, with str -> str metadata.
        """

    def load(self, path: str, strict: bool = True) -> None:
        """
        Reads a safetensors file by name, converting dtype; strict as load_state_dict.
        """

class LearnedPositionalEmbedding:
    def __init__(self, max_len: int, d_model: int, batch_first: bool = False, scale: float = 1.0, dtype: str = 'float32', init_std: float = 1.0) -> None: ...

    def forward(self, input: object, offset: int = 0) -> object: ...

    def backward(self, grad_output: object) -> object: ...

    def state_dict(self) -> dict:
        """Parameters by PyTorch's names (arrays sharing the module's memory)."""

    def grads(self) -> dict:
        """Accumulated parameter gradients by name (copies)."""

    def parameters(self, prefix: str = '') -> ParameterList:
        """
        The parameters (sharing the module's memory), for an optimizer; names get 'prefix.'.
        """

    def load_state_dict(self, state_dict: dict, strict: bool = True) -> None:
        """
        Copies values by name, converting dtype; strict: every parameter present and no extra name.
        """

    def train(self, mode: bool = True) -> None: ...

    @property
    def training(self) -> bool: ...

    def zero_grad(self) -> None: ...

    def manual_seed(self, seed: int) -> None:
        """
        Re-seeds every dropout of the module: the same seed gives the same patterns on the next forward.
        """

    def num_parameters(self) -> int: ...

    def save(self, path: str, metadata: Mapping[str, str] = {}) -> None:
        """
        Writes the state dict (PyTorch's names) to a safetensors file, with str -> str metadata.
        """

    def load(self, path: str, strict: bool = True) -> None:
        """
        Reads a safetensors file by name, converting dtype; strict as load_state_dict.
        """

class FeedForward:
    def __init__(self, d_model: int, d_ff: int, activation: str = 'relu', dropout: float = 0.0, bias: bool = True, dtype: str = 'float32') -> None: ...

    def forward(self, input: object) -> object: ...

    def backward(self, grad_output: object) -> object: ...

    def state_dict(self) -> dict:
        """Parameters by PyTorch's names (arrays sharing the module's memory)."""

    def grads(self) -> dict:
        """Accumulated parameter gradients by name (copies)."""

    def parameters(self, prefix: str = '') -> ParameterList:
        """
        The parameters (sharing the module's memory), for an optimizer; names get 'prefix.'.
        """

    def load_state_dict(self, state_dict: dict, strict: bool = True) -> None:
        """
        Copies values by name, converting dtype; strict: every parameter present and no extra name.
        """

    def train(self, mode: bool = True) -> None: ...

    @property
    def training(self) -> bool: ...

    def zero_grad(self) -> None: ...

    def manual_seed(self, seed: int) -> None:
        """
        Re-seeds every dropout of the module: the same seed gives the same patterns on the next forward.
        """

    def num_parameters(self) -> int: ...

    def save(self, path: str, metadata: Mapping[str, str] = {}) -> None:
        """
        Writes the state dict (PyTorch's names) to a safetensors file, with str -> str metadata.
        """

    def load(self, path: str, strict: bool = True) -> None:
        """
        Reads a safetensors file by name, converting dtype; strict as load_state_dict.
        """

class Embedding:
    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int = -1, dtype: str = 'float32') -> None: ...

    def forward(self, input: object) -> object: ...

    def backward(self, grad_output: object) -> None: ...

    def state_dict(self) -> dict:
        """Parameters by PyTorch's names (arrays sharing the module's memory)."""

    def grads(self) -> dict:
        """Accumulated parameter gradients by name (copies)."""

    def parameters(self, prefix: str = '') -> ParameterList:
        """
        The parameters (sharing the module's memory), for an optimizer; names get 'prefix.'.
        """

    def load_state_dict(self, state_dict: dict, strict: bool = True) -> None:
        """
        Copies values by name, converting dtype; strict: every parameter present and no extra name.
        """

    def train(self, mode: bool = True) -> None: ...

    @property
    def training(self) -> bool: ...

    def zero_grad(self) -> None: ...

    def manual_seed(self, seed: int) -> None:
        """
        Re-seeds every dropout of the module: the same seed gives the same patterns on the next forward.
        """

    def num_parameters(self) -> int: ...

    def save(self, path: str, metadata: Mapping[str, str] = {}) -> None:
        """
        Writes the state dict (PyTorch's names) to a safetensors file, with str -> str metadata.
        """

    def load(self, path: str, strict: bool = True) -> None:
        """
        Reads a safetensors file by name, converting dtype; strict as load_state_dict.
        """
