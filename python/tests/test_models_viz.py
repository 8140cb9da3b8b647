"""`attn viz --model DIR --text ... --out OUT` on all-MiniLM-L6-v2: the HTML report of every head.

The report must hold every layer x head (6 x 12) as a figure with its heatmap and the text's tokens, a PNG and an SVG
per head must be in OUT, and each head's mean row entropy in the report must equal the one computed from
transformers' attentions (BertModel, eager attention, output_attentions=True, float64 entropy) within 1e-4. Headless
Chromium (when installed) opens the report and must decode every head's image and show the colour map. Bad input
(a missing folder, an empty text) fails with one line and writes nothing.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

TEXT = "The cat sat on the mat; naïve café owners don't mind."
LAYERS, HEADS = 6, 12


def viz(attn_bin, *args):
    return subprocess.run(
        [attn_bin, "viz", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "ATTN_NUM_THREADS": os.environ.get("ATTN_NUM_THREADS", "2")},
    )


@pytest.fixture(scope="module")
def report(attn_bin, model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("viz") / "out"
    r = viz(attn_bin, "--model", model_dir, "--text", TEXT, "--out", out)
    assert r.returncode == 0, r.stderr
    return out, (out / "report.html").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def hf_attentions(model_dir):
    import torch
    from transformers import AutoTokenizer, BertModel

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = BertModel.from_pretrained(model_dir, attn_implementation="eager").eval()
    enc = tok(TEXT, return_tensors="pt")
    with torch.no_grad():
        att = model(**enc, output_attentions=True).attentions
    return tok.convert_ids_to_tokens(enc["input_ids"][0]), [a[0].double().numpy() for a in att]


def figures(page: str) -> dict[tuple[int, int], tuple[float, str]]:
    """(layer, head) -> (data-entropy, the figure's HTML)."""
    out = {}
    for m in re.finditer(
        r'<figure id="l(\d+)-h(\d+)" data-layer="\1" data-head="\2" data-entropy="([^"]+)">'
        r"(.*?)</figure>",
        page,
        re.S,
    ):
        out[int(m[1]), int(m[2])] = (float(m[3]), m[4])
    return out


def test_report_has_every_head_with_its_tokens(report, hf_attentions):
    out, page = report
    tokens, _ = hf_attentions
    figs = figures(page)
    assert sorted(figs) == [(layer, h) for layer in range(LAYERS) for h in range(HEADS)]
    for (layer, h), (_, body) in figs.items():
        assert re.search(
            r'<img width="\d+" src="data:image/png;base64,[A-Za-z0-9+/=]{100,}"', body
        ), (layer, h)
        assert f"layer {layer} &middot; head {h}" in body
        assert f'href="#l{layer}-h{h}"' in page, (
            f"the overview does not link to layer {layer} head {h}"
        )
    # The tokens, both axes (queries = keys for one text), once per layer above its heads.
    lines = [html.unescape(t) for t in re.findall(r'<p class="tokens">queries: (.*?)</p>', page)]
    assert lines == [" ".join(tokens)] * LAYERS
    assert "[CLS]" in tokens and "[SEP]" in tokens and "cafe" in tokens
    assert not re.search(r'(src|href)="https?:', page), "the report refers to the network"
    assert "<script" not in page


def test_png_and_svg_per_head(report):
    out, _ = report
    for layer in range(LAYERS):
        for h in range(HEADS):
            png = (out / f"layer{layer}-head{h}.png").read_bytes()
            assert png[:8] == b"\x89PNG\r\n\x1a\n", (layer, h)
            svg = (out / f"layer{layer}-head{h}.svg").read_text(encoding="utf-8")
            assert "<svg" in svg and "</svg>" in svg, (layer, h)
    assert len(list(out.glob("*.png"))) == len(list(out.glob("*.svg"))) == LAYERS * HEADS


def test_entropy_matches_transformers(report, hf_attentions):
    _, page = report
    _, att = hf_attentions
    figs = figures(page)
    cells = {
        (int(m[1]), int(m[2])): float(m[3])
        for m in re.finditer(r'<a class="[a-z]*" href="#l(\d+)-h(\d+)"[^>]*>([0-9.]+)</a>', page)
    }
    worst = 0.0
    for layer in range(LAYERS):
        p = att[layer]  # [H, L, L]
        ref = -(p * np.log(np.where(p > 0, p, 1.0))).sum(-1).mean(-1)  # mean over query rows, [H]
        for h in range(HEADS):
            worst = max(worst, abs(figs[layer, h][0] - ref[h]))
            # the overview, 3 decimals
            assert abs(cells[layer, h] - ref[h]) < 5e-4 + 1e-4, (
                layer,
                h,
                cells[layer, h],
                ref[h],
            )
    assert worst < 1e-4, worst
    # the flags follow the demo's thresholds (0.2 nats, 90% of log L)
    L = att[0].shape[-1]
    for layer in range(LAYERS):
        for h in range(HEADS):
            v = figs[layer, h][0]
            body = figs[layer, h][1]
            assert ("near one-hot" in body) == (v < 0.2), (layer, h, v)
            assert ("near uniform" in body) == (v >= 0.2 and v > 0.9 * np.log(L)), (layer, h, v)


def test_bad_input_writes_nothing(attn_bin, model_dir, tmp_path):
    for args, needle in [
        (["--model", tmp_path / "missing", "--text", "hi"], "missing"),
        (["--model", model_dir, "--text", ""], "--text"),
        (["--model", model_dir, "--text", "   "], "--text"),
    ]:
        out = tmp_path / "out"
        r = viz(attn_bin, *args, "--out", out)
        assert r.returncode != 0
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0], r.stderr
        assert not out.exists()


def read_png_rgb(path: Path) -> np.ndarray:
    """A non-interlaced 8-bit RGB/RGBA PNG (what Chromium writes) as [h, w, 3] uint8."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, w = 8, b"", 0
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and colour in (2, 6) and interlace == 0, (depth, colour, interlace)
            ch = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(h, 1 + w * ch)
    img = np.zeros((h, w * ch), np.int32)
    prev = np.zeros(w * ch, np.int32)
    for y in range(h):  # undo the per-row filters
        f, row = raw[y, 0], raw[y, 1:].astype(np.int32)
        if f == 0:
            cur = row
        elif f == 2:
            cur = (row + prev) & 255
        else:
            cur = np.zeros_like(row)
            for x in range(w * ch):
                a = cur[x - ch] if x >= ch else 0
                b, c = prev[x], (prev[x - ch] if x >= ch else 0)
                if f == 1:
                    pr = a
                elif f == 3:
                    pr = (a + b) // 2
                else:
                    pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                    pr = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                cur[x] = (row[x] + pr) & 255
        img[y] = prev = cur
    return img.reshape(h, w, ch)[:, :, :3].astype(np.uint8)


def test_every_head_renders_in_chromium(report, tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed (scripts/setup.sh installs it)")
    out, page = report
    # A copy with a probe: after load, the body records every figure whose image the browser decoded.
    probe = (
        "<script>window.addEventListener('load', () => { const ok = [...document.querySelectorAll("
        "'figure[data-head] img')].filter(i => i.complete && i.naturalWidth > 0).map(i => "
        "i.parentElement.id); document.body.setAttribute('data-rendered', ok.join(' ')); });</script>"
    )
    probed = tmp_path / "probed.html"
    probed.write_text(page.replace("</body>", probe + "</body>"), encoding="utf-8")
    flags = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--no-first-run",
        "--disable-extensions",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--virtual-time-budget=20000",
    ]
    dom = subprocess.run(
        flags + ["--dump-dom", probed.as_uri()], capture_output=True, text=True, timeout=180
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    m = re.search(r'data-rendered="([^"]*)"', dom.stdout)
    assert m, "the probe did not run"
    assert sorted(m[1].split()) == sorted(
        f"l{layer}-h{h}" for layer in range(LAYERS) for h in range(HEADS)
    )
    # The overview and the first layer's heads on screen: many colours, including the colour map's bright end.
    shot = tmp_path / "shot.png"
    r = subprocess.run(
        flags + ["--window-size=1280,2400", f"--screenshot={shot}", (out / "report.html").as_uri()],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0 and shot.is_file(), r.stderr[-2000:]
    img = read_png_rgb(shot)
    colours = np.unique(img.reshape(-1, 3)[::7], axis=0)
    assert len(colours) > 200, len(colours)
    # the map's top (viridis-like)
    yellowish = (img[:, :, 0] > 180) & (img[:, :, 1] > 180) & (img[:, :, 2] < 110)
    violet = (img[:, :, 0] < 90) & (img[:, :, 1] < 40) & (img[:, :, 2] > 60)  # its bottom
    assert yellowish.sum() > 500 and violet.sum() > 5000, (yellowish.sum(), violet.sum())
