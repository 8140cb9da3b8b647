#!/usr/bin/env python3
"""Writes the PyTorch parity fixtures of attn::nn (tests/fixtures/torch/<case>/*.npy + config.json).

Run where torch is installed (pip install torch numpy):  python3 tests/make_torch_fixtures.py
Each case builds a torch module, fills its parameters and inputs with values that are exact in float32
(so that attn's f32 and f64 runs see the same numbers), computes in float64 with dropout 0 in training mode
(which keeps PyTorch off its inference fast path), and saves:
  config.json            the module type and constructor arguments, the call's options
  param.<name>.npy       the state dict (PyTorch names), float32 (exact)
  input.<name>.npy       inputs, float32 (exact); mask.<name>.npy masks (bool: True = not allowed)
  out.npy                the output (float64); weights.npy the attention weights when asked
  dout.npy               the upstream gradient (float32, exact); grad_input.<name>.npy, grad.<param>.npy the
                         gradients (float64)
attn's tests/nn/torch_parity_test.cc reads them.
"""

import json
import os
import shutil

import numpy as np
import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "torch")
torch.manual_seed(1234)


def f32_exact(shape, scale=1.0):
    return (torch.randn(*shape, dtype=torch.float32) * scale).to(torch.float64)


def fill_params(module, scale):
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_((1.0 + 0.2 * torch.randn(*p.shape, dtype=torch.float32)).to(torch.float64))
            else:
                p.copy_(f32_exact(p.shape, scale))


def exact32(t):
    """Values drawn exact in float32 are stored as float32 (half the bytes, nothing lost)."""
    a = t.detach().numpy()
    b = a.astype(np.float32)
    assert np.array_equal(b.astype(np.float64), a)
    return b


def save(case, config, module, inputs, masks, out, weights=None):
    d = os.path.join(ROOT, case)
    os.makedirs(d, exist_ok=True)
    dout = f32_exact(out.shape)
    out.backward(dout)
    np.save(os.path.join(d, "out.npy"), out.detach().numpy())
    np.save(os.path.join(d, "dout.npy"), exact32(dout))
    if weights is not None:
        np.save(os.path.join(d, "weights.npy"), weights.detach().numpy())
    for name, t in inputs.items():
        np.save(os.path.join(d, f"input.{name}.npy"), exact32(t))
        np.save(os.path.join(d, f"grad_input.{name}.npy"), t.grad.numpy())
    for name, m in masks.items():
        np.save(
            os.path.join(d, f"mask.{name}.npy"), m.numpy() if m.dtype == torch.bool else exact32(m)
        )
    for name, p in module.named_parameters():
        np.save(os.path.join(d, f"param.{name}.npy"), exact32(p))
        np.save(os.path.join(d, f"grad.{name}.npy"), p.grad.numpy())
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f, indent=1, sort_keys=True)


def padding(B, L, lengths):
    m = torch.zeros(B, L, dtype=torch.bool)
    for b, n in enumerate(lengths):
        m[b, n:] = True
    return m


def mha_cases():
    # Self-attention, sequence-first, key padding + a bool attn_mask, per-head weights.
    E, H, L, B = 16, 4, 5, 2
    m = torch.nn.MultiheadAttention(E, H, dtype=torch.float64)
    fill_params(m, 0.3)
    x = f32_exact((L, B, E)).requires_grad_()
    kpm = padding(B, L, [5, 3])
    am = torch.zeros(L, L, dtype=torch.bool)
    am[0, 2] = True
    out, w = m(
        x, x, x, key_padding_mask=kpm, attn_mask=am, need_weights=True, average_attn_weights=False
    )
    save(
        "mha_self",
        {
            "module": "MultiheadAttention",
            "embed_dim": E,
            "num_heads": H,
            "batch_first": False,
            "self": True,
            "average_attn_weights": False,
        },
        m,
        {"x": x},
        {"key_padding_mask": kpm, "attn_mask": am},
        out,
        w,
    )

    # Cross-attention, batch-first, kdim/vdim (q/k/v_proj_weight), float attn_mask, averaged weights.
    Lq, Lk, kdim, vdim = 3, 6, 10, 12
    m = torch.nn.MultiheadAttention(
        E, H, kdim=kdim, vdim=vdim, batch_first=True, dtype=torch.float64
    )
    fill_params(m, 0.3)
    q = f32_exact((B, Lq, E)).requires_grad_()
    k = f32_exact((B, Lk, kdim)).requires_grad_()
    v = f32_exact((B, Lk, vdim)).requires_grad_()
    am = f32_exact((Lq, Lk), 0.5)
    out, w = m(q, k, v, attn_mask=am, need_weights=True, average_attn_weights=True)
    save(
        "mha_cross_kdim_vdim",
        {
            "module": "MultiheadAttention",
            "embed_dim": E,
            "num_heads": H,
            "kdim": kdim,
            "vdim": vdim,
            "batch_first": True,
            "self": False,
            "average_attn_weights": True,
        },
        m,
        {"query": q, "key": k, "value": v},
        {"attn_mask": am},
        out,
        w,
    )


def encoder_cases():
    E, H, F, L, B = 16, 4, 32, 6, 2
    for act in ["relu", "gelu"]:
        for norm_first in [False, True]:
            batch_first = norm_first  # both layouts covered
            layer = torch.nn.TransformerEncoderLayer(
                E,
                H,
                F,
                dropout=0.0,
                activation=act,
                batch_first=batch_first,
                norm_first=norm_first,
                dtype=torch.float64,
            )
            fill_params(layer, 0.25)
            shape = (B, L, E) if batch_first else (L, B, E)
            x = f32_exact(shape).requires_grad_()
            kpm = padding(B, L, [6, 4])
            out = layer(x, src_key_padding_mask=kpm)
            case = f"encoder_{act}_{'pre' if norm_first else 'post'}norm"
            save(
                case,
                {
                    "module": "TransformerEncoderLayer",
                    "d_model": E,
                    "nhead": H,
                    "dim_feedforward": F,
                    "activation": act,
                    "batch_first": batch_first,
                    "norm_first": norm_first,
                },
                layer,
                {"src": x},
                {"src_key_padding_mask": kpm},
                out,
            )


def decoder_cases():
    E, H, F, Lt, Lm, B = 16, 4, 32, 5, 7, 2
    for norm_first in [False, True]:
        layer = torch.nn.TransformerDecoderLayer(
            E,
            H,
            F,
            dropout=0.0,
            activation="relu",
            batch_first=True,
            norm_first=norm_first,
            dtype=torch.float64,
        )
        fill_params(layer, 0.25)
        tgt = f32_exact((B, Lt, E)).requires_grad_()
        mem = f32_exact((B, Lm, E)).requires_grad_()
        causal = torch.nn.Transformer.generate_square_subsequent_mask(
            Lt, dtype=torch.float64
        ) == -float("inf")
        tkpm = padding(B, Lt, [5, 4])
        mkpm = padding(B, Lm, [5, 7])
        out = layer(
            tgt,
            mem,
            tgt_mask=causal,
            tgt_key_padding_mask=tkpm,
            memory_key_padding_mask=mkpm,
            tgt_is_causal=True,
        )
        case = f"decoder_causal_padding_{'pre' if norm_first else 'post'}norm"
        save(
            case,
            {
                "module": "TransformerDecoderLayer",
                "d_model": E,
                "nhead": H,
                "dim_feedforward": F,
                "activation": "relu",
                "batch_first": True,
                "norm_first": norm_first,
            },
            layer,
            {"tgt": tgt, "memory": mem},
            {"tgt_mask": causal, "tgt_key_padding_mask": tkpm, "memory_key_padding_mask": mkpm},
            out,
        )


if __name__ == "__main__":
    if os.path.isdir(ROOT):
        shutil.rmtree(ROOT)
    mha_cases()
    encoder_cases()
    decoder_cases()
    total = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(ROOT) for f in fs)
    print(f"wrote {ROOT} ({total / 1024:.0f} KiB), torch {torch.__version__}")
