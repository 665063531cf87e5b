"""PSFT and CurioSFT against the authors' code (`tests/authors_code.py`), in float64, value and gradient: the logits
path, the fused PyTorch path, the framework-free API and (in Triton's interpreter, or on a GPU) the fused Triton path;
the old policy and the teacher different from the policy; the thresholds of each (PSFT's clip edge, CurioSFT's pinned
and floored temperatures) decided alike everywhere; PSFT with K = 1 is cross-entropy's gradient."""

from __future__ import annotations

import pytest
import torch

from authors_code import curio_authors_forward, curio_compute_tau, psft_authors_forward
from trl_emo.losses import FusedLinearLoss, _triton, fused_linear_loss, fused_lm_loss, get_loss
from trl_emo.losses._common import select_targets
from trl_emo.losses.asft import ReferenceHead
from trl_emo.losses.curio_sft import ENTROPY_FLOOR, temperatures

B, T, H, V = 3, 14, 8, 40


def grads(loss, *tensors):
    return torch.autograd.grad(loss, tensors, allow_unused=True)


def assert_same(got, want, what, rtol=1e-9):
    """Equal to float64 rounding, the largest difference relative to the largest value: to 1e-9, since verl's token mean
    divides by the token count plus 1e-8 (`masked_mean`), 3e-10 relative for these 30 tokens."""
    for g, w in zip(got, want, strict=True):
        g, w = g.detach(), w.detach()
        scale = w.abs().max().clamp_min(1e-30)
        assert float((g - w).abs().max() / scale) < rtol, (what, float((g - w).abs().max() / scale))


def model_inputs(seed, scale=0.8, drift=0.3, dtype=torch.float64):
    """A batch, the policy's head `weight` and another head for the old policy / teacher (`ref_weight`)."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, H, generator=g, dtype=dtype).requires_grad_(True)
    weight = (scale * torch.randn(V, H, generator=g, dtype=dtype)).requires_grad_(True)
    ref_weight = weight.detach() + drift * torch.randn(V, H, generator=g, dtype=dtype)
    labels = torch.randint(0, V, (B, T), generator=g)
    labels[0, :4] = -100  # a prompt
    labels[1, 9:] = -100  # padding
    labels[2, :2] = -100
    return hidden, weight, ref_weight, labels


def three_ways(name, hidden, weight, ref_weight, labels, hp, chunk_size=5, backend="torch"):
    """(logits path, fused path) of one micro-batch, the reference (old policy / teacher) from `ref_weight`, or the
    policy itself when `ref_weight` is None."""
    spec = get_loss(name)
    full = {**get_loss(name).defaults, **hp}
    shifted, mask = select_targets(labels)
    targets = shifted[mask]
    h = hidden.detach()[:, :-1][mask]
    ref_logits = None if ref_weight is None else (h @ ref_weight.t()).detach()
    logits = spec.per_token(hidden[:, :-1][mask] @ weight.t(), targets, **full, reference=ref_logits).sum() / mask.sum()
    reference = None if ref_weight is None else ReferenceHead(h, ref_weight)
    # Each path indexes `hidden` itself: a shared indexing node would be freed by the first gradient taken.
    fused = fused_linear_loss(hidden[:, :-1][mask], weight, targets, spec, {**full, "reference": reference},
                              chunk_size=chunk_size, backend=backend)
    return logits, fused


# -- PSFT -------------------------------------------------------------------------------------------------------------

PSFT_CASES = [
    {"clip_low": 0.2, "clip_high": 0.28},  # their script
    {"clip_low": 0.2, "clip_high": 0.2},  # the paper's symmetric epsilon
    {"clip_low": 0.5, "clip_high": 1.0},
]


@pytest.mark.parametrize("hp", PSFT_CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_psft_equals_the_authors_code(hp, seed):
    hidden, weight, ref_weight, labels = model_inputs(seed, drift=0.5)
    authors = psft_authors_forward(hidden @ weight.t(), hidden @ ref_weight.t(), labels, hp["clip_low"], hp["clip_high"])
    logits, fused = three_ways("psft", hidden, weight, ref_weight, labels, hp)
    want = grads(authors, hidden, weight)
    assert_same([logits, fused.loss], [authors, authors], "value")
    assert_same(grads(logits, hidden, weight), want, "logits gradient")
    assert_same(grads(fused.loss, hidden, weight), want, "fused gradient")
    # The old policy is far enough: some tokens clipped (no gradient), some not, some ratios below 1 - eps_lo.
    ratio, clipped = fused.metrics["psft_ratio"], fused.metrics["psft_clipped"]
    assert 0 < float(clipped.mean()) < 1 and float(ratio.min()) < 1 - hp["clip_low"]


def test_psft_with_the_old_policy_the_current_model_is_cross_entropy():
    """K = 1, or the first step of every window: r = 1, each token's loss is −1 and the gradient is cross-entropy's,
    also at eps_hi = 0 where r = 1 is exactly the clip edge (the gradient flows there, as through their max/clamp)."""
    hidden, weight, _, labels = model_inputs(2)
    shifted, mask = select_targets(labels)
    ce = torch.nn.functional.cross_entropy((hidden[:, :-1] @ weight.t())[mask], shifted[mask])
    want = grads(ce, hidden, weight)
    for hp in ({"clip_low": 0.2, "clip_high": 0.28}, {"clip_low": 0.0, "clip_high": 0.0}):
        authors = psft_authors_forward(hidden @ weight.t(), None, labels, hp["clip_low"], hp["clip_high"])
        logits, fused = three_ways("psft", hidden, weight, None, labels, hp)
        assert fused.loss.item() == -1.0 and logits.item() == -1.0
        assert_same([authors], [torch.tensor(-1.0, dtype=torch.float64)], "authors' value", rtol=1e-8)  # their + 1e-8
        assert_same(grads(logits, hidden, weight), want, "logits gradient")
        assert_same(grads(fused.loss, hidden, weight), want, "fused gradient")
        assert_same(grads(authors, hidden, weight), want, "authors' gradient", rtol=1e-8)
    # And an old policy given as the current weights' own log-probabilities (a separate forward): the same.
    spec = get_loss("psft")
    h, targets = hidden[:, :-1][mask], shifted[mask]
    same = fused_linear_loss(h, weight, targets, spec, {**spec.defaults, "reference": ReferenceHead(h.detach(),
                                                                                                    weight.detach())})
    assert_same(grads(same.loss, hidden, weight), want, "fused gradient, old policy = policy", rtol=1e-12)


def test_psft_clip_edges_and_the_log_ratio_clamp():
    """Rows at chosen log-ratios: just under, at and just over the clip edge, below −20 (their clamp cuts the
    gradient) and above 20: value and gradient row by row as their code's."""
    from trl_emo.losses.psft import ratio_terms

    edge = 2.0  # eps_hi = 1: the edge 2.0 and log 2 are exact enough that exp(log 2) == 2.0
    logp = torch.full((7,), -1.5, dtype=torch.float64, requires_grad=True)
    deltas = torch.tensor([0.0, 0.5, float(torch.log(torch.tensor(edge, dtype=torch.float64))), 0.7, -20.5, -19.5, 20.5],
                          dtype=torch.float64)
    old = (logp - deltas).detach()
    assert torch.exp(logp.detach() - old)[2] == edge
    value, weight, ratio, clipped = ratio_terms(logp.detach(), old, clip_high=1.0)
    assert clipped.tolist() == [False, False, False, True, False, False, True]
    # Their loss, one token per row (advantage 1), autograd through their maximum/clamp.
    r = torch.exp(torch.clamp(logp - old, -20.0, 20.0))
    theirs = torch.maximum(-r, -torch.clamp(r, 1 - 0.2, 1 + 1.0))
    (d_theirs,) = torch.autograd.grad(theirs.sum(), logp)
    assert torch.equal(value, theirs.detach())
    assert torch.allclose(-weight, d_theirs, rtol=0, atol=1e-15)  # ∂ℓ/∂log p_y = −w
    assert weight[2] == edge and weight[4] == 0.0 and weight[5] > 0.0


# -- CurioSFT ---------------------------------------------------------------------------------------------------------

CURIO_CASES = [
    {"topk": 8},  # the top-k branch of their entropy (512 of a real vocabulary)
    {"topk": 512},  # k >= V: the whole row
    {"topk": 8, "alpha": 0.5, "tau_min": 1.0, "tau_max": 2.0},  # the paper's alpha
]


def _curio_case(seed):
    """Policy ≠ teacher, and teacher rows of every kind: sure ones (entropy under the 0.03 floor), flat ones (τ pinned
    at τ_max), peaked ones (τ pinned at τ_min) and rows in between."""
    hidden, weight, ref_weight, labels = model_inputs(seed, scale=1.5, drift=0.4)
    with torch.no_grad():
        hidden[0, 6] *= 12.0  # peaked rows: their entropy at the floor or below
        hidden[2, 3] *= 12.0
        hidden[1, 2] *= 0.02  # flat rows
        hidden[2, 8] *= 0.02
    return hidden, weight, ref_weight, labels


@pytest.mark.parametrize("hp", CURIO_CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_curio_sft_equals_the_authors_code(hp, seed):
    hidden, weight, ref_weight, labels = _curio_case(seed)
    full = {**get_loss("curio_sft").defaults, **hp}
    authors, tau = curio_authors_forward(hidden @ weight.t(), hidden @ ref_weight.t(), labels, full["tau_min"],
                                         full["tau_max"], full["topk"], full["alpha"], return_tau=True)
    logits, fused = three_ways("curio_sft", hidden, weight, ref_weight, labels, hp)
    want = grads(authors, hidden, weight)
    assert_same([logits, fused.loss], [authors, authors], "value")
    assert_same(grads(logits, hidden, weight), want, "logits gradient", )
    assert_same(grads(fused.loss, hidden, weight), want, "fused gradient", )
    assert torch.equal(fused.metrics["curio_tau"], tau)
    # Every kind of row is there: floored or pinned at τ_min, pinned at τ_max, and inside the bracket.
    assert (tau == full["tau_min"]).any() and (tau == full["tau_max"]).any() or full["tau_min"] == 1.0
    assert ((tau > full["tau_min"]) & (tau < full["tau_max"])).any()


def test_curio_sft_teacher_is_the_policy_until_its_first_update():
    """Without a teacher the policy's own (detached) logits are read, as the authors' teacher is the policy before its
    first sync: the pull is then toward the policy itself at τ > 1."""
    hidden, weight, _, labels = _curio_case(3)
    authors = curio_authors_forward(hidden @ weight.t(), None, labels, topk=8)
    logits, fused = three_ways("curio_sft", hidden, weight, None, labels, {"topk": 8})
    assert_same([logits, fused.loss], [authors, authors], "value", )
    assert_same(grads(fused.loss, hidden, weight), grads(authors, hidden, weight), "gradient", )
    # The same as handing the policy's own head as the teacher.
    shifted, mask = select_targets(labels)
    h = hidden[:, :-1][mask]
    explicit = fused_linear_loss(h, weight, shifted[mask], get_loss("curio_sft"),
                                 {**get_loss("curio_sft").defaults, "topk": 8,
                                  "reference": ReferenceHead(h.detach(), weight.detach())}, chunk_size=5)
    assert_same([explicit.loss], [fused.loss], "explicit teacher = policy", rtol=1e-13)


def test_curio_temperature_search_is_theirs_at_its_edges():
    """The bisection iterate, row by row, bit for bit their code's: rows whose target entropy lies beyond either end of
    the bracket (pinned at τ_min or τ_max), inside it, a uniform row (every logit tied), with k < V and k = V."""
    g = torch.Generator().manual_seed(5)
    scales = torch.tensor([0.1, 1.0, 3.0, 8.0, 30.0, 1.0], dtype=torch.float64)
    z = torch.randn(6, V, generator=g, dtype=torch.float64) * scales[:, None]
    z[5] = 0.0  # uniform: every entropy is ln k, H* above every reachable value
    for k in (8, V):
        _, want = curio_compute_tau(z, 1.1, 1.5, k)
        got = temperatures(z.topk(k, -1).values, 1.1, 1.5)
        assert torch.equal(got, want), k
        assert got[5] == 1.5 and got[3] == 1.1
    assert 1.1 < got[2] < 1.5  # k = V: inside the bracket


# -- the Triton kernels (interpreted on the CPU, compiled on a GPU) ---------------------------------------------------

triton_only = pytest.mark.skipif(
    not _triton.HAS_TRITON or (not torch.cuda.is_available() and not _triton.interpreting()),
    reason="needs Triton (compiled on CUDA, or TRITON_INTERPRET=1 on the CPU)",
)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def small_blocks(monkeypatch):
    # 16-column blocks: a 40-token row spans three blocks, the last partial.
    monkeypatch.setattr(_triton, "_MAX_BLOCK_INTERPRETED", 16)
    monkeypatch.setattr(_triton, "_MAX_BLOCK", 16)


def _on_device(hidden, weight, ref_weight, labels):
    return (hidden.detach().float().to(DEVICE).requires_grad_(True), weight.detach().float().to(DEVICE).requires_grad_(True),
            ref_weight.float().to(DEVICE), labels.to(DEVICE))


@triton_only
def test_psft_triton_kernel_equals_the_authors_code(small_blocks):
    hidden, weight, ref_weight, labels = _on_device(*model_inputs(10, drift=0.5))
    authors = psft_authors_forward(hidden @ weight.t(), hidden @ ref_weight.t(), labels)
    _, fused = three_ways("psft", hidden, weight, ref_weight, labels, {}, chunk_size=8, backend="triton")
    assert_same([fused.loss], [authors], "value", rtol=1e-5)
    assert_same(grads(fused.loss, hidden, weight), grads(authors, hidden, weight), "gradient", rtol=1e-4)
    assert 0 < float(fused.metrics["psft_clipped"].mean()) < 1


@triton_only
def test_curio_sft_triton_kernels_equal_the_authors_code_and_choose_the_same_temperatures(small_blocks):
    hidden, weight, ref_weight, labels = _on_device(*_curio_case(11))
    authors, tau = curio_authors_forward(hidden @ weight.t(), hidden @ ref_weight.t(), labels, topk=8,
                                         return_tau=True)
    _, fused = three_ways("curio_sft", hidden, weight, ref_weight, labels, {"topk": 8}, chunk_size=8,
                          backend="triton")
    assert_same([fused.loss], [authors], "value", rtol=1e-5)
    assert_same(grads(fused.loss, hidden, weight), grads(authors, hidden, weight), "gradient", rtol=1e-4)
    # The search runs the same PyTorch code on both backends: the same temperatures from the same float32 logits.
    _, torch_path = three_ways("curio_sft", hidden, weight, ref_weight, labels, {"topk": 8}, chunk_size=8)
    assert torch.equal(fused.metrics["curio_tau"], torch_path.metrics["curio_tau"])
    assert torch.allclose(fused.metrics["curio_tau"], tau.float(), atol=1e-5)  # float32 against their float64
    assert (tau == 1.1).any() and (tau == 1.5).any()


# -- the framework-free API -------------------------------------------------------------------------------------------


def test_psft_and_curio_outside_the_trainer_take_tensors():
    """`FusedLinearLoss` / `fused_lm_loss` with the old policy's log-probabilities (PSFT), or the old policy's / the
    teacher's hidden states and head (`reference`); the same losses as the authors'; bad inputs in one line."""
    hidden, weight, ref_weight, labels = model_inputs(12, drift=0.5)
    old_logp = torch.log_softmax(hidden @ ref_weight.t(), -1)[:, :-1].gather(
        -1, labels[:, 1:].clamp_min(0)[..., None])[..., 0]
    old_logp = torch.cat([old_logp, torch.zeros(B, 1, dtype=old_logp.dtype)], 1)  # laid out like hidden
    authors = psft_authors_forward(hidden @ weight.t(), hidden @ ref_weight.t(), labels)
    by_logp = FusedLinearLoss("psft")(hidden, weight, labels, old_log_probs=old_logp.detach())
    by_head = fused_lm_loss(hidden, weight, labels, "psft", reference=ReferenceHead(hidden.detach(), ref_weight))
    assert_same([by_logp, by_head], [authors, authors], "psft value")
    assert_same(grads(by_logp, hidden, weight), grads(authors, hidden, weight), "psft gradient")
    teacher = curio_authors_forward(hidden @ weight.t(), hidden @ ref_weight.t(), labels, topk=8)
    ours = fused_lm_loss(hidden, weight, labels, "curio_sft", curio_topk=8,
                         reference=ReferenceHead(hidden.detach(), ref_weight))
    assert_same([ours], [teacher], "curio value", )
    with pytest.raises(ValueError, match=r"^loss 'gem' reads no old log-probabilities; drop old_log_probs=\.$"):
        fused_lm_loss(hidden, weight, labels, "gem", old_log_probs=old_logp)
    with pytest.raises(ValueError, match=r"old_log_probs \(3, 13\) must have the shape of hidden without its last"):
        fused_lm_loss(hidden, weight, labels, "psft", old_log_probs=old_logp[:, 1:])


def test_the_floor_reads_the_full_vocabulary_entropy():
    """A teacher row sure of one token (full entropy under 0.03) takes τ_min whatever its top-k entropy says; the
    threshold is inclusive (their `<=`)."""
    from trl_emo.losses.curio_sft import teacher_rows

    z = torch.zeros(2, V, dtype=torch.float64)
    z[:, 0] = 12.0  # entropy ≈ 39 · e^-12 · 13 ≈ 3e-3: floored
    z[1, 0] = 2.0  # not sure: searched
    rows = teacher_rows(z, torch.tensor([0, 1]), 1.1, 1.5, 8)
    p = z.softmax(-1)
    entropy = -(p * p.log()).sum(-1)
    assert entropy[0] <= ENTROPY_FLOOR < entropy[1]
    assert rows["tau"][0] == 1.1 and rows["tau"][1] > 1.1
