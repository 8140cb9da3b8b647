"""attn.viz: pictures of attention weights (PNG or SVG, drawn by attn's C++ library with Cairo) and the
self-contained HTML report.

    attn.viz.heatmap(weights, x_labels=None, y_labels=None, path="attention.png")
        weights [Lq, Lk] -> one heatmap (queries down, keys across); [H, Lq, Lk] -> one panel per head.
    attn.viz.report(path, title=..., summary=..., series=..., layers=...)   -> the HTML report
    attn.viz.mean_row_entropy(weights [H, Lq, Lk]) -> [H] mean row entropy in nats

The report of a pretrained model's heads (what `attn viz --model DIR` writes) is attn.models.heads_report.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from . import _core

_viz = _core.viz

__all__ = ["heatmap", "mean_row_entropy", "report"]


def _labels(labels: Iterable[Any] | None) -> list:
    return [] if labels is None else [str(x) for x in labels]


def _host(weights: Any) -> Any:
    # torch tensors that require grad, or in bf16, are read as plain float arrays.
    if hasattr(weights, "detach"):
        weights = weights.detach()
        if str(weights.dtype) == "torch.bfloat16":
            weights = weights.float()
    return weights


def heatmap(
    weights: Any,
    x_labels: Sequence[Any] | None = None,
    y_labels: Sequence[Any] | None = None,
    path: str | None = "attention.png",
    *,
    title: str = "",
    x_axis: str = "key",
    y_axis: str = "query",
    vmin: float | None = None,
    vmax: float | None = None,
    cell_px: float = 0,
    scale: float = 1,
    format: str | None = None,
) -> bytes | None:
    """Draws attention weights as a heatmap.

    weights: [Lq, Lk] (one picture) or [H, Lq, Lk] (one panel per head, a shared colour bar), a NumPy array or a
    torch tensor. x_labels: Lk key tokens, y_labels: Lq query tokens (indices when None). The colour range is
    [0, 1] when every value lies in it, else the values' range, unless vmin / vmax are given; NaN and inf
    cells get a colour of their own. path: a .png or .svg file, written atomically (returns None); with
    path=None the encoded image is returned as bytes in `format` ('png' or 'svg').
    """
    w = _host(weights)
    args = (
        _labels(x_labels),
        _labels(y_labels),
        title,
        x_axis,
        y_axis,
        vmin,
        vmax,
        float(cell_px),
        float(scale),
    )
    if path is None:
        return _viz.render_heatmap(w, *args, format or "png")
    if format is not None and not str(path).lower().endswith("." + format.lower()):
        raise ValueError(f"attn.viz.heatmap: path {path!r} does not end in .{format}")
    _viz.write_heatmap(str(path), w, *args)
    return None


def mean_row_entropy(weights: Any) -> list:
    """Mean over query rows of -sum_j p_ij log p_ij for weights [H, Lq, Lk] (fully masked rows left out): [H]."""
    return _viz.mean_row_entropy(_host(weights))


def report(
    path: str | None,
    *,
    title: str = "attn report",
    summary: Mapping[str, Any] | None = None,
    series: Mapping[str, Iterable[tuple]] | None = None,
    layers: Iterable[Any] | None = None,
    one_hot_below_nats: float = 0.2,
    uniform_above_fraction: float = 0.9,
) -> str:
    """The HTML training report (no scripts, no network): a summary table, curves, and per layer the attention
    heatmaps and the heads' mean row entropy (heads flagged near one-hot or near uniform).

    summary: {"task": "reverse", ...} shown in order. series: {"loss/train": [(step, value), ...], ...}; the part
    before '/' names the chart. layers: (name, weights [H, Lq, Lk], q_tokens, k_tokens) tuples (tokens may be
    None). Writes `path` atomically when given; returns the HTML.
    """
    summ = [(str(k), str(v)) for k, v in (summary or {}).items()]
    ser = {str(k): [(float(s), float(v)) for s, v in pts] for k, pts in (series or {}).items()}
    lays = []
    for item in layers or []:
        name, w, qt, kt = item
        lays.append((str(name), _host(w), _labels(qt), _labels(kt)))
    html = _viz.render_report(
        title, summ, ser, lays, float(one_hot_below_nats), float(uniform_above_fraction)
    )
    if path is not None:
        _viz.write_file_atomically(str(path), html.encode("utf-8"))
    return html
