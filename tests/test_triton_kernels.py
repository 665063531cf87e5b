"""The Triton row kernels (the GPU path) against the PyTorch chunk kernels (the CPU path).

On a machine without CUDA they run in Triton's CPU interpreter (`TRITON_INTERPRET=1`, set by
conftest.py before any Triton kernel is defined), on small shapes: the same kernel code, checked
in CI. On a CUDA machine the same tests run the compiled kernels on the GPU. Blocks are made small
so that every row spans several blocks (the online-softmax rescaling is exercised) with a partial
last block.
"""

from __future__ import annotations

import logging

import pytest
import torch

pytest.importorskip("triton", reason="the Triton kernels need `pip install triton` (in the test extra)")

from trl_emo.losses import CostEmbedding, HeadTransform, fused_linear_loss, get_loss, register_loss, unregister_loss  # noqa: E402
from trl_emo.losses import _triton, fused, nll  # noqa: E402
from trl_emo.losses.asft import ReferenceHead  # noqa: E402

from loss_cases import case_id, cases  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and not _triton.interpreting():
    pytest.skip("no CUDA and TRITON_INTERPRET is not set", allow_module_level=True)

CASES = cases(require_row_kernel=True)
IDS = [case_id(name, hp) for name, hp in CASES]
N, H, V = 37, 16, 300


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    # 128-column blocks: a 300-token row is 3 blocks, the last one partial.
    monkeypatch.setattr(_triton, "_MAX_BLOCK_INTERPRETED", 128)
    monkeypatch.setattr(_triton, "_MAX_BLOCK", 128)


def inputs(seed, dtype=torch.float32, bias=False):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, H, generator=g).to(DEVICE, dtype).requires_grad_(True)
    weight = (0.5 * torch.randn(V, H, generator=g)).to(DEVICE, dtype).requires_grad_(True)
    b = (0.2 * torch.randn(V, generator=g)).to(DEVICE, dtype).requires_grad_(True) if bias else None
    targets = torch.randint(0, V, (N,), generator=g).to(DEVICE)
    cost = CostEmbedding(torch.randn(V, 8, generator=g).to(DEVICE))
    return hidden, weight, b, targets, cost


def with_cost(name, hp, cost, hidden=None, weight=None):
    """The loss's keyword arguments: EMO's cost embedding; for ASFT a reference head (another head)."""
    spec = get_loss(name)
    out = dict(hp)
    if spec.uses_cost_embedding:
        out["cost_embedding"] = cost
    if spec.needs_reference:
        g = torch.Generator().manual_seed(11)
        ref_weight = weight.detach() + 0.3 * torch.randn(weight.shape, generator=g).to(weight.device, weight.dtype)
        out["reference"] = ReferenceHead(hidden.detach(), ref_weight, logit_scale=0.8, softcap=6.0)
    return out


def run(name, hp, hidden, weight, bias, targets, backend, **kwargs):
    out = fused_linear_loss(hidden, weight, targets, get_loss(name), hp, bias=bias, backend=backend, **kwargs)
    params = [p for p in (hidden, weight, bias) if p is not None and p.requires_grad]
    grads = torch.autograd.grad(out.loss, params) if out.loss.requires_grad else ()
    return out, grads


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def assert_same(got, want, tol):
    (o1, g1), (o2, g2) = got, want
    assert rel(o1.loss, o2.loss) < tol
    for field in ("token_losses", "nll", "entropy"):
        assert rel(getattr(o1, field), getattr(o2, field)) < tol, field
    assert torch.equal(o1.is_top1, o2.is_top1)
    assert set(o1.metrics) == set(o2.metrics)
    for key in o1.metrics:
        assert rel(o1.metrics[key], o2.metrics[key]) < tol, key
    assert len(g1) == len(g2)
    for a, b in zip(g1, g2):
        assert a.dtype == b.dtype
        assert rel(a, b) < tol


@pytest.mark.parametrize(("name", "hp"), CASES, ids=IDS)
def test_row_kernel_equals_the_pytorch_kernel(name, hp):
    hidden, weight, _, targets, cost = inputs(0)
    hp = with_cost(name, hp, cost, hidden, weight)
    got = run(name, hp, hidden, weight, None, targets, "triton", chunk_size=16)
    want = run(name, hp, hidden, weight, None, targets, "torch", chunk_size=16)
    assert_same(got, want, 2e-5)


@pytest.mark.parametrize(("name", "hp"), CASES, ids=IDS)
def test_row_kernel_with_bias_scale_softcap_and_num_items(name, hp):
    hidden, weight, bias, targets, cost = inputs(1, bias=True)
    hp = with_cost(name, hp, cost, hidden, weight)
    kwargs = {"chunk_size": 20, "transform": HeadTransform(logit_scale=0.5, softcap=4.0), "num_items_in_batch": 3 * N}
    got = run(name, hp, hidden, weight, bias, targets, "triton", **kwargs)
    want = run(name, hp, hidden, weight, bias, targets, "torch", **kwargs)
    assert_same(got, want, 2e-5)


def test_argmax_ties_across_blocks_pick_the_first_like_torch():
    hidden, weight, _, targets, _ = inputs(2)
    with torch.no_grad():
        weight[250] = weight[5]  # rows 5 and 250 (blocks 0 and 1) give every position the same logit
        hidden.mul_(0.0).add_(weight[5])  # ... which is each position's maximum
    targets[:10] = 250
    targets[10:20] = 5
    out, _ = run("nll", {}, hidden, weight, None, targets, "triton")
    z = (hidden @ weight.t()).detach()
    assert torch.equal(out.is_top1.bool(), z.argmax(-1) == targets)
    assert out.is_top1[10:20].all() and not out.is_top1[:10].any()


def test_no_gradient_pass_leaves_no_gradient_work():
    hidden, weight, _, targets, _ = inputs(3)
    with torch.no_grad():
        out, _ = run("gem", {"beta": 0.7, "h": "logsigmoid"}, hidden, weight, None, targets, "triton")
    ref, _ = run("gem", {"beta": 0.7, "h": "logsigmoid"}, hidden, weight, None, targets, "torch")
    assert not out.loss.requires_grad
    assert rel(out.token_losses, ref.token_losses) < 2e-5


def test_frozen_head_gets_no_gradient_and_hidden_still_does():
    hidden, weight, _, targets, _ = inputs(4)
    frozen = weight.detach()
    (o, (gh,)) = run("mixce", {"gamma": 0.8}, hidden, frozen, None, targets, "triton")
    (_, (want,)) = run("mixce", {"gamma": 0.8}, hidden, frozen, None, targets, "torch")
    assert rel(gh, want) < 2e-5


def test_all_masked_micro_batch_is_a_connected_zero():
    hidden, weight, _, targets, _ = inputs(5)
    out, (gh, gw) = run("gem", {"beta": 0.7, "h": "linear"}, hidden[:0], weight, None, targets[:0], "triton")
    assert out.loss.item() == 0.0 and out.loss.requires_grad
    assert gh.shape == (0, H) and not gw.any()


def reference_float64(name, hp, hidden, weight, targets, num_items=None):
    h = hidden.detach().double().requires_grad_(True)
    w = weight.detach().double().requires_grad_(True)
    if "cost_embedding" in hp:
        hp = {**hp, "cost_embedding": CostEmbedding(hp["cost_embedding"].weight.double())}
    return run(name, hp, h, w, None, targets, "torch", num_items_in_batch=num_items)


def norm_rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize(
    ("name", "hp"),
    [("nll", {}), ("gem", {"beta": 0.7, "h": "logsigmoid"}), ("emo", {"weighting": "mle", "demd": "reference", "ratio_cap": None})],
    ids=["nll", "gem_ls", "emo"],
)
def test_half_precision_against_float64(name, hp, dtype):
    """Half-precision logits and gradients: the error is the rounding of the inputs and of the logits.

    Tolerances are loose on the CPU: Triton's interpreter truncates float32 -> bf16 stores instead of
    rounding them, which doubles the error of the stored gradient.
    """
    hidden, weight, _, targets, _ = inputs(6, dtype=dtype)
    hp = with_cost(name, hp, CostEmbedding(weight.detach()))
    (o, (gh, gw)) = run(name, hp, hidden, weight, None, targets, "triton")
    (ref, (rh, rw)) = reference_float64(name, hp, hidden, weight, targets)
    assert gh.dtype == dtype and gw.dtype == dtype
    assert abs(o.loss.item() - ref.loss.item()) <= 2e-3 * abs(ref.loss.item())
    tol = 1.5e-2 if dtype == torch.bfloat16 else 3e-3
    assert norm_rel(gh, rh) < tol and norm_rel(gw, rw) < tol


def test_fp16_autocast_applies_one_over_n_after_the_products():
    """With fp16 logits, (p - e_y)/N for a large N would underflow before the products."""
    if DEVICE == "cpu" and not torch.amp.autocast_mode.is_autocast_available("cpu"):
        pytest.skip("no CPU autocast")
    hidden, weight, _, targets, _ = inputs(10)
    num_items = 10**6
    with torch.autocast(DEVICE, dtype=torch.float16):
        (o, (gh, gw)) = run("gem", {"beta": 0.7, "h": "linear"}, hidden, weight, None, targets, "triton", num_items_in_batch=num_items)
    (ref, (rh, rw)) = reference_float64("gem", {"beta": 0.7, "h": "linear"}, hidden.half(), weight.half(), targets, num_items)
    assert gh.dtype == torch.float32 and gw.dtype == torch.float32
    assert norm_rel(gh, rh) < 3e-3 and norm_rel(gw, rw) < 3e-3


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_fp16_parameters_under_a_gradscaler_scale(backend):
    """GradScaler's first scale, 2**16, is itself above fp16's largest number (65,504), and the unscaled gradient
    of a mean over many tokens is below its smallest: the gradient formed in forward must take the scale in float32
    and be rounded once (seen on an H100: every element inf or 0 before)."""
    hidden, weight, _, targets, _ = inputs(12, dtype=torch.float16)
    scale, num_items = 2.0**16, 4096
    out = fused_linear_loss(hidden, weight, targets, get_loss("gem"), {"beta": 0.7, "h": "linear"}, backend=backend,
                            num_items_in_batch=num_items)
    gh, gw = torch.autograd.grad(out.loss * scale, (hidden, weight))
    h = hidden.detach().double().requires_grad_(True)
    w = weight.detach().double().requires_grad_(True)
    ref = fused_linear_loss(h, w, targets, get_loss("gem"), {"beta": 0.7, "h": "linear"}, backend="torch",
                            num_items_in_batch=num_items)
    rh, rw = torch.autograd.grad(ref.loss * scale, (h, w))
    assert gh.dtype == torch.float16 and gw.dtype == torch.float16
    assert torch.isfinite(gh).all() and torch.isfinite(gw).all()
    assert norm_rel(gh, rh) < 3e-3 and norm_rel(gw, rw) < 3e-3


def test_float32_weight_gradient_accumulator_for_a_bf16_head():
    hidden, weight, _, targets, _ = inputs(7, dtype=torch.bfloat16)
    (_, (_, gw_bf16)) = run("nll", {}, hidden, weight, None, targets, "triton", chunk_size=4)
    (_, (_, gw_fp32)) = run("nll", {}, hidden, weight, None, targets, "triton", chunk_size=4, fp32_weight_grad=True)
    (_, (_, rw)) = reference_float64("nll", {}, hidden, weight, targets)
    assert gw_fp32.dtype == torch.bfloat16
    # Ten roundings of the running sum (one per chunk) against one at the end.
    assert norm_rel(gw_fp32, rw) < norm_rel(gw_bf16, rw)


def test_chunk_rows_follow_the_memory_budget():
    plan = fused._Plan(
        spec=get_loss("gem"), hparams={}, transform=HeadTransform(), backend="triton", chunk_size=None,
        chunk_memory=None, compute_dtype=torch.bfloat16, want_grad=True,
    )
    assert plan.chunk_rows(128_256, 16_384) == 1280
    assert plan.chunk_rows(128_256, 100) == 128  # never more rows than positions (rounded to whole tiles)
    emo_plan = fused._Plan(**{**plan.__dict__, "spec": get_loss("emo")})
    assert emo_plan.chunk_rows(128_256, 16_384) == 1024  # 1.25 [n, V] buffers in the same budget
    small = fused._Plan(**{**plan.__dict__, "chunk_memory": 64 * 2**20})
    rows = small.chunk_rows(128_256, 16_384)
    assert rows * 128_256 * 2 <= 64 * 2**20 and rows % 64 == 0


def test_auto_falls_back_to_pytorch_when_a_kernel_cannot_be_built(monkeypatch, caplog):
    class CompilationError(Exception):
        pass

    CompilationError.__module__ = "triton.compiler.errors"

    def broken(launch, **hparams):
        raise CompilationError("out of registers")

    register_loss("test_unbuildable", nll.per_token, chunk_kernel=nll.chunk, row_kernel=broken)
    monkeypatch.setattr(_triton, "triton_usable", lambda device, explicit=False: True)
    try:
        hidden, weight, _, targets, _ = inputs(8)
        spec = get_loss("test_unbuildable")
        with caplog.at_level(logging.WARNING, logger="trl_emo.losses.fused"):
            out = fused_linear_loss(hidden, weight, targets, spec, {}, backend="auto")
        ref = fused_linear_loss(hidden, weight, targets, spec, {}, backend="torch")
        assert rel(out.loss, ref.loss) < 1e-6
        assert "could not be built" in caplog.text
        assert fused.resolve_backend("auto", spec, torch.device(DEVICE), torch.float32) == "torch"
        with pytest.raises(CompilationError):
            fused_linear_loss(hidden, weight, targets, spec, {}, backend="triton")
    finally:
        unregister_loss("test_unbuildable")
        fused._BROKEN_ROW_KERNELS.pop("test_unbuildable", None)


def test_explicit_triton_backend_explains_why_it_cannot_run():
    hidden, weight, _, targets, _ = inputs(9)
    with pytest.raises(ValueError, match="float64"):
        fused_linear_loss(hidden.double(), weight.double(), targets, get_loss("nll"), {}, backend="triton")
    with pytest.raises(ValueError, match="fused backend must be one of"):
        fused_linear_loss(hidden, weight, targets, get_loss("nll"), {}, backend="cuda")
