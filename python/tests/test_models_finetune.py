"""Fine-tuning attn.models.BertModel (all-MiniLM-L6-v2) against transformers' BertModel with autograd: the same
checkpoint, ids and mask, the same output gradients; every compared parameter gradient within float32 round-off in
float32, and under attn.nn.autocast within twice torch.autocast's error (both against transformers' float32). A few
AdamW steps of a classification head on top (dropout on, as the config says) lower the loss. transformers runs in
eval mode (no dropout), and attn in training mode with its dropout turned off (test_models_dropout.py compares the
dropout itself)."""

import numpy as np
import pytest

ann = pytest.importorskip("attn.nn", reason="this build of attn has no nn module")
models = pytest.importorskip("attn.models", reason="this build of attn has no models module")
torch = pytest.importorskip("torch", reason="PyTorch is not installed")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")
from torch_refs import fro, within_twice  # noqa: E402  (this folder's; it imports torch)


@pytest.fixture(scope="module")
def batch():
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1000, 8000, (3, 21), generator=g)
    ids[:, 0] = 101
    mask = torch.ones(3, 21, dtype=torch.long)
    mask[1, 15:] = 0
    dh = torch.randn(3, 21, 384, generator=g)
    dp = torch.randn(3, 384, generator=g)
    return ids, mask, dh, dp


def _hf_grads(model_dir, ids, mask, dh, dp, autocast):
    hf = transformers.BertModel.from_pretrained(model_dir, attn_implementation="eager").eval()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = hf(input_ids=ids, attention_mask=mask)
    ((out.last_hidden_state.float() * dh).sum() + (out.pooler_output.float() * dp).sum()).backward()
    p = dict(hf.named_parameters())
    layer = "encoder.layer.{}."
    grads = {
        "embeddings.word_embeddings.weight": p["embeddings.word_embeddings.weight"].grad,
        "embeddings.position_embeddings.weight": p["embeddings.position_embeddings.weight"].grad,
        "embeddings.LayerNorm.weight": p["embeddings.LayerNorm.weight"].grad,
        "pooler.dense.weight": p["pooler.dense.weight"].grad,
    }
    for i in (0, 5):
        pre = layer.format(i)
        grads[pre + "self_attn.in_proj_weight"] = torch.cat(
            [p[pre + f"attention.self.{n}.weight"].grad for n in ("query", "key", "value")]
        )
        grads[pre + "linear1.weight"] = p[pre + "intermediate.dense.weight"].grad
        grads[pre + "linear2.bias"] = p[pre + "output.dense.bias"].grad
        grads[pre + "norm1.weight"] = p[pre + "attention.output.LayerNorm.weight"].grad
    return grads


def _attn_grads(model_dir, ids, mask, dh, dp, autocast):
    m = models.BertModel.from_pretrained(
        model_dir, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
    ).train()
    with ann.autocast(enabled=autocast):
        out = m(ids, mask)
    assert out.last_hidden_state.dtype == (torch.bfloat16 if autocast else torch.float32)
    m.zero_grad()
    m.backward(dh, dp)
    params = m.parameters()
    return {name: torch.as_tensor(g) for name, g in zip(params.names(), params.grads())}


def test_gradients_match_transformers_in_float32(model_dir, batch):
    ids, mask, dh, dp = batch
    want = _hf_grads(model_dir, ids, mask, dh, dp, False)
    got = _attn_grads(model_dir, ids, mask, dh, dp, False)
    for name, w in want.items():
        err = fro(got[name], w)
        print(f"{name}: {err:.3g}")
        assert err < 1e-4, name


def test_autocast_gradients_within_twice_torch_autocast(model_dir, batch):
    ids, mask, dh, dp = batch
    ref = _hf_grads(model_dir, ids, mask, dh, dp, False)
    theirs = _hf_grads(model_dir, ids, mask, dh, dp, True)
    ours = _attn_grads(model_dir, ids, mask, dh, dp, True)
    assert within_twice(ours, theirs, ref, 1e-4) > 1e-3  # bf16 really ran


def test_a_few_steps_of_fine_tuning_lower_the_loss(model_dir, batch):
    ids, mask, _, _ = batch
    m = models.BertModel.from_pretrained(model_dir).train()
    m.manual_seed(0)
    head = ann.Linear(384, 2)
    params = m.parameters() + head.parameters(prefix="head")
    opt = ann.AdamW(params, lr=1e-4)
    labels = torch.tensor([0, 1, 1])
    losses = []
    for _ in range(6):
        with ann.autocast():
            pooled = m(ids, mask).pooler_output
            logits = head(pooled)
        loss, dlogits = ann.cross_entropy(logits.float(), labels)
        m.zero_grad()
        m.backward(None, head.backward(dlogits)["input"])
        opt.step()
        losses.append(loss)
    print(losses)
    assert losses[-1] < 0.7 * losses[0]


def test_backward_errors(model_dir, batch):
    ids, mask, dh, dp = batch
    m = models.BertModel.from_pretrained(model_dir)
    m.zero_grad()
    m(ids, mask)  # eval mode: nothing kept
    with pytest.raises(ValueError, match="training mode"):
        m.backward(dh)
    m.train()
    m(ids, mask)
    with pytest.raises(ValueError, match="d_last_hidden_state"):
        m.backward(dh[:, :5], dp)  # refused before the pooler's gradient is added
    m16 = models.BertModel.from_pretrained(model_dir, dtype="bfloat16").train()
    m16(ids, mask)
    with pytest.raises(ValueError, match="inference only"):
        m16.backward(dh)
    # a refused backward changed no gradient
    assert all(not np.any(g) for g in m.parameters().grads())
