"""GEM, entropy-regularized reverse-KL distribution matching (Li et al., ICLR 2025).

Per target position, with `q = sg(softmax(z / beta))`:
`ℓ = Σ_i q_i w_i (z_i - z_y)`, `w = 1` (`h="linear"`) or `w_i = sg(sigmoid(0.01 (z_i - z_y)))`
(`h="logsigmoid"`); `∂ℓ/∂z_j = q_j w_j - [j = y] Σ_i q_i w_i` (linear: `q - e_y`). The
log-normalizer cancels, so the value needs no log-softmax. See `docs/losses.md`.
"""

from __future__ import annotations

import torch

from ._common import check_choice, check_number, softmax_stats, upcast
from ._triton import RowLaunch, logits_block, row_inputs, running_max, softmax_sums, store_grad, store_stats, tl, triton
from .registry import LossSpec

H_CHOICES = ("linear", "logsigmoid")
# The slope inside the logsigmoid weight: small, so that h stays nearly linear (the paper's value).
LOGSIGMOID_SLOPE = 0.01


def check(hp: dict) -> None:
    check_number("gem_beta", hp["beta"], 0.0, 1.0, low_open=True)
    check_choice("gem_h", hp["h"], H_CHOICES)


def per_token(logits, targets, beta, h):
    """`Σ_i q_i w_i (z_i - z_y)` per position (the reference, through autograd)."""
    check_choice("gem h", h, H_CHOICES)
    z = upcast(logits)
    q = torch.softmax(z.detach() / beta, dim=-1)
    diff = z - z.gather(-1, targets[:, None])
    if h == "linear":
        return (q * diff).sum(-1)
    w = torch.sigmoid(LOGSIGMOID_SLOPE * diff.detach())
    return (q * w * diff).sum(-1)


def chunk(z, targets, want_grad, beta, h):
    s = softmax_stats(z, targets)
    q = s.p if beta == 1.0 else torch.softmax(z / beta, dim=-1)
    z_y = z[s.rows, targets]
    if h == "linear":
        # ℓ = Σ q_i z_i - z_y  (Σ q = 1)
        values = torch.linalg.vecdot(q, z) - z_y
        grad = None
        if want_grad:
            grad = q if q is not s.p else q.clone()
            grad[s.rows, targets] -= 1.0
        return s.result(values, grad)
    diff = z - z_y[:, None]
    qw = torch.sigmoid(LOGSIGMOID_SLOPE * diff)
    qw.mul_(q)
    values = torch.linalg.vecdot(qw, diff)
    grad = None
    if want_grad:
        total = qw.sum(-1)
        grad = qw
        grad[s.rows, targets] -= total
    return s.result(values, grad)


@triton.jit
def _rows(
    Z, z_stride, Y, ZY, BIAS, STATS, stats_stride, GRAD_SCALE, V, logit_scale, softcap,
    inv_beta, slope,
    LOGSIGMOID: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, WRITE_GRAD: tl.constexpr, BLOCK: tl.constexpr,
):
    row, Z_row, y, z_y = row_inputs(Z, z_stride, Y, ZY)
    # One read gives softmax(z) (for the logged cross-entropy and entropy) and softmax(z / beta);
    # both share the running max. Sums are relative to it (see _triton.py).
    m = -1.0e30
    s = 0.0
    t = 0.0
    idx = 0
    s_b = 0.0
    t_b = 0.0  # linear: Σ e_b (z - m)
    w_sum = 0.0  # logsigmoid: Σ e_b w
    u = 0.0  # logsigmoid: Σ e_b w (z - z_y)
    for off in range(0, V, BLOCK):
        offs, mask, z = logits_block(Z_row, BIAS, off, V, logit_scale, softcap, HAS_BIAS, HAS_SOFTCAP, BLOCK)
        m_new, idx = running_max(m, idx, z, off)
        s, t, e = softmax_sums(m, m_new, s, t, z)
        alpha_b = tl.exp((m - m_new) * inv_beta)
        e_b = tl.exp((z - m_new) * inv_beta)
        if LOGSIGMOID:
            ew = e_b * tl.sigmoid(slope * (z - z_y))
            w_sum = alpha_b * w_sum + tl.sum(ew, 0)
            u = alpha_b * u + tl.sum(ew * (z - z_y), 0)
        else:
            t_b = alpha_b * (t_b + s_b * (m - m_new)) + tl.sum(e_b * (z - m_new), 0)
        s_b = alpha_b * s_b + tl.sum(e_b, 0)
        m = m_new
    log_s = tl.log(s)
    nll = m + log_s - z_y
    if LOGSIGMOID:
        value = u / s_b
    else:
        value = t_b / s_b + m - z_y
    store_stats(STATS, stats_stride, row, value, nll, log_s - t / s, (idx == y).to(tl.float32))
    if WRITE_GRAD:
        grad_scale = tl.load(GRAD_SCALE)
        if LOGSIGMOID:
            at_target = w_sum / s_b
        else:
            at_target = 1.0
        for off in range(0, V, BLOCK):
            offs, mask, z = logits_block(Z_row, BIAS, off, V, logit_scale, softcap, HAS_BIAS, HAS_SOFTCAP, BLOCK)
            q = tl.exp((z - m) * inv_beta) / s_b
            if LOGSIGMOID:
                q = q * tl.sigmoid(slope * (z - z_y))
            g = q - tl.where(offs == y, at_target, 0.0)
            store_grad(Z_row, offs, mask, g, z, grad_scale, logit_scale, softcap, HAS_SOFTCAP)


def rows(launch: RowLaunch, beta, h):
    kernel = "gem_logsigmoid" if h == "logsigmoid" else "gem"  # its own launch configuration
    _rows[(launch.rows,)](
        *launch.args(), 1.0 / float(beta), LOGSIGMOID_SLOPE, LOGSIGMOID=h == "logsigmoid", **launch.meta(kernel)
    )


LOSS = LossSpec(
    name="gem",
    per_token=per_token,
    chunk_kernel=chunk,
    row_kernel=rows,
    config_fields={"beta": "gem_beta", "h": "gem_h"},
    defaults={"beta": 0.7, "h": "linear"},
    validate=check,
    description="GEM: entropy-regularized reverse-KL distribution matching (Li et al., ICLR 2025)",
)
