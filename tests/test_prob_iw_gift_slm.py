"""Beyond Log Likelihood (`prob`), iw-SFT, GIFT and SLM against their authors' code (`tests/authors_code.py`; SLM: the
paper's formula), in float64, value and gradient: the logits path and the fused PyTorch path, and the fused Triton
path (in the interpreter, or on a GPU) in float32; the invariants (iw-SFT with the policy as reference and `prob` as
`q → 0` are cross-entropy, GIFT as `β → ∞`); thresholds and ties decided alike on every backend and chunk size; the
scope of each weight or selection under gradient accumulation; packed sequences."""

from __future__ import annotations

import pytest
import torch

from authors_code import (
    beyond_ll_authors_forward,
    gift_authors_forward,
    iw_sft_authors_forward,
    iw_sft_reference_log_probs,
    slm_paper_forward,
)
from trl_emo.losses import FusedLinearLoss, _triton, fused_linear_loss, get_loss
from trl_emo.losses._common import select_targets
from trl_emo.losses.asft import ReferenceHead
from trl_emo.losses.registry import RowTensors
from trl_emo.losses.slm import kept_count

B, T, H, V = 3, 14, 8, 40


def grads(loss, *tensors):
    return torch.autograd.grad(loss, tensors, allow_unused=True, retain_graph=True)


def assert_same(got, want, what, rtol=1e-9):
    """Equal up to `rtol` of the largest value (the authors' `+ 1e-8` denominators stay far below 1e-9 here)."""
    for g, w in zip(got, want, strict=True):
        g, w = g.detach(), w.detach()
        scale = w.abs().max().clamp_min(1e-30)
        assert float((g - w).abs().max() / scale) < rtol, (what, float((g - w).abs().max() / scale))


def model_inputs(seed, scale=1.5, dtype=torch.float64, argmax_share=0.5):
    """A batch whose targets are half the policy's own argmax (so `p_y` spans small to near 1), a prompt, padding, and a
    reference head near the policy's."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, H, generator=g, dtype=dtype)
    weight = scale * torch.randn(V, H, generator=g, dtype=dtype)
    ref_weight = weight + 0.5 * torch.randn(V, H, generator=g, dtype=dtype)
    labels = torch.randint(0, V, (B, T), generator=g)
    mine = torch.rand(B, T - 1, generator=g) < argmax_share
    labels[:, 1:] = torch.where(mine, (hidden[:, :-1] @ weight.t()).argmax(-1), labels[:, 1:])
    labels[0, :4] = -100  # a prompt
    labels[1, 10:] = -100  # padding
    labels[2, :2] = -100
    return hidden.requires_grad_(True), weight.requires_grad_(True), ref_weight, labels


def rows_of(hidden, labels):
    """The target positions: their hidden states, targets, and sequence (batch row) ids."""
    targets, mask = select_targets(labels)
    sequences = torch.arange(labels.shape[0])[:, None].expand_as(mask)[mask]
    return hidden[:, :-1][mask], targets[mask], mask, sequences


def ours(name, hp, hidden, weight, ref_weight, labels, chunk_size=5, backend="torch", num_items=None):
    """(logits path, fused path) of one micro-batch, `Σ ℓ / N`."""
    spec = get_loss(name)
    h, targets, mask, sequences = rows_of(hidden, labels)
    count = mask.sum() if num_items is None else num_items
    extra = {"sequences": RowTensors({"id": sequences})} if spec.reads_sequences(hp) else {}
    logits_extra = dict(extra)
    if spec.needs_reference:
        logits_extra["reference"] = (h.detach() @ ref_weight.t()).detach()
        extra["reference"] = ReferenceHead(h.detach(), ref_weight)
    logits = spec.per_token(h @ weight.t(), targets, **hp, **logits_extra).sum() / count
    fused = fused_linear_loss(h, weight, targets, spec, {**hp, **extra}, chunk_size=chunk_size, backend=backend,
                              num_items_in_batch=num_items)
    return logits, fused


def check_exact(copy, logits, fused, hidden, weight, rtol=1e-9):
    assert_same([logits, fused.loss], [copy, copy], "value", rtol)
    want = grads(copy, hidden, weight)
    assert_same(grads(logits, hidden, weight), want, "logits gradient", rtol)
    assert_same(grads(fused.loss, hidden, weight), want, "fused gradient", rtol)


# -- Beyond Log Likelihood ---------------------------------------------------------------------------------------------

PROB_CASES = [
    ("GeneralFamily-10", {"q": 10.0}),  # their math script
    ("GeneralFamily-8", {"q": 8.0}),  # their README's example
    ("p", {"q": 1.0}),
    ("logp", {"q": 0.0}),
    ("original", {"q": 0.0}),
    ("OnlyTopP-0.3", {"q": 1.0, "only": "top", "threshold": 0.3}),
    ("OnlyBottomP-0.3", {"q": 1.0, "only": "bottom", "threshold": 0.3}),
    ("OnlyTopLogP-0.05", {"q": 0.0, "only": "top", "threshold": 0.05}),
    ("OnlyBottomLogP-0.6", {"q": 0.0, "only": "bottom", "threshold": 0.6}),
]


def prob_hp(settings):
    return {"q": 10.0, "only": None, "threshold": None, **settings}


def beyond_ll_copy(hidden, weight, labels, objective_trans):
    targets, mask = select_targets(labels)
    logits = (hidden @ weight.t())[:, :-1].reshape(-1, V)
    return beyond_ll_authors_forward(logits, targets.clamp(min=0).reshape(-1), mask.reshape(-1).double(),
                                     objective_trans)


@pytest.mark.parametrize(("objective_trans", "settings"), PROB_CASES, ids=[c[0] for c in PROB_CASES])
def test_prob_equals_the_authors_code(objective_trans, settings):
    hidden, weight, ref_weight, labels = model_inputs(0)
    hp = prob_hp(settings)
    copy = beyond_ll_copy(hidden, weight, labels, objective_trans)
    logits, fused = ours("prob", hp, hidden, weight, ref_weight, labels)
    check_exact(copy, logits, fused, hidden, weight)
    if hp["only"] is not None:  # the threshold keeps some tokens and drops others
        assert 0 < float(fused.metrics["prob_kept"].mean()) < 1


def test_prob_at_q_zero_is_cross_entropy_and_approaches_it_as_q_goes_to_zero():
    hidden, weight, ref_weight, labels = model_inputs(1)
    copy = beyond_ll_copy(hidden, weight, labels, "original")
    logits, fused = ours("prob", prob_hp({"q": 0.0}), hidden, weight, ref_weight, labels)
    check_exact(copy, logits, fused, hidden, weight)
    nll_logits, nll = ours("nll", {}, hidden, weight, ref_weight, labels)
    check_exact(nll.loss, logits, fused, hidden, weight, rtol=1e-13)
    # (1 - p^q) / q = -log p - q log² p / 2 + ...: within q · (log p)² of cross-entropy (expm1 keeps it exact).
    logits, fused = ours("prob", prob_hp({"q": 1e-7}), hidden, weight, ref_weight, labels)
    check_exact(copy, logits, fused, hidden, weight, rtol=1e-5)
    assert float(((fused.loss - copy).abs() / copy).detach()) > 1e-10  # not cross-entropy itself


BACKENDS = ["torch"] + (["triton"] if _triton.HAS_TRITON and (torch.cuda.is_available() or _triton.interpreting())
                        else [])
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def small_blocks(monkeypatch):
    # 16-column blocks: a 40-token row spans three blocks, the last partial.
    monkeypatch.setattr(_triton, "_MAX_BLOCK_INTERPRETED", 16)
    monkeypatch.setattr(_triton, "_MAX_BLOCK", 16)


def test_prob_thresholds_are_decided_alike_on_every_backend_and_chunk_size(small_blocks):
    """Rows whose `p_y` is the threshold in exact arithmetic (two tied top logits: `p_y = ½`) are kept by `top` and by
    `bottom` on both backends and at every chunk size, whatever float32 leaves of `log ½`; rows 0.1 % away fall on
    their own side."""
    t = 0.5
    z = torch.randn(24, V, generator=torch.Generator().manual_seed(2))
    at, above, below = [0, 5, 11, 17], [2, 20], [8, 14]
    for i in at:
        z[i] = -40.0
        z[i, i % V] = z[i, (i + 1) % V] = 9.0  # two tied maxima: p = ½ each
    for i, share in [(i, t * 1.001) for i in above] + [(i, t * 0.999) for i in below]:
        z[i] = -40.0
        z[i, 0] = 0.0
        z[i, 1] = torch.log(torch.tensor((1 - share) / share))  # p_0 = share, the rest on token 1
    targets = torch.randint(0, V, (24,), generator=torch.Generator().manual_seed(3))
    targets[at] = torch.tensor([i % V for i in at])
    targets[above + below] = 0
    weight = torch.eye(V)  # the hidden states are the logits
    hidden, weight, targets = z.to(DEVICE), weight.to(DEVICE), targets.to(DEVICE)
    for only, want in (("top", set(at + above)), ("bottom", set(at + below))):
        hp = prob_hp({"q": 1.0, "only": only, "threshold": t})
        seen = {}
        for backend in BACKENDS:
            for chunk_size in (3, 7, 24) if backend == "torch" else (7, 24):
                out = fused_linear_loss(hidden, weight, targets, get_loss("prob"), hp, chunk_size=chunk_size,
                                        backend=backend)
                seen[backend, chunk_size] = set(out.metrics["prob_kept"].nonzero().flatten().tolist())
        kept = next(iter(seen.values()))
        assert all(rows == kept for rows in seen.values()), seen
        assert want <= kept and not (set(at + above + below) - want) & kept, (only, kept)


# -- iw-SFT ------------------------------------------------------------------------------------------------------------

IW_CASES = [
    {"temperature": 1.0, "clip": 16.0, "sum_over_time": True},  # what their trainer passes
    {"temperature": 2.0, "clip": 16.0, "sum_over_time": True},  # their loss class's default temperature
    {"temperature": 1.0, "clip": 16.0, "sum_over_time": False},  # their per-token branch
]


def iw_sft_copy(hidden, weight, ref_weight, labels, hp, num_items):
    """Their loss one sequence at a time (batch size 1, their setting), each normalized by the batch's token count."""
    total = 0.0
    for b in range(labels.shape[0]):
        h, lab = hidden[b : b + 1], labels[b : b + 1]
        ref = iw_sft_reference_log_probs(h @ ref_weight.t(), lab)
        total = total + iw_sft_authors_forward(h @ weight.t(), lab, ref, num_items, hp["sum_over_time"],
                                               hp["temperature"])
    return total


@pytest.mark.parametrize("hp", IW_CASES, ids=["run", "class-default", "per-token"])
@pytest.mark.parametrize("seed", [0, 1])
def test_iw_sft_equals_the_authors_code_one_sequence_at_a_time(hp, seed):
    # Seed 1: the policy's own argmax as most targets and a flat reference, so that its weights reach the clamps.
    hidden, weight, ref_weight, labels = model_inputs(seed, argmax_share=0.9 if seed else 0.5)
    if seed == 1:
        ref_weight = 0.05 * ref_weight
    num_items = int((labels[:, 1:] != -100).sum())
    copy = iw_sft_copy(hidden, weight, ref_weight, labels, hp, num_items)
    logits, fused = ours("iw_sft", hp, hidden, weight, ref_weight, labels)
    check_exact(copy, logits, fused, hidden, weight)
    w = fused.metrics["iw_sft_weight"]
    assert float(w.max()) > float(w.min()) or float(w.min()) == 16.0  # each sequence (token) its own weight
    if seed == 1 and hp["sum_over_time"] and hp["temperature"] == 2.0:
        assert float(w.max()) == 16.0  # the clamp
    if seed == 1 and not hp["sum_over_time"]:
        assert float(w.min()) == pytest.approx(0.2) and float(w.max()) == pytest.approx(1.8)


def test_iw_sft_weights_each_sequence_of_a_batch_where_the_authors_broadcast_only_one():
    """Their `[B, 1]` weight times the `[B, T-1, 1]` loss: an error at batch size 3 here, and with `B = T - 1` the
    weights silently land on time steps, not sequences; trl_emo equals their loss one sequence at a time."""
    hidden, weight, ref_weight, labels = model_inputs(2)
    hp = IW_CASES[0]
    ref = iw_sft_reference_log_probs(hidden @ ref_weight.t(), labels)
    with pytest.raises(RuntimeError):
        iw_sft_authors_forward(hidden @ weight.t(), labels, ref, 30.0)
    short_h, short_labels = hidden[:, :4], labels[:, :4].clone()  # B = 3 = T - 1
    short_labels[:, 1:] = torch.randint(0, V, (3, 3), generator=torch.Generator().manual_seed(4))
    count = int((short_labels[:, 1:] != -100).sum())
    batched = iw_sft_authors_forward(short_h @ weight.t(), short_labels,
                                     iw_sft_reference_log_probs(short_h @ ref_weight.t(), short_labels), count)
    copy = iw_sft_copy(short_h, weight, ref_weight, short_labels, hp, count)
    logits, fused = ours("iw_sft", hp, short_h, weight, ref_weight, short_labels)
    assert abs(float((batched - copy).detach())) > 1e-3
    assert_same([logits, fused.loss], [copy, copy], "value")


def test_iw_sft_with_the_policy_as_reference_is_cross_entropy():
    hidden, weight, _, labels = model_inputs(3)
    for hp in IW_CASES:
        logits, fused = ours("iw_sft", hp, hidden, weight, weight.detach(), labels)
        ce, ce_fused = ours("nll", {}, hidden, weight, None, labels)
        assert_same([logits, fused.loss], [ce, ce], "value", rtol=1e-12)
        assert_same(grads(fused.loss, hidden, weight), grads(ce, hidden, weight), "gradient", rtol=1e-12)
        assert torch.equal(fused.metrics["iw_sft_weight"], torch.ones_like(fused.metrics["iw_sft_weight"]))


def test_iw_sft_a_sequence_without_targets_adds_nothing_where_the_authors_get_nan():
    """Their mean over a sequence with no target is 0/0: the loss masks it out, but its gradient is `0 · NaN`."""
    hidden, weight, ref_weight, labels = model_inputs(4)
    labels[1] = -100
    count = int((labels[:, 1:] != -100).sum())
    lone = iw_sft_authors_forward(hidden[1:2] @ weight.t(), labels[1:2],
                                  iw_sft_reference_log_probs(hidden[1:2] @ ref_weight.t(), labels[1:2]), count)
    assert float(lone.detach()) == 0.0 and torch.isnan(grads(lone, weight)[0]).any()
    copy = sum(iw_sft_authors_forward(hidden[b : b + 1] @ weight.t(), labels[b : b + 1],
                                      iw_sft_reference_log_probs(hidden[b : b + 1] @ ref_weight.t(), labels[b : b + 1]),
                                      count) for b in (0, 2))
    logits, fused = ours("iw_sft", IW_CASES[0], hidden, weight, ref_weight, labels)
    check_exact(copy, logits, fused, hidden, weight)


def test_iw_sft_is_exact_under_gradient_accumulation_and_packing():
    """Each weight reads its own sequence only: two accumulated micro-batches are the whole batch exactly, and a packed
    row (`sequence_ids`, as TRL's padding-free packing marks examples by `position_ids`) is its sequences apart."""
    hidden, weight, ref_weight, labels = model_inputs(5)
    hp = IW_CASES[0]
    total = int((labels[:, 1:] != -100).sum())
    _, whole = ours("iw_sft", hp, hidden, weight, ref_weight, labels)
    parts = [ours("iw_sft", hp, hidden[s], weight, ref_weight, labels[s], num_items=total)[1].loss
             for s in (slice(0, 2), slice(2, 3))]
    assert_same([sum(parts)], [whole.loss], "accumulated value", rtol=1e-12)
    assert_same(grads(sum(parts), hidden, weight), grads(whole.loss, hidden, weight), "accumulated gradient", 1e-12)

    loss_fn = FusedLinearLoss("iw_sft", chunk_size=5)
    rows = loss_fn(hidden, weight, labels, reference=ReferenceHead(hidden.detach(), ref_weight))
    packed_labels = labels.clone()
    packed_labels[1:, 0] = -100  # TRL: the first label of each packed example is -100
    packed = loss_fn(hidden.reshape(1, B * T, H), weight, packed_labels.reshape(1, B * T),
                     reference=ReferenceHead(hidden.detach().reshape(1, B * T, H), ref_weight),
                     sequence_ids=torch.arange(B).repeat_interleave(T)[None])
    assert_same([packed], [rows], "packed value", rtol=1e-12)
    one_sequence = loss_fn(hidden.reshape(1, B * T, H), weight, packed_labels.reshape(1, B * T),
                           reference=ReferenceHead(hidden.detach().reshape(1, B * T, H), ref_weight))
    assert abs(float((one_sequence - rows).detach())) > 1e-6  # without the ids, the packed row is one sequence


# -- GIFT --------------------------------------------------------------------------------------------------------------

GIFT_CASES = [
    {"beta": 20.0, "smooth_lambda": 0.0, "formula": "authors"},  # their script
    {"beta": 2.0, "smooth_lambda": 0.1, "formula": "authors"},
    {"beta": 2.0, "smooth_lambda": 0.0, "formula": "paper"},
    {"beta": 5.0, "smooth_lambda": 0.1, "formula": "paper"},
]


def gift_copy(hidden, weight, ref_weight, labels, hp):
    targets, mask = select_targets(labels)
    logits = (hidden @ weight.t())[:, :-1].reshape(-1, V)
    ref_logits = (hidden @ ref_weight.t())[:, :-1].reshape(-1, V)
    return gift_authors_forward(logits, ref_logits, targets.clamp(min=0).reshape(-1), mask.reshape(-1).double(),
                                hp["beta"], hp["smooth_lambda"], eps=1e-10 if hp["formula"] == "authors" else 0.0)


@pytest.mark.parametrize("hp", GIFT_CASES, ids=["script", "smoothed", "paper", "paper-smoothed"])
def test_gift_equals_the_authors_code(hp):
    hidden, weight, ref_weight, labels = model_inputs(6, scale=4.0)  # peaked: many p_ref below 1e-8
    copy = gift_copy(hidden, weight, ref_weight, labels, hp)
    logits, fused = ours("gift", hp, hidden, weight, ref_weight, labels)
    check_exact(copy, logits, fused, hidden, weight)
    mass = fused.metrics["gift_target_mass"]
    assert 0 < float(mass.min()) and float(mass.max()) < 1


def test_gift_formulas_differ_where_the_reference_is_below_1e_8_and_large_beta_is_cross_entropy():
    hidden, weight, ref_weight, labels = model_inputs(7, scale=6.0)
    authors = ours("gift", GIFT_CASES[1], hidden, weight, ref_weight, labels)[1].loss
    paper = ours("gift", {**GIFT_CASES[1], "smooth_lambda": 0.0, "formula": "paper"}, hidden, weight, ref_weight,
                 labels)[1].loss
    with_eps = ours("gift", {**GIFT_CASES[1], "smooth_lambda": 0.0}, hidden, weight, ref_weight, labels)[1].loss
    assert abs(float((paper - with_eps).detach())) > 1e-9 and abs(float((authors - with_eps).detach())) > 1e-6
    ce = ours("nll", {}, hidden, weight, None, labels)[0]
    _, far = ours("gift", {"beta": 80.0, "smooth_lambda": 0.0, "formula": "authors"}, hidden, weight, ref_weight,
                  labels)
    assert_same([far.loss], [ce], "beta 80 value", rtol=1e-10)
    assert_same(grads(far.loss, hidden, weight), grads(ce, hidden, weight), "beta 80 gradient", rtol=1e-10)


# -- SLM ---------------------------------------------------------------------------------------------------------------

SLM_CASES = [{"keep_ratio": 0.6, "scope": "batch"}, {"keep_ratio": 0.3, "scope": "batch"},
             {"keep_ratio": 0.6, "scope": "sequence"}]


def slm_copy(hidden, weight, ref_weight, labels, hp):
    h, targets, mask, sequences = rows_of(hidden, labels)
    groups = None
    if hp["scope"] == "sequence":
        groups = [((sequences == b).nonzero().flatten(), kept_count(int((sequences == b).sum()), hp["keep_ratio"]))
                  for b in range(B)]
    return slm_paper_forward(h @ weight.t(), h.detach() @ ref_weight.t(), targets,
                             kept_count(len(targets), hp["keep_ratio"]), groups)


@pytest.mark.parametrize("hp", SLM_CASES, ids=["batch-0.6", "batch-0.3", "sequence-0.6"])
def test_slm_equals_the_papers_formula(hp):
    hidden, weight, ref_weight, labels = model_inputs(8)
    copy = slm_copy(hidden, weight, ref_weight, labels, hp)
    logits, fused = ours("slm", hp, hidden, weight, ref_weight, labels)
    check_exact(copy, logits, fused, hidden, weight)
    n = fused.nll.numel()
    if hp["scope"] == "batch":
        assert int(fused.metrics["slm_selected"].sum()) == kept_count(n, hp["keep_ratio"])


def test_slm_kept_count_is_the_ceiling_of_ratio_times_n():
    assert [kept_count(n, 0.6) for n in (1, 2, 5, 10, 11)] == [1, 2, 3, 6, 7]  # 0.6 · 5 = 3.0000000000000004 → 3
    assert kept_count(7, 1.0) == 7 and kept_count(3, 0.7) == 3


def test_slm_ties_select_the_same_earlier_rows_on_every_backend_and_chunk_size(small_blocks):
    """The policy as its own reference (the first step with the default reference): every excess loss is 0 on both
    backends, and the earliest ⌈0.6 N⌉ rows are taken everywhere."""
    g = torch.Generator().manual_seed(9)
    n = 30
    hidden, weight = torch.randn(n, 16, generator=g), 0.5 * torch.randn(V, 16, generator=g)
    targets = torch.randint(0, V, (n,), generator=g)
    hidden, weight, targets = hidden.to(DEVICE), weight.to(DEVICE), targets.to(DEVICE)
    hp = {"keep_ratio": 0.6, "scope": "batch"}
    k = kept_count(n, 0.6)
    for backend in BACKENDS:
        for chunk_size in (3, 7, 30) if backend == "torch" else (7, 30):
            out = fused_linear_loss(hidden, weight, targets, get_loss("slm"),
                                    {**hp, "reference": ReferenceHead(hidden, weight)}, chunk_size=chunk_size,
                                    backend=backend)
            assert out.metrics["slm_selected"].nonzero().flatten().tolist() == list(range(k)), (backend, chunk_size)
            assert float(out.metrics["slm_excess_loss"].abs().max()) == 0.0, (backend, chunk_size)
            assert out.loss.item() == pytest.approx(float(out.nll[:k].mean()), rel=1e-6)


def test_slm_selection_is_per_micro_batch_under_gradient_accumulation():
    """Two accumulated micro-batches: each micro-batch's own selection and mean, weighted by its share of the tokens."""
    hidden, weight, ref_weight, labels = model_inputs(10)
    hp = SLM_CASES[0]
    counts = [int((labels[s, 1:] != -100).sum()) for s in (slice(0, 2), slice(2, 3))]
    total = sum(counts)
    accumulated = sum(ours("slm", hp, hidden[s], weight, ref_weight, labels[s], num_items=total)[1].loss
                      for s in (slice(0, 2), slice(2, 3)))
    combined = sum(c / total * slm_copy(hidden[s], weight, ref_weight, labels[s], hp)
                   for c, s in zip(counts, (slice(0, 2), slice(2, 3))))
    assert_same([accumulated], [combined], "value")
    assert_same(grads(accumulated, hidden, weight), grads(combined, hidden, weight), "gradient")
    _, whole = ours("slm", hp, hidden, weight, ref_weight, labels)
    assert abs(float((whole.loss - accumulated).detach())) > 1e-6  # not the selection over both at once


# -- the Triton kernels (interpreted on the CPU, compiled on a GPU) ------------------------------------------------------

triton_only = pytest.mark.skipif(len(BACKENDS) < 2, reason="needs Triton (compiled on CUDA, or TRITON_INTERPRET=1)")

TRITON_CASES = [
    ("prob", prob_hp({"q": 10.0}), lambda h, w, r, lab, hp: beyond_ll_copy(h, w, lab, "GeneralFamily-10")),
    ("prob", prob_hp({"q": 1.0, "only": "top", "threshold": 0.3}),
     lambda h, w, r, lab, hp: beyond_ll_copy(h, w, lab, "OnlyTopP-0.3")),
    ("iw_sft", IW_CASES[0], lambda h, w, r, lab, hp: iw_sft_copy(h, w, r, lab, hp, int((lab[:, 1:] != -100).sum()))),
    ("gift", GIFT_CASES[0], gift_copy),
    ("gift", GIFT_CASES[3], gift_copy),
    ("slm", SLM_CASES[2], slm_copy),
]


@triton_only
@pytest.mark.parametrize(("name", "hp", "copy_of"), TRITON_CASES,
                         ids=["prob", "prob-OnlyTopP", "iw_sft", "gift", "gift-paper", "slm-sequence"])
def test_triton_kernels_equal_the_authors_code(name, hp, copy_of, small_blocks):
    hidden, weight, ref_weight, labels = model_inputs(11, scale=2.0)
    copy = copy_of(hidden, weight, ref_weight, labels, hp)
    h32 = hidden.detach().float().to(DEVICE).requires_grad_(True)
    w32 = weight.detach().float().to(DEVICE).requires_grad_(True)
    _, fused = ours(name, hp, h32, w32, ref_weight.float().to(DEVICE), labels.to(DEVICE), chunk_size=8,
                    backend="triton")
    assert_same([fused.loss.double().cpu()], [copy], "value", rtol=1e-5)
    got = [g.double().cpu() for g in grads(fused.loss, h32, w32)]
    assert_same(got, grads(copy, hidden, weight), "gradient", rtol=1e-4)
