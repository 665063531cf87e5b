"""TaiLr, total-variation-guided weighting of cross-entropy (Ji et al., 2023; EMO paper eq. 16).

`formula="paper"`: `ℓ = -sg(w) log p_y` with `w = p_y / (γ + (1-γ) p_y)`, optionally floored at
`min_weight`; `∂ℓ/∂z = w (p - e_y)`.

`formula="authors"`: the TaiLr baseline of the EMO repository (the "tvd" mode of its GPT-2 script)
at mixing ratio `g = 1 - γ`: `g · nll + (1 - g) · TaiLr(γ, floor 0.2)`, i.e. the weight
`w' = (1 - γ) + γ · max(w, 0.2)` (the floor is `min_weight` when that is set). A different loss from
the paper's formula: it always keeps at least `1 - γ` of the cross-entropy gradient.
"""

from __future__ import annotations

from ._common import check_choice, check_number, weighted_nll_chunk, weighted_nll_per_token
from ._triton import RowLaunch, row_inputs, softmax_pass, store_stats, tl, triton, weighted_ce_grad
from .registry import LossSpec

FORMULAS = ("paper", "authors")
# The floor the EMO repository's script puts on TaiLr's weight.
AUTHORS_MIN_WEIGHT = 0.2


def check(hp: dict) -> None:
    check_number("tailr_gamma", hp["gamma"], 0.0, 1.0)
    check_number("tailr_min_weight", hp["min_weight"], 0.0, 1.0, allow_none=True)
    check_choice("tailr_formula", hp["formula"], FORMULAS)


def _floor(min_weight, formula):
    if formula == "authors" and min_weight is None:
        return AUTHORS_MIN_WEIGHT
    return min_weight


def weight(p_y, gamma, min_weight, formula="paper"):
    """TaiLr's weight of `-log p_y` (see the module docstring for the two formulas)."""
    floor = _floor(min_weight, formula)
    w = p_y / (gamma + (1.0 - gamma) * p_y)
    if floor is not None:
        w = w.clamp(min=floor)
    return (1.0 - gamma) + gamma * w if formula == "authors" else w


def per_token(logits, targets, gamma, min_weight, formula):
    return weighted_nll_per_token(logits, targets, lambda p_y: weight(p_y, gamma, min_weight, formula))


def chunk(z, targets, want_grad, gamma, min_weight, formula):
    return weighted_nll_chunk(z, targets, want_grad, lambda p_y: weight(p_y, gamma, min_weight, formula))


@triton.jit
def _rows(
    Z, z_stride, Y, ZY, BIAS, STATS, stats_stride, GRAD_SCALE, V, logit_scale, softcap,
    gamma, min_weight,
    HAS_FLOOR: tl.constexpr, AUTHORS: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, WRITE_GRAD: tl.constexpr, BLOCK: tl.constexpr,
):
    row, Z_row, y, z_y = row_inputs(Z, z_stride, Y, ZY)
    lse, entropy, idx = softmax_pass(Z_row, BIAS, V, logit_scale, softcap, HAS_BIAS, HAS_SOFTCAP, BLOCK)
    nll = lse - z_y
    p_y = tl.exp(-nll)
    w = p_y / (gamma + (1.0 - gamma) * p_y)
    if HAS_FLOOR:
        w = tl.maximum(w, min_weight)
    if AUTHORS:
        w = (1.0 - gamma) + gamma * w
    store_stats(STATS, stats_stride, row, w * nll, nll, entropy, (idx == y).to(tl.float32))
    if WRITE_GRAD:
        weighted_ce_grad(Z_row, BIAS, V, lse, y, w, GRAD_SCALE, logit_scale, softcap, HAS_BIAS, HAS_SOFTCAP, BLOCK)


def rows(launch: RowLaunch, gamma, min_weight, formula):
    floor = _floor(min_weight, formula)
    _rows[(launch.rows,)](
        *launch.args(),
        float(gamma),
        float(floor) if floor is not None else 0.0,
        HAS_FLOOR=floor is not None,
        AUTHORS=formula == "authors",
        **launch.meta("tailr"),
    )


LOSS = LossSpec(
    name="tailr",
    per_token=per_token,
    chunk_kernel=chunk,
    row_kernel=rows,
    config_fields={"gamma": "tailr_gamma", "min_weight": "tailr_min_weight", "formula": "tailr_formula"},
    defaults={"gamma": 0.8, "min_weight": None, "formula": "paper"},
    validate=check,
    description="TaiLr: total-variation-guided weighting of nll (Ji et al., 2023)",
)
