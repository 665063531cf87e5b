"""The first pass of the losses whose per-row weights need every row's target log-probability before any gradient:
under the policy (`prob`'s thresholds: how many tokens are kept), and under a frozen reference (`iw_sft`'s
per-sequence weight, `slm`'s excess loss).

Per row only `log p_y = z_y − lse(z)` (and the reference's `log q_y = z^r_y − lse(z^r)`): a log-normalizer is one read
of the chunk's logits, so the first pass costs one more product with the head per chunk (and one with the reference's
head), never a `[tokens, V]` tensor. The PyTorch path takes the same float32 logits as its loss pass
(`StatisticsPass.logits`, `ReferenceHead.logits`) and their `logsumexp`; the Triton path writes the compute-dtype
products into a chunk buffer (the reference's into the loss's extra buffer), a row kernel reduces each row to its
log-normalizer, and the target logits are float32 dot products, as the loss pass computes them (`fused._target_logits`).
"""

from __future__ import annotations

import torch

from ._triton import RowLaunch, logits_block, tl, triton
from .asft import ReferenceHead
from .eksft import _reference_chunk as reference_chunk
from .fused import HeadTransform, _target_logits


@triton.jit
def _log_normalizer(Z_row, BIAS, V, logit_scale, softcap, HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                    BLOCK: tl.constexpr):
    m = -1.0e30
    s = 0.0
    for off in range(0, V, BLOCK):
        offs, mask, z = logits_block(Z_row, BIAS, off, V, logit_scale, softcap, HAS_BIAS, HAS_SOFTCAP, BLOCK)
        m_new = tl.maximum(m, tl.max(z, 0))
        s = tl.exp(m - m_new) * s + tl.sum(tl.exp(z - m_new), 0)
        m = m_new
    return m + tl.log(s)


@triton.jit
def _statistics(
    Z, z_stride, BIAS, R, r_stride, OUT, out_stride, V, logit_scale, softcap, ref_scale, ref_softcap,
    HAS_REF: tl.constexpr, HAS_REF_SOFTCAP: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # One row: the policy's log-normalizer into OUT[0], the reference's (R: its logits, bias already added) into OUT[1].
    row = tl.program_id(0).to(tl.int64)
    tl.store(OUT + row, _log_normalizer(Z + row * z_stride, BIAS, V, logit_scale, softcap, HAS_BIAS, HAS_SOFTCAP, BLOCK))
    if HAS_REF:
        lse_r = _log_normalizer(R + row * r_stride, BIAS, V, ref_scale, ref_softcap, False, HAS_REF_SOFTCAP, BLOCK)
        tl.store(OUT + out_stride + row, lse_r)


def launch_statistics(launch: RowLaunch, name: str, reference: ReferenceHead | None = None, r: torch.Tensor | None = None):
    """The log-normalizers of one chunk into `launch.stats[0]` (and the reference's, from its logits `r`, into
    `launch.stats[1]`), with the launch configuration `<name>_statistics`."""
    meta = launch.meta(f"{name}_statistics")  # no gradient: only BLOCK and warps are taken
    has_ref = reference is not None
    _statistics[(launch.rows,)](
        launch.z, launch.z.stride(0), launch.bias if launch.bias is not None else launch.stats,
        r if has_ref else launch.z, r.stride(0) if has_ref else 0, launch.stats, launch.stats.stride(0), launch.vocab,
        float(launch.logit_scale), float(launch.softcap) if launch.softcap is not None else 1.0,
        float(reference.logit_scale) if has_ref else 1.0,
        float(reference.softcap) if has_ref and reference.softcap is not None else 1.0,
        HAS_REF=has_ref, HAS_REF_SOFTCAP=has_ref and reference.softcap is not None,
        HAS_BIAS=launch.bias is not None, HAS_SOFTCAP=launch.softcap is not None,
        **{key: meta[key] for key in ("BLOCK", "num_warps") if key in meta},
    )


@torch.no_grad()
def target_log_probs(statistics, name: str, reference: ReferenceHead | None = None):
    """`(log p_y [N], log q_y [N] or None)`: every row's target log-probability under the policy (the logits the loss
    pass will compute, `statistics` a `fused.StatisticsPass`) and, given `reference`, under the reference. `name`: the
    loss, whose `<name>_statistics` launch configuration the Triton kernel takes."""
    n = statistics.n_rows
    if statistics.backend == "triton":
        return _triton_log_probs(statistics, name, reference)
    logp = None
    ref_logp = None
    for start, end in statistics.chunks():
        targets = statistics.targets[start:end, None]
        z = statistics.logits(start, end)
        if logp is None:
            logp = torch.empty(n, device=z.device, dtype=z.dtype)
            ref_logp = torch.empty_like(logp) if reference is not None else None
        # `z_y − logsumexp(z)`: no `[n, V]` output, unlike `log_softmax` (the same value to the last bits).
        logp[start:end] = z.gather(1, targets).squeeze(1) - torch.logsumexp(z, dim=-1)
        del z
        if reference is not None:
            zr = reference.rows(start, end).logits()
            ref_logp[start:end] = (zr.gather(1, targets).squeeze(1) - torch.logsumexp(zr, dim=-1)).to(logp.dtype)
    return logp, ref_logp


def _triton_log_probs(statistics, name: str, reference: ReferenceHead | None):
    n, vocab = statistics.n_rows, statistics.vocab
    device, cd = statistics.hidden.device, statistics.compute_dtype
    rows = min(statistics.chunk_size, n)
    buffer = torch.empty(rows, vocab, device=device, dtype=cd)
    scratch = torch.empty(rows, vocab, device=device, dtype=cd) if reference is not None else None
    out = torch.empty(2, n, device=device, dtype=torch.float32)
    logp = torch.empty(n, device=device, dtype=torch.float32)
    ref_logp = torch.empty_like(logp) if reference is not None else None
    ref_transform = HeadTransform(reference.logit_scale, reference.softcap) if reference is not None else None
    for start, end in statistics.chunks():
        z = statistics.raw_logits(start, end, buffer)
        targets = statistics.targets[start:end]
        r = reference_chunk(reference, scratch, start, end) if reference is not None else None
        launch = RowLaunch(
            z=z, targets=targets, target_logits=z.new_zeros(0, dtype=torch.float32), bias=statistics.bias,
            stats=out[:, start:end], grad_scale=z.new_ones(1, dtype=torch.float32),
            logit_scale=statistics.transform.logit_scale, softcap=statistics.transform.softcap, write_grad=False,
        )
        launch_statistics(launch, name, reference, r)
        logp[start:end] = statistics.target_logits(start, end) - out[0, start:end]
        if reference is not None:
            ref = reference.rows(start, end)
            z_ry = _target_logits(ref.hidden.to(cd), ref.weight_as(cd), ref.bias, targets, ref_transform)
            ref_logp[start:end] = z_ry - out[1, start:end]
    return logp, ref_logp
