"""ASFT, anchored supervised fine-tuning (arXiv 2509.23753): DFT anchored to a reference model.

Per target position, with the reference model's distribution `r`:
`ℓ = -sg(p_y) log p_y + alpha KL(r || p)`, `KL(r || p) = Σ_i r_i (log r_i - log p_i)`, so
`∂ℓ/∂z = p_y (p - e_y) + alpha (p - r)`. The reference is given per position as the reference
model's final hidden states and head (`ReferenceHead`), and its logits are built one chunk at a time
like the policy's, so neither model's `[tokens, vocab]` logits ever exist. With `alpha = 0` ASFT is
DFT and needs no reference (the trainer then skips the reference forward entirely).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch

from ._common import check_number, softmax_stats, target_log_prob, upcast
from ._triton import (
    RowLaunch,
    load_logits,
    logits_block,
    row_inputs,
    running_max,
    softmax_sums,
    store_grad,
    store_stats,
    tl,
    triton,
)
from .precision import mm_float32
from .registry import LossSpec, TokenAligned


def check(hp: dict) -> None:
    check_number("asft_alpha", hp["alpha"], 0.0, math.inf)


@dataclass
class ReferenceHead(TokenAligned):
    """The reference model at the target positions: hidden states `[N, H']`, its head `[V, H']`."""

    hidden: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor | None = None
    logit_scale: float = 1.0
    softcap: float | None = None
    # Casts of the head for the GPU path's products, shared by every chunk's slice of this object.
    casts: dict = field(default_factory=dict, repr=False)

    def weight_as(self, dtype: torch.dtype) -> torch.Tensor:
        if self.weight.dtype == dtype:
            return self.weight
        if dtype not in self.casts:
            self.casts[dtype] = self.weight.to(dtype)
        return self.casts[dtype]

    def rows(self, start: int, end: int) -> ReferenceHead:
        return replace(self, hidden=self.hidden[start:end])

    def to(self, device) -> ReferenceHead:
        if self.hidden.device == torch.device(device) and self.weight.device == torch.device(device):
            return self
        moved = {"hidden": self.hidden.to(device), "weight": self.weight.to(device), "casts": {}}
        if self.bias is not None:
            moved["bias"] = self.bias.to(device)
        return replace(self, **moved)

    def logits(self) -> torch.Tensor:
        """The reference logits of these rows, float32 `[n, V]` (the PyTorch path)."""
        z = mm_float32(self.hidden.to(self.weight.dtype), self.weight.t())
        if self.bias is not None:
            z.add_(self.bias.to(z.dtype))
        if self.logit_scale != 1.0:
            z.mul_(self.logit_scale)
        if self.softcap is not None:
            z.div_(self.softcap).tanh_().mul_(self.softcap)
        return z


def _reference_log_probs(reference) -> torch.Tensor:
    ref_logits = reference.logits() if isinstance(reference, ReferenceHead) else upcast(reference)
    return torch.log_softmax(ref_logits.detach(), dim=-1)


def per_token(logits, targets, alpha, reference=None):
    """`reference`: the reference logits `[N, V]` (logits path) or a `ReferenceHead`."""
    logp = torch.log_softmax(upcast(logits), dim=-1)
    logp_y = target_log_prob(logp, targets)
    values = -logp_y.exp().detach() * logp_y
    if alpha == 0:
        return values
    if reference is None:
        raise ValueError("ASFT with asft_alpha > 0 needs the reference model's logits or hidden states.")
    logr = _reference_log_probs(reference).to(logp.dtype)
    return values + alpha * (logr.exp() * (logr - logp)).sum(-1)


def chunk(z, targets, want_grad, alpha, reference=None):
    s = softmax_stats(z, targets)
    p_y = s.nll.neg().exp()
    values = p_y * s.nll
    kl = torch.zeros_like(values)
    r = None
    if alpha != 0:
        logr = _reference_log_probs(reference).to(z.dtype)
        r = logr.exp()
        kl = torch.linalg.vecdot(r, logr - s.logp)
        values = values + alpha * kl
    grad = None
    if want_grad:
        # p_y (p - e_y) + alpha (p - r) = (p_y + alpha) p - p_y e_y - alpha r
        grad = s.p.mul_(p_y[:, None] + alpha)
        grad[s.rows, targets] -= p_y
        if r is not None:
            grad.sub_(r, alpha=alpha)
    return s.result(values, grad, ref_kl=kl)


@triton.jit
def _rows(
    Z, z_stride, Y, ZY, BIAS, STATS, stats_stride, GRAD_SCALE, V, logit_scale, softcap,
    R, r_stride, alpha, ref_scale, ref_softcap,
    HAS_REF: tl.constexpr, HAS_REF_SOFTCAP: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, WRITE_GRAD: tl.constexpr, BLOCK: tl.constexpr,
):
    # R holds the reference logits of this chunk (bias already added), transformed here.
    row, Z_row, y, z_y = row_inputs(Z, z_stride, Y, ZY)
    R_row = R + row * r_stride
    m = -1.0e30
    s = 0.0
    t = 0.0
    idx = 0
    m_r = -1.0e30
    s_r = 0.0
    u = 0.0  # Σ e_r (z_r - z), relative to the reference's running max
    for off in range(0, V, BLOCK):
        offs, mask, z = logits_block(Z_row, BIAS, off, V, logit_scale, softcap, HAS_BIAS, HAS_SOFTCAP, BLOCK)
        m_new, idx = running_max(m, idx, z, off)
        s, t, e = softmax_sums(m, m_new, s, t, z)
        m = m_new
        if HAS_REF:
            zr = load_logits(R_row, BIAS, offs, mask, ref_scale, ref_softcap, False, HAS_REF_SOFTCAP)
            mr_new = tl.maximum(m_r, tl.max(zr, 0))
            alpha_r = tl.exp(m_r - mr_new)
            e_r = tl.exp(zr - mr_new)
            s_r = alpha_r * s_r + tl.sum(e_r, 0)
            u = alpha_r * u + tl.sum(e_r * (zr - z), 0)
            m_r = mr_new
    log_s = tl.log(s)
    lse = m + log_s
    nll = lse - z_y
    p_y = tl.exp(-nll)
    kl = 0.0
    lse_r = 0.0
    if HAS_REF:
        lse_r = m_r + tl.log(s_r)
        # KL(r || p) = Σ r (z_r - lse_r - z + lse)
        kl = u / s_r - lse_r + lse
    store_stats(STATS, stats_stride, row, p_y * nll + alpha * kl, nll, log_s - t / s, (idx == y).to(tl.float32))
    tl.store(STATS + 4 * stats_stride + row, kl)
    if WRITE_GRAD:
        grad_scale = tl.load(GRAD_SCALE)
        for off in range(0, V, BLOCK):
            offs, mask, z = logits_block(Z_row, BIAS, off, V, logit_scale, softcap, HAS_BIAS, HAS_SOFTCAP, BLOCK)
            p = tl.exp(z - lse)
            g = p_y * (p - tl.where(offs == y, 1.0, 0.0))
            if HAS_REF:
                zr = load_logits(R_row, BIAS, offs, mask, ref_scale, ref_softcap, False, HAS_REF_SOFTCAP)
                g += alpha * (p - tl.exp(zr - lse_r))
            store_grad(Z_row, offs, mask, g, z, grad_scale, logit_scale, softcap, HAS_SOFTCAP)


def rows(launch: RowLaunch, alpha, reference=None):
    has_ref = alpha != 0
    r = launch.scratch[: launch.rows]
    if has_ref:
        torch.mm(reference.hidden.to(r.dtype), reference.weight_as(r.dtype).t(), out=r)
        if reference.bias is not None:
            r.add_(reference.bias.to(r.dtype))
    _rows[(launch.rows,)](
        *launch.args(),
        r,
        r.stride(0),
        float(alpha),
        float(reference.logit_scale) if has_ref else 1.0,
        float(reference.softcap) if has_ref and reference.softcap is not None else 1.0,
        HAS_REF=has_ref,
        HAS_REF_SOFTCAP=has_ref and reference.softcap is not None,
        **launch.meta("asft"),
    )


LOSS = LossSpec(
    name="asft",
    per_token=per_token,
    chunk_kernel=chunk,
    row_kernel=rows,
    scratch_rows=1.0,
    config_fields={"alpha": "asft_alpha"},
    defaults={"alpha": 0.1},
    validate=check,
    description="ASFT: DFT anchored to a reference model by alpha KL(ref || model) (arXiv 2509.23753)",
    metrics=("ref_kl",),
    needs_reference=lambda hp: hp["alpha"] != 0,
    reference_field="asft_ref_model",
)
