"""attn.nn.autocast (mixed-precision training) against torch.autocast(device_type="cpu", dtype=torch.bfloat16):
the same encoder layer trained one step under each, every gradient compared with float64's; attn's error within
twice torch's (DESIGN.md's bf16 contract) and the rounding really happening; a short training loop under autocast
tracking the float32 one; the mode's scope and errors. Skipped, with the reason, where torch is missing."""

import copy

import numpy as np
import pytest

ann = pytest.importorskip("attn.nn", reason="this build of attn has no nn module")
torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed: the PyTorch parity tests are skipped"
)
from torch_refs import within_twice  # noqa: E402  (this folder's; it imports torch)


def _torch_layer(norm_first, activation="gelu"):
    torch.manual_seed(3)
    layer = torch.nn.TransformerEncoderLayer(
        64, 4, 160, dropout=0.0, activation=activation, batch_first=True, norm_first=norm_first
    )
    with torch.no_grad():
        for p in layer.parameters():
            p.mul_(2.0)
    return layer


def _torch_grads(layer, x, pad, w, autocast):
    layer = copy.deepcopy(layer)
    x = x.clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        y = layer(x, src_key_padding_mask=pad)
    (y.double() * w).sum().backward()
    grads = {name: p.grad for name, p in layer.named_parameters()}
    grads["src"] = x.grad
    return y, grads


@pytest.mark.parametrize("activation", ["gelu", "relu"])
@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_step_within_twice_torch_autocast_of_float64(norm_first, activation):
    layer = _torch_layer(norm_first, activation)
    mine = ann.TransformerEncoderLayer(
        64, 4, 160, dropout=0.0, activation=activation, batch_first=True, norm_first=norm_first
    )
    mine.load_state_dict(layer.state_dict())
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4, 37, 64, generator=g)
    w = torch.randn(4, 37, 64, generator=g, dtype=torch.float64)
    pad = torch.zeros(4, 37, dtype=torch.bool)
    pad[1, 30:] = True
    _, ref = _torch_grads(layer.double(), x.double(), pad, w, False)
    _, theirs = _torch_grads(_torch_layer(norm_first, activation), x, pad, w, True)
    with ann.autocast():
        ours_y = mine(x, src_key_padding_mask=pad)
    assert ours_y.dtype == (torch.float32 if norm_first else torch.bfloat16)
    ours = mine.backward(w.float())
    assert ours["src"].dtype == torch.float32
    # bf16 rounding happened
    assert within_twice(ours, theirs, ref, 1e-6, f"norm_first={norm_first} ") > 1e-4
    assert all(ours[name].dtype == torch.float32 for name in ref)
    # master weights stay f32
    assert all(str(v.dtype).endswith("float32") for v in mine.state_dict().values())


def test_autocast_training_loop_tracks_float32():
    """encoder layer + linear head, cross_entropy and AdamW: the same 12 steps in float32 and under autocast;
    the autocast losses follow the float32 ones to bf16's accuracy and fall as far."""

    def run(autocast):
        torch.manual_seed(0)
        ref = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        head_ref = torch.nn.Linear(32, 3)
        enc = ann.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        head = ann.Linear(32, 3)
        enc.load_state_dict(ref.state_dict())
        head.load_state_dict(head_ref.state_dict())
        params = enc.parameters() + head.parameters(prefix="head")
        opt = ann.AdamW(params, lr=3e-3)
        g = torch.Generator().manual_seed(9)
        x = torch.randn(8, 10, 32, generator=g)
        y = (x[..., :3].sum(-1) > 0).long() + (x[..., 3] > 1).long()
        losses = []
        for _ in range(12):
            with ann.autocast(enabled=autocast):
                logits = head(enc(x))
            assert logits.dtype == (torch.bfloat16 if autocast else torch.float32)
            loss, dlogits = ann.cross_entropy(logits.float().reshape(-1, 3), y.reshape(-1))
            enc.backward(head.backward(dlogits.reshape(8, 10, 3))["input"])
            opt.step()
            losses.append(loss)
        return losses

    f32, mixed = run(False), run(True)
    print("f32", [round(v, 4) for v in f32], "autocast", [round(v, 4) for v in mixed])
    assert f32[-1] < 0.8 * f32[0] and mixed[-1] < 0.8 * mixed[0]
    assert max(abs(a - b) for a, b in zip(f32, mixed)) <= 0.03 * f32[0]
    assert f32 != mixed  # bf16 really ran


def test_mode_scope_decorator_and_errors():
    assert not ann.is_autocast_enabled()
    with ann.autocast():
        assert ann.is_autocast_enabled()
        with ann.autocast(enabled=False):
            assert not ann.is_autocast_enabled()
        assert ann.is_autocast_enabled()
    assert not ann.is_autocast_enabled()

    @ann.autocast()
    def inside():
        return ann.is_autocast_enabled()

    assert inside() and not ann.is_autocast_enabled()
    for ok in ("bfloat16", torch.bfloat16):
        ann.autocast(dtype=ok)
    with pytest.raises(ValueError, match="bfloat16"):
        ann.autocast(dtype=torch.float16)
    lin = ann.Linear(8, 4)
    x = np.ones((3, 8), np.float32)
    with ann.autocast():
        y = lin(x)  # NumPy has no bfloat16: the bf16 output comes back as float32 values
    assert y.dtype == np.float32
    assert np.array_equal(y, torch.from_numpy(y).bfloat16().float().numpy())  # bf16 values
    lin64 = ann.Linear(8, 4, dtype="float64")
    with ann.autocast():
        assert lin64(x).dtype == np.float64  # float64 modules ignore autocast
