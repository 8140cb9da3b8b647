"""transformers' generate() with attn_implementation="attn" against "sdpa", side by side in one process (issue 51's
row): a tiny random-weight Llama config (built with from_config; no weights are downloaded), a long prompt and greedy
new tokens, bf16 by default. Prints the end-to-end time of each and their ratio, and checks that both produced the
same tokens.

    python3 bench/hf_generate.py [--prompt 8192] [--new 64] [--dtype bfloat16] [--threads 2] [--reps 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import transformers

import attn
import attn.transformers  # noqa: F401  (registers attn_implementation="attn")


def _model(implementation: str, dtype: torch.dtype) -> transformers.PreTrainedModel:
    config = transformers.LlamaConfig(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=16384,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(dtype).eval()
    model.config._attn_implementation = implementation  # the same weights for both implementations
    return model


def _generate(model, prompt: torch.Tensor, new: int) -> tuple[float, torch.Tensor]:
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(
            prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0
        )
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt", type=int, default=8192)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    attn.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    prompt = torch.randint(1, 512, (1, args.prompt), generator=torch.Generator().manual_seed(1))
    model = _model("sdpa", dtype)
    times: dict[str, list[float]] = {"sdpa": [], "attn": []}
    tokens = {}
    for _ in range(args.reps):
        for implementation in ("sdpa", "attn"):
            model.config._attn_implementation = implementation
            seconds, tokens[implementation] = _generate(model, prompt, args.new)
            times[implementation].append(seconds)
    same = torch.equal(tokens["sdpa"], tokens["attn"])
    sdpa, ours = statistics.median(times["sdpa"]), statistics.median(times["attn"])
    print(
        f"generate(), tiny Llama (2 layers, Hq 8, Hkv 2, D 32), {args.dtype}, prompt {args.prompt}, {args.new} new "
        f'tokens, {args.threads} threads: "sdpa" {sdpa:.2f} s, "attn" {ours:.2f} s; sdpa / attn {sdpa / ours:.2f}; '
        f"same tokens: {same}"
    )


if __name__ == "__main__":
    main()
