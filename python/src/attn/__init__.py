"""attn: exact scaled dot-product attention on the CPU (NumPy and PyTorch bindings of the attn C++ library)."""
from ._core import attention, attention_backward, get_num_threads, resolve_backend, set_num_threads

__version__ = "0.1.0"
__all__ = ["attention", "attention_backward", "get_num_threads", "resolve_backend", "set_num_threads"]
