"""MixCE, mixed forward/reverse cross-entropy (Zhang et al., 2023; EMO paper eq. 17).

`ℓ = -sg(γ + (1-γ) p_y) log p_y`; `∂ℓ/∂z = w (p - e_y)` with that weight `w`.
"""

from __future__ import annotations

from ._common import check_number, log_softmax, softmax_stats, target_log_prob
from ._triton import RowLaunch, load_logits, softmax_pass, store_grad, store_stats, tl, triton
from .registry import LossSpec


def check(hp: dict) -> None:
    check_number("mixce_gamma", hp["gamma"], 0.0, 1.0)


def per_token(logits, targets, gamma):
    logp_y = target_log_prob(log_softmax(logits), targets)
    return -(gamma + (1.0 - gamma) * logp_y.exp().detach()) * logp_y


def chunk(z, targets, want_grad, gamma):
    s = softmax_stats(z, targets)
    w = gamma + (1.0 - gamma) * s.nll.neg().exp()
    grad = None
    if want_grad:
        grad = s.p
        grad[s.rows, targets] -= 1.0
        grad.mul_(w[:, None])
    return s.result(w * s.nll, grad)


@triton.jit
def _rows(
    Z, z_stride, Y, ZY, BIAS, STATS, stats_stride, GRAD_SCALE, V, logit_scale, softcap,
    gamma,
    HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, WRITE_GRAD: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    Z_row = Z + row * z_stride
    y = tl.load(Y + row)
    z_y = tl.load(ZY + row)
    lse, entropy, idx = softmax_pass(Z_row, BIAS, V, logit_scale, softcap, HAS_BIAS, HAS_SOFTCAP, BLOCK)
    nll = lse - z_y
    w = gamma + (1.0 - gamma) * tl.exp(-nll)
    store_stats(STATS, stats_stride, row, w * nll, nll, entropy, (idx == y).to(tl.float32))
    if WRITE_GRAD:
        grad_scale = tl.load(GRAD_SCALE)
        for off in range(0, V, BLOCK):
            offs = off + tl.arange(0, BLOCK)
            mask = offs < V
            z = load_logits(Z_row, BIAS, offs, mask, logit_scale, softcap, HAS_BIAS, HAS_SOFTCAP)
            g = w * (tl.exp(z - lse) - tl.where(offs == y, 1.0, 0.0))
            store_grad(Z_row, offs, mask, g, z, grad_scale, logit_scale, softcap, HAS_SOFTCAP)


def rows(launch: RowLaunch, gamma):
    _rows[(launch.rows,)](*launch.args(), float(gamma), **launch.meta())


LOSS = LossSpec(
    name="mixce",
    per_token=per_token,
    chunk_kernel=chunk,
    row_kernel=rows,
    config_fields={"gamma": "mixce_gamma"},
    validate=check,
    description="MixCE: mixed forward/reverse cross-entropy (Zhang et al., 2023)",
)
