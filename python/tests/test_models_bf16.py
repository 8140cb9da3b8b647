"""bf16 inference (BertModel.from_pretrained(path, dtype='bfloat16'), attn.nn modules with dtype='bfloat16')
against float32, against float64 and against torch's own bf16 (model.to(torch.bfloat16)) of the same weights.

The rule (DESIGN.md, FlashAttention's): attn's bf16 error against float64 at most twice that of a plain bf16
implementation, here torch's bf16 of the same model on the same inputs. Measured on all-MiniLM-L6-v2 (AMD EPYC Zen 3,
AVX2: bf16 products widened to f32 for sgemm), real tokens of the HARD_TEXTS batch (64 tokens at most):
last_hidden_state max abs error vs f64 attn 0.040 / torch 0.042, relative Frobenius 1.07e-2 / 1.35e-2; mean-pooled
sentence embeddings at cosine >= 0.99992 of attn's float32 (min over the batch); one encoder layer (64 wide, 4 heads,
GELU) relative Frobenius vs f64 attn 4.6e-3 / torch 5.5e-3 post-norm, 5.6e-3 / 7.0e-3 pre-norm.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
from minilm import HARD_TEXTS

import attn
import attn.nn as ann
from attn import models

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def _fro(a, b):
    a, b = torch.as_tensor(a).double(), torch.as_tensor(b).double()
    return float((a - b).norm() / b.norm())


def _max_abs(a, b, keep):
    d = (torch.as_tensor(a).double() - torch.as_tensor(b).double()).abs()
    return float(d[keep].max())


@pytest.fixture(scope="module")
def batch(model_dir):
    tok = models.Tokenizer.from_pretrained(model_dir)
    enc = tok(HARD_TEXTS, padding=True, truncation=True, max_length=64, return_tensors="pt")
    return enc["input_ids"].long(), enc["attention_mask"].long()


@pytest.fixture(scope="module")
def runs(model_dir, batch):
    """last_hidden_state and pooler_output of attn f32, attn bf16, torch bf16 and torch f64 on one batch."""
    ids, mask = batch
    a32 = models.BertModel.from_pretrained(model_dir)
    a16 = models.BertModel.from_pretrained(model_dir, dtype=torch.bfloat16)
    hf = transformers.BertModel.from_pretrained(model_dir, attn_implementation="eager").eval()
    with torch.no_grad():
        t64 = copy.deepcopy(hf).double()(ids, attention_mask=mask)
        t16 = copy.deepcopy(hf).to(torch.bfloat16)(ids, attention_mask=mask)
    return dict(a32=a32(ids, mask), a16=a16(ids, mask), t16=t16, t64=t64, model=a16)


def test_bf16_model_reports_its_dtype_and_returns_bf16(runs, batch, model_dir):
    o = runs["a16"]
    assert runs["model"].dtype == "bfloat16"
    assert models.BertModel.from_pretrained(model_dir).dtype == "float32"
    assert o.last_hidden_state.dtype == torch.bfloat16 and o.pooler_output.dtype == torch.bfloat16
    ids, mask = batch
    n = runs["model"](ids.numpy(), mask.numpy(), output_attentions=True)
    assert n.last_hidden_state.dtype == np.float32  # NumPy has no bf16: float32 holding bf16 values
    assert torch.equal(
        torch.from_numpy(n.last_hidden_state).bfloat16().float(), o.last_hidden_state.float()
    )
    att = n.attentions[0]
    assert att.dtype == np.float32 and np.allclose(att.sum(-1), 1.0, atol=1e-2)


def test_bf16_within_twice_torch_bf16_of_float64(runs, batch):
    """Real tokens only (padded positions are ill-conditioned; test_models_bert.py says why)."""
    keep = batch[1].bool()
    a16, t16, t64 = runs["a16"], runs["t16"], runs["t64"]
    ref = t64.last_hidden_state
    err_a = _max_abs(a16.last_hidden_state, ref, keep)
    err_t = _max_abs(t16.last_hidden_state, ref, keep)
    fro_a = _fro(a16.last_hidden_state[keep], ref[keep])
    fro_t = _fro(t16.last_hidden_state[keep], ref[keep])
    print(
        f"last_hidden_state vs f64: max abs attn {err_a:.3g} torch {err_t:.3g}; fro attn {fro_a:.3g} "
        f"torch {fro_t:.3g}"
    )
    assert 0 < err_a <= 2 * err_t and fro_a <= 2 * fro_t
    # rounded (not secretly float32: that is ~1e-6), and within bf16's error
    assert 1e-3 < fro_a <= 3e-2
    pa, pt = _fro(a16.pooler_output, t64.pooler_output), _fro(t16.pooler_output, t64.pooler_output)
    assert pa <= max(2 * pt, 1e-2), (pa, pt)


def test_bf16_sentence_embeddings_against_float32(runs, batch):
    """Mean pooling over the real tokens, normalised (all-MiniLM-L6-v2's sentence-transformers pipeline)."""
    mask = batch[1].double().unsqueeze(-1)

    def embed(h):
        e = (torch.as_tensor(h).double() * mask).sum(1) / mask.sum(1).clamp(min=1)
        return e / e.norm(dim=-1, keepdim=True)

    cos = (embed(runs["a16"].last_hidden_state) * embed(runs["a32"].last_hidden_state)).sum(-1)
    print(f"sentence embeddings bf16 vs f32: min cosine {float(cos.min()):.6f}")
    assert float(cos.min()) >= 0.9995


def _torch_layer(norm_first):
    g = torch.Generator().manual_seed(3)
    layer = torch.nn.TransformerEncoderLayer(
        64, 4, 160, dropout=0.0, activation="gelu", batch_first=True, norm_first=norm_first
    ).eval()
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(
                0.2 * torch.randn(p.shape, generator=g)
                + (1.0 if p.dim() == 1 and p.shape[0] == 64 else 0)
            )
    return layer


@pytest.mark.parametrize("norm_first", [False, True])
def test_nn_encoder_layer_bf16_within_twice_torch_bf16(norm_first):
    layer = _torch_layer(norm_first)
    mine = ann.TransformerEncoderLayer(
        64,
        4,
        160,
        dropout=0.0,
        activation="gelu",
        batch_first=True,
        norm_first=norm_first,
        dtype="bfloat16",
    ).eval()
    mine.load_state_dict(layer.state_dict())
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4, 37, 64, generator=g).bfloat16()
    pad = torch.zeros(4, 37, dtype=torch.bool)
    pad[1, 30:] = True
    with torch.no_grad():
        ref = copy.deepcopy(layer).double()(x.double(), src_key_padding_mask=pad)
        theirs = copy.deepcopy(layer).to(torch.bfloat16)(x, src_key_padding_mask=pad)
    ours = mine(x, src_key_padding_mask=pad)
    assert ours.dtype == torch.bfloat16
    keep = ~pad
    ea, et = _fro(ours[keep], ref[keep]), _fro(theirs[keep], ref[keep])
    print(f"norm_first={norm_first}: fro vs f64 attn {ea:.3g} torch {et:.3g}")
    assert 1e-4 < ea <= 2 * et
    with pytest.raises(ValueError, match="inference only"):
        mine.backward(torch.ones_like(ours))


def test_nn_linear_bf16_is_float32_rounded_once():
    g = torch.Generator().manual_seed(7)
    lin = ann.Linear(67, 45, dtype=torch.bfloat16)
    w, b = torch.randn(45, 67, generator=g).bfloat16(), torch.randn(45, generator=g).bfloat16()
    lin.load_state_dict({"weight": w, "bias": b})
    x = torch.randn(3, 11, 67, generator=g).bfloat16()
    y = lin(x)
    assert y.dtype == torch.bfloat16
    want = x.double() @ w.double().T + b.double()
    # f32 accumulation then one rounding: within one bf16 half-ulp of the exact product, plus f32's error
    assert float(((y.double() - want).abs() / (want.abs() + 1e-3)).max()) <= 2**-8 + 1e-5
    assert "bf16: " in attn._core.nn.gemm_kernels()
