"""Reference helpers the nn tests share (torch compositions; imported after the tests' importorskip of torch)."""

import torch


def rel(a, b):
    """max |a - b| relative to max(1, max |b|), in float64; the shapes must agree."""
    a = torch.as_tensor(a).detach().double()
    b = torch.as_tensor(b).detach().double()
    assert a.shape == b.shape, (a.shape, b.shape)
    return float((a - b).abs().max() / max(1.0, float(b.abs().max())))


def fro(a, b):
    """||a - b|| / ||b|| (Frobenius), in float64."""
    a, b = torch.as_tensor(a).detach().double(), torch.as_tensor(b).detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def within_twice(ours: dict, theirs: dict, ref: dict, slack: float, label: str = "") -> float:
    """DESIGN.md's bf16 contract, per tensor: attn's error against ref (Frobenius) at most twice the plain bf16
    implementation's (torch's) plus slack; prints both; returns attn's worst error (the caller checks the rounding
    happened at all)."""
    worst = 0.0
    for name, r in ref.items():
        ea, et = fro(ours[name], r), fro(theirs[name], r)
        print(f"{label}{name}: attn {ea:.3g}, torch {et:.3g}")
        assert ea <= 2 * et + slack, f"{label}{name}: attn {ea:.3g} against torch's {et:.3g}"
        worst = max(worst, ea)
    return worst


def rope(x, offset=0, interleaved=False, base=10000.0):
    """x [N, H, L, hd] rotated at positions offset .. offset + L - 1: pairs (i, i + hd/2) (GPT-NeoX) or, interleaved,
    (2i, 2i + 1). Only which dims pair up is observable (q . k ignores a common permutation of hd), so the tests
    tell the layouts apart."""
    L, hd = x.shape[-2], x.shape[-1]
    inv = base ** (-torch.arange(0, hd // 2, dtype=torch.float64) * 2 / hd)
    ang = (offset + torch.arange(L, dtype=torch.float64))[:, None] * inv[None, :]  # [L, hd/2]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
    a, b = x[..., : hd // 2], x[..., hd // 2 :]
    return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)
