"""EMO, earth mover distance optimization (Ren et al., ICLR 2024).

With a fixed cost embedding `E` (row-normalized `Ê`) and `c_i = ê_i · ê_y`, the upper bound of the
earth mover distance to the one-hot data distribution is `DEMD = 1 - Σ_i p_i c_i`, with
`∂DEMD/∂z_j = p_j (c̄ - c_j)`, `c̄ = Σ_i p_i c_i`. It is mixed with cross-entropy by dynamic,
stop-gradient weights (`weighting`). `demd="reference"` adds `sg(p_y)` to the value, as the
authors' code does: the EMO term's gradient is unchanged, but under `mle`/`emo` weighting the
dynamic weight reads the value, so the *total* gradient differs between `reference` and `paper`.
See `docs/losses.md`.

All `c_i` of a chunk are one more product per chunk, `Ê_y Ê^T` (`[n, d'] x [d', V]`).
"""

from __future__ import annotations

import math

import torch

from ._common import check_choice, log_softmax, softmax_stats, target_log_prob, upcast
from ._triton import RowLaunch, logits_block, row_inputs, running_max, softmax_sums, store_grad, store_stats, tl, triton
from .cost import CostEmbedding
from .registry import LossSpec

WEIGHTINGS = ("mle", "emo", "none")
DEMD_CHOICES = ("reference", "paper")
# The stabilizer of the dynamic weights in EMO's reference code.
RATIO_EPS = 1e-10


def check(hp: dict) -> None:
    check_choice("emo_weighting", hp["weighting"], WEIGHTINGS)
    check_choice("emo_demd", hp["demd"], DEMD_CHOICES)
    cap = hp["ratio_cap"]
    if cap is not None and not (isinstance(cap, (int, float)) and not isinstance(cap, bool) and cap > 0 and math.isfinite(cap)):
        raise ValueError(f"emo_ratio_cap must be a positive number or null, got {cap!r}.")


def as_cost(cost_embedding) -> CostEmbedding:
    if cost_embedding is None:
        raise ValueError("The EMO loss needs a cost embedding ([vocab, dim] tensor or CostEmbedding).")
    return cost_embedding if isinstance(cost_embedding, CostEmbedding) else CostEmbedding(cost_embedding)


def weights(nll, emo, weighting, ratio_cap):
    """The stop-gradient weights `(a, b)` of `ℓ = a·nll + b·emo` (paper appendix A.2)."""
    if weighting == "mle":
        ratio = nll / (emo + RATIO_EPS)
        if ratio_cap is not None:
            ratio = ratio.clamp(max=ratio_cap)
        return torch.full_like(nll, 0.5), 0.5 * ratio
    if weighting == "emo":
        ratio = emo / (nll + RATIO_EPS)
        if ratio_cap is not None:
            ratio = ratio.clamp(max=ratio_cap)
        return ratio, torch.ones_like(nll)
    check_choice("emo weighting", weighting, ("none",))
    return torch.zeros_like(nll), torch.ones_like(nll)


def per_token(logits, targets, cost_embedding, weighting, demd, ratio_cap):
    """DEMD mixed with nll by dynamic weighting, per position (the reference, through autograd)."""
    check_choice("emo demd", demd, DEMD_CHOICES)
    cost = as_cost(cost_embedding)
    z = upcast(logits)
    logp = log_softmax(z)
    p = logp.exp()
    e_hat = cost.normalized().to(device=z.device, dtype=z.dtype)
    c = e_hat[targets] @ e_hat.t()
    distance = 1.0 - (p * c).sum(-1)
    if demd == "reference":
        distance = distance + target_log_prob(logp, targets).exp().detach()
    nll = -target_log_prob(logp, targets)
    a, b = weights(nll.detach(), distance.detach(), weighting, ratio_cap)
    return a * nll + b * distance


def chunk(z, targets, want_grad, cost_embedding, weighting, demd, ratio_cap):
    s = softmax_stats(z, targets)
    c = cost_embedding.similarity(targets)  # [n, V] cosine of every token with the target
    c_bar = torch.linalg.vecdot(s.p, c)
    distance = 1.0 - c_bar
    emo = distance + s.p[s.rows, targets] if demd == "reference" else distance
    a, b = weights(s.nll, emo, weighting, ratio_cap)
    values = a * s.nll + b * emo
    grad = None
    if want_grad:
        # ∂ℓ/∂z = a (p - e_y) + b p (c̄ - c) = p (a + b (c̄ - c)) - a e_y, written into c's storage
        grad = c.neg_().add_(c_bar[:, None]).mul_(b[:, None]).add_(a[:, None]).mul_(s.p)
        grad[s.rows, targets] -= a
    return s.result(values, grad, emo_distance=distance)


@triton.jit
def _rows(
    Z, z_stride, Y, ZY, BIAS, STATS, stats_stride, GRAD_SCALE, V, logit_scale, softcap,
    C, c_stride, INV_NORM, ratio_eps, ratio_cap,
    WEIGHTING: tl.constexpr, DEMD_REFERENCE: tl.constexpr, HAS_CAP: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, WRITE_GRAD: tl.constexpr, BLOCK: tl.constexpr,
):
    # WEIGHTING: 0 = mle, 1 = emo, 2 = none. C holds the raw products E_y E^T of this chunk.
    row, Z_row, y, z_y = row_inputs(Z, z_stride, Y, ZY)
    C_row = C + row * c_stride
    inv_norm_y = tl.load(INV_NORM + y)
    # Pass 1: softmax(z) and Σ e c together, relative to the running max (see _triton.py).
    m = -1.0e30
    s = 0.0
    t = 0.0
    k = 0.0
    idx = 0
    for off in range(0, V, BLOCK):
        offs, mask, z = logits_block(Z_row, BIAS, off, V, logit_scale, softcap, HAS_BIAS, HAS_SOFTCAP, BLOCK)
        c = tl.load(C_row + offs, mask=mask, other=0.0).to(tl.float32) * tl.load(INV_NORM + offs, mask=mask, other=0.0)
        m_new, idx = running_max(m, idx, z, off)
        alpha = tl.exp(m - m_new)
        s, t, e = softmax_sums(m, m_new, s, t, z)
        k = alpha * k + tl.sum(e * c, 0)
        m = m_new
    log_s = tl.log(s)
    lse = m + log_s
    entropy = log_s - t / s
    c_bar = k / s * inv_norm_y
    nll = lse - z_y
    distance = 1.0 - c_bar
    emo = distance
    if DEMD_REFERENCE:
        emo = distance + tl.exp(-nll)
    if WEIGHTING == 0:
        ratio = nll / (emo + ratio_eps)
        if HAS_CAP:
            ratio = tl.minimum(ratio, ratio_cap)
        a = 0.5
        b = 0.5 * ratio
    elif WEIGHTING == 1:
        ratio = emo / (nll + ratio_eps)
        if HAS_CAP:
            ratio = tl.minimum(ratio, ratio_cap)
        a = ratio
        b = 1.0
    else:
        a = 0.0
        b = 1.0
    store_stats(STATS, stats_stride, row, a * nll + b * emo, nll, entropy, (idx == y).to(tl.float32))
    tl.store(STATS + 4 * stats_stride + row, distance)
    if WRITE_GRAD:
        grad_scale = tl.load(GRAD_SCALE)
        for off in range(0, V, BLOCK):
            offs, mask, z = logits_block(Z_row, BIAS, off, V, logit_scale, softcap, HAS_BIAS, HAS_SOFTCAP, BLOCK)
            c = tl.load(C_row + offs, mask=mask, other=0.0).to(tl.float32) * tl.load(INV_NORM + offs, mask=mask, other=0.0)
            c = c * inv_norm_y
            g = tl.exp(z - lse) * (a + b * (c_bar - c)) - tl.where(offs == y, a, 0.0)
            store_grad(Z_row, offs, mask, g, z, grad_scale, logit_scale, softcap, HAS_SOFTCAP)


def rows(launch: RowLaunch, cost_embedding, weighting, demd, ratio_cap):
    cost = cost_embedding
    table = cost.weight_as(launch.z.dtype)
    buffer = launch.scratch
    # The cosines' numerators for a part of the chunk at a time (a quarter-size buffer keeps EMO's
    # chunks as large as GEM's for the same memory), in the compute dtype with float32 accumulation
    # inside the product; the row kernel applies both inverse norms in float32.
    for start in range(0, launch.rows, buffer.shape[0]):
        part = launch.part(start, min(start + buffer.shape[0], launch.rows))
        c = buffer[: part.rows]
        torch.mm(table[part.targets], table.t(), out=c)
        _rows[(part.rows,)](
            *part.args(),
            c,
            c.stride(0),
            cost.inv_norm,
            RATIO_EPS,
            float(ratio_cap) if ratio_cap is not None else 0.0,
            WEIGHTING=WEIGHTINGS.index(weighting),
            DEMD_REFERENCE=demd == "reference",
            HAS_CAP=ratio_cap is not None,
            **part.meta("emo"),
        )


LOSS = LossSpec(
    name="emo",
    per_token=per_token,
    chunk_kernel=chunk,
    row_kernel=rows,
    scratch_rows=0.25,
    config_fields={"weighting": "emo_weighting", "demd": "emo_demd", "ratio_cap": "emo_ratio_cap"},
    defaults={"weighting": "mle", "demd": "reference", "ratio_cap": None},
    uses_cost_embedding=True,
    validate=check,
    description="EMO: earth mover distance optimization with dynamic weighting (Ren et al., ICLR 2024)",
    metrics=("emo_distance",),
)
