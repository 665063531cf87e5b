"""Cross-entropy: `ℓ = -log p_y`, `∂ℓ/∂z = p - e_y`.

`trl_emo.SFTTrainer` hands `loss_type="nll"` to TRL untouched; this definition is the reference the
other losses are checked and benchmarked against (`benchmarks/loss_bench.py` times it beside TRL's
and Liger's kernels).
"""

from __future__ import annotations

from ._common import ce_grad_, log_softmax, softmax_stats, target_log_prob
from ._triton import RowLaunch, row_inputs, softmax_pass, store_stats, tl, triton, weighted_ce_grad
from .registry import LossSpec


def per_token(logits, targets):
    """`-log p_y` per position."""
    return -target_log_prob(log_softmax(logits), targets)


def chunk(z, targets, want_grad):
    s = softmax_stats(z, targets)
    return s.result(s.nll, ce_grad_(s, targets) if want_grad else None)


@triton.jit
def _rows(
    Z, z_stride, Y, ZY, BIAS, STATS, stats_stride, GRAD_SCALE, V, logit_scale, softcap,
    HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, WRITE_GRAD: tl.constexpr, BLOCK: tl.constexpr,
):
    row, Z_row, y, z_y = row_inputs(Z, z_stride, Y, ZY)
    lse, entropy, idx = softmax_pass(Z_row, BIAS, V, logit_scale, softcap, HAS_BIAS, HAS_SOFTCAP, BLOCK)
    nll = lse - z_y
    store_stats(STATS, stats_stride, row, nll, nll, entropy, (idx == y).to(tl.float32))
    if WRITE_GRAD:
        weighted_ce_grad(Z_row, BIAS, V, lse, y, 1.0, GRAD_SCALE, logit_scale, softcap, HAS_BIAS, HAS_SOFTCAP, BLOCK)


def rows(launch: RowLaunch):
    _rows[(launch.rows,)](*launch.args(), **launch.meta("nll"))


LOSS = LossSpec(name="nll", per_token=per_token, chunk_kernel=chunk, row_kernel=rows, description="cross-entropy")
