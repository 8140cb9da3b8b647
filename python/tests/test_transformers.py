"""attn.transformers: attn_implementation="attn" against transformers' own attention.

Tiny random-weight decoders (Llama with GQA, Qwen2 with MQA, Mistral with a sliding window shorter than the prompt,
Gemma 2 with logit softcapping and alternating sliding/global layers, GPT-2, GPT-OSS with learned sinks), each built
with from_config, saved with save_pretrained and loaded twice: with "attn" and with transformers' reference for the
family ("sdpa"; "eager" for Gemma 2 and GPT-OSS, which sdpa cannot run: softcap, sinks). float32, a batch of three
prompts with left padding. Each must give: the same forward logits on the real tokens to 1e-5 relative (the norm of
the difference over the norm, over every real position); the same 32 greedy tokens with a DynamicCache and with a
StaticCache, each step's logits to 1e-5; one training step's gradients to 1e-4 per parameter. The real
all-MiniLM-L6-v2 (BERT, bidirectional, right padding) is held to the same bounds. A recorder proves every layer ran
attn's kernel (no fallback) and that the layers got the mask as attn's options (AttnMask), not a dense one.

The bounds have room: attn reads ~1e-6 from sdpa here, as sdpa reads from eager. They still catch a broken mapping:
these tests fail with the window one key wider, the softcap, the sinks, the scaling, the padding or the dropout
dropped, the cache's key offset ignored, or a None mask's causality aligned bottom-right (each tried once).
"""

from __future__ import annotations

import collections
import dataclasses
import subprocess
import sys
from typing import Callable

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", minversion="5.0")

from minilm import HARD_TEXTS  # noqa: E402
from transformers import AttentionInterface, AttentionMaskInterface  # noqa: E402
from transformers.integrations.sdpa_attention import sdpa_attention_forward  # noqa: E402
from transformers.masking_utils import (  # noqa: E402
    and_masks,
    bidirectional_mask_function,
    causal_mask_function,
    chunked_causal_mask_function,
    sdpa_mask,
    sliding_window_bidirectional_mask_function,
    sliding_window_causal_mask_function,
)

import attn  # noqa: E402
import attn.torch  # noqa: E402
import attn.transformers as attn_hf  # noqa: E402

RTOL_LOGITS = 1e-5
RTOL_GRADS = 1e-4
NEW_TOKENS = 32
VOCAB = 128
WINDOW = 5  # Mistral's, Gemma 2's and GPT-OSS's sliding window: shorter than the 12-token prompts
LEFT_PADS = (0, 3, 7)  # per prompt of the batch [3, 12]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """The norm of the difference over the norm of the reference b."""
    return float((a - b).norm() / b.norm())


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models: one torch thread (attn has one from conftest), so a loaded machine does not stall the tests."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ---- what ran: the registered function's calls, attn's kernel calls, the fallbacks ------------------------------


class Recorder:
    """Counts, while installed, the calls of the registered "attn" attention function (by the kind of mask each
    got: 'AttnMask(left, right)', 'Tensor' or 'None', and whether it was a prefill, Lq > 1), the calls of
    attn.torch.attention (attn's kernels; with the key's heads and the options) and of the sdpa fallback."""

    def __init__(self) -> None:
        self.layers: collections.Counter = collections.Counter()
        self.kernel_calls: list = []
        self.fallbacks = 0

    def kinds(self, prefill: bool = True) -> set:
        return {kind for kind, is_prefill in self.layers if is_prefill == prefill}

    def check_all_ran_attn(self) -> None:
        n_layers = sum(self.layers.values())
        assert n_layers > 0, "the model never called the 'attn' attention function"
        assert len(self.kernel_calls) == n_layers, (len(self.kernel_calls), n_layers)
        assert self.fallbacks == 0, f"{self.fallbacks} calls fell back to sdpa"


@pytest.fixture
def recorder(monkeypatch) -> Recorder:
    rec = Recorder()
    registered, kernel, fallback = (
        attn_hf.attention_forward,
        attn.torch.attention,
        attn_hf.sdpa_attention_forward,
    )

    def layer(module, query, key, value, attention_mask, **kwargs):
        if isinstance(attention_mask, attn_hf.AttnMask):
            kind = f"AttnMask{attention_mask.window}"
        else:
            kind = type(attention_mask).__name__ if attention_mask is not None else "None"
        rec.layers[(kind, query.shape[2] > 1)] += 1
        return registered(module, query, key, value, attention_mask, **kwargs)

    def counted_kernel(q, k, v, **options):
        rec.kernel_calls.append((q.shape[1], k.shape[1], options))
        return kernel(q, k, v, **options)

    def counted_fallback(*args, **kwargs):
        rec.fallbacks += 1
        return fallback(*args, **kwargs)

    monkeypatch.setitem(AttentionInterface._global_mapping, "attn", layer)
    monkeypatch.setattr(attn.torch, "attention", counted_kernel)
    monkeypatch.setattr(attn_hf, "sdpa_attention_forward", counted_fallback)
    return rec


# ---- the tiny decoders -----------------------------------------------------------------------------------------


@dataclasses.dataclass
class Family:
    config: Callable  # -> a transformers config
    reference: str  # the attn_implementation attn is compared with
    windows: set  # the AttnMask windows the prefill's layers must get
    kv_heads: int = 2  # of 4 query heads


# initializer_range 0.2 (not 0.02): scores of order 1, so that the softcap, the window and the sinks change the output
# well past the tolerances (with 0.02 a softcap of 2 would be the identity to 1e-7).
_COMMON = dict(
    vocab_size=VOCAB, pad_token_id=0, bos_token_id=1, eos_token_id=2, initializer_range=0.2
)
_DECODER = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    **_COMMON,
)
_FULL, _SLIDING = (
    (-1, -1),
    (WINDOW - 1, 0),
)  # attn's windows: transformers' window W is W - 1 keys back


def _families() -> dict:
    t = transformers
    families = {
        "llama": Family(lambda: t.LlamaConfig(**_DECODER), "sdpa", {_FULL}),
        "qwen2": Family(
            lambda: t.Qwen2Config(**{**_DECODER, "num_key_value_heads": 1}), "sdpa", {_FULL}, 1
        ),
        "mistral": Family(
            lambda: t.MistralConfig(**_DECODER, sliding_window=WINDOW), "sdpa", {_SLIDING}
        ),
        "gemma2": Family(
            lambda: t.Gemma2Config(
                **_DECODER,
                head_dim=16,
                sliding_window=WINDOW,
                attn_logit_softcapping=2.0,
                query_pre_attn_scalar=32,  # scaling 32**-0.5, not 1/sqrt(head_dim)
            ),
            "eager",  # sdpa has no softcap
            {_FULL, _SLIDING},
        ),
        "gpt2": Family(
            lambda: t.GPT2Config(
                n_embd=64,
                n_layer=3,
                n_head=4,
                n_positions=128,
                resid_pdrop=0.0,
                embd_pdrop=0.0,
                attn_pdrop=0.0,
                **_COMMON,
            ),
            "sdpa",
            {_FULL},
            4,
        ),
        "gpt_oss": Family(
            lambda: t.GptOssConfig(
                **{**_DECODER, "intermediate_size": 64},
                head_dim=16,
                num_local_experts=4,
                num_experts_per_tok=2,
                sliding_window=WINDOW,
            ),
            "eager",  # sdpa has no sinks
            {_FULL, _SLIDING},
        ),
    }
    if not hasattr(t, "GptOssConfig"):  # (added in transformers 4.55)
        del families["gpt_oss"]
    return families


FAMILIES = _families()


@dataclasses.dataclass
class Loaded:
    attn: torch.nn.Module
    ref: torch.nn.Module
    ids: torch.Tensor  # [3, 12], left-padded with 0
    mask: torch.Tensor  # [3, 12], 0 = padding
    family: Family
    folder: str


def _prompts() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (len(LEFT_PADS), 12), generator=generator)
    mask = torch.ones_like(ids)
    for b, pads in enumerate(LEFT_PADS):
        ids[b, :pads], mask[b, :pads] = 0, 0
    return ids, mask


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def loaded(request, tmp_path_factory) -> Loaded:
    family = FAMILIES[request.param]
    config = family.config()
    torch.manual_seed(0)
    folder = str(tmp_path_factory.mktemp(request.param))
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    load = transformers.AutoModelForCausalLM.from_pretrained
    models = [
        load(folder, attn_implementation=name, dtype=torch.float32)
        for name in ("attn", family.reference)
    ]
    assert models[0].config._attn_implementation == "attn"
    return Loaded(*models, *_prompts(), family, folder)


def test_forward_logits(loaded, recorder):
    """Prefill logits of the left-padded batch on the real positions (a left-pad query sees no key: its row is 0 under
    attn and sdpa, an average under eager; nothing reads it)."""
    real = loaded.mask.bool()
    with torch.no_grad():
        logits = [
            m.eval()(input_ids=loaded.ids, attention_mask=loaded.mask).logits
            for m in (loaded.attn, loaded.ref)
        ]
    assert rel(logits[0][real], logits[1][real]) <= RTOL_LOGITS
    recorder.check_all_ran_attn()
    assert recorder.kinds() == {f"AttnMask{w}" for w in loaded.family.windows}
    # GQA as it comes: attn got the key's own heads (2, 1 for Qwen2's MQA), never repeated to the query's 4
    heads = {(hq, hkv) for hq, hkv, _ in recorder.kernel_calls}
    assert heads == {(4, loaded.family.kv_heads)}, heads


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_generate_greedy(loaded, recorder, cache):
    """32 greedy tokens: the same tokens, and every step's logits to 1e-5 (a StaticCache's sliding layers roll, its full
    layers hold zeros past the written keys, which the mask's position offset removes)."""
    options = dict(
        max_new_tokens=NEW_TOKENS,
        min_new_tokens=NEW_TOKENS,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
    )
    if cache == "static":
        options["cache_implementation"] = "static"
    out = [
        m.eval().generate(input_ids=loaded.ids, attention_mask=loaded.mask, **options)
        for m in (loaded.attn, loaded.ref)
    ]
    assert torch.equal(out[0].sequences, out[1].sequences)
    assert len(out[0].logits) == NEW_TOKENS
    worst = max(rel(a, b) for a, b in zip(out[0].logits, out[1].logits))
    assert worst <= RTOL_LOGITS, worst
    recorder.check_all_ran_attn()
    assert recorder.kinds(prefill=True) == {f"AttnMask{w}" for w in loaded.family.windows}
    # decode: an AttnMask per step with a DynamicCache; a StaticCache's decode gets transformers' [B, 1, 1, Lk] mask
    # (generate asks for a tensor there, for torch.compile), still run by attn
    assert recorder.kinds(prefill=False) == (
        {"Tensor"} if cache == "static" else {f"AttnMask{w}" for w in loaded.family.windows}
    )


def _labels(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Causal-LM labels that read no padded position's output: -100 on the pads and on the first real token (which
    the last pad's output would predict)."""
    before = torch.nn.functional.pad(mask[:, :-1], (1, 0), value=1)
    return ids.masked_fill((mask == 0) | (before == 0), -100)


def check_gradients(models: tuple, loss_of: Callable) -> None:
    """loss_of(model).backward() on both models; every parameter's gradient to RTOL_GRADS relative. A gradient that is
    zero in exact arithmetic (a key bias without RoPE: softmax ignores a constant added to a row's scores) is round-off
    on both sides, so the denominator is at least 1e-3 of the largest parameter gradient."""
    for m in models:
        m.zero_grad(set_to_none=True)
        loss_of(m).backward()
    grads = [{n: p.grad for n, p in m.named_parameters() if p.grad is not None} for m in models]
    assert grads[0].keys() == grads[1].keys() and grads[0]
    floor = 1e-3 * max(float(g.norm()) for g in grads[1].values())
    errors = {
        n: float((grads[0][n] - g).norm()) / max(float(g.norm()), floor)
        for n, g in grads[1].items()
    }
    worst = max(errors, key=errors.get)
    assert errors[worst] <= RTOL_GRADS, (worst, errors[worst])
    for m in models:
        m.zero_grad(set_to_none=True)


def test_training_gradients(loaded, recorder):
    """One training step (train mode, dropout 0 in these configs): a causal-LM loss's gradients, attn's backward
    against the reference's (GPT-OSS's sinks included)."""
    labels = _labels(loaded.ids, loaded.mask)
    models = (loaded.attn.train(), loaded.ref.train())
    check_gradients(
        models, lambda m: m(input_ids=loaded.ids, attention_mask=loaded.mask, labels=labels).loss
    )
    recorder.check_all_ran_attn()
    for m in models:
        m.eval()


@pytest.mark.skipif("gpt_oss" not in FAMILIES, reason="no GPT-OSS in this transformers")
@pytest.mark.parametrize("loaded", ["gpt_oss"], indirect=True)
def test_sinks_alone_trainable(loaded, recorder):
    """Only the sinks train (every other weight frozen, so q, k and v need no gradient): the sinks still get theirs."""
    labels = _labels(loaded.ids, loaded.mask)
    models = (loaded.attn.train(), loaded.ref.train())
    for m in models:
        for name, p in m.named_parameters():
            p.requires_grad_(name.endswith(".sinks"))
    try:
        check_gradients(
            models,
            lambda m: m(input_ids=loaded.ids, attention_mask=loaded.mask, labels=labels).loss,
        )
    finally:
        for m in models:
            m.eval().requires_grad_(True)
    recorder.check_all_ran_attn()


# ---- BERT: the real all-MiniLM-L6-v2 ---------------------------------------------------------------------------


def test_bert_minilm(model_dir, recorder):
    """all-MiniLM-L6-v2 (6 layers, bidirectional, right padding: attn runs the key mask as key lengths) against sdpa:
    last_hidden_state on the real tokens to 1e-5, and the gradients of the mean-pooled embeddings' squared norm."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    batch = tokenizer(HARD_TEXTS, padding=True, truncation=True, max_length=32, return_tensors="pt")
    models = [
        transformers.AutoModel.from_pretrained(model_dir, attn_implementation=name).eval()
        for name in ("attn", "sdpa")
    ]
    weights = batch["attention_mask"][..., None].float()

    def loss_of(model):
        hidden = model(**batch).last_hidden_state
        return ((hidden * weights).sum(1) / weights.sum(1)).pow(2).sum()

    with torch.no_grad():
        hidden = [m(**batch).last_hidden_state for m in models]
    real = batch["attention_mask"].bool()
    assert rel(hidden[0][real], hidden[1][real]) <= RTOL_LOGITS
    check_gradients(models, loss_of)
    recorder.check_all_ran_attn()
    assert recorder.kinds() == {"AttnMask(-1, -1)"}
    options = recorder.kernel_calls[0][2]
    assert not options["causal"] and options["mask"].shape == (len(HARD_TEXTS), 1, 1, real.shape[1])


# ---- the mask function against transformers' own masks ------------------------------------------------------------

# (q_length, kv_length, q_offset, kv_offset): prefill, decode, a chunk after a cache, a StaticCache's prefill and decode
# (keys past the written ones), a sliding-window cache that dropped its oldest keys (kv_offset > 0)
_SIZES = [
    (6, 6, 0, 0),
    (1, 9, 8, 0),
    (3, 9, 6, 0),
    (6, 16, 0, 0),
    (1, 16, 8, 0),
    (1, 5, 12, 8),
    (4, 8, 12, 8),
]
_PATTERNS = {
    "causal": causal_mask_function,
    "sliding3": sliding_window_causal_mask_function(3),
    "sliding1": sliding_window_causal_mask_function(1),
    "bidirectional": bidirectional_mask_function,
    "bidirectional-sliding2": sliding_window_bidirectional_mask_function(2),
}


def _padding(kind: str, batch: int, length: int) -> torch.Tensor | None:
    if kind == "none":
        return None
    mask = torch.ones(batch, length, dtype=torch.bool)
    if kind == "left":
        mask[1, :5], mask[2, :2] = False, False
    else:  # right, and shorter than the keys for a StaticCache (transformers pads it with False)
        mask[1, -4:] = False
        mask = mask[:, :-1]
    return mask


@pytest.mark.parametrize("pattern", sorted(_PATTERNS))
@pytest.mark.parametrize("padding", ["none", "left", "right"])
def test_make_mask_is_transformers_mask(pattern, padding):
    """make_mask's AttnMask allows exactly the (query, key) pairs of transformers' sdpa_mask, for every pattern attn
    takes as options, cache offsets and padding: the window convention (transformers' W is W keys, the query's own
    included) checked against transformers itself."""
    for q_length, kv_length, q_offset, kv_offset in _SIZES:
        sizes = dict(
            batch_size=3,
            q_length=q_length,
            kv_length=kv_length,
            q_offset=q_offset,
            kv_offset=kv_offset,
            mask_function=_PATTERNS[pattern],
            attention_mask=_padding(padding, 3, kv_offset + kv_length),
        )
        made = attn_hf.make_mask(**sizes, allow_is_causal_skip=True)
        assert isinstance(made, attn_hf.AttnMask), (pattern, sizes)
        expected = sdpa_mask(**sizes, allow_is_causal_skip=False).expand(3, 1, q_length, kv_length)
        got = made.dense().expand(3, 1, q_length, kv_length)
        assert torch.equal(got, expected), (
            pattern,
            padding,
            q_length,
            kv_length,
            q_offset,
            kv_offset,
        )
        padded = (
            sizes["attention_mask"] is not None and not sizes["attention_mask"][:, kv_offset:].all()
        )
        assert (made.keep is not None) == bool(padded), (pattern, padding, sizes)


def test_make_mask_leaves_other_patterns_to_transformers():
    """Patterns attn does not take as options here (chunked attention; a custom and_mask_function, which transformers
    asks for with use_vmap), and callers that want a tensor (both skip flags off), get transformers' own dense mask."""
    sizes = dict(batch_size=2, q_length=5, kv_length=5)
    chunked = dict(
        sizes,
        mask_function=chunked_causal_mask_function(3, torch.zeros(2, dtype=torch.long)),
        local_size=3,
    )
    custom = and_masks(causal_mask_function, lambda b, h, q, kv: (q + kv) % 3 != 1)
    custom = dict(sizes, mask_function=custom, allow_is_causal_skip=False, use_vmap=True)
    plain = dict(sizes, mask_function=causal_mask_function, allow_is_causal_skip=False)
    for case in (chunked, custom, plain):
        made = attn_hf.make_mask(**case)
        assert isinstance(made, torch.Tensor) and torch.equal(made, sdpa_mask(**case))
    assert AttentionMaskInterface._global_mapping["attn"] is attn_hf.make_mask


# ---- features beyond the families' defaults ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> str:
    """A tiny Llama (attention dropout 0.5, used only in train mode) saved to a folder."""
    torch.manual_seed(0)
    folder = str(tmp_path_factory.mktemp("llama_dropout"))
    config = transformers.LlamaConfig(**_DECODER, attention_dropout=0.5)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return folder


def test_dropout_in_training(llama, recorder):
    """Training-mode dropout reaches attn (dropout_p, a seed from torch's RNG): the same torch seed gives the same
    logits, another seed others; eval mode has none."""
    model = transformers.AutoModelForCausalLM.from_pretrained(
        llama, attn_implementation="attn"
    ).train()
    ids, mask = _prompts()

    def logits(seed):
        torch.manual_seed(seed)
        with torch.no_grad():
            return model(input_ids=ids, attention_mask=mask).logits

    first, again, other = logits(0), logits(0), logits(1)
    assert torch.equal(first, again) and not torch.allclose(first, other)
    assert all(options.get("dropout_p") == 0.5 for _, _, options in recorder.kernel_calls)
    model.eval()
    recorder.kernel_calls.clear()
    logits(0)
    assert all("dropout_p" not in options for _, _, options in recorder.kernel_calls)


def test_output_attentions_and_sampling(llama, recorder):
    """output_attentions returns attn's weights [B, Hq, Lq, Lk] (eager's on the real rows), and sampled generation
    draws the same tokens as sdpa's from the same seed."""
    ids, mask = _prompts()
    load = transformers.AutoModelForCausalLM.from_pretrained
    models = {
        name: load(llama, attn_implementation=name).eval() for name in ("attn", "eager", "sdpa")
    }
    with torch.no_grad():
        outs = {
            n: models[n](input_ids=ids, attention_mask=mask, output_attentions=True)
            for n in ("attn", "eager")
        }
    real = mask.bool()[:, None, :, None].expand(-1, 4, -1, ids.shape[1])
    for got, expected in zip(outs["attn"].attentions, outs["eager"].attentions):
        assert got.shape == expected.shape == (3, 4, 12, 12)
        assert rel(got[real], expected[real]) <= RTOL_LOGITS
    sampled = []
    for name in ("attn", "sdpa"):
        torch.manual_seed(3)
        sampled.append(
            models[name].generate(
                input_ids=ids, attention_mask=mask, do_sample=True, max_new_tokens=8, top_k=0
            )
        )
    assert torch.equal(*sampled)
    recorder.check_all_ran_attn()


def test_packed_sequences(llama, recorder):
    """Sequences packed in one row (position_ids restarting, no cache): transformers' block-diagonal causal mask
    (dense: attn has no pattern for it here), run by attn, against sdpa."""
    load = transformers.AutoModelForCausalLM.from_pretrained
    models = [load(llama, attn_implementation=name).eval() for name in ("attn", "sdpa")]
    ids = torch.randint(3, VOCAB, (1, 12), generator=torch.Generator().manual_seed(2))
    positions = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3]])
    with torch.no_grad():
        logits = [m(input_ids=ids, position_ids=positions, use_cache=False).logits for m in models]
    assert rel(logits[0], logits[1]) <= RTOL_LOGITS
    recorder.check_all_ran_attn()
    assert recorder.kinds() == {"Tensor"}


# ---- direct calls: fallback and refusals --------------------------------------------------------------------------


class _Layer(torch.nn.Module):
    is_causal = True


def test_fallback_to_sdpa_off_the_cpu(recorder):
    """Tensors attn's kernels cannot read (here on the meta device) go to transformers' sdpa; softcap and sinks, which
    sdpa has not, are refused with the reason rather than dropped."""
    q, k = torch.empty(2, 4, 3, 8, device="meta"), torch.empty(2, 2, 3, 8, device="meta")
    out, weights = attn_hf.attention_forward(_Layer(), q, k, k, None, scaling=0.5)
    assert out.shape == (2, 3, 4, 8) and weights is None and recorder.fallbacks == 1
    assert not recorder.kernel_calls
    with pytest.raises(ValueError, match="softcap"):
        attn_hf.attention_forward(_Layer(), q, k, k, None, softcap=2.0)
    with pytest.raises(ValueError, match="s_aux"):
        attn_hf.attention_forward(_Layer(), q, k, k, None, s_aux=torch.zeros(4, device="meta"))


@pytest.mark.parametrize("lq, lk", [(3, 5), (1, 5), (4, 4)])
@pytest.mark.parametrize("causal", [True, False])
def test_tensor_and_none_masks_as_sdpa(recorder, lq, lk, causal):
    """The masks make_mask leaves to transformers, run by attn as sdpa_attention_forward runs them: None is causal
    top-left for a causal layer with Lq > 1 (a StaticCache's empty prefill: keys past Lq removed), none otherwise; a
    float mask is added (-inf removes a key); GQA by the module's num_key_value_groups."""
    layer = _Layer()
    layer.is_causal, layer.num_key_value_groups = causal, 2
    generator = torch.Generator().manual_seed(lq * 10 + lk)
    q, k, v = (torch.randn(2, h, n, 8, generator=generator) for h, n in ((4, lq), (2, lk), (2, lk)))
    additive = torch.randn(2, 1, lq, lk, generator=generator)
    additive[:, :, :, -1] = float("-inf")
    for mask in (None, additive):
        got, _ = attn_hf.attention_forward(layer, q, k, v, mask, scaling=0.3)
        expected, _ = sdpa_attention_forward(layer, q, k, v, mask, scaling=0.3)
        assert got.shape == expected.shape == (2, lq, 4, 8) and got.is_contiguous()
        assert rel(got, expected) <= RTOL_LOGITS, mask
    assert len(recorder.kernel_calls) == 2 and recorder.fallbacks == 0


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning", "ignore:.*jit.trace.*:FutureWarning")
def test_jit_trace_falls_back_to_sdpa(recorder):
    """Under torch.jit.trace attn's call would be recorded as a constant: the trace goes to sdpa, and the traced
    function is right on new inputs."""
    layer = _Layer()
    layer.num_key_value_groups = 2

    def forward(q, k, v):
        return attn_hf.attention_forward(layer, q, k, v, None, scaling=0.3)[0]

    generator = torch.Generator().manual_seed(5)
    inputs = [[torch.randn(1, h, 4, 8, generator=generator) for h in (4, 2, 2)] for _ in range(2)]
    traced = torch.jit.trace(forward, tuple(inputs[0]), check_trace=False)
    assert recorder.fallbacks == 1
    assert rel(traced(*inputs[1]), forward(*inputs[1])) <= RTOL_LOGITS


def test_bad_input_names_the_argument():
    q, k = torch.randn(2, 4, 3, 8), torch.randn(2, 2, 5, 8)
    layer = _Layer()
    with pytest.raises(ValueError, match=r"query \(2, 4, 3\)"):
        attn_hf.attention_forward(layer, q[:, :, :, 0], k, k, None)
    with pytest.raises(ValueError, match="multiple"):
        attn_hf.attention_forward(layer, torch.randn(2, 3, 3, 8), k, k, None)
    with pytest.raises(ValueError, match="head dim"):
        attn_hf.attention_forward(layer, q, torch.randn(2, 2, 5, 4), k, None)
    made = attn_hf.make_mask(batch_size=2, q_length=3, kv_length=6)
    with pytest.raises(ValueError, match=r"made for \[B, 1, Lq, Lk\] = \(2, 1, 3, 6\)"):
        attn_hf.attention_forward(layer, q, k, k, made)
    with pytest.raises(ValueError, match="4-D"):
        attn_hf.attention_forward(layer, q, k, k, torch.ones(3, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match="bool"):
        attn_hf.attention_forward(layer, q, k, k, torch.ones(1, 1, 3, 5, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"s_aux.*\[4\]"):
        attn_hf.attention_forward(layer, q, k, k, None, s_aux=torch.zeros(2))
    with pytest.raises(ValueError, match="attention_mask must be the 2-D padding mask"):
        attn_hf.make_mask(batch_size=2, q_length=3, kv_length=5, attention_mask=torch.ones(3, 5))


def test_import_attn_loads_neither_torch_nor_transformers():
    code = "import sys, attn; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"], out.stdout + out.stderr
