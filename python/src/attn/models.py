"""attn.models: pretrained BERT-family encoders (BERT, MiniLM, RoBERTa, DistilBERT) from a HuggingFace folder, the
WordPiece tokenizer and sentence-transformers embeddings, computed by attn's C++ library (attn::models) with
HuggingFace's call signatures.

    tok = attn.models.Tokenizer.from_pretrained(path)            # tokenizer.json or vocab.txt
    batch = tok(texts, padding=True, truncation=True, return_tensors="np")   # input_ids, token_type_ids, attention_mask
    model = attn.models.BertModel.from_pretrained(path)          # config.json + model.safetensors, strict
    out = model(**batch, output_attentions=True)                 # .last_hidden_state [B, L, H], .pooler_output [B, H],
                                                                 # .attentions: one [B, heads, L, L] per layer
    emb = attn.models.SentenceTransformer(path).encode(texts)    # [N, D] float32, as sentence-transformers
                                                                 # (= what `attn embed --model path` writes)
    rep = attn.models.heads_report(path, text, "out")            # out/report.html + a PNG and SVG per head
                                                                 # (= what `attn viz --model path` writes)

Torch tensors in give torch tensors out, NumPy (or lists) in give NumPy out. Everything runs in float32 on the CPU,
with the GIL released. A padded position (attention_mask 0) still gets an output, as in transformers; a row with
no real token at all gives zeros where transformers averages uniformly.

BertModel.from_pretrained reads a folder of model_type "bert" (MiniLM too), "roberta" or "distilbert";
RobertaModel and DistilBertModel (transformers' names) read only their own. RoBERTa's tokenizer is byte-level BPE,
which attn does not implement: feed it input_ids from transformers' tokenizer (Tokenizer and SentenceTransformer
read WordPiece folders only, which covers BERT, MiniLM and DistilBERT).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from . import _core

_m = _core.models

__all__ = [
    "BatchEncoding",
    "BertModel",
    "BertModelOutput",
    "DistilBertModel",
    "HeadsReport",
    "RobertaModel",
    "SentenceTransformer",
    "Tokenizer",
    "heads_report",
]


def _folder(path: Any, fn: str) -> str:
    p = os.fspath(path)
    if not os.path.isdir(p):
        raise FileNotFoundError(
            f"{fn}: path {p!r} is not a folder (attn reads local HuggingFace folders only)"
        )
    return p


def _reraise(e: ValueError, fn: str) -> ValueError:
    # The C++ messages start with the class's C++ name; Python users see theirs.
    msg = str(e)
    for prefix in (
        "attn::models::BertModel: forward: ",
        "attn::models::BertModel: ",
        "attn::models::SentenceEncoder: encode: ",
        "attn::models::SentenceEncoder: ",
        "attn::models::WordPieceTokenizer: ",
        "attn::viz::write_model_report: ",
    ):
        if msg.startswith(prefix):
            msg = msg[len(prefix) :]
            break
    if not msg.startswith("attn."):
        msg = f"{fn}: {msg}"
    return ValueError(msg)


def _texts(text: Any, fn: str, name: str) -> tuple[list, bool]:
    """(list of str, whether one str was given)."""
    if isinstance(text, str):
        return [text], True
    if isinstance(text, (list, tuple)) and all(isinstance(t, str) for t in text):
        return list(text), False
    raise TypeError(
        f"{fn}: {name} must be a str or a list of str, got {type(text).__name__}"
        + (" holding a non-str" if isinstance(text, (list, tuple)) else "")
    )


class BatchEncoding(dict):
    """A dict of input_ids, token_type_ids and attention_mask (transformers' BatchEncoding): `model(**batch)` works,
    and so do `batch["input_ids"]` and `batch.input_ids`."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class Tokenizer:
    """BERT's WordPiece tokenizer with exactly HuggingFace's ids (lower casing, accent stripping, Chinese characters,
    punctuation splitting, [UNK], special tokens, truncation to the model's length)."""

    def __init__(self, core: Any, padding_side: str = "right") -> None:
        self._tok = core
        self.padding_side = padding_side

    @classmethod
    def from_pretrained(cls, path: Any) -> Tokenizer:
        """A HuggingFace folder: tokenizer.json (+ tokenizer_config.json), or vocab.txt + tokenizer_config.json."""
        p = _folder(path, "attn.models.Tokenizer.from_pretrained")
        try:
            core = _m.WordPieceTokenizer.from_folder(p)
        except ValueError as e:
            raise _reraise(e, "attn.models.Tokenizer.from_pretrained") from None
        side = "right"
        cfg = os.path.join(p, "tokenizer_config.json")
        if os.path.isfile(cfg):
            with open(cfg, encoding="utf-8") as f:
                side = json.load(f).get("padding_side", "right") or "right"
        return cls(core, side)

    @property
    def vocab_size(self) -> int:
        return self._tok.vocab_size

    @property
    def pad_token_id(self) -> int:
        return self._tok.pad_token_id

    @property
    def model_max_length(self) -> int | None:
        """The folder's truncation length, None when it has none."""
        n = self._tok.model_max_length
        return n if n > 0 else None

    def tokenize(self, text: str) -> list:
        """The tokens of `text`, without special tokens and without truncation (transformers' tokenize)."""
        return self._tok.encode(
            _texts(text, "attn.models.Tokenizer.tokenize", "text")[0][0], 0, False
        )[2]

    def convert_ids_to_tokens(self, ids: int | Sequence[int]) -> Any:
        if isinstance(ids, (int, np.integer)):
            return self._tok.id_to_token(int(ids))
        return [self._tok.id_to_token(int(i)) for i in ids]

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> Any:
        unk = self._tok.token_to_id(self._tok.unk_token)

        def one(t: str) -> int:
            i = self._tok.token_to_id(t)
            return unk if i < 0 else i

        return one(tokens) if isinstance(tokens, str) else [one(t) for t in tokens]

    def __call__(
        self,
        text: str | Sequence[str],
        padding: bool | str = True,
        truncation: bool | str | None = True,
        max_length: int | None = None,
        return_tensors: str | None = "np",
        add_special_tokens: bool = True,
        pad_to_multiple_of: int | None = None,
    ) -> BatchEncoding:
        """transformers' tokenizer(text, padding=..., truncation=..., max_length=..., return_tensors=...).

        padding: True / "longest" (to the longest text), "max_length" (to max_length, or the model's), False /
        "do_not_pad". truncation: True / "longest_first" / "only_first" (to max_length, or the model's
        model_max_length), False / "do_not_truncate"; None truncates only when max_length is given without padding
        (transformers' rule). return_tensors: "np" (int64 arrays [B, L]), "pt" (torch int64), or None (lists; a
        single str gives flat lists). The padding goes on the tokenizer_config's padding_side (right by default).
        """
        fn = "attn.models.Tokenizer"
        texts, single = _texts(text, fn, "text")
        pad = {
            True: "longest",
            False: "none",
            None: "none",
            "longest": "longest",
            "max_length": "max_length",
            "do_not_pad": "none",
        }.get(padding if isinstance(padding, (bool, str)) or padding is None else "?", "?")
        if pad == "?":
            raise ValueError(
                f"{fn}: padding must be True, False, 'longest', 'max_length' or 'do_not_pad', "
                f"got {padding!r}"
            )
        if truncation is None:
            truncation = max_length is not None and pad == "none"
        trunc = {
            True: True,
            False: False,
            "longest_first": True,
            "only_first": True,
            "do_not_truncate": False,
        }.get(truncation if isinstance(truncation, (bool, str)) else "?", None)
        if trunc is None:
            raise ValueError(
                f"{fn}: truncation must be True, False, 'longest_first', 'only_first' or "
                f"'do_not_truncate', got {truncation!r}"
            )
        if max_length is not None and (
            not isinstance(max_length, (int, np.integer)) or max_length < 1
        ):
            raise ValueError(f"{fn}: max_length must be a positive int or None, got {max_length!r}")
        if return_tensors not in (None, "np", "pt"):
            raise ValueError(
                f"{fn}: return_tensors must be 'np', 'pt' or None, got {return_tensors!r}"
            )
        multiple = int(pad_to_multiple_of or 0)
        if multiple < 0:
            raise ValueError(f"{fn}: pad_to_multiple_of must be >= 0, got {pad_to_multiple_of!r}")
        cut = (
            (int(max_length) if max_length is not None else self.model_max_length)
            if trunc
            else None
        )
        if cut and pad != "none" and multiple and cut % multiple:
            raise ValueError(
                f"{fn}: truncation and padding are both on but the truncation length ({cut}) is not a "
                f"multiple of pad_to_multiple_of ({multiple}), which transformers refuses too"
            )
        # The C++ encoder's max_length: -1 = the model's, 0 = none.
        limit = (int(max_length) if max_length is not None else -1) if trunc else 0
        target = 0
        if pad == "max_length":
            target = int(max_length) if max_length is not None else (self.model_max_length or 0)
            if multiple and target % multiple:
                target += multiple - target % multiple
        try:
            ids, mask, types = self._tok.encode_batch(
                texts,
                limit,
                add_special_tokens,
                target,
                multiple if pad != "none" else 0,
                self.padding_side,
            )
        except ValueError as e:
            raise _reraise(e, fn) from None
        L = ids.shape[1]
        n = mask.sum(axis=1)
        keep = np.full_like(n, L) if pad == "longest" else np.maximum(n, target)
        left = self.padding_side == "left"

        def rows(a: np.ndarray) -> Any:
            if return_tensors is None:
                out = [a[b, L - k :] if left else a[b, :k] for b, k in enumerate(keep.tolist())]
                return out[0].tolist() if single else [r.tolist() for r in out]
            if len(set(keep.tolist())) > 1:
                raise ValueError(
                    f"{fn}: the encodings have lengths {sorted(set(keep.tolist()))}; use padding=True "
                    f"(or return_tensors=None) to make a tensor of them"
                )
            k = int(keep.max()) if len(keep) else 0
            a = np.ascontiguousarray(a[:, L - k :] if left else a[:, :k])
            if return_tensors == "pt":
                import torch

                return torch.from_numpy(a)
            return a

        return BatchEncoding(
            input_ids=rows(ids), token_type_ids=rows(types), attention_mask=rows(mask)
        )


class BertModelOutput:
    """transformers' BaseModelOutputWithPooling: last_hidden_state [B, L, H], pooler_output [B, H] (None without a
    pooler), attentions (a tuple of [B, heads, L, L], one per layer, when asked; else None). out[0] is
    last_hidden_state, out["pooler_output"] the pooler output."""

    __slots__ = ("last_hidden_state", "pooler_output", "attentions")

    def __init__(
        self, last_hidden_state: Any, pooler_output: Any, attentions: tuple | None
    ) -> None:
        self.last_hidden_state = last_hidden_state
        self.pooler_output = pooler_output
        self.attentions = attentions

    def to_tuple(self) -> tuple:
        return tuple(getattr(self, k) for k in self.__slots__ if getattr(self, k) is not None)

    def __getitem__(self, key: int | str) -> Any:
        return getattr(self, key) if isinstance(key, str) else self.to_tuple()[key]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.to_tuple())

    def __repr__(self) -> str:
        shapes = {
            k: tuple(getattr(self, k).shape)
            for k in ("last_hidden_state", "pooler_output")
            if getattr(self, k) is not None
        }
        if self.attentions is not None:
            shapes["attentions"] = (
                f"{len(self.attentions)} x {tuple(self.attentions[0].shape)}"
                if self.attentions
                else "()"
            )
        return f"BertModelOutput({', '.join(f'{k}={v}' for k, v in shapes.items())})"


def _model_dtype(dtype: Any, fn: str) -> str:
    name = str(dtype)
    if name.startswith("torch."):
        name = name[len("torch.") :]
    if name not in ("bfloat16", "bf16"):
        try:
            name = np.dtype(name).name
        except TypeError:
            pass
    if name not in ("float32", "bfloat16", "bf16"):
        raise ValueError(
            f"{fn}: dtype must be float32 or bfloat16 (attn's BERT runs in float32, or in bf16 for "
            f"inference), got {dtype!r}"
        )
    return "float32" if name == "float32" else "bfloat16"


class BertModel:
    """A HuggingFace BERT-family encoder computing what transformers' BertModel (BERT, MiniLM), RobertaModel or
    DistilBertModel computes in eval mode: embeddings -> post-norm encoder layers -> pooler (when the checkpoint has
    one; DistilBERT has none). The folder's config.json model_type picks the family:

        bert        positions 0..L-1, token types
        roberta     positions from the ids, as transformers: pad_token_id + 1, + 2, ... counting only ids that are
                    not pad_token_id (those get pad_token_id), whatever the attention_mask says
        distilbert  positions 0..L-1, no token types (token_type_ids must be None or all 0), no pooler
    """

    _model_types: tuple = ("bert", "roberta", "distilbert")

    def __init__(self, core: Any, path: str | None = None) -> None:
        self._model = core
        self._path = path  # the folder it was read from: heads_report's default tokenizer

    @classmethod
    def from_pretrained(
        cls,
        path: Any,
        dtype: Any = "float32",
        *,
        hidden_dropout_prob: float | None = None,
        attention_probs_dropout_prob: float | None = None,
    ) -> BertModel:
        """config.json + model.safetensors. Strict and all-or-nothing: a missing, extra or misshapen tensor, or a
        config attn cannot run (another model_type, relative positions, a decoder, an unknown activation), raises
        ValueError naming it. dtype: float32, or bfloat16 ('bfloat16' / torch.bfloat16) for bf16 inference as
        model.to(torch.bfloat16): bf16 weights and activations, f32 accumulation, LayerNorm and softmax statistics in
        f32; outputs bf16 torch tensors (float32 NumPy arrays holding bf16 values), attentions float32. Measured on
        all-MiniLM-L6-v2: see python/tests/test_models_bf16.py. hidden_dropout_prob / attention_probs_dropout_prob
        replace the config's (DistilBERT's dropout / attention_dropout; DistilBertModel.from_pretrained takes those
        names), as transformers' from_pretrained(path, hidden_dropout_prob=0.0) does: dropout in training mode,
        where transformers applies it."""
        fn = f"attn.models.{cls.__name__}.from_pretrained"
        dt = _model_dtype(dtype, fn)
        p = _folder(path, fn)
        cfg = os.path.join(p, "config.json")
        if len(cls._model_types) == 1 and os.path.isfile(cfg):
            with open(cfg, encoding="utf-8") as f:
                model_type = json.load(f).get("model_type", "bert")
            if model_type != cls._model_types[0]:
                raise ValueError(
                    f"{fn}: {cfg} has model_type {model_type!r}, not {cls._model_types[0]!r} "
                    f"(attn.models.BertModel reads bert, roberta and distilbert folders)"
                )
        try:
            return cls(
                _m.BertModel.from_pretrained(
                    p, dt, hidden_dropout_prob, attention_probs_dropout_prob
                ),
                p,
            )
        except ValueError as e:
            raise _reraise(e, fn) from None

    @property
    def config(self) -> dict:
        return self._model.config

    @property
    def dtype(self) -> str:
        """'float32' or 'bfloat16': what the model computes in (from_pretrained's dtype)."""
        return "bfloat16" if self._model.dtype == "bf16" else "float32"

    def train(self, mode: bool = True) -> BertModel:
        """Fine-tuning: in training mode the forward keeps what backward() needs and applies the config's dropout
        where transformers does: hidden_dropout_prob on the embeddings' output and each sublayer's output before its
        residual add (DistilBERT: not the attention's), attention_probs_dropout_prob on the attention weights (eval
        mode, the default, keeps and drops nothing). manual_seed(s) fixes the patterns. Under attn.nn.autocast() a
        float32 model computes in bfloat16 with float32 weights and gradients; a bfloat16 model runs inference
        only. Returns self."""
        self._model.train(bool(mode))
        return self

    def eval(self) -> BertModel:
        """Inference mode (the default): the forward keeps nothing for a backward. Returns self."""
        return self.train(False)

    @property
    def training(self) -> bool:
        return self._model.training

    def backward(self, grad_last_hidden_state: Any = None, grad_pooler_output: Any = None) -> None:
        """The gradients of the last training-mode forward's outputs (either may be None = zero): ADDS the
        parameters' gradients (read them through parameters(); zero_grad() clears them), as torch's backward
        accumulates. One backward per forward."""
        try:
            self._model.backward(grad_last_hidden_state, grad_pooler_output)
        except ValueError as e:
            raise _reraise(e, f"attn.models.{type(self).__name__}.backward") from None

    def parameters(self, prefix: str = "") -> Any:
        """Every parameter under attn's names (query / key / value stacked as self_attn.in_proj_*), sharing the
        model's memory: for attn.nn.AdamW / SGD / clip_grad_norm_ (+ joins another module's list)."""
        return self._model.parameters(str(prefix))

    def zero_grad(self) -> None:
        self._model.zero_grad()

    def manual_seed(self, seed: int) -> None:
        """Re-seeds every dropout: the same seed gives the same patterns on the next training forward."""
        self._model.manual_seed(int(seed))

    def state_dict(self) -> dict:
        """The weights under transformers' names, as NumPy copies."""
        return self._model.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        """Transformers-named tensors, strict: every tensor the config implies, with its shape, and no other (the
        position_ids buffer excepted). On any error nothing changes."""
        try:
            self._model.load_state_dict(dict(state_dict))
        except ValueError as e:
            raise _reraise(e, f"attn.models.{type(self).__name__}.load_state_dict") from None

    def __call__(
        self,
        input_ids: Any = None,
        attention_mask: Any = None,
        token_type_ids: Any = None,
        output_attentions: bool = False,
    ) -> BertModelOutput:
        """input_ids [B, L] (int32 / int64), attention_mask [B, L] (nonzero = real token; None = all real),
        token_type_ids [B, L] (None = all 0) -> BertModelOutput of float32 arrays, torch tensors when any input was
        one."""
        fn = f"attn.models.{type(self).__name__}"
        if input_ids is None:
            raise ValueError(f"{fn}: input_ids is required")
        if not isinstance(output_attentions, bool):
            raise TypeError(
                f"{fn}: output_attentions must be a bool, got {type(output_attentions).__name__}"
            )
        try:
            hidden, pooled, att = self._model.forward(
                input_ids, attention_mask, token_type_ids, output_attentions
            )
        except ValueError as e:
            raise _reraise(e, fn) from None
        return BertModelOutput(hidden, pooled, tuple(att) if output_attentions else None)

    forward = __call__

    def heads_report(
        self,
        text: str | Sequence[str],
        out_dir: Any,
        *,
        tokenizer: Any = None,
        title: str | None = None,
    ) -> HeadsReport:
        """attn.models.heads_report(self, text, out_dir, ...): the HTML report of this model's heads on text."""
        return heads_report(self, text, out_dir, tokenizer=tokenizer, title=title)


class RobertaModel(BertModel):
    """transformers' RobertaModel: BertModel for a folder of model_type "roberta" only (any other is refused).
    attn has no byte-level BPE tokenizer: give it input_ids from transformers' AutoTokenizer."""

    _model_types = ("roberta",)


class DistilBertModel(BertModel):
    """transformers' DistilBertModel: BertModel for a folder of model_type "distilbert" only (any other is refused).
    Its outputs have pooler_output None; token_type_ids (which attn's Tokenizer gives) must be None or all 0."""

    _model_types = ("distilbert",)

    @classmethod
    def from_pretrained(
        cls,
        path: Any,
        dtype: Any = "float32",
        *,
        dropout: float | None = None,
        attention_dropout: float | None = None,
    ) -> DistilBertModel:
        """As BertModel.from_pretrained, with DistilBERT's own names for the dropout overrides (its config's keys,
        which transformers' DistilBertModel.from_pretrained(path, dropout=...) takes): dropout on the embeddings'
        output and the feed-forward's (.config's hidden_dropout_prob), attention_dropout on the attention weights
        (.config's attention_probs_dropout_prob). BERT's names are refused here rather than ignored."""
        fn = f"attn.models.{cls.__name__}.from_pretrained"
        for name, p in (("dropout", dropout), ("attention_dropout", attention_dropout)):
            if p is not None and not 0.0 <= float(p) < 1.0:
                raise ValueError(f"{fn}: {name} must be in [0, 1), got {p}")
        return super().from_pretrained(
            path, dtype, hidden_dropout_prob=dropout, attention_probs_dropout_prob=attention_dropout
        )


class SentenceTransformer:
    """sentence-transformers' SentenceTransformer for a local folder: modules.json (Transformer -> Pooling ->
    optional Normalize), sentence_bert_config.json's max_seq_length, 1_Pooling/config.json's modes."""

    def __init__(self, model_name_or_path: Any, device: str | None = None) -> None:
        fn = "attn.models.SentenceTransformer"
        if device not in (None, "cpu"):
            raise ValueError(
                f"{fn}: device must be 'cpu' or None (attn runs on the CPU), got {device!r}"
            )
        self._path = _folder(model_name_or_path, fn)
        try:
            self._enc = _m.SentenceEncoder.from_folder(self._path)
        except ValueError as e:
            raise _reraise(e, fn) from None

    @property
    def max_seq_length(self) -> int:
        return self._enc.max_seq_length

    def get_sentence_embedding_dimension(self) -> int:
        return self._enc.dimension

    def tokenize(self, texts: Sequence[str]) -> BatchEncoding:
        """The padded batch the Transformer module builds (int64 NumPy arrays [B, L])."""
        ids, mask, types = self._enc.tokenize(
            _texts(texts, "attn.models.SentenceTransformer.tokenize", "texts")[0]
        )
        return BatchEncoding(input_ids=ids, token_type_ids=types, attention_mask=mask)

    def encode(
        self,
        sentences: str | Sequence[str],
        batch_size: int = 32,
        show_progress_bar: bool | None = None,
        convert_to_tensor: bool = False,
        normalize_embeddings: bool = False,
    ) -> Any:
        """sentences -> [N, D] float32 embeddings ([D] for one str), in the order given, as
        sentence-transformers' encode (longest first in batches of batch_size; each embedding does not depend on
        its batch beyond rounding). normalize_embeddings: divide by the L2 norm (already so when the folder lists
        Normalize). convert_to_tensor: a torch tensor instead of NumPy. show_progress_bar is accepted and
        ignored."""
        fn = "attn.models.SentenceTransformer.encode"
        texts, single = _texts(sentences, fn, "sentences")
        if (
            not isinstance(batch_size, (int, np.integer))
            or isinstance(batch_size, bool)
            or batch_size < 1
        ):
            raise ValueError(f"{fn}: batch_size must be a positive int, got {batch_size!r}")
        try:
            emb = self._enc.encode(texts, int(batch_size))
        except ValueError as e:
            raise _reraise(e, fn) from None
        if normalize_embeddings:
            emb = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12).astype(
                np.float32
            )
        if single:
            emb = emb[0]
        if convert_to_tensor:
            import torch

            return torch.from_numpy(np.ascontiguousarray(emb))
        return emb


class HeadsReport:
    """What heads_report wrote. path: the page to open (out_dir/report.html for one text, out_dir/index.html for
    several); reports: each text's report.html; files: every file written; layers, heads: the model's; tokens: the
    text's tokens ([CLS] ... [SEP]); entropy: each head's mean row entropy in nats, a float64 array [layers, heads].
    For a list of texts, tokens and entropy are lists with one entry per text."""

    __slots__ = ("path", "reports", "files", "layers", "heads", "tokens", "entropy")

    def __init__(self, d: dict, single: bool) -> None:
        self.path = d["html"]
        self.reports = list(d["reports"])
        self.files = list(d["files"])
        self.layers = int(d["layers"])
        self.heads = int(d["heads"])
        entropy = [
            np.asarray(e, dtype=np.float64).reshape(self.layers, self.heads) for e in d["entropy"]
        ]
        self.tokens = d["tokens"][0] if single else list(d["tokens"])
        self.entropy = entropy[0] if single else entropy

    def __repr__(self) -> str:
        return (
            f"HeadsReport(path={self.path!r}, {len(self.reports)} text(s), {self.layers} layers x {self.heads} "
            f"heads, {len(self.files)} files)"
        )


def heads_report(
    model: Any,
    text: str | Sequence[str],
    out_dir: Any,
    *,
    tokenizer: Any = None,
    title: str | None = None,
) -> HeadsReport:
    """The HTML report of a BERT-family model's heads on text: exactly the files `attn viz --model DIR --text TEXT
    --out OUT` writes (the same C++ code, attn::viz::write_model_report).

    model: a HuggingFace folder (config.json, model.safetensors, tokenizer.json or vocab.txt) or a BertModel
    (read from a folder). text: one str -> out_dir/report.html (an overview of layers x heads by mean row entropy,
    heads flagged near one-hot or near uniform, linking to every head's heatmap with the tokens on both axes; no
    scripts, no network) and out_dir/layer{l}-head{h}.png and .svg; a list of str -> out_dir/text{i}/ holding the
    same per text, and out_dir/index.html. tokenizer: None (the model's folder), a Tokenizer or a folder. title:
    the page's title (default "attn viz: <folder name>"). The text is truncated to the tokenizer's
    model_max_length. Everything is computed before out_dir is created, so an error writes nothing.
    """
    fn = "attn.models.heads_report"
    texts, single = _texts(text, fn, "text")
    if not texts:
        raise ValueError(f"{fn}: text is an empty list: give a str or a list of at least one str")
    for i, t in enumerate(texts):
        if not t.strip():
            raise ValueError(
                f"{fn}: text{'' if single else f'[{i}]'} is empty (or only spaces): give the text "
                f"whose attention to draw"
            )
    if isinstance(model, BertModel):
        path = model._path
        bert = model
    elif isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if not os.path.isdir(path):
            raise FileNotFoundError(
                f"{fn}: model {path!r} is not a folder (give a HuggingFace folder or a BertModel)"
            )
        bert = None
    else:
        raise TypeError(
            f"{fn}: model must be a folder (str or os.PathLike) or an attn.models.BertModel, got "
            f"{type(model).__name__}"
        )
    if tokenizer is None:
        if path is None:
            raise ValueError(
                f"{fn}: tokenizer is None and the model was not read from a folder: pass tokenizer="
            )
        tokenizer = path
    if isinstance(tokenizer, (str, os.PathLike)):
        if not os.path.isdir(os.fspath(tokenizer)):
            raise FileNotFoundError(f"{fn}: tokenizer {os.fspath(tokenizer)!r} is not a folder")
        tokenizer = Tokenizer.from_pretrained(tokenizer)
    elif not isinstance(tokenizer, Tokenizer):
        raise TypeError(
            f"{fn}: tokenizer must be None, a folder or an attn.models.Tokenizer, got "
            f"{type(tokenizer).__name__}"
        )
    if not isinstance(out_dir, (str, os.PathLike)) or not os.fspath(out_dir):
        raise TypeError(f"{fn}: out_dir must be a non-empty str or os.PathLike, got {out_dir!r}")
    out = os.fspath(out_dir)
    if os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"{fn}: out_dir {out!r} exists and is not a folder")
    if title is not None and not isinstance(title, str):
        raise TypeError(f"{fn}: title must be a str or None, got {type(title).__name__}")
    if not hasattr(_m, "write_heads_report"):  # pragma: no cover - a build without the viz part
        raise ImportError(f"{fn}: this build of attn has no viz module")
    if bert is None:
        bert = BertModel.from_pretrained(path)
    try:
        d = _m.write_heads_report(bert._model, tokenizer._tok, texts, out, path or "", title or "")
    except ValueError as e:
        raise _reraise(e, fn) from None
    return HeadsReport(d, single)
