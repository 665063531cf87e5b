"""MixCE, mixed forward/reverse cross-entropy (Zhang et al., 2023; EMO paper eq. 17).

`ℓ = -sg(γ + (1-γ) p_y) log p_y`; `∂ℓ/∂z = w (p - e_y)` with that weight `w`.
"""

from __future__ import annotations

from ._common import check_number, weighted_nll_chunk, weighted_nll_per_token
from ._triton import RowLaunch, row_inputs, softmax_pass, store_stats, tl, triton, weighted_ce_grad
from .registry import LossSpec


def check(hp: dict) -> None:
    check_number("mixce_gamma", hp["gamma"], 0.0, 1.0)


def per_token(logits, targets, gamma):
    return weighted_nll_per_token(logits, targets, lambda p_y: gamma + (1.0 - gamma) * p_y)


def chunk(z, targets, want_grad, gamma):
    return weighted_nll_chunk(z, targets, want_grad, lambda p_y: gamma + (1.0 - gamma) * p_y)


@triton.jit
def _rows(
    Z, z_stride, Y, ZY, BIAS, STATS, stats_stride, GRAD_SCALE, V, logit_scale, softcap,
    gamma,
    HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, WRITE_GRAD: tl.constexpr, BLOCK: tl.constexpr,
):
    row, Z_row, y, z_y = row_inputs(Z, z_stride, Y, ZY)
    lse, entropy, idx = softmax_pass(Z_row, BIAS, V, logit_scale, softcap, HAS_BIAS, HAS_SOFTCAP, BLOCK)
    nll = lse - z_y
    w = gamma + (1.0 - gamma) * tl.exp(-nll)
    store_stats(STATS, stats_stride, row, w * nll, nll, entropy, (idx == y).to(tl.float32))
    if WRITE_GRAD:
        weighted_ce_grad(Z_row, BIAS, V, lse, y, w, GRAD_SCALE, logit_scale, softcap, HAS_BIAS, HAS_SOFTCAP, BLOCK)


def rows(launch: RowLaunch, gamma):
    _rows[(launch.rows,)](*launch.args(), float(gamma), **launch.meta("mixce"))


LOSS = LossSpec(
    name="mixce",
    per_token=per_token,
    chunk_kernel=chunk,
    row_kernel=rows,
    config_fields={"gamma": "mixce_gamma"},
    defaults={"gamma": 0.8},
    validate=check,
    description="MixCE: mixed forward/reverse cross-entropy (Zhang et al., 2023)",
)
