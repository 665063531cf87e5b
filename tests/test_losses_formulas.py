"""Every objective's value and gradient against `docs/losses.md`, in float64.

Three independent checks per loss: `gradcheck` (where the loss has no stop-gradient, so its
gradient *is* the derivative of its value), the closed-form gradients of `losses.md` written out
here, and reference code in the style of the papers' own implementations, written here again.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from trl_emo.losses import (
    CostEmbedding,
    causal_lm_loss,
    ce_entropy_per_token,
    emo_per_token,
    gem_per_token,
    mixce_per_token,
    nll_per_token,
    tailr_per_token,
)

N, V, D = 9, 13, 5


@pytest.fixture
def z():
    torch.manual_seed(0)
    return (3 * torch.randn(N, V, dtype=torch.float64)).requires_grad_(True)


@pytest.fixture
def y():
    torch.manual_seed(1)
    return torch.randint(0, V, (N,))


@pytest.fixture
def emb():
    torch.manual_seed(2)
    return torch.randn(V, D, dtype=torch.float64)


def grad_of(fn, z):
    return torch.autograd.grad(fn(z).sum(), z)[0]


def one_hot(y):
    return F.one_hot(y, V).double()


# -- references written the way the papers' code computes them ------------------------------


def gem_reference(logits, labels, beta, h):
    """GEM as the authors' code writes it: with log-probabilities, normalizer included."""
    with torch.no_grad():
        on_label = logits.gather(-1, labels[:, None])
        diff = logits - on_label
        weights = torch.ones_like(diff) if h == "linear" else torch.sigmoid(0.01 * diff)
        q = torch.exp(F.log_softmax(logits / beta, dim=-1))
    log_probs = F.log_softmax(logits, dim=-1)
    real = log_probs.gather(-1, labels[:, None])
    return -torch.sum(q * weights * (real - log_probs), dim=-1)


def emo_reference(logits, labels, embedding, weighting="mle", demd="reference", cap=None):
    """EMO as the authors' code writes it: one-hot data distribution projected on the normalized embedding."""
    hot = one_hot(labels)
    stable = (hot + 1e-15) / (hot + 1e-15).sum(-1, keepdim=True)
    e = embedding / embedding.norm(dim=1, keepdim=True)
    p_repr = stable @ e
    q = torch.softmax(logits, dim=-1)
    if demd == "reference":
        q = q - (q * hot).detach()
    emo = 1 - (p_repr * (q @ e)).sum(-1)
    mle = F.cross_entropy(logits, labels, reduction="none")
    if weighting == "none":
        return emo
    if weighting == "mle":
        ratio = (mle / (emo + 1e-10)).detach()
        if cap is not None:
            ratio = torch.clamp(ratio, max=cap)
        return 0.5 * (mle + ratio * emo)
    ratio = (emo / (mle + 1e-10)).detach()
    if cap is not None:
        ratio = torch.clamp(ratio, max=cap)
    return emo + ratio * mle


# -- gradcheck: losses without stop-gradient -------------------------------------------------


@pytest.mark.parametrize(
    "fn",
    [
        nll_per_token,
        lambda z, y: ce_entropy_per_token(z, y, coef=0.3),
        lambda z, y: emo_per_token(z, y, cost_embedding=EMB64, weighting="none", demd="paper", ratio_cap=None),
    ],
    ids=["nll", "ce_entropy", "emo_demd_paper"],
)
def test_gradcheck_without_stop_gradient(fn, y):
    z = torch.randn(4, V, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: fn(x, y[:4]), (z,), eps=1e-6, atol=1e-7)
    assert torch.autograd.gradgradcheck(lambda x: fn(x, y[:4]).sum(), (z,), eps=1e-6, atol=1e-6)


torch.manual_seed(3)
EMB64 = torch.randn(V, D, dtype=torch.float64)


# -- nll ----------------------------------------------------------------------------------


def test_nll_value_and_gradient(z, y):
    assert torch.allclose(nll_per_token(z, y), F.cross_entropy(z, y, reduction="none"), atol=1e-12)
    p = torch.softmax(z, -1)
    assert torch.allclose(grad_of(lambda x: nll_per_token(x, y), z), p - one_hot(y), atol=1e-12)


# -- GEM ----------------------------------------------------------------------------------


@pytest.mark.parametrize("h", ["linear", "logsigmoid"])
@pytest.mark.parametrize("beta", [0.3, 0.7, 1.0])
def test_gem_matches_authors_formulation(z, y, beta, h):
    ours = gem_per_token(z, y, beta=beta, h=h)
    ref = gem_reference(z, y, beta, h)
    assert torch.allclose(ours, ref, atol=1e-10)
    assert torch.allclose(grad_of(lambda x: gem_per_token(x, y, beta, h), z), grad_of(lambda x: gem_reference(x, y, beta, h), z), atol=1e-12)


@pytest.mark.parametrize("beta", [0.4, 0.7])
def test_gem_gradient_formula(z, y, beta):
    q = torch.softmax(z.detach() / beta, -1)
    linear = grad_of(lambda x: gem_per_token(x, y, beta, "linear"), z)
    assert torch.allclose(linear, q - one_hot(y), atol=1e-12)
    w = torch.sigmoid(0.01 * (z.detach() - z.detach().gather(-1, y[:, None])))
    qw = q * w
    expected = qw - one_hot(y) * qw.sum(-1, keepdim=True)
    assert torch.allclose(grad_of(lambda x: gem_per_token(x, y, beta, "logsigmoid"), z), expected, atol=1e-12)


def test_gem_value_formula(z, y):
    q = torch.softmax(z.detach() / 0.7, -1)
    expected = (q * (z - z.gather(-1, y[:, None]))).sum(-1)
    assert torch.allclose(gem_per_token(z, y, 0.7, "linear"), expected, atol=1e-12)


def test_gem_beta_one_linear_is_exactly_cross_entropy_gradient(z, y):
    gem = grad_of(lambda x: gem_per_token(x, y, beta=1.0, h="linear"), z)
    ce = grad_of(lambda x: F.cross_entropy(x, y, reduction="none"), z)
    assert torch.allclose(gem, ce, atol=1e-14, rtol=0)


def test_gem_linear_is_beta_times_cross_entropy_at_temperature_beta(z, y):
    beta = 0.7
    gem = grad_of(lambda x: gem_per_token(x, y, beta=beta, h="linear"), z)
    tempered = grad_of(lambda x: beta * F.cross_entropy(x / beta, y, reduction="none"), z)
    assert torch.allclose(gem, tempered, atol=1e-14)


def test_gem_rejects_unknown_h(z, y):
    with pytest.raises(ValueError, match="linear"):
        gem_per_token(z, y, beta=0.7, h="tanh")


# -- EMO ----------------------------------------------------------------------------------


@pytest.mark.parametrize("weighting", ["mle", "emo", "none"])
@pytest.mark.parametrize("demd", ["reference", "paper"])
@pytest.mark.parametrize("cap", [None, 1.5])
def test_emo_matches_authors_formulation(z, y, emb, weighting, demd, cap):
    def ours(x):
        return emo_per_token(x, y, cost_embedding=emb, weighting=weighting, demd=demd, ratio_cap=cap)

    def ref(x):
        return emo_reference(x, y, emb, weighting, demd, cap)

    assert torch.allclose(ours(z), ref(z), atol=1e-9)
    assert torch.allclose(grad_of(ours, z), grad_of(ref, z), atol=1e-9)


def test_emo_demd_gradient_is_p_times_cbar_minus_c(z, y, emb):
    e = emb / emb.norm(dim=1, keepdim=True)
    c = e[y] @ e.t()
    p = torch.softmax(z.detach(), -1)
    c_bar = (p * c).sum(-1, keepdim=True)
    grad = grad_of(lambda x: emo_per_token(x, y, cost_embedding=emb, weighting="none", demd="paper", ratio_cap=None), z)
    assert torch.allclose(grad, p * (c_bar - c), atol=1e-12)
    value = emo_per_token(z, y, cost_embedding=emb, weighting="none", demd="paper", ratio_cap=None)
    assert torch.allclose(value, 1 - (p * c).sum(-1), atol=1e-12)


def test_emo_reference_and_paper_values_differ_by_p_y_and_share_gradient(z, y, emb):
    def value(x, demd):
        return emo_per_token(x, y, cost_embedding=emb, weighting="none", demd=demd, ratio_cap=None)

    p_y = torch.softmax(z.detach(), -1).gather(-1, y[:, None]).squeeze(-1)
    assert torch.allclose(value(z, "reference") - value(z, "paper"), p_y, atol=1e-12)
    assert torch.allclose(grad_of(lambda x: value(x, "reference"), z), grad_of(lambda x: value(x, "paper"), z), atol=1e-14)


def test_emo_mle_weighting_formula(z, y, emb):
    nll = F.cross_entropy(z, y, reduction="none").detach()
    emo = emo_per_token(z, y, cost_embedding=emb, weighting="none", demd="reference", ratio_cap=None).detach()
    expected_grad = 0.5 * (
        grad_of(lambda x: F.cross_entropy(x, y, reduction="none"), z)
        + (nll / (emo + 1e-10))[:, None] * grad_of(lambda x: emo_per_token(x, y, cost_embedding=emb, weighting="none", demd="reference", ratio_cap=None), z)
    )
    got = grad_of(lambda x: emo_per_token(x, y, cost_embedding=emb, weighting="mle", demd="reference", ratio_cap=None), z)
    assert torch.allclose(got, expected_grad, atol=1e-12)


def test_emo_ratio_cap_bounds_the_weight(z, y, emb):
    capped = emo_per_token(z, y, cost_embedding=emb, weighting="mle", demd="reference", ratio_cap=0.5)
    nll = F.cross_entropy(z, y, reduction="none")
    emo = emo_per_token(z, y, cost_embedding=emb, weighting="none", demd="reference", ratio_cap=None)
    ratio = nll / emo
    assert (ratio > 0.5).any(), "the test needs positions where the cap binds"
    assert torch.allclose(capped, 0.5 * (nll + ratio.clamp(max=0.5) * emo), atol=1e-12)


def test_emo_self_cost_is_zero_and_zero_rows_do_not_nan(y):
    emb = torch.randn(V, D, dtype=torch.float64)
    emb[3] = 0.0  # a never-trained row
    cost = CostEmbedding(emb)
    sim = cost.similarity(torch.arange(V))
    assert torch.allclose(sim.diagonal()[torch.arange(V) != 3], torch.ones(V - 1, dtype=torch.float64))
    assert torch.isfinite(sim).all() and (sim[3] == 0).all()


# -- TaiLr, MixCE, CE + entropy -------------------------------------------------------------


@pytest.mark.parametrize("gamma", [0.0, 0.7, 0.9, 1.0])
def test_tailr_and_mixce_formulas(z, y, gamma):
    p = torch.softmax(z.detach(), -1)
    p_y = p.gather(-1, y[:, None]).squeeze(-1)
    nll = F.cross_entropy(z, y, reduction="none")
    tailr_w = p_y / (gamma + (1 - gamma) * p_y)
    mixce_w = gamma + (1 - gamma) * p_y
    assert torch.allclose(tailr_per_token(z, y, gamma, None, "paper"), tailr_w * nll, atol=1e-12)
    assert torch.allclose(mixce_per_token(z, y, gamma), mixce_w * nll, atol=1e-12)
    ce_grad = p - one_hot(y)
    assert torch.allclose(grad_of(lambda x: tailr_per_token(x, y, gamma, None, "paper"), z), tailr_w[:, None] * ce_grad, atol=1e-12)
    assert torch.allclose(grad_of(lambda x: mixce_per_token(x, y, gamma), z), mixce_w[:, None] * ce_grad, atol=1e-12)


def test_ce_entropy_value_and_gradient(z, y):
    coef = 0.1
    dist = torch.distributions.Categorical(logits=z)
    expected = F.cross_entropy(z, y, reduction="none") - coef * dist.entropy()
    assert torch.allclose(ce_entropy_per_token(z, y, coef), expected, atol=1e-12)
    p = torch.softmax(z.detach(), -1)
    logp = torch.log_softmax(z.detach(), -1)
    entropy = -(p * logp).sum(-1, keepdim=True)
    expected_grad = p - one_hot(y) + coef * p * (logp + entropy)
    assert torch.allclose(grad_of(lambda x: ce_entropy_per_token(x, y, coef), z), expected_grad, atol=1e-12)


# -- batch reduction ------------------------------------------------------------------------


def test_causal_lm_loss_shifts_masks_and_reduces_by_num_items():
    torch.manual_seed(4)
    logits = torch.randn(2, 6, V, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, V, (2, 6))
    labels[0, :3] = -100
    labels[1, 5] = -100
    loss = causal_lm_loss(nll_per_token, logits, labels)
    flat_logits = logits[:, :-1].reshape(-1, V)
    flat_labels = labels[:, 1:].reshape(-1)
    assert torch.allclose(loss, F.cross_entropy(flat_logits, flat_labels, ignore_index=-100), atol=1e-12)
    valid = int((labels[:, 1:] != -100).sum())
    scaled = causal_lm_loss(nll_per_token, logits, labels, num_items_in_batch=3 * valid)
    assert torch.allclose(scaled * 3, loss, atol=1e-12)


GEM_HP = {"beta": 0.7, "h": "linear"}
EMO_HP = {"weighting": "mle", "demd": "reference", "ratio_cap": None}


def test_half_precision_logits_are_computed_in_float32():
    torch.manual_seed(5)
    logits = torch.randn(2, 5, V, dtype=torch.bfloat16)
    labels = torch.randint(0, V, (2, 5))
    loss = causal_lm_loss(gem_per_token, logits, labels, **GEM_HP)
    assert loss.dtype == torch.float32
    assert torch.allclose(loss, causal_lm_loss(gem_per_token, logits.float(), labels, **GEM_HP), atol=1e-6)
    emo = causal_lm_loss(emo_per_token, logits, labels, cost_embedding=torch.randn(V, D), **EMO_HP)
    assert emo.dtype == torch.float32


def test_all_masked_batch_is_a_zero_that_back_propagates():
    logits = torch.randn(2, 4, V, requires_grad=True)
    labels = torch.full((2, 4), -100)
    gem = causal_lm_loss(gem_per_token, logits, labels, **GEM_HP)
    emo = causal_lm_loss(emo_per_token, logits, labels, cost_embedding=torch.randn(V, D), **EMO_HP)
    for loss in (gem, emo, causal_lm_loss(nll_per_token, logits, labels)):
        assert loss.item() == 0.0
        (grad,) = torch.autograd.grad(loss, logits)
        assert torch.equal(grad, torch.zeros_like(grad))


def test_tailr_weight_floor(z, y):
    p_y = torch.softmax(z.detach(), -1).gather(-1, y[:, None]).squeeze(-1)
    nll = F.cross_entropy(z, y, reduction="none")
    weight = (p_y / (0.8 + 0.2 * p_y)).clamp(min=0.2)
    assert (p_y / (0.8 + 0.2 * p_y) < 0.2).any(), "the test needs positions where the floor binds"
    assert torch.allclose(tailr_per_token(z, y, 0.8, min_weight=0.2, formula="paper"), weight * nll, atol=1e-12)
    expected = weight[:, None] * (torch.softmax(z.detach(), -1) - one_hot(y))
    assert torch.allclose(grad_of(lambda x: tailr_per_token(x, y, 0.8, min_weight=0.2, formula="paper"), z), expected, atol=1e-12)


# -- EAFT and ASFT ----------------------------------------------------------------------------


def _topk_entropy(logits, k):
    """The top-k entropy written out: renormalise the k largest probabilities."""
    p = torch.softmax(logits.detach(), -1)
    top = p.topk(k, -1).values
    q = top / top.sum(-1, keepdim=True)
    return -(q * q.log()).sum(-1)


@pytest.mark.parametrize(("entropy", "k", "alpha"), [("topk", 4, 1.0), ("topk", 6, 0.5), ("full", None, 2.0)])
def test_eaft_value_and_gradient(z, y, entropy, k, alpha):
    import math

    from trl_emo.losses import eaft_per_token

    p = torch.softmax(z.detach(), -1)
    if entropy == "full":
        h = -(p * p.log()).sum(-1) / math.log(V)
    else:
        h = _topk_entropy(z, k) / math.log(k)
    w = h**alpha
    nll = F.cross_entropy(z, y, reduction="none")
    got = eaft_per_token(z, y, alpha=alpha, entropy=entropy, topk=k or 20)
    assert torch.allclose(got, w * nll, atol=1e-12)
    grad = grad_of(lambda x: eaft_per_token(x, y, alpha=alpha, entropy=entropy, topk=k or 20), z)
    assert torch.allclose(grad, w[:, None] * (p - one_hot(y)), atol=1e-12)


def test_eaft_with_alpha_zero_is_cross_entropy(z, y):
    from trl_emo.losses import eaft_per_token

    assert torch.allclose(eaft_per_token(z, y, alpha=0.0, entropy="topk", topk=5), F.cross_entropy(z, y, reduction="none"))


def test_eaft_topk_larger_than_the_vocabulary_is_a_clear_error():
    from trl_emo.losses import get_loss

    with pytest.raises(ValueError, match="eaft_topk=50 is larger than the model's vocabulary \\(13 tokens\\)"):
        get_loss("eaft").validate_vocab({"alpha": 1.0, "entropy": "topk", "topk": 50}, V)


@pytest.mark.parametrize("alpha", [0.0, 0.1, 1.0])
def test_asft_value_and_gradient(z, y, alpha):
    from trl_emo.losses import asft_per_token

    torch.manual_seed(7)
    ref = 2 * torch.randn(N, V, dtype=torch.float64)
    p = torch.softmax(z.detach(), -1)
    r = torch.softmax(ref, -1)
    p_y = p.gather(-1, y[:, None]).squeeze(-1)
    nll = F.cross_entropy(z, y, reduction="none")
    kl = (r * (r.log() - torch.log_softmax(z, -1))).sum(-1)
    got = asft_per_token(z, y, alpha=alpha, reference=ref)
    assert torch.allclose(got, p_y * nll + alpha * kl, atol=1e-12)
    grad = grad_of(lambda x: asft_per_token(x, y, alpha=alpha, reference=ref), z)
    expected = p_y[:, None] * (p - one_hot(y)) + alpha * (p - r)
    assert torch.allclose(grad, expected, atol=1e-12)


def test_asft_kl_term_passes_gradcheck(y):
    """The KL anchor has no stop-gradient: its closed-form gradient is the true derivative."""
    from trl_emo.losses import asft_per_token

    ref = torch.randn(4, V, dtype=torch.float64)
    z = torch.randn(4, V, dtype=torch.float64, requires_grad=True)

    def kl_only(x):
        return asft_per_token(x, y[:4], alpha=1.0, reference=ref) - asft_per_token(x, y[:4], alpha=0.0, reference=ref)

    assert torch.autograd.gradcheck(kl_only, (z,), eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("g", [0.2, 0.5])
def test_tailr_authors_formula_is_the_emo_repository_mixed_baseline(z, y, g):
    """The EMO repository's TaiLr baseline at mixing ratio g, written the way its script combines it:
    g * nll + (1 - g) * tailr(gamma = 1 - g, weight floored at 0.2)."""
    gamma = 1.0 - g
    nll = F.cross_entropy(z, y, reduction="none")
    p_y = torch.softmax(z.detach(), -1).gather(-1, y[:, None]).squeeze(-1)
    tvd = (p_y / (gamma + (1 - gamma) * p_y)).clamp(min=0.2) * nll
    expected = g * nll + (1 - g) * tvd
    ours = tailr_per_token(z, y, gamma, None, "authors")
    assert torch.allclose(ours, expected, atol=1e-12)
    assert torch.allclose(grad_of(lambda x: tailr_per_token(x, y, gamma, None, "authors"), z),
                          grad_of(lambda x: g * F.cross_entropy(x, y, reduction="none")
                                  + (1 - g) * (p_y / (gamma + (1 - gamma) * p_y)).clamp(min=0.2) * F.cross_entropy(x, y, reduction="none"), z),
                          atol=1e-12)
    # ... and a different loss from the floored paper formula at the same gamma (about 75% apart at g = 0.2).
    paper = grad_of(lambda x: tailr_per_token(x, y, gamma, 0.2, "paper"), z)
    authors = grad_of(lambda x: tailr_per_token(x, y, gamma, None, "authors"), z)
    assert float((paper - authors).norm() / authors.norm()) > 0.1


def test_emo_reference_and_paper_share_the_term_gradient_but_not_the_weighted_total(z, y, emb):
    def grad(weighting, demd):
        return grad_of(lambda x: emo_per_token(x, y, cost_embedding=emb, weighting=weighting, demd=demd, ratio_cap=None), z)

    assert torch.allclose(grad("none", "reference"), grad("none", "paper"), atol=1e-12)
    for weighting in ("mle", "emo"):
        a, b = grad(weighting, "reference"), grad(weighting, "paper")
        assert float((a - b).norm() / b.norm()) > 1e-3, weighting
