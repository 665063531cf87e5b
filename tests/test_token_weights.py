"""Per-token loss weights and a LoRA adapter on the head, for every registered loss (issue 44).

The fused path with weights and a low-rank head term equals the logits path with the same weights (value and
gradient, the adapter's included), on the PyTorch backend for every case and on the Triton row kernels (Triton's
interpreter on a CPU) for every loss's defaults; weight 1 everywhere gives the unweighted result bit for bit, and
weight 0 is masking. A loss registered later is covered as soon as it is registered (`loss_cases.cases`).
"""

from __future__ import annotations

import pytest
import torch

from trl_emo.losses import CostEmbedding, FusedLinearLoss, fused_linear_loss, get_loss
from trl_emo.losses._common import select_positions
from trl_emo.losses.asft import ReferenceHead
from trl_emo.losses.fused import HeadAdapter, HeadTransform
from trl_emo.losses.registry import ROLES, TOKEN_WEIGHTS, token_weight_rows

from loss_cases import case_id, cases, default_hparams
from test_fused import hparams_for

B, T, H, V, R = 3, 13, 16, 97, 4
CASES = cases()
IDS = [case_id(name, hp) for name, hp in CASES]
SCALING = 0.75


def make(seed=0, bias=False):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, H, generator=g).requires_grad_(True)
    weight = (0.4 * torch.randn(V, H, generator=g)).requires_grad_(True)
    lora_a = (0.3 * torch.randn(R, H, generator=g)).requires_grad_(True)
    lora_b = (0.3 * torch.randn(V, R, generator=g)).requires_grad_(True)
    b = (0.1 * torch.randn(V, generator=g)).requires_grad_(True) if bias else None
    labels = torch.randint(0, V, (B, T), generator=g)
    labels[0, :4] = -100  # a prompt
    labels[2, 10:] = -100  # padding
    # Weights in [0, 2], a few exact zeros (masking) and a run of ones.
    weights = 2.0 * torch.rand(B, T, generator=g)
    weights[1, 3:6] = 0.0
    weights[2, :3] = 1.0
    ref_weight = (weight.detach() + 0.3 * torch.randn(V, H, generator=g)).detach()
    cost = CostEmbedding(torch.randn(V, 8, generator=g))
    return hidden, weight, b, lora_a, lora_b, labels, weights, ref_weight, cost


def fused(name, hp, hidden, weight, bias, lora, labels, weights, ref_weight, cost, backend="torch", chunk_size=7):
    """The fused path as the trainer runs it: positions selected with their weights, the adapter's rows."""
    spec = get_loss(name)
    positions = select_positions(labels, label_rows=spec.reads_label_rows(hp), weights=weights)
    rows = positions.take(hidden)
    kwargs = hparams_for(name, hp, cost, ReferenceHead(rows.detach(), ref_weight))
    if positions.roles is not None:
        kwargs[ROLES] = positions.roles
    adapter = None if lora is None else HeadAdapter(SCALING * rows @ lora[0].t(), lora[1])
    return fused_linear_loss(rows, weight, positions.targets, spec, kwargs, bias=bias, chunk_size=chunk_size,
                             weights=positions.weights, adapter=adapter, backend=backend,
                             transform=HeadTransform(0.9, 5.0))


def logits_path(name, hp, hidden, weight, bias, lora, labels, weights, ref_weight, cost):
    """The reference: the full logits `[B, T, V]` with the adapter's product, then the per-token function on the
    selected rows, weighted as `Objective.from_logits` weighs them."""
    spec = get_loss(name)
    y = hidden @ weight.t() + SCALING * (hidden @ lora[0].t()) @ lora[1].t()
    if bias is not None:
        y = y + bias
    z = 5.0 * torch.tanh(0.9 * y / 5.0)
    positions = select_positions(labels, label_rows=spec.reads_label_rows(hp), weights=weights)
    kwargs = hparams_for(name, hp, cost, positions.take(hidden @ ref_weight.t()).detach())
    if positions.roles is not None:
        kwargs[ROLES] = positions.roles
    w = positions.weights
    if not spec.scales_by_weight:
        kwargs[TOKEN_WEIGHTS] = token_weight_rows(w, positions.roles)
    values = spec.per_token(positions.take(z), positions.targets, **kwargs)
    if spec.scales_by_weight:
        values = values * w
    return values.sum() / w.sum()


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


@pytest.mark.parametrize(("name", "hp"), CASES, ids=IDS)
def test_weights_and_a_head_adapter_equal_the_logits_path(name, hp):
    hidden, weight, _, lora_a, lora_b, labels, weights, ref_weight, cost = make()
    params = (hidden, weight, lora_a, lora_b)
    want = logits_path(name, hp, hidden, weight, None, (lora_a, lora_b), labels, weights, ref_weight, cost)
    want_grads = torch.autograd.grad(want, params)
    got = fused(name, hp, hidden, weight, None, (lora_a, lora_b), labels, weights, ref_weight, cost)
    grads = torch.autograd.grad(got.loss, params)
    assert rel(got.loss, want) < 1e-5
    for what, a, b in zip(("hidden", "weight", "lora_A", "lora_B"), grads, want_grads):
        assert rel(a, b) < 1e-5, what
    # The rows' objective sums to the loss times the sum of the weights.
    assert torch.allclose(got.token_losses.sum() / got.weights.sum(), got.loss, rtol=1e-5)


@pytest.mark.parametrize(("name", "hp"), CASES, ids=IDS)
def test_weight_one_is_the_unweighted_loss_bit_for_bit_and_weight_zero_is_masking(name, hp):
    hidden, weight, bias, _, _, labels, weights, ref_weight, cost = make(seed=1, bias=True)
    spec = get_loss(name)
    loss_fn = FusedLinearLoss(name, cost_embedding=cost, chunk_size=5, backend="torch", **hp)
    reference = ReferenceHead(hidden.detach(), ref_weight) if spec.wants_reference(hp) else None

    def run(labels, w):
        out = loss_fn(hidden, weight, labels, bias, reference=reference, weights=w, return_stats=True)
        return out, torch.autograd.grad(out.loss, (hidden, weight, bias))

    plain, plain_grads = run(labels, None)
    ones, ones_grads = run(labels, torch.ones(B, T))
    assert torch.equal(ones.loss, plain.loss) and torch.equal(ones.token_losses, plain.token_losses)
    assert all(torch.equal(a, b) for a, b in zip(ones_grads, plain_grads))
    zeroed = weights.clone()
    masked = labels.clone()
    zeroed[0, 6:9] = 0.0
    masked[0, 6:9] = -100
    masked[zeroed == 0] = -100
    got, got_grads = run(labels, zeroed)
    want, want_grads = run(masked, torch.where(masked == -100, torch.zeros_like(zeroed), zeroed))
    assert torch.equal(got.loss, want.loss)
    assert all(torch.equal(a, b) for a, b in zip(got_grads, want_grads))


def test_bad_weights_are_one_line_errors():
    hidden, weight, _, _, _, labels, _, _, _ = make()
    loss_fn = FusedLinearLoss("gem")
    for bad, match in (
        (torch.ones(B, T - 1), "labels' shape"),
        (-torch.ones(B, T), "non-negative"),
        (torch.full((B, T), float("nan")), "non-negative"),
        (torch.ones(B, T, dtype=torch.bool), "real numbers"),
        ([1.0] * T, "tensor"),
    ):
        with pytest.raises(ValueError, match=match) as info:
            loss_fn(hidden, weight, labels, weights=bad)
        assert "\n" not in str(info.value) and "weights" in str(info.value)


def test_weights_below_one_normalize_by_their_sum():
    """A sum of weights below 1 is the denominator itself (not clamped to 1 as a token count is)."""
    hidden, weight, _, _, _, labels, _, _, _ = make()
    small = torch.full((B, T), 1e-3)
    unweighted = FusedLinearLoss("nll")(hidden, weight, labels)
    assert torch.allclose(FusedLinearLoss("nll")(hidden, weight, labels, weights=small), unweighted, rtol=1e-5)


# -- the Triton row kernels --------------------------------------------------------------------------------------------

triton_cases = [(name, hp) for name, hp in ((n, default_hparams(n)) for n, _ in CASES) if get_loss(name).row_kernel]
TRITON_CASES = list({name: (name, hp) for name, hp in triton_cases}.values())


# The weight-1 check on the Triton path, for a loss the paths scale, one that takes weights itself (EKSFT) and one with a
# first pass and per-sequence terms (SLM); the PyTorch path checks every loss (above). The interpreter is slow.
BIT_FOR_BIT_ON_TRITON = ("nll", "eksft", "slm")


@pytest.fixture
def small_blocks(monkeypatch):
    from trl_emo.losses import _triton

    if not torch.cuda.is_available() and not _triton.interpreting():
        pytest.skip("no CUDA and TRITON_INTERPRET is not set")
    # 64-column blocks: a 97-token row is 2 blocks, the last one partial.
    monkeypatch.setattr(_triton, "_MAX_BLOCK_INTERPRETED", 64)
    monkeypatch.setattr(_triton, "_MAX_BLOCK", 64)


@pytest.mark.parametrize(("name", "hp"), TRITON_CASES, ids=[name for name, _ in TRITON_CASES])
def test_row_kernels_take_weights_and_a_head_adapter(name, hp, small_blocks):
    pytest.importorskip("triton")
    hidden, weight, bias, lora_a, lora_b, labels, weights, ref_weight, cost = make(seed=2, bias=True)
    params = (hidden, weight, bias, lora_a, lora_b)
    results = {}
    for backend in ("triton", "torch"):
        out = fused(name, hp, hidden, weight, bias, (lora_a, lora_b), labels, weights, ref_weight, cost, backend, 16)
        results[backend] = (out, torch.autograd.grad(out.loss, params))
    (got, got_grads), (want, want_grads) = results["triton"], results["torch"]
    assert rel(got.loss, want.loss) < 2e-5 and rel(got.token_losses, want.token_losses) < 2e-5
    for what, a, b in zip(("hidden", "weight", "bias", "lora_A", "lora_B"), got_grads, want_grads):
        assert rel(a, b) < 2e-5, what
    if name not in BIT_FOR_BIT_ON_TRITON:
        return
    # Weight 1 everywhere: the Triton path's unweighted bits.
    ones = fused(name, hp, hidden, weight, bias, None, labels, torch.ones(B, T), ref_weight, cost, "triton", 16)
    plain = fused(name, hp, hidden, weight, bias, None, labels, None, ref_weight, cost, "triton", 16)
    assert torch.equal(ones.loss, plain.loss)
    assert all(torch.equal(a, b) for a, b in zip(torch.autograd.grad(ones.loss, params[:3]),
                                                  torch.autograd.grad(plain.loss, params[:3])))


def test_the_framework_free_api_takes_a_lora_head_and_weights():
    """`FusedLinearLoss(..., lora=(A, B, scaling), weights=...)` equals the logits path (PEFT's LoRA forward)."""
    hidden, weight, _, lora_a, lora_b, labels, weights, ref_weight, cost = make(seed=3)
    weight.requires_grad_(False)  # a LoRA'd head is frozen
    params = (hidden, lora_a, lora_b)
    want = logits_path("gem", default_hparams("gem"), hidden, weight, None, (lora_a, lora_b), labels, weights,
                       ref_weight, cost)
    want_grads = torch.autograd.grad(want, params)
    got = FusedLinearLoss("gem", chunk_size=6, logit_scale=0.9, softcap=5.0)(
        hidden, weight, labels, lora=(lora_a, lora_b, SCALING), weights=weights)
    assert rel(got, want) < 1e-5
    assert all(rel(a, b) < 1e-5 for a, b in zip(torch.autograd.grad(got, params), want_grads))
    with pytest.raises(ValueError, match="lora must be") as info:
        FusedLinearLoss("gem")(hidden, weight, labels, lora=(lora_b, lora_a, SCALING))
    assert "\n" not in str(info.value)
