"""attn.nn's optimizers (SGD, AdamW), clip_grad_norm_, WarmupCosine and cross_entropy against torch: the same
modules (attn's loaded with torch's state dicts) stepped on the same inputs, attn's gradients from its backward and
torch's from autograd, parameters compared after several steps (float64 to 1e-12 relative, float32 to 1e-6);
optimizer state dicts resume bitwise. Skipped, with the reason, where torch is missing."""

import copy
import itertools
import math

import numpy as np
import pytest

ann = pytest.importorskip("attn.nn", reason="this build of attn has no nn module")
torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed: the PyTorch parity tests are skipped"
)
from torch_refs import rel as _rel  # noqa: E402  (this folder's; it imports torch)

TOL = {torch.float64: 1e-12, torch.float32: 1e-6}
DTYPES = [torch.float64, torch.float32]
STEPS = 5


def _pair(kind, dtype, seed=0, bias=True):
    """(torch module, attn module with its weights, input shape)."""
    torch.manual_seed(seed)
    if kind == "linear":
        ref = torch.nn.Linear(6, 5, dtype=dtype)
        ours, shape = ann.Linear(6, 5, dtype=dtype), (3, 6)
    else:
        cfg = dict(dim_feedforward=16, dropout=0.0, bias=bias, dtype=dtype)
        ref = torch.nn.TransformerEncoderLayer(8, 2, **cfg)
        ours, shape = ann.TransformerEncoderLayer(8, 2, **cfg), (5, 2, 8)
    ours.load_state_dict(ref.state_dict())
    return ref, ours, shape


def _inputs(shape, dtype, steps=STEPS, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randn(shape, dtype=dtype, generator=g),
            torch.randn(shape[:-1] + (5 if shape[-1] == 6 else 8,), dtype=dtype, generator=g),
        )
        for _ in range(steps)
    ]


def _backward_both(ref, ours, x, dout):
    ref.zero_grad()
    ref(x).backward(dout)
    ours(x)
    ours.backward(dout)


def _assert_params_close(ref, ours, tol, what=""):
    sd = ours.state_dict()
    assert set(sd) == {n for n, _ in ref.named_parameters()}
    for name, p in ref.named_parameters():
        assert _rel(sd[name], p) <= tol, f"{what} {name}: {_rel(sd[name], p)}"


OPTIMIZERS = {
    "sgd": (torch.optim.SGD, ann.SGD, dict(lr=0.1)),
    "sgd_wd": (torch.optim.SGD, ann.SGD, dict(lr=0.1, weight_decay=0.05)),
    "momentum": (
        torch.optim.SGD,
        ann.SGD,
        dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01),
    ),
    "nesterov": (
        torch.optim.SGD,
        ann.SGD,
        dict(lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.01),
    ),
    "adamw": (torch.optim.AdamW, ann.AdamW, dict(lr=1e-2)),
    "adamw_custom": (
        torch.optim.AdamW,
        ann.AdamW,
        dict(lr=3e-3, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
    ),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["linear", "encoder"])
@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
def test_optimizer_matches_torch(opt_name, kind, dtype):
    torch_cls, attn_cls, kwargs = OPTIMIZERS[opt_name]
    # The key third of in_proj_bias has an exact gradient of zero (softmax ignores a constant added to a row of
    # scores), so both sides hold rounding noise there, which AdamW divides by its own size: incomparable. AdamW's
    # encoder runs without biases (Linear covers bias parameters).
    ref, ours, shape = _pair(kind, dtype, bias=torch_cls is not torch.optim.AdamW)
    ref_opt, opt = torch_cls(ref.parameters(), **kwargs), attn_cls(ours.parameters(), **kwargs)
    before = {k: v.copy() for k, v in ours.state_dict().items()}
    for i, (x, dout) in enumerate(_inputs(shape, dtype)):
        _backward_both(ref, ours, x, dout)
        ref_opt.step()
        opt.step()
        _assert_params_close(ref, ours, TOL[dtype], f"step {i}")
    # the steps moved every parameter (so agreeing is not agreeing on nothing)
    assert all(np.abs(np.asarray(v) - before[k]).max() > 1e-4 for k, v in ours.state_dict().items())


@pytest.mark.parametrize("opt_name", ["momentum", "nesterov", "adamw"])
def test_state_dict_round_trip_resumes_bitwise(opt_name):
    _, attn_cls, kwargs = OPTIMIZERS[opt_name]
    _, a, shape = _pair("encoder", torch.float64)
    opt_a = attn_cls(a.parameters(), **kwargs)
    data = [(x.numpy(), d.numpy()) for x, d in _inputs(shape, torch.float64, steps=6)]

    def train(module, opt, batches):
        for x, dout in batches:
            module(x)
            module.backward(dout)
            opt.step()

    train(a, opt_a, data[:3])
    model_state = {k: v.copy() for k, v in a.state_dict().items()}
    opt_state = copy.deepcopy(opt_a.state_dict())
    assert opt_state["state"]  # momentum buffers / moments exist after three steps
    train(a, opt_a, data[3:])
    # other weights, overwritten by the checkpoint
    _, b, _ = _pair("encoder", torch.float64, seed=5)
    b.load_state_dict(model_state)
    opt_b = attn_cls(b.parameters(), lr=123.0, **{k: v for k, v in kwargs.items() if k != "lr"})
    opt_b.load_state_dict(opt_state)
    assert opt_b.lr == kwargs["lr"]
    train(b, opt_b, data[3:])
    for name, value in a.state_dict().items():
        assert np.array_equal(b.state_dict()[name], value), name
    for name, value in opt_a.state_dict()["state"].items():
        assert np.array_equal(opt_b.state_dict()["state"][name], value), name


def test_state_dict_is_a_snapshot_and_a_refused_load_changes_nothing():
    _, m, shape = _pair("linear", torch.float64)
    opt = ann.AdamW(m.parameters(), lr=0.1)
    x, dout = (t.numpy() for t in _inputs(shape, torch.float64, steps=1)[0])
    m(x)
    m.backward(dout)
    opt.step()
    state = opt.state_dict()
    saved = copy.deepcopy(state)
    opt.step()
    # copies, not views
    assert all(np.array_equal(state["state"][k], v) for k, v in saved["state"].items())
    now = copy.deepcopy(opt.state_dict())
    # every value changed but one name missing (the last one checked): nothing may be copied
    bad = {k: np.zeros_like(v) for k, v in saved["state"].items() if k != "bias.exp_avg_sq"}
    with pytest.raises(ValueError, match="bias.exp_avg_sq"):
        opt.load_state_dict({"state": bad, "lr": 0.5})
    bad = {k: np.zeros_like(v) for k, v in saved["state"].items()}
    bad["step"] = np.array([-1], dtype=np.int64)
    with pytest.raises(ValueError, match="negative"):
        opt.load_state_dict({"state": bad, "lr": 0.5})
    bad["step"] = np.array([3], dtype=np.int64)
    bad["weight.exp_avg"] = np.zeros((2, 2))
    with pytest.raises(ValueError, match="shape"):
        opt.load_state_dict({"state": bad, "lr": 0.5})
    assert opt.lr == 0.1
    for k, v in opt.state_dict()["state"].items():
        assert np.array_equal(v, now["state"][k]), k
    with pytest.raises(ValueError, match="'state' and 'lr'"):
        opt.load_state_dict(saved["state"])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("max_norm", [0.05, 1e3])
def test_clip_grad_norm_matches_torch(dtype, max_norm):
    ref_lin, lin, _ = _pair("linear", dtype)
    ref_enc, enc, shape = _pair("encoder", dtype, seed=3)
    x, dout = _inputs(shape, dtype, steps=1)[0]
    _backward_both(ref_enc, enc, x, dout)
    xl, doutl = _inputs((3, 6), dtype, steps=1)[0]
    _backward_both(ref_lin, lin, xl, doutl)
    ref_params = list(ref_enc.parameters()) + list(ref_lin.parameters())
    ref_norm = torch.nn.utils.clip_grad_norm_(ref_params, max_norm)
    norm = ann.clip_grad_norm_(
        list(enc.parameters()) + list(lin.parameters(prefix="head")), max_norm
    )
    assert isinstance(norm, float)
    assert abs(norm - float(ref_norm)) <= TOL[dtype] * float(ref_norm)
    assert (norm > max_norm) == (max_norm < 1)  # one case clips, the other does not
    for ref, ours in ((ref_enc, enc), (ref_lin, lin)):
        grads = ours._m.grads()
        for name, p in ref.named_parameters():
            assert _rel(grads[name], p.grad) <= TOL[dtype], name


def _reference_lr(base, warmup, total, min_lr, s):
    if s < warmup:
        return base * (s + 1) / warmup
    if s >= total:
        return min_lr
    return (
        min_lr
        + (base - min_lr) * (1 + math.cos(math.pi * (s - warmup) / max(1, total - warmup))) / 2
    )


@pytest.mark.parametrize(
    "warmup,total,min_lr", [(3, 10, 0.0), (0, 7, 1e-4), (4, 4, 1e-3), (1, 2, 0.0)]
)
def test_warmup_cosine_matches_the_formula_and_torch_protocol(warmup, total, min_lr):
    _, m, _ = _pair("linear", torch.float64)
    opt = ann.AdamW(m.parameters(), lr=0.02)
    sched = ann.WarmupCosine(opt, warmup, total, min_lr=min_lr)
    # torch's scheduler protocol, with the same formula: LambdaLR sets lr(0) at construction, step() advances
    p = torch.nn.Parameter(torch.zeros(1))
    ref_opt = torch.optim.AdamW([p], lr=0.02)
    ref = torch.optim.lr_scheduler.LambdaLR(
        ref_opt, lambda s: _reference_lr(0.02, warmup, total, min_lr, s) / 0.02
    )
    for s in range(total + 3):
        assert opt.lr == pytest.approx(
            _reference_lr(0.02, warmup, total, min_lr, s), rel=1e-15, abs=1e-18
        ), s
        assert sched.get_last_lr()[0] == pytest.approx(
            ref.get_last_lr()[0], rel=1e-14, abs=1e-18
        ), s
        ref_opt.step()
        ref.step()
        sched.step()
    assert opt.lr == min_lr
    state = sched.state_dict()
    again = ann.WarmupCosine(ann.SGD(m.parameters(), lr=5.0), warmup, total)
    again.load_state_dict(state)
    again.step()
    assert again.optimizer.lr == min_lr and again.last_epoch == total + 4


CE_CASES = {
    "2d": ((7, 5), (7,)),
    "1d": ((5,), ()),
    "4d": ((3, 4, 2, 3), (3, 2, 3)),  # classes in dim 1, as torch
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(CE_CASES))
@pytest.mark.parametrize(
    "ignore_index,label_smoothing", [(-100, 0.0), (1, 0.0), (-100, 0.2), (2, 0.35)]
)
def test_cross_entropy_matches_torch(dtype, case, ignore_index, label_smoothing):
    shape, tshape = CE_CASES[case]
    g = torch.Generator().manual_seed(7)
    logits = (3 * torch.randn(shape, dtype=dtype, generator=g)).requires_grad_()
    C = shape[1] if len(shape) > 1 else shape[0]
    targets = torch.randint(0, C, tshape, generator=g)
    if case != "1d":
        targets.view(-1)[::3] = ignore_index if ignore_index >= 0 else -100
        targets.view(-1)[1] = 0  # at least one row counts
    ref = torch.nn.functional.cross_entropy(
        logits, targets, ignore_index=ignore_index, label_smoothing=label_smoothing
    )
    ref.backward()
    ref = float(ref.detach())
    for arrays in ("torch", "numpy"):
        x, t = (
            (logits.detach(), targets)
            if arrays == "torch"
            else (logits.detach().numpy(), targets.numpy())
        )
        loss, dlogits = ann.cross_entropy(
            x, t, ignore_index=ignore_index, label_smoothing=label_smoothing
        )
        assert isinstance(loss, float)
        assert isinstance(dlogits, torch.Tensor if arrays == "torch" else np.ndarray)
        assert abs(loss - ref) <= TOL[dtype] * max(1.0, abs(ref))
        assert _rel(dlogits, logits.grad) <= TOL[dtype]


def test_cross_entropy_edge_cases_and_errors():
    logits = np.random.default_rng(0).standard_normal((4, 3))
    loss, d = ann.cross_entropy(logits, np.full(4, -100))
    assert loss == 0.0 and not d.any()  # every row ignored: 0, not torch's nan
    with pytest.raises(TypeError, match="targets"):
        ann.cross_entropy(logits, np.zeros(4))
    with pytest.raises(ValueError, match="targets must have shape"):
        ann.cross_entropy(logits, np.zeros(3, dtype=np.int64))
    with pytest.raises(ValueError, match="outside"):
        ann.cross_entropy(logits, np.array([0, 1, 3, 0]))
    with pytest.raises(ValueError, match="label_smoothing"):
        ann.cross_entropy(logits, np.zeros(4, dtype=np.int64), label_smoothing=1.5)


def test_a_training_loop_matches_torch():
    """encoder layer + linear head, cross_entropy, clip_grad_norm_, AdamW and WarmupCosine, as a torch loop."""
    dtype = torch.float64
    # no in_proj_bias: see test_optimizer_matches_torch
    ref_enc, enc, _ = _pair("encoder", dtype, bias=False)
    torch.manual_seed(4)
    ref_head = torch.nn.Linear(8, 3, dtype=dtype)
    head = ann.Linear(8, 3, dtype=dtype)
    head.load_state_dict(ref_head.state_dict())
    ref_params = list(ref_enc.parameters()) + list(ref_head.parameters())
    ref_opt = torch.optim.AdamW(ref_params, lr=0.05)
    ref_sched = torch.optim.lr_scheduler.LambdaLR(
        ref_opt, lambda s: _reference_lr(1.0, 2, 8, 0.1, s)
    )
    params = enc.parameters() + head.parameters(prefix="head")
    opt = ann.AdamW(params, lr=0.05)
    sched = ann.WarmupCosine(opt, 2, 8, min_lr=0.005)
    g = torch.Generator().manual_seed(9)
    x = torch.randn(5, 2, 8, dtype=dtype, generator=g)
    y = torch.randint(0, 3, (5, 2), generator=g)
    losses = []
    for _ in range(8):
        ref_opt.zero_grad()
        ref_loss = torch.nn.functional.cross_entropy(
            ref_head(ref_enc(x)).reshape(-1, 3), y.reshape(-1)
        )
        ref_loss.backward()
        ref_norm = torch.nn.utils.clip_grad_norm_(ref_params, 0.5)
        ref_opt.step()
        ref_sched.step()

        loss, dlogits = ann.cross_entropy(head(enc(x)).reshape(-1, 3), y.reshape(-1))
        enc.backward(head.backward(dlogits.reshape(5, 2, 3))["input"])
        norm = ann.clip_grad_norm_(params, 0.5)
        opt.step()
        sched.step()
        losses.append(loss)
        assert abs(loss - float(ref_loss.detach())) <= 1e-11 and abs(
            norm - float(ref_norm)
        ) <= 1e-11 * float(ref_norm)
        assert opt.lr == pytest.approx(ref_opt.param_groups[0]["lr"], rel=1e-14)
    _assert_params_close(ref_enc, enc, 1e-11)
    _assert_params_close(ref_head, head, 1e-11)
    assert losses[-1] < losses[0]


def test_parameters_handle():
    lin = ann.Linear(3, 2)
    p = lin.parameters()
    assert len(p) == 2 and p.names() == ["weight", "bias"]
    assert [q.names() for q in p] == [["weight"], ["bias"]]
    assert (p + ann.LayerNorm(3).parameters(prefix="norm")).names() == [
        "weight",
        "bias",
        "norm.weight",
        "norm.bias",
    ]
    both = list(itertools.chain(p, ann.Linear(2, 2).parameters(prefix="b")))
    assert ann.SGD(both, lr=0.1).lr == 0.1
    assert len(ann.ReLU().parameters()) == 0
    # step() writes the module's own memory
    opt = ann.SGD(p, lr=1.0)
    lin(np.ones((1, 3), dtype=np.float32))
    lin.backward(np.ones((1, 2), dtype=np.float32))
    w = lin.state_dict()["weight"].copy()
    opt.step()
    assert np.allclose(lin.state_dict()["weight"], w - 1.0)


def test_argument_errors():
    lin = ann.Linear(3, 2)
    with pytest.raises(TypeError, match="params must be the parameters"):
        ann.SGD(torch.nn.Linear(3, 2).parameters(), lr=0.1)
    with pytest.raises(TypeError, match="got Linear"):
        ann.AdamW(lin)
    with pytest.raises(ValueError, match="empty"):
        ann.AdamW(ann.ReLU().parameters())
    with pytest.raises(ValueError, match="lr must be >= 0"):
        ann.SGD(lin.parameters(), lr=-0.1)
    with pytest.raises(TypeError, match="lr must be a real number"):
        ann.AdamW(lin.parameters(), lr="0.1")
    with pytest.raises(ValueError, match=r"betas\[0\] must be in \[0, 1\)"):
        ann.AdamW(lin.parameters(), betas=(1.0, 0.999))
    with pytest.raises(ValueError, match=r"betas\[1\]"):
        ann.AdamW(lin.parameters(), betas=(0.9, -0.1))
    with pytest.raises(TypeError, match="betas must be a pair"):
        ann.AdamW(lin.parameters(), betas=0.9)
    with pytest.raises(ValueError, match="eps"):
        ann.AdamW(lin.parameters(), eps=0.0)
    with pytest.raises(ValueError, match="weight_decay"):
        ann.AdamW(lin.parameters(), weight_decay=-1.0)
    with pytest.raises(ValueError, match="momentum"):
        ann.SGD(lin.parameters(), lr=0.1, momentum=-0.5)
    with pytest.raises(ValueError, match="nesterov"):
        ann.SGD(lin.parameters(), lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="named 'weight'.*prefix"):
        ann.SGD(lin.parameters() + ann.Linear(3, 2).parameters(), lr=0.1)
    with pytest.raises(ValueError, match="twice"):
        ann.SGD(lin.parameters() + lin.parameters(prefix="again"), lr=0.1)
    with pytest.raises(ValueError, match="max_norm"):
        ann.clip_grad_norm_(lin.parameters(), 0.0)
    with pytest.raises(ValueError, match="norm_type"):
        ann.clip_grad_norm_(lin.parameters(), 1.0, norm_type=1)
    opt = ann.SGD(lin.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="lr"):
        opt.lr = -1.0
    with pytest.raises(TypeError, match="optimizer must be an attn.nn optimizer"):
        ann.WarmupCosine(torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1), 1, 2)
    with pytest.raises(ValueError, match="warmup_steps"):
        ann.WarmupCosine(opt, 5, 3)
