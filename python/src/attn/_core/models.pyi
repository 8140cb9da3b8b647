"""
attn::models: BERT-family encoders and their tokenizer (use attn.models).
"""

from collections.abc import Sequence

import attn._core.nn


from typing import Any

from numpy.typing import ArrayLike  # NumPy arrays, PyTorch CPU tensors, nested lists

class WordPieceTokenizer:
    @staticmethod
    def from_folder(path: str) -> WordPieceTokenizer:
        """
        A HuggingFace folder: tokenizer.json (+ tokenizer_config.json), or vocab.txt + tokenizer_config.json.
        """

    def encode(self, text: str, max_length: int = -1, add_special_tokens: bool = True) -> tuple[list[int], list[int], list[str]]:
        """
        One text -> (ids, token_type_ids, tokens). max_length: tokens of the result, special ones included; -1 = the model's model_max_length, 0 = no truncation.
        """

    def encode_batch(self, texts: list[str], max_length: int = -1, add_special_tokens: bool = True, min_length: int = 0, pad_to_multiple_of: int = 0, padding_side: str = 'right') -> tuple[Any, Any, Any]:
        """
        texts -> (input_ids, attention_mask, token_type_ids), int64 NumPy arrays [B, L] padded with [PAD] to the longest encoding (at least min_length, rounded up to a multiple of pad_to_multiple_of). max_length as in encode.
        """

    def token_to_id(self, token: str) -> int:
        """-1 when the token is not in the vocabulary."""

    def id_to_token(self, id: int) -> str: ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def pad_token_id(self) -> int: ...

    @property
    def pad_token(self) -> str: ...

    @property
    def unk_token(self) -> str: ...

    @property
    def model_max_length(self) -> int:
        """Truncation length of the folder (0 = none)."""

class BertModel:
    @staticmethod
    def from_pretrained(path: str, dtype: str = 'float32', hidden_dropout_prob: float | None = None, attention_probs_dropout_prob: float | None = None) -> BertModel:
        """
        config.json + model.safetensors of a HuggingFace folder of model_type bert (MiniLM too), roberta or distilbert; strict (every tensor the config implies, with its shape, and no other), all-or-nothing. dtype 'float32' or 'bfloat16' (inference in bf16: bf16 weights and activations, f32 accumulation and LayerNorm / softmax statistics). The dropout probabilities, when given, replace the config's (training mode only).
        """

    @property
    def dtype(self) -> str:
        """The compute dtype: 'f32' or 'bf16'."""

    def train(self, mode: bool = True) -> None: ...

    @property
    def training(self) -> bool: ...

    def backward(self, grad_last_hidden_state: object | None = None, grad_pooler_output: object | None = None) -> None: ...

    def parameters(self, prefix: str = '') -> attn._core.nn.ParameterList: ...

    def zero_grad(self) -> None: ...

    def manual_seed(self, seed: int) -> None: ...

    def forward(self, input_ids: ArrayLike, attention_mask: ArrayLike | None = None, token_type_ids: ArrayLike | None = None, output_attentions: bool = False) -> tuple[Any, Any, tuple[Any, ...]]:
        """
        input_ids [B, L] (int32 / int64), attention_mask [B, L] (nonzero = real token), token_type_ids [B, L] -> (last_hidden_state [B, L, H], pooler_output [B, H] or None, attentions: one [B, heads, L, L] per layer when output_attentions, else ()), float32 (a bf16 model: bf16 torch tensors, float32 NumPy arrays of bf16 values; attentions float32), torch tensors when any input was one.
        """

    def load_state_dict(self, state_dict: dict) -> None:
        """
        HF-named tensors, strict and all-or-nothing: on any error the model is unchanged.
        """

    def load_safetensors(self, path: str) -> None:
        """As load_state_dict, from a .safetensors file."""

    def state_dict(self) -> dict:
        """The weights under HF's names, as NumPy copies."""

    @property
    def config(self) -> dict: ...

    @property
    def has_pooler(self) -> bool: ...

class SentenceEncoder:
    @staticmethod
    def from_folder(path: str) -> SentenceEncoder:
        """
        A sentence-transformers folder: modules.json, sentence_bert_config.json, 1_Pooling/config.json, the model and its tokenizer.
        """

    def encode(self, texts: list[str], batch_size: int = 32) -> Any:
        """
        texts -> [N, D] float32 NumPy embeddings, in the order of texts (run longest first, in batches of batch_size, as sentence-transformers).
        """

    def tokenize(self, texts: Sequence[str]) -> tuple:
        """
        The padded batch (input_ids, attention_mask, token_type_ids) the Transformer module builds.
        """

    @property
    def dimension(self) -> int: ...

    @property
    def max_seq_length(self) -> int: ...

    @property
    def normalize(self) -> bool: ...

    @property
    def pooling(self) -> dict: ...

def write_heads_report(model: BertModel, tokenizer: WordPieceTokenizer, texts: list[str], out_dir: str, model_path: str, title: str) -> dict[str, Any]:
    """
    attn::viz::write_model_report: report.html and a PNG and SVG per head in out_dir (one text), or out_dir/text{i}/ per text and out_dir/index.html; everything is computed before out_dir is created. Returns {html, reports, files, layers, heads, tokens, entropy [text][layer][head]}.
    """
