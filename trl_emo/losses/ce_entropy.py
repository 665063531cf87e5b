"""Cross-entropy minus an entropy bonus, the GEM paper's baseline: `ℓ = -log p_y - λ H(p)`.

`∂H/∂z_j = -p_j (log p_j + H)`, so `∂ℓ/∂z = p - e_y + λ p (log p + H)`.
"""

from __future__ import annotations

import math

from ._common import log_softmax, softmax_stats, target_log_prob
from ._triton import RowLaunch, logits_block, row_inputs, softmax_pass, store_grad, store_stats, tl, triton
from .registry import LossSpec


def check(hp: dict) -> None:
    coef = hp["coef"]
    if not (isinstance(coef, (int, float)) and not isinstance(coef, bool) and math.isfinite(coef)):
        raise ValueError(f"entropy_coef must be a finite number, got {coef!r}.")


def per_token(logits, targets, coef):
    logp = log_softmax(logits)
    entropy = -(logp.exp() * logp).sum(-1)
    return -target_log_prob(logp, targets) - coef * entropy


def chunk(z, targets, want_grad, coef):
    s = softmax_stats(z, targets)
    values = s.nll - coef * s.entropy
    grad = None
    if want_grad:
        grad = s.logp.add_(s.entropy[:, None]).mul_(coef).add_(1.0).mul_(s.p)
        grad[s.rows, targets] -= 1.0
    return s.result(values, grad)


@triton.jit
def _rows(
    Z, z_stride, Y, ZY, BIAS, STATS, stats_stride, GRAD_SCALE, V, logit_scale, softcap,
    coef,
    HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, WRITE_GRAD: tl.constexpr, BLOCK: tl.constexpr,
):
    row, Z_row, y, z_y = row_inputs(Z, z_stride, Y, ZY)
    lse, entropy, idx = softmax_pass(Z_row, BIAS, V, logit_scale, softcap, HAS_BIAS, HAS_SOFTCAP, BLOCK)
    nll = lse - z_y
    store_stats(STATS, stats_stride, row, nll - coef * entropy, nll, entropy, (idx == y).to(tl.float32))
    if WRITE_GRAD:
        grad_scale = tl.load(GRAD_SCALE)
        for off in range(0, V, BLOCK):
            offs, mask, z = logits_block(Z_row, BIAS, off, V, logit_scale, softcap, HAS_BIAS, HAS_SOFTCAP, BLOCK)
            logp = z - lse
            g = tl.exp(logp) * (1.0 + coef * (logp + entropy)) - tl.where(offs == y, 1.0, 0.0)
            store_grad(Z_row, offs, mask, g, z, grad_scale, logit_scale, softcap, HAS_SOFTCAP)


def rows(launch: RowLaunch, coef):
    _rows[(launch.rows,)](*launch.args(), float(coef), **launch.meta("ce_entropy"))


LOSS = LossSpec(
    name="ce_entropy",
    per_token=per_token,
    chunk_kernel=chunk,
    row_kernel=rows,
    config_fields={"coef": "entropy_coef"},
    defaults={"coef": 0.1},
    validate=check,
    description="cross-entropy minus an entropy bonus (GEM paper's baseline)",
)
