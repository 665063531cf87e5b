"""Closed-form value and logit-gradient of each objective, for one chunk of positions.

The fused path (`fused.py`) builds one chunk of float32 logits `z [n, V]` at a time and asks a
kernel for the per-position loss `ℓ [n]` and `∂ℓ/∂z [n, V]`, which it turns straight into the
gradients of the hidden states and of the head. The formulas are those of `docs/losses.md`;
tests check every kernel against autograd on the reference functions in `functional.py`.

Each kernel also returns the cross-entropy, entropy and top-1 correctness of every position, so
the trainer can log them beside the objective without a second pass over the vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .cost import CostEmbedding
from .functional import _GEM_LOGSIGMOID_SLOPE, _RATIO_EPS, tailr_weight


@dataclass
class ChunkResult:
    """What a kernel returns for `n` positions (every tensor float32 and detached)."""

    values: torch.Tensor  # [n] the objective
    grad: torch.Tensor | None  # [n, V] ∂ℓ/∂z, None when no gradient was asked for
    nll: torch.Tensor  # [n] cross-entropy
    entropy: torch.Tensor  # [n] entropy of softmax(z)
    is_top1: torch.Tensor  # [n] 1.0 where the target is the argmax
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)  # [n] extra quantities to log


@dataclass
class _Softmax:
    logp: torch.Tensor  # [n, V]
    p: torch.Tensor  # [n, V]
    nll: torch.Tensor  # [n]
    entropy: torch.Tensor  # [n]
    is_top1: torch.Tensor  # [n]
    rows: torch.Tensor  # [n] arange, to index the target column


def _softmax(z: torch.Tensor, targets: torch.Tensor) -> _Softmax:
    logp = torch.log_softmax(z, dim=-1)
    p = logp.exp()
    rows = torch.arange(z.shape[0], device=z.device)
    return _Softmax(
        logp=logp,
        p=p,
        nll=-logp[rows, targets],
        # `vecdot` reduces without materializing the [n, V] product
        entropy=-torch.linalg.vecdot(p, logp),
        is_top1=(z.argmax(-1) == targets).to(z.dtype),
        rows=rows,
    )


def _result(values, grad, s: _Softmax, **metrics) -> ChunkResult:
    return ChunkResult(values=values, grad=grad, nll=s.nll, entropy=s.entropy, is_top1=s.is_top1, metrics=metrics)


def nll_kernel(z, targets, want_grad):
    s = _softmax(z, targets)
    grad = None
    if want_grad:
        grad = s.p  # p - e_y, built in place: p is not needed afterwards
        grad[s.rows, targets] -= 1.0
    return _result(s.nll, grad, s)


def gem_kernel(z, targets, want_grad, beta=0.7, h="linear"):
    s = _softmax(z, targets)
    q = s.p if beta == 1.0 else torch.softmax(z / beta, dim=-1)
    z_y = z[s.rows, targets]
    if h == "linear":
        # ℓ = Σ q_i z_i - z_y  (Σ q = 1);  ∂ℓ/∂z = q - e_y
        values = torch.linalg.vecdot(q, z) - z_y
        grad = None
        if want_grad:
            grad = q if q is not s.p else q.clone()
            grad[s.rows, targets] -= 1.0
        return _result(values, grad, s)
    # logsigmoid: w_i = sigmoid(0.01 (z_i - z_y)); ℓ = Σ q_i w_i (z_i - z_y)
    diff = z - z_y[:, None]
    qw = torch.sigmoid(_GEM_LOGSIGMOID_SLOPE * diff)
    qw.mul_(q)
    values = torch.linalg.vecdot(qw, diff)
    grad = None
    if want_grad:
        # ∂ℓ/∂z_j = q_j w_j - [j = y] Σ_i q_i w_i
        total = qw.sum(-1)
        grad = qw
        grad[s.rows, targets] -= total
    return _result(values, grad, s)


def emo_kernel(
    z,
    targets,
    want_grad,
    cost_embedding: CostEmbedding | None = None,
    weighting="mle",
    demd="reference",
    ratio_cap=None,
):
    s = _softmax(z, targets)
    c = cost_embedding.similarity(targets)  # [n, V] cosine of every token with the target
    c_bar = torch.linalg.vecdot(s.p, c)  # Σ p_i c_i
    distance = 1.0 - c_bar  # DEMD
    p_y = s.p[s.rows, targets]
    emo = distance + p_y if demd == "reference" else distance
    nll = s.nll
    # ℓ = a·nll + b·emo with stop-gradient weights (a, b), so ∂ℓ/∂z = a (p - e_y) + b p (c̄ - c)
    if weighting == "mle":
        ratio = nll / (emo + _RATIO_EPS)
        if ratio_cap is not None:
            ratio = ratio.clamp(max=ratio_cap)
        a, b = torch.full_like(nll, 0.5), 0.5 * ratio
    elif weighting == "emo":
        ratio = emo / (nll + _RATIO_EPS)
        if ratio_cap is not None:
            ratio = ratio.clamp(max=ratio_cap)
        a, b = ratio, torch.ones_like(nll)
    else:  # "none"
        a, b = torch.zeros_like(nll), torch.ones_like(nll)
    values = a * nll + b * emo
    grad = None
    if want_grad:
        # p * (a + b (c̄ - c)), written into c's storage
        grad = c.neg_().add_(c_bar[:, None]).mul_(b[:, None]).add_(a[:, None]).mul_(s.p)
        grad[s.rows, targets] -= a
    return _result(values, grad, s, emo_distance=distance)


def _confidence_weighted_kernel(weight_fn: Callable[..., torch.Tensor]):
    """Kernels of the form ℓ = -sg(w(p_y)) log p_y (TaiLr, MixCE): ∂ℓ/∂z = w (p - e_y)."""

    def kernel(z, targets, want_grad, **hparams):
        s = _softmax(z, targets)
        w = weight_fn(s.nll.neg().exp(), **hparams)
        grad = None
        if want_grad:
            grad = s.p
            grad[s.rows, targets] -= 1.0
            grad.mul_(w[:, None])
        return _result(w * s.nll, grad, s)

    return kernel


tailr_kernel = _confidence_weighted_kernel(tailr_weight)
mixce_kernel = _confidence_weighted_kernel(lambda p_y, gamma=0.8: gamma + (1.0 - gamma) * p_y)


def ce_entropy_kernel(z, targets, want_grad, coef=0.1):
    s = _softmax(z, targets)
    values = s.nll - coef * s.entropy
    grad = None
    if want_grad:
        # ∂H/∂z_j = -p_j (log p_j + H), so ∂ℓ/∂z = p - e_y + λ p (log p + H)
        grad = s.logp.add_(s.entropy[:, None]).mul_(coef).add_(1.0).mul_(s.p)
        grad[s.rows, targets] -= 1.0
    return _result(values, grad, s)


def autograd_kernel(per_token: Callable[..., torch.Tensor]):
    """A kernel for a loss registered without one: the gradient of its per-token function by autograd."""

    def kernel(z, targets, want_grad, **hparams):
        with torch.enable_grad():
            leaf = z.detach().requires_grad_(want_grad)
            values = per_token(leaf, targets, **hparams)
            grad = torch.autograd.grad(values.sum(), leaf)[0] if want_grad else None
        s = _softmax(z, targets)
        return _result(values.detach(), grad, s)

    return kernel
