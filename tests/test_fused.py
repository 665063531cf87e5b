"""The fused path equals the logits path: values and gradients, for every loss."""

from __future__ import annotations

import pytest
import torch

from trl_emo.losses import CostEmbedding, HeadTransform, fused_linear_loss, get_loss, register_loss, unregister_loss
from trl_emo.losses.asft import ReferenceHead
from trl_emo.losses.fused import auto_chunk_size

from loss_cases import case_id, cases

V, H = 101, 24

CASES = cases()
IDS = [case_id(name, hp) for name, hp in CASES]


def make_inputs(dtype=torch.float32, n_rows=3, seq=17, seed=0, bias=False):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n_rows, seq, H, generator=g, dtype=dtype).requires_grad_(True)
    weight = (0.3 * torch.randn(V, H, generator=g, dtype=dtype)).requires_grad_(True)
    b = (0.1 * torch.randn(V, generator=g, dtype=dtype)).requires_grad_(True) if bias else None
    labels = torch.randint(0, V, (n_rows, seq), generator=g)
    labels[0, :6] = -100  # a prompt
    labels[2, 12:] = -100  # padding
    cost = CostEmbedding(torch.randn(V, 16, generator=g, dtype=torch.float64 if dtype == torch.float64 else torch.float32))
    return hidden, weight, b, labels, cost


def reference_weight(weight):
    """ASFT's reference model in these tests: the same hidden states through another head."""
    g = torch.Generator().manual_seed(123)
    return (weight.detach() + 0.3 * torch.randn(weight.shape, generator=g, dtype=weight.dtype)).detach()


def hparams_for(name, hp, cost, reference=None):
    spec = get_loss(name)
    out = dict(hp)
    if spec.uses_cost_embedding:
        out["cost_embedding"] = cost
    if spec.needs_reference:
        out["reference"] = reference
    return out


def logits_path(name, hp, hidden, weight, bias, labels, cost, transform=HeadTransform(), num_items=None):
    """The reference: full logits `[B, T, V]`, then the per-token reference function on valid positions."""
    y = hidden @ weight.t()
    if bias is not None:
        y = y + bias
    z = y.float() * transform.logit_scale
    if transform.softcap is not None:
        z = transform.softcap * torch.tanh(z / transform.softcap)
    targets, mask = labels[:, 1:], labels[:, 1:] != -100
    ref_logits = (hidden[:, :-1][mask] @ reference_weight(weight).t()).detach()
    values = get_loss(name).per_token(z[:, :-1][mask], targets[mask], **hparams_for(name, hp, cost, ref_logits))
    count = mask.sum() if num_items is None else num_items
    return values.sum() / count


def fused_path(name, hp, hidden, weight, bias, labels, cost, chunk_size=7, transform=None, num_items=None):
    mask = labels[:, 1:] != -100
    return fused_linear_loss(
        hidden[:, :-1][mask],
        weight,
        labels[:, 1:][mask],
        get_loss(name),
        hparams_for(name, hp, cost, ReferenceHead(hidden[:, :-1][mask].detach(), reference_weight(weight))),
        bias=bias,
        num_items_in_batch=num_items,
        chunk_size=chunk_size,
        transform=transform,
    )


def rel_close(a, b, rtol=1e-5):
    a, b = a.detach(), b.detach()
    scale = b.abs().max().clamp_min(1e-12)
    return float((a - b).abs().max() / scale) <= rtol


@pytest.mark.parametrize(("name", "hp"), CASES, ids=IDS)
def test_fused_equals_logits_path_float32(name, hp):
    hidden, weight, _, labels, cost = make_inputs()
    ref = logits_path(name, hp, hidden, weight, None, labels, cost)
    ref_grads = torch.autograd.grad(ref, (hidden, weight))
    out = fused_path(name, hp, hidden, weight, None, labels, cost)
    grads = torch.autograd.grad(out.loss, (hidden, weight))
    assert rel_close(out.loss, ref)
    for got, want in zip(grads, ref_grads):
        assert rel_close(got, want), float((got - want).abs().max())


@pytest.mark.parametrize(("name", "hp"), CASES, ids=IDS)
def test_fused_with_bias_scale_softcap_and_num_items(name, hp):
    hidden, weight, bias, labels, cost = make_inputs(bias=True, seed=1)
    transform = HeadTransform(logit_scale=0.5, softcap=4.0)
    num_items = 3 * int((labels[:, 1:] != -100).sum())
    ref = logits_path(name, hp, hidden, weight, bias, labels, cost, transform, num_items)
    ref_grads = torch.autograd.grad(ref, (hidden, weight, bias))
    out = fused_path(name, hp, hidden, weight, bias, labels, cost, chunk_size=5, transform=transform, num_items=num_items)
    grads = torch.autograd.grad(out.loss, (hidden, weight, bias))
    assert rel_close(out.loss, ref)
    for got, want in zip(grads, ref_grads):
        assert rel_close(got, want)


@pytest.mark.parametrize("chunk_size", [1, 3, 64, 10_000])
def test_chunk_size_does_not_change_the_result(chunk_size):
    hidden, weight, _, labels, cost = make_inputs(dtype=torch.float64, seed=2)
    hp = {"weighting": "mle", "demd": "reference", "ratio_cap": None}
    ref = fused_path("emo", hp, hidden, weight, None, labels, cost, chunk_size=4)
    out = fused_path("emo", hp, hidden, weight, None, labels, cost, chunk_size=chunk_size)
    assert torch.allclose(out.loss, ref.loss, atol=1e-13)
    assert torch.allclose(torch.autograd.grad(out.loss, weight)[0], torch.autograd.grad(ref.loss, weight)[0], atol=1e-13)


@pytest.mark.parametrize("name", ["nll", "ce_entropy"])
def test_fused_backward_passes_gradcheck(name):
    """For losses without stop-gradient the fused custom backward must be the true derivative."""
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(5, 6, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(11, 6, generator=g, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(11, generator=g, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 11, (5,), generator=g)
    hp = {"coef": 0.2} if name == "ce_entropy" else {}

    def fn(h, w, b):
        return fused_linear_loss(h, w, targets, get_loss(name), hp, bias=b, chunk_size=2, transform=HeadTransform(2.0, 3.0)).loss

    assert torch.autograd.gradcheck(fn, (hidden, weight, bias), eps=1e-6, atol=1e-7)


def test_bf16_inputs_accumulate_in_float32():
    hidden, weight, _, labels, cost = make_inputs(seed=4)
    hp = {"beta": 0.7, "h": "logsigmoid"}
    ref = fused_path("gem", hp, hidden, weight, None, labels, cost)
    ref_gw = torch.autograd.grad(ref.loss, weight)[0]
    h16 = hidden.detach().bfloat16().requires_grad_(True)
    w16 = weight.detach().bfloat16().requires_grad_(True)
    out = fused_path("gem", hp, h16, w16, None, labels, cost)
    assert out.loss.dtype == torch.float32 and out.nll.dtype == torch.float32
    gh, gw = torch.autograd.grad(out.loss, (h16, w16))
    assert gh.dtype == torch.bfloat16 and gw.dtype == torch.bfloat16
    # bf16 inputs: only the rounding of the inputs (and of the final gradient) remains
    assert (out.loss - ref.loss).abs().item() < 2e-2 * ref.loss.abs().clamp_min(1).item()
    assert float((gw.float() - ref_gw).abs().max()) < 5e-2 * float(ref_gw.abs().max())


def test_statistics_are_cross_entropy_entropy_and_accuracy():
    hidden, weight, _, labels, cost = make_inputs(seed=5)
    out = fused_path("gem", {"beta": 0.7, "h": "linear"}, hidden, weight, None, labels, cost)
    mask = labels[:, 1:] != -100
    z = (hidden[:, :-1][mask] @ weight.t()).detach()
    targets = labels[:, 1:][mask]
    logp = torch.log_softmax(z, -1)
    assert torch.allclose(out.nll, -logp.gather(-1, targets[:, None]).squeeze(-1), atol=1e-5)
    assert torch.allclose(out.entropy, -(logp.exp() * logp).sum(-1), atol=1e-5)
    assert torch.equal(out.is_top1.bool(), z.argmax(-1) == targets)


def test_emo_reports_its_distance():
    hidden, weight, _, labels, cost = make_inputs(seed=6)
    out = fused_path("emo", {"weighting": "mle", "demd": "paper", "ratio_cap": None}, hidden, weight, None, labels, cost)
    assert "emo_distance" in out.metrics
    assert torch.allclose(out.metrics["emo_distance"], out.metrics["emo_distance"].clamp(0, 2))


def test_no_gradient_work_under_no_grad():
    hidden, weight, _, labels, cost = make_inputs(seed=7)
    with torch.no_grad():
        out = fused_path("gem", {"beta": 0.7, "h": "linear"}, hidden, weight, None, labels, cost)
    assert not out.loss.requires_grad
    ref = fused_path("gem", {"beta": 0.7, "h": "linear"}, hidden, weight, None, labels, cost)
    assert torch.allclose(out.loss, ref.loss)


def test_frozen_head_gets_no_gradient_and_hidden_still_does():
    hidden, weight, _, labels, cost = make_inputs(seed=8)
    frozen = weight.detach()
    out = fused_path("gem", {"beta": 0.7, "h": "linear"}, hidden, frozen, None, labels, cost)
    (gh,) = torch.autograd.grad(out.loss, hidden)
    ref = logits_path("gem", {"beta": 0.7, "h": "linear"}, hidden, frozen, None, labels, cost)
    assert rel_close(gh, torch.autograd.grad(ref, hidden)[0])


@pytest.mark.parametrize(("name", "hp"), CASES, ids=IDS)
def test_all_masked_micro_batch_is_zero_and_back_propagates(name, hp):
    hidden, weight, _, labels, cost = make_inputs()
    labels[:] = -100
    out = fused_path(name, hp, hidden, weight, None, labels, cost)
    assert out.loss.item() == 0.0 and out.loss.requires_grad
    gh, gw = torch.autograd.grad(out.loss, (hidden, weight))
    assert not gh.any() and not gw.any()


def test_third_party_loss_runs_fused_through_autograd():
    @register_loss("test_focal", description="focal loss for a test")
    def focal(logits, targets, gamma=2.0):
        logp = torch.log_softmax(logits.float(), -1).gather(-1, targets[:, None]).squeeze(-1)
        return -((1 - logp.exp()) ** gamma) * logp

    try:
        hidden, weight, _, labels, cost = make_inputs(seed=9)
        ref = logits_path("test_focal", {"gamma": 1.5}, hidden, weight, None, labels, cost)
        out = fused_path("test_focal", {"gamma": 1.5}, hidden, weight, None, labels, cost)
        assert rel_close(out.loss, ref)
        assert rel_close(torch.autograd.grad(out.loss, weight)[0], torch.autograd.grad(ref, weight)[0])
    finally:
        unregister_loss("test_focal")


def test_auto_chunk_size_bounds_the_logits_buffer():
    assert auto_chunk_size(128_256) * 128_256 * 4 <= 128 * 2**20
    assert auto_chunk_size(32_000) == 1048
    assert auto_chunk_size(10) == 8192
