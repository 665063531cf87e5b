"""TaiLr, total-variation-guided weighting of cross-entropy (Ji et al., 2023; EMO paper eq. 16).

`ℓ = -sg(w) log p_y` with `w = p_y / (γ + (1-γ) p_y)`, optionally floored at `min_weight`;
`∂ℓ/∂z = w (p - e_y)`.
"""

from __future__ import annotations

from ._common import check_number, weighted_nll_chunk, weighted_nll_per_token
from ._triton import RowLaunch, row_inputs, softmax_pass, store_stats, tl, triton, weighted_ce_grad
from .registry import LossSpec


def check(hp: dict) -> None:
    check_number("tailr_gamma", hp["gamma"], 0.0, 1.0)
    check_number("tailr_min_weight", hp["min_weight"], 0.0, 1.0, allow_none=True)


def weight(p_y, gamma, min_weight):
    """`p_y / (γ + (1-γ) p_y)`, floored at `min_weight` when given."""
    w = p_y / (gamma + (1.0 - gamma) * p_y)
    return w if min_weight is None else w.clamp(min=min_weight)


def per_token(logits, targets, gamma, min_weight):
    return weighted_nll_per_token(logits, targets, lambda p_y: weight(p_y, gamma, min_weight))


def chunk(z, targets, want_grad, gamma, min_weight):
    return weighted_nll_chunk(z, targets, want_grad, lambda p_y: weight(p_y, gamma, min_weight))


@triton.jit
def _rows(
    Z, z_stride, Y, ZY, BIAS, STATS, stats_stride, GRAD_SCALE, V, logit_scale, softcap,
    gamma, min_weight,
    HAS_FLOOR: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, WRITE_GRAD: tl.constexpr, BLOCK: tl.constexpr,
):
    row, Z_row, y, z_y = row_inputs(Z, z_stride, Y, ZY)
    lse, entropy, idx = softmax_pass(Z_row, BIAS, V, logit_scale, softcap, HAS_BIAS, HAS_SOFTCAP, BLOCK)
    nll = lse - z_y
    p_y = tl.exp(-nll)
    w = p_y / (gamma + (1.0 - gamma) * p_y)
    if HAS_FLOOR:
        w = tl.maximum(w, min_weight)
    store_stats(STATS, stats_stride, row, w * nll, nll, entropy, (idx == y).to(tl.float32))
    if WRITE_GRAD:
        weighted_ce_grad(Z_row, BIAS, V, lse, y, w, GRAD_SCALE, logit_scale, softcap, HAS_BIAS, HAS_SOFTCAP, BLOCK)


def rows(launch: RowLaunch, gamma, min_weight):
    _rows[(launch.rows,)](
        *launch.args(),
        float(gamma),
        float(min_weight) if min_weight is not None else 0.0,
        HAS_FLOOR=min_weight is not None,
        **launch.meta(),
    )


LOSS = LossSpec(
    name="tailr",
    per_token=per_token,
    chunk_kernel=chunk,
    row_kernel=rows,
    config_fields={"gamma": "tailr_gamma", "min_weight": "tailr_min_weight"},
    validate=check,
    description="TaiLr: total-variation-guided weighting of nll (Ji et al., 2023)",
)
