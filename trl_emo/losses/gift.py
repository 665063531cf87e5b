"""GIFT, Gibbs initialization with finite temperature (arXiv 2601.09233), as the authors' code computes it
(`zzy1127/GIFT` at ba91084, `verl/verl/trainer/fsdp_gift_trainer.py`, `_compute_loss_and_backward`, L376-527).

Per target token, with `r` the frozen base model's distribution at that position (their reference, L316-372: the
starting weights loaded again) and `V` the vocabulary:

    m_v = (1 − λ) r_v + λ / V                      (their smoothing, `smooth_lambda`, L432-433; 0 in their script)
    ẑ_v = log(m_v + 1e-10) + β · 1[v = y]          (L434-441; β = 20, their script's `trainer.beta`)
    q = softmax(ẑ)                                 (L444: the "Gibbs" target, no gradient)
    ℓ = −Σ_v q_v log p_v,      ∂ℓ/∂z = p − q       (L448-449)

averaged over the target tokens (L513-522, `Σ ℓ / (count + 1e-8)`; the trainer's `num_items_in_batch` here). `β → ∞`
is cross-entropy; `β = 0` with `λ = 0` is distillation into the base model. `gift_formula: paper` drops the `1e-10`
(the algorithm in their docstring, L384-388, writes `log p_ref`): `m_v`'s logarithm is then exact, which moves `q` only
where the base model gives a token less than ~1e-8. Their docstring also writes the loss as a sum over each sequence's
tokens divided by the number of sequences; their code (and this) takes a token mean. In evaluation their trainer scores
plain cross-entropy (L451-454); `eval_loss` is the objective here, with `eval_cross_entropy` beside it.

Fused as ASFT: the reference's logits are built chunk by chunk from its final hidden states and head. Both kernels form
`q` without a logarithm over the vocabulary: `q_v = m_v / Z` off the target, `q_y = m_y e^β / Z`, with the target's
boosted mass and the rest's summed apart and `log Z` taken by a log-sum. The PyTorch chunk kernel forms `q` in the
reference's buffer; the Triton row kernel reads each row of both twice: first both log-normalizers, then `q_v`, the
loss `Σ q_v (lse − z_v)` and `p − q` in place.
"""

from __future__ import annotations

import math

import torch

from ._common import check_choice, check_number, log_softmax, softmax_stats, upcast
from ._triton import (
    RowLaunch,
    load_logits,
    logits_block,
    row_inputs,
    running_max,
    softmax_sums,
    store_grad,
    store_stats,
    tanh,
    tl,
    triton,
)
from .asft import ReferenceHead
from .registry import LossSpec
from .target_stats import reference_chunk

FORMULAS = ("authors", "paper")
# Their `torch.log(mixed_ref_probs + 1e-10)` (L434).
EPS = 1e-10
METRICS = ("gift_target_mass",)


def check(hp: dict) -> None:
    check_number("gift_beta", hp["beta"], 0.0, math.inf)
    if not math.isfinite(hp["beta"]):
        raise ValueError(f"gift_beta must be a finite number >= 0, got {hp['beta']!r}.")
    check_number("gift_smooth_lambda", hp["smooth_lambda"], 0.0, 1.0)
    check_choice("gift_formula", hp["formula"], FORMULAS)


def mixture(smooth_lambda: float, formula: str, vocab: int) -> tuple[float, float]:
    """`(1 − λ, c)` of `m_v + ε = (1 − λ) r_v + c`: `c = λ / V + 1e-10` (authors) or `λ / V` (paper)."""
    return 1.0 - smooth_lambda, smooth_lambda / vocab + (EPS if formula == "authors" else 0.0)


def target_distribution_(logr: torch.Tensor, targets: torch.Tensor, beta, smooth_lambda, formula) -> torch.Tensor:
    """GIFT's `q` from the reference's log-probabilities `logr` `[n, V]`, formed in `logr`'s storage."""
    keep, floor = mixture(smooth_lambda, formula, logr.shape[-1])
    if floor != 0.0:
        logr.exp_().mul_(keep).add_(floor).log_()
    logr[torch.arange(logr.shape[0], device=logr.device), targets] += beta
    return logr.sub_(torch.logsumexp(logr, dim=-1, keepdim=True)).exp_()


def _reference_log_probs(reference, like: torch.Tensor) -> torch.Tensor:
    if reference is None:
        raise ValueError("gift needs the reference model's logits or hidden states.")
    logits = reference.logits() if isinstance(reference, ReferenceHead) else upcast(reference).detach().clone()
    logits = logits.to(like.dtype)
    return logits.sub_(torch.logsumexp(logits, dim=-1, keepdim=True))


# -- the logits path (the reference implementation) -------------------------------------------------------------------


def per_token(logits, targets, beta, smooth_lambda, formula, reference=None):
    """`−Σ_v q_v log p_v` per row. `reference`: the reference logits (logits path) or a `ReferenceHead`."""
    logp = log_softmax(logits)
    with torch.no_grad():
        q = target_distribution_(_reference_log_probs(reference, logp), targets, beta, smooth_lambda, formula)
    return -(q * logp).sum(-1)


# -- the fused path ---------------------------------------------------------------------------------------------------


def chunk(z, targets, want_grad, beta, smooth_lambda, formula, reference=None):
    """`q` without taking logarithms: `q_v = m_v / Z` off the target and `q_y = m_y e^β / Z`, `Z` from the target's
    mass and the rest's summed apart (`log Z` by a log-sum, so a large β cannot overflow), as the row kernel does: two
    fewer passes of `exp`/`log` over the chunk than forming `softmax(log(m + ε) + β e_y)`."""
    s = softmax_stats(z, targets)
    if reference is None:
        raise ValueError("gift needs the reference model's logits or hidden states.")
    m = reference.logits() if isinstance(reference, ReferenceHead) else upcast(reference).detach().clone()
    m = m.to(z.dtype)
    keep, floor = mixture(smooth_lambda, formula, m.shape[-1])
    lse_r = torch.logsumexp(m, dim=-1)
    log_ry = m[s.rows, targets] - lse_r
    m.sub_(lse_r[:, None]).exp_()  # r
    if floor != 0.0:
        m.mul_(keep).add_(floor)  # m = (1 − λ) r + c
    m_y = m[s.rows, targets]
    log_my = log_ry if floor == 0.0 else torch.log(m_y)  # exact where r_y underflows and no floor lifts it
    rest = (m.sum(-1) - m_y).clamp_(min=0.0)
    log_z = torch.logaddexp(log_my + beta, torch.log(rest))
    inv_z = torch.exp(-log_z)
    q_y = torch.exp(log_my + beta - log_z)
    logp_y = -s.nll
    values = -(inv_z * torch.linalg.vecdot(m, s.logp) + (q_y - m_y * inv_z) * logp_y)
    grad = None
    if want_grad:
        q = m.mul_(inv_z[:, None])
        q[s.rows, targets] = q_y
        grad = s.p.sub_(q)
    return s.result(values, grad, gift_target_mass=q_y)


@triton.jit
def _rows(
    Z, z_stride, Y, ZY, BIAS, STATS, stats_stride, GRAD_SCALE, V, logit_scale, softcap,
    R, r_stride, ref_scale, ref_softcap, beta, keep, floor,
    HAS_FLOOR: tl.constexpr, HAS_REF_SOFTCAP: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, WRITE_GRAD: tl.constexpr, BLOCK: tl.constexpr,
):
    # R holds the reference logits of this chunk (its bias already added), transformed here. m_v = keep r_v + floor.
    row, Z_row, y, z_y = row_inputs(Z, z_stride, Y, ZY)
    R_row = R + row * r_stride
    m = -1.0e30
    s = 0.0
    t = 0.0
    idx = 0
    m_r = -1.0e30
    s_r = 0.0
    for off in range(0, V, BLOCK):
        offs, mask, z = logits_block(Z_row, BIAS, off, V, logit_scale, softcap, HAS_BIAS, HAS_SOFTCAP, BLOCK)
        m_new, idx = running_max(m, idx, z, off)
        s, t, e = softmax_sums(m, m_new, s, t, z)
        m = m_new
        zr = load_logits(R_row, BIAS, offs, mask, ref_scale, ref_softcap, False, HAS_REF_SOFTCAP)
        mr_new = tl.maximum(m_r, tl.max(zr, 0))
        s_r = tl.exp(m_r - mr_new) * s_r + tl.sum(tl.exp(zr - mr_new), 0)
        m_r = mr_new
    log_s = tl.log(s)
    lse = m + log_s
    nll = lse - z_y
    lse_r = m_r + tl.log(s_r)
    zr_y = tl.load(R_row + y).to(tl.float32) * ref_scale
    if HAS_REF_SOFTCAP:
        zr_y = ref_softcap * tanh(zr_y / ref_softcap)
    log_ry = zr_y - lse_r
    if HAS_FLOOR:
        log_my = tl.log(keep * tl.exp(log_ry) + floor)
    else:
        log_my = log_ry  # λ = 0 without ε: keep = 1
    # log Z = log(m_y e^β + Σ_{v≠y} m_v), the two masses summed apart. Σ_{v≠y} r_v = 1 − r_y loses ~1e-7 to rounding
    # where r_y ≈ 1, never more than 1e-7 of Z ≥ Σ_v m_v ≈ 1.
    a = log_my + beta
    log_rest = tl.log(keep * tl.maximum(1.0 - tl.exp(log_ry), 0.0) + (V - 1) * floor)
    top = tl.maximum(a, log_rest)
    log_z = top + tl.log(1.0 + tl.exp(-tl.abs(a - log_rest)))
    q_y = tl.exp(a - log_z)
    # q_v = (keep r_v + floor) / Z off the target: scale and offset of exp(z_r − lse_r).
    q_scale = keep * tl.exp(-log_z)
    q_floor = floor * tl.exp(-log_z)
    grad_scale = tl.load(GRAD_SCALE)
    value = 0.0
    for off in range(0, V, BLOCK):
        offs, mask, z = logits_block(Z_row, BIAS, off, V, logit_scale, softcap, HAS_BIAS, HAS_SOFTCAP, BLOCK)
        zr = load_logits(R_row, BIAS, offs, mask, ref_scale, ref_softcap, False, HAS_REF_SOFTCAP)
        q = tl.where(offs == y, q_y, tl.where(mask, q_scale * tl.exp(zr - lse_r) + q_floor, 0.0))
        value += tl.sum(q * (lse - z), 0)
        if WRITE_GRAD:
            store_grad(Z_row, offs, mask, tl.exp(z - lse) - q, z, grad_scale, logit_scale, softcap, HAS_SOFTCAP)
    store_stats(STATS, stats_stride, row, value, nll, log_s - t / s, (idx == y).to(tl.float32))
    tl.store(STATS + 4 * stats_stride + row, q_y)


def rows(launch: RowLaunch, beta, smooth_lambda, formula, reference=None):
    r = reference_chunk(reference, launch.scratch, 0, launch.rows)
    keep, floor = mixture(smooth_lambda, formula, launch.vocab)
    _rows[(launch.rows,)](
        *launch.args(), r, r.stride(0), float(reference.logit_scale),
        float(reference.softcap) if reference.softcap is not None else 1.0, float(beta), float(keep), float(floor),
        HAS_FLOOR=floor != 0.0, HAS_REF_SOFTCAP=reference.softcap is not None, **launch.meta("gift"),
    )


LOSS = LossSpec(
    name="gift",
    per_token=per_token,
    chunk_kernel=chunk,
    row_kernel=rows,
    scratch_rows=1.0,
    config_fields={"beta": "gift_beta", "smooth_lambda": "gift_smooth_lambda", "formula": "gift_formula"},
    # Their script (exp_scripts/run_gift_training.sh): trainer.beta=20.0, trainer.smooth_lambda=0.0; the code's
    # defaults are the same (fsdp_gift_trainer.py L111-112).
    defaults={"beta": 20.0, "smooth_lambda": 0.0, "formula": "authors"},
    validate=check,
    description="GIFT: cross-entropy against softmax(log p_ref + beta onehot(y)), a finite-temperature target from a "
    "frozen base model (arXiv 2601.09233)",
    metrics=METRICS,
    needs_reference=True,
    reference_field="gift_ref_model",
)
