"""attn.viz: heatmaps (PNG / SVG) and the HTML report from the bindings."""

import numpy as np
import pytest

import attn

viz = pytest.importorskip("attn.viz", reason="this build of attn has no viz module")


def _weights(rng, h=2, lq=4, lk=6):
    q = rng.standard_normal((h, lq, 8))
    k = rng.standard_normal((h, lk, 8))
    return attn.attention(q, k, k, causal=True, return_weights=True)[1]


def test_heatmap_png_and_svg_files(rng, tmp_path):
    w = _weights(rng)
    png = tmp_path / "head.png"
    viz.heatmap(w[0], list("abcdef"), list("ABCD"), png, title="head 0")
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 500
    svg = tmp_path / "grid.svg"
    viz.heatmap(w, path=svg)
    text = svg.read_text()
    assert text.lstrip().startswith("<?xml") and "<svg" in text and "head 1" in text


def test_heatmap_bytes_labels_and_torch(rng):
    w = _weights(rng)
    svg = viz.heatmap(w[0], [f"tok{i}" for i in range(6)], None, path=None, format="svg").decode()
    assert "tok5" in svg  # the key labels are drawn as text


def test_heatmap_of_torch_tensors(rng):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    w = _weights(rng)
    t = torch.tensor(w[0], requires_grad=True)
    assert viz.heatmap(t, path=None)[:4] == b"\x89PNG"
    assert viz.heatmap(t.to(torch.bfloat16), path=None)[:4] == b"\x89PNG"


def test_heatmap_bad_input(rng, tmp_path):
    with pytest.raises(ValueError, match="weights must be"):
        viz.heatmap(np.zeros(3), path=None)
    with pytest.raises(ValueError, match="png or .svg"):
        viz.heatmap(np.zeros((2, 2)), path=tmp_path / "x.jpg")
    with pytest.raises(ValueError):
        viz.heatmap(np.zeros((2, 2)), list("abc"), path=None)  # 3 labels for 2 keys
    with pytest.raises(TypeError):
        viz.heatmap("not an array", path=None)


def test_entropy_and_report(rng, tmp_path):
    w = _weights(rng, h=2, lq=4, lk=4)
    uniform = np.full((1, 3, 5), 0.2)
    np.testing.assert_allclose(viz.mean_row_entropy(uniform), [np.log(5)], rtol=1e-12)
    one_hot = np.zeros((1, 3, 5))
    one_hot[..., 0] = 1
    np.testing.assert_allclose(viz.mean_row_entropy(one_hot), [0.0], atol=1e-12)
    path = tmp_path / "report.html"
    html = viz.report(
        path,
        title="my run",
        summary={"task": "reverse", "accuracy": 0.97},
        series={"loss/train": [(0, 2.0), (10, 0.5)], "loss/held-out": [(0, 2.1), (10, 0.7)]},
        layers=[("layer 0", w, list("abcd"), list("abcd"))],
    )
    assert path.read_text() == html
    assert (
        "my run" in html
        and "reverse" in html
        and "layer 0" in html
        and "data:image/png;base64" in html
    )
