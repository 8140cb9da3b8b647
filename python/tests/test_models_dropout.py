"""attn.models.BertModel's dropout in training mode against transformers' own.

The two draw different patterns, so the outputs are compared in distribution: over several seeds, how far a training
forward moves last_hidden_state from the eval one (relative RMS) must agree within 10% between attn and transformers,
for all-MiniLM-L6-v2 (BERT's sites) and a tiny random DistilBERT built here (no dropout on the attention's output).
A site too many or too few moves that figure by far more (the test was run against both). Overrides, seeding and eval
mode are exact."""

from __future__ import annotations

import numpy as np
import pytest

models = pytest.importorskip("attn.models", reason="this build of attn has no models module")
torch = pytest.importorskip("torch", reason="PyTorch is not installed")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

SEEDS = range(6)


def _batch(vocab: int, seed: int = 3):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (4, 24), generator=g)
    mask = torch.ones(4, 24, dtype=torch.long)
    mask[1, 17:] = 0
    return ids, mask


def _hf_spread(hf, ids, mask) -> float:
    with torch.no_grad():
        ref = hf.eval()(input_ids=ids, attention_mask=mask).last_hidden_state
        hf.train()
        moved = []
        for s in SEEDS:
            torch.manual_seed(s)
            out = hf(input_ids=ids, attention_mask=mask).last_hidden_state
            moved.append(float((out - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()))
    return float(np.mean(moved))


def _attn_spread(m, ids, mask) -> float:
    ref = m.eval()(ids, mask).last_hidden_state
    m.train()
    moved = []
    for s in SEEDS:
        m.manual_seed(100 + s)
        out = m(ids, mask).last_hidden_state
        moved.append(float((out - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()))
    return float(np.mean(moved))


def _distilbert(folder, dropout: float, attention_dropout: float):
    config = transformers.DistilBertConfig(
        vocab_size=99,
        max_position_embeddings=64,
        dim=32,
        n_layers=2,
        n_heads=4,
        hidden_dim=64,
        dropout=dropout,
        attention_dropout=attention_dropout,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = transformers.DistilBertModel(config)
    # weights spread so that the heads attend sharply and dropping a weight shows
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "layer_norm" not in name.lower():
                p.normal_(0.0, 0.2)
    hf.save_pretrained(str(folder), safe_serialization=True)
    return hf


def test_minilm_training_forward_moves_as_much_as_transformers(model_dir):
    ids, mask = _batch(8000)
    hf = transformers.BertModel.from_pretrained(model_dir, attn_implementation="eager")
    theirs = _hf_spread(hf, ids, mask)
    ours = _attn_spread(models.BertModel.from_pretrained(model_dir), ids, mask)
    print(f"relative RMS moved by dropout: attn {ours:.4f}, transformers {theirs:.4f}")
    assert theirs > 0.05  # dropout really ran
    assert abs(ours / theirs - 1) < 0.1


@pytest.mark.parametrize("dropout,attention_dropout", [(0.3, 0.0), (0.0, 0.3)])
def test_distilbert_sites_move_as_much_as_transformers(tmp_path, dropout, attention_dropout):
    hf = _distilbert(tmp_path, dropout, attention_dropout)
    ids, mask = _batch(99)
    theirs = _hf_spread(hf, ids, mask)
    m = models.DistilBertModel.from_pretrained(tmp_path)
    assert m.config["hidden_dropout_prob"] == dropout
    assert m.config["attention_probs_dropout_prob"] == attention_dropout
    ours = _attn_spread(m, ids, mask)
    print(f"relative RMS moved by dropout: attn {ours:.4f}, transformers {theirs:.4f}")
    assert theirs > 0.05
    assert abs(ours / theirs - 1) < 0.1


def test_overrides_seeds_and_eval_mode(model_dir):
    ids, mask = _batch(8000)
    m = models.BertModel.from_pretrained(model_dir)
    assert m.config["hidden_dropout_prob"] == 0.1  # all-MiniLM-L6-v2's config
    ref = m(ids, mask).last_hidden_state
    m.train()
    m.manual_seed(1)
    a = m(ids, mask).last_hidden_state
    m.manual_seed(1)
    assert torch.equal(m(ids, mask).last_hidden_state, a)
    assert not torch.equal(a, ref)
    assert torch.equal(m.eval()(ids, mask).last_hidden_state, ref)
    off = models.BertModel.from_pretrained(
        model_dir, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
    )
    assert off.config["attention_probs_dropout_prob"] == 0.0
    assert torch.equal(off.train()(ids, mask).last_hidden_state, ref)
    with pytest.raises(ValueError, match=r"hidden_dropout_prob must be in \[0, 1\), got 1"):
        models.BertModel.from_pretrained(model_dir, hidden_dropout_prob=1.0)


def test_distilbert_overrides_take_distilberts_names(tmp_path):
    _distilbert(tmp_path, 0.1, 0.1)
    m = models.DistilBertModel.from_pretrained(tmp_path, dropout=0.25, attention_dropout=0.0)
    assert m.config["hidden_dropout_prob"] == 0.25
    assert m.config["attention_probs_dropout_prob"] == 0.0
    # the config's
    assert models.DistilBertModel.from_pretrained(tmp_path).config["hidden_dropout_prob"] == 0.1
    with pytest.raises(
        ValueError,
        match=r"DistilBertModel.from_pretrained: attention_dropout must be in \[0, 1\), "
        r"got 1.5",
    ):
        models.DistilBertModel.from_pretrained(tmp_path, attention_dropout=1.5)
    # BERT's name: refused, not silently unused
    with pytest.raises(TypeError, match="hidden_dropout_prob"):
        models.DistilBertModel.from_pretrained(tmp_path, hidden_dropout_prob=0.0)
