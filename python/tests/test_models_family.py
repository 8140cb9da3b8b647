"""attn.models on RoBERTa and DistilBERT against transformers, on tiny random models built here (no network).

Each model is transformers' own (RobertaModel, DistilBertModel, and their masked-LM task models, whose encoder sits
under "roberta." / "distilbert."), saved with save_pretrained(safe_serialization=True) and its weights redrawn with a
spread (std 0.2, LayerNorm scales in [0.5, 1.5]) large enough that the heads attend sharply and a wrong position,
name or activation moves the output by far more than the tolerance. The batches are padded (right and left), and
RoBERTa's holds a pad id inside a real row, so that its positions (counted from the ids, not the mask) matter.

last_hidden_state must be within 2e-5 of transformers' eager float32 run and of its float64 run on every position,
the pooler within 2e-5, the attention weights within 1e-5. A damaged checkpoint or config is refused naming the
problem, and nothing is half-loaded.
"""

from __future__ import annotations

import copy
import json
import os
import shutil

import numpy as np
import pytest

models = pytest.importorskip("attn.models", reason="this build of attn has no models module")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

VOCAB, HIDDEN, HEADS, LAYERS, MAXPOS = 99, 32, 4, 2, 64

# name -> (transformers config class and kwargs, base model class, task model class, encoder prefix in the task)
FAMILIES = {
    "roberta": (
        "RobertaConfig",
        dict(
            hidden_size=HIDDEN,
            num_hidden_layers=LAYERS,
            num_attention_heads=HEADS,
            intermediate_size=64,
            type_vocab_size=1,
            layer_norm_eps=1e-5,
        ),
        "RobertaModel",
        "RobertaForMaskedLM",
        "roberta.",
    ),
    "distilbert": (
        "DistilBertConfig",
        dict(dim=HIDDEN, n_layers=LAYERS, n_heads=HEADS, hidden_dim=64),
        "DistilBertModel",
        "DistilBertForMaskedLM",
        "distilbert.",
    ),
    # DistilBERT reads its activation from "activation" (not BERT's hidden_act): relu proves it does.
    "distilbert-relu": (
        "DistilBertConfig",
        dict(dim=HIDDEN, n_layers=LAYERS, n_heads=HEADS, hidden_dim=64, activation="relu"),
        "DistilBertModel",
        "DistilBertForMaskedLM",
        "distilbert.",
    ),
}


def spread(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm" in name or "layer_norm" in name:
                p.copy_(
                    torch.rand(p.shape, generator=g) + 0.5
                    if name.endswith("weight")
                    else 0.1 * torch.randn(p.shape, generator=g)
                )
            else:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))


def build(family: str, task: bool, folder) -> torch.nn.Module:
    cfg_cls, kwargs, base, head, _ = FAMILIES[family]
    config = getattr(transformers, cfg_cls)(
        vocab_size=VOCAB, max_position_embeddings=MAXPOS, **kwargs
    )
    config._attn_implementation = "eager"  # output_attentions needs the eager path
    torch.manual_seed(0)
    m = getattr(transformers, head if task else base)(config).eval()
    spread(m, seed=len(family) + task)
    m.save_pretrained(str(folder), safe_serialization=True)
    return m


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request):
    return request.param


@pytest.fixture(scope="module")
def saved(family, tmp_path_factory):
    """(folder, transformers' base model) for the family."""
    d = tmp_path_factory.mktemp(family)
    return str(d), build(family, False, d)


def padded_batch(pad: int, seed: int = 5):
    """[6, 37] ids with right and left padding (ids pad, mask 0), one full row, and for RoBERTa a pad id inside a
    real row (mask 1 there): HF numbers positions from the ids, so that token gets position pad_token_id."""
    rng = np.random.default_rng(seed)
    lengths = [37, 20, 9, 1, 30, 33]
    L = max(lengths)
    ids = np.full((len(lengths), L), pad, np.int64)
    mask = np.zeros((len(lengths), L), np.int64)
    for b, n in enumerate(lengths):
        row = rng.integers(3, VOCAB, n)
        row[0] = 0
        sl = slice(L - n, L) if b == 4 else slice(0, n)  # row 4 is left-padded
        ids[b, sl] = row
        mask[b, sl] = 1
    ids[5, 10] = pad  # a pad id among real tokens, attended to (mask 1)
    return ids, mask


def hf_run(model, ids, mask):
    with torch.no_grad():
        o = model(
            input_ids=torch.from_numpy(ids),
            attention_mask=torch.from_numpy(mask),
            output_attentions=True,
        )
        f64 = (
            copy.deepcopy(model)
            .double()(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
            .last_hidden_state.numpy()
        )
    return o, f64


def test_matches_transformers_on_a_padded_batch(family, saved):
    folder, hf = saved
    m = models.BertModel.from_pretrained(folder)
    assert m.config["model_type"] == hf.config.model_type
    ids, mask = padded_batch(hf.config.pad_token_id)
    o, f64 = hf_run(hf, ids, mask)
    got = m(input_ids=ids, attention_mask=mask, output_attentions=True)
    want = o.last_hidden_state.numpy()
    assert got.last_hidden_state.shape == want.shape == (*ids.shape, HIDDEN)
    diff, diff64 = (
        np.abs(got.last_hidden_state - want).max(),
        np.abs(got.last_hidden_state - f64).max(),
    )
    att = max(float(np.abs(a - w.numpy()).max()) for a, w in zip(got.attentions, o.attentions))
    print(
        f"{family}: max |diff| {diff:.3g} (f64 {diff64:.3g}; transformers f32 vs f64 {np.abs(want - f64).max():.3g}),"
        f" attentions {att:.3g}"
    )
    assert diff <= 2e-5 and diff64 <= 2e-5
    assert len(got.attentions) == LAYERS
    for a in got.attentions:
        assert (
            a.shape == (ids.shape[0], HEADS, ids.shape[1], ids.shape[1]) and a.dtype == np.float32
        )
    assert att <= 1e-5
    # The heads are sharp enough for the comparison to mean something.
    assert max(float(a.max()) for a in got.attentions) > 0.9
    if family == "roberta":
        assert got.pooler_output.shape == (ids.shape[0], HIDDEN)
        assert np.abs(got.pooler_output - o.pooler_output.numpy()).max() <= 2e-5
        assert got[1] is got.pooler_output
    else:
        assert got.pooler_output is None and "pooler_output" not in o
        assert got[1] is got.attentions  # transformers' tuple order without a pooler


def test_roberta_positions_come_from_the_ids(tmp_path):
    """The same ids with a pad id moved: a BERT-style 0..L-1 numbering would give the same output for the tokens
    before it; RoBERTa's shifts every later token, as transformers does."""
    hf = build("roberta", False, tmp_path)
    m = models.RobertaModel.from_pretrained(str(tmp_path))
    # pad_token_id 1 inside row 1
    ids = np.array([[0, 5, 7, 9, 11, 2], [0, 1, 7, 9, 11, 2]], np.int64)
    got = m(ids).last_hidden_state
    with torch.no_grad():
        want = hf(input_ids=torch.from_numpy(ids)).last_hidden_state.numpy()
    assert np.abs(got - want).max() <= 2e-5
    # tokens 7, 9, 11, 2 sit one position earlier in row 1
    assert np.abs(got[0, 2:] - got[1, 2:]).max() > 1e-2
    # Longer than max_position_embeddings - pad - 1 = 62 real tokens is refused, as transformers cannot run it.
    with pytest.raises(
        ValueError,
        match=r"attn\.models\.RobertaModel: .*row 0 has 63 tokens that are not "
        r"pad_token_id 1; roberta numbers them from 2, so at most 62",
    ):
        m(np.full((1, 63), 7, np.int64))
    # Pads beyond that length are fine: they all sit at position pad_token_id.
    long = np.concatenate([np.full((1, 62), 7), np.ones((1, 10))], axis=1).astype(np.int64)
    with torch.no_grad():
        want = hf(input_ids=torch.from_numpy(long)).last_hidden_state.numpy()
    assert np.abs(m(long).last_hidden_state - want).max() <= 2e-5


def test_task_checkpoint_loads_its_encoder(family, tmp_path):
    """A masked-LM checkpoint (encoder under "roberta." / "distilbert.", plus its head) gives the encoder's output."""
    hf = build(family, True, tmp_path)
    base = hf.roberta if family == "roberta" else hf.distilbert
    m = models.BertModel.from_pretrained(str(tmp_path))
    ids, mask = padded_batch(hf.config.pad_token_id, seed=7)
    with torch.no_grad():
        want = base(
            input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)
        ).last_hidden_state
    got = m(ids, mask)
    assert np.abs(got.last_hidden_state - want.numpy()).max() <= 2e-5
    assert got.pooler_output is None  # RobertaForMaskedLM has no pooler either


def test_torch_in_torch_out_and_token_types(family, saved):
    folder, hf = saved
    cls = models.RobertaModel if family == "roberta" else models.DistilBertModel
    m = cls.from_pretrained(folder)
    ids, mask = padded_batch(hf.config.pad_token_id)
    o = m(
        input_ids=torch.from_numpy(ids),
        attention_mask=torch.from_numpy(mask),
        output_attentions=True,
    )
    assert (
        isinstance(o.last_hidden_state, torch.Tensor) and o.last_hidden_state.dtype == torch.float32
    )
    assert all(isinstance(a, torch.Tensor) for a in o.attentions)
    n = m(ids.astype(np.int32), mask.astype(bool))
    np.testing.assert_array_equal(n.last_hidden_state, o.last_hidden_state.numpy())
    # All-zero token_type_ids (what a WordPiece tokenizer gives) change nothing; DistilBERT has no others.
    z = m(ids, mask, np.zeros_like(ids))
    np.testing.assert_array_equal(z.last_hidden_state, n.last_hidden_state)
    if family == "roberta":
        with pytest.raises(
            ValueError, match=r"token_type_ids holds 1 at flat index 0, outside \[0, 1\)"
        ):
            m(ids, mask, np.ones_like(ids))
    else:
        with pytest.raises(
            ValueError, match=r"attn\.models\.DistilBertModel: distilbert has no token types"
        ):
            m(ids, mask, np.ones_like(ids))


# ---- damaged checkpoints and configs ----


def damaged_copy(folder, dst, edit=None, config=None):
    """A copy of the folder whose tensors went through edit(dict) and whose config.json through config(dict)."""
    from safetensors.numpy import load_file, save_file

    shutil.copytree(folder, dst)
    if edit:
        t = load_file(os.path.join(folder, "model.safetensors"))
        edit(t)
        save_file(t, os.path.join(dst, "model.safetensors"))
    if config:
        path = os.path.join(dst, "config.json")
        with open(path) as f:
            c = json.load(f)
        config(c)
        with open(path, "w") as f:
            json.dump(c, f)
    return str(dst)


# family -> (a tensor, the config key of the activation)
NAMES = {
    "roberta": ("encoder.layer.1.attention.self.key.weight", "hidden_act"),
    "distilbert": ("transformer.layer.1.attention.k_lin.weight", "activation"),
    "distilbert-relu": ("transformer.layer.1.attention.k_lin.weight", "activation"),
}


def test_damaged_checkpoint_is_refused_naming_the_problem(family, saved, tmp_path):
    folder, _ = saved
    name, act = NAMES[family]
    d = damaged_copy(folder, tmp_path / "missing", edit=lambda t: t.pop(name))
    with pytest.raises(ValueError, match=rf"missing 1: {name}\b.*nothing was loaded"):
        models.BertModel.from_pretrained(d)

    def misshape(t):
        t[name] = t[name][:, :5].copy()

    d = damaged_copy(folder, tmp_path / "misshapen", edit=misshape)
    with pytest.raises(ValueError, match=rf"{name} is \[32, 5\], expected \[32, 32\]"):
        models.BertModel.from_pretrained(d)

    extra_name = name.replace("layer.1.", "layer.2.")

    def extra(t):
        t[extra_name] = np.zeros((HIDDEN, HIDDEN), np.float32)

    d = damaged_copy(folder, tmp_path / "extra", edit=extra)
    with pytest.raises(ValueError, match=rf"unexpected 1: {extra_name}"):
        models.BertModel.from_pretrained(d)

    d = damaged_copy(folder, tmp_path / "act", config=lambda c: c.update({act: "mish"}))
    with pytest.raises(ValueError, match=rf"{act} 'mish' is not supported"):
        models.BertModel.from_pretrained(d)

    d = damaged_copy(folder, tmp_path / "type", config=lambda c: c.update(model_type="xlnet"))
    with pytest.raises(
        ValueError, match=r"model_type 'xlnet' is not supported \(bert.*roberta.*distilbert\)"
    ):
        models.BertModel.from_pretrained(d)


def test_roberta_config_refusals(tmp_path):
    folder = tmp_path / "good"
    build("roberta", False, folder)
    d = damaged_copy(
        folder, tmp_path / "pos", config=lambda c: c.update(position_embedding_type="relative_key")
    )
    with pytest.raises(
        ValueError, match=r"position_embedding_type 'relative_key' is not supported"
    ):
        models.RobertaModel.from_pretrained(d)
    d = damaged_copy(folder, tmp_path / "dec", config=lambda c: c.update(is_decoder=True))
    with pytest.raises(ValueError, match=r"is_decoder is not supported"):
        models.BertModel.from_pretrained(d)
    # attn has no byte-level BPE: a RoBERTa tokenizer.json is refused, not misread.
    with open(os.path.join(folder, "tokenizer.json"), "w") as f:
        json.dump({"version": "1.0", "model": {"type": "BPE", "vocab": {}, "merges": []}}, f)
    with pytest.raises(ValueError, match=r"model\.type is 'BPE'; only WordPiece is supported"):
        models.Tokenizer.from_pretrained(str(folder))
    # transformers' class names read only their own model_type.
    with pytest.raises(
        ValueError,
        match=r"DistilBertModel\.from_pretrained: .*model_type 'roberta', not "
        r"'distilbert'",
    ):
        models.DistilBertModel.from_pretrained(str(folder))


def test_strict_load_leaves_the_model_unchanged(family, saved):
    folder, hf = saved
    m = models.BertModel.from_pretrained(folder)
    ids, mask = padded_batch(hf.config.pad_token_id)
    before = m(ids, mask).last_hidden_state
    sd = m.state_dict()
    assert set(sd) == {
        k for k in hf.state_dict() if not k.endswith(("position_ids", "token_type_ids"))
    }
    name = NAMES[family][0]
    bad = dict(sd)
    bad[name] = np.zeros_like(sd[name])  # fits, so it would load
    del bad["embeddings.LayerNorm.bias"]
    with pytest.raises(
        ValueError, match=r"missing 1: embeddings\.LayerNorm\.bias.*nothing was loaded"
    ):
        m.load_state_dict(bad)
    np.testing.assert_array_equal(m(ids, mask).last_hidden_state, before)
    bad["embeddings.LayerNorm.bias"] = sd["embeddings.LayerNorm.bias"]
    m.load_state_dict(bad)
    assert np.abs(m(ids, mask).last_hidden_state - before).max() > 1e-3
