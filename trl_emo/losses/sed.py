"""SED-SFT (Chen, Liu, Meng, ACL 2026; arXiv 2602.07464): cross-entropy plus a penalty that pulls `p_y` toward ½ on
the tokens where the model spreads its mass.

Per target position, with `p = softmax(z)`:

    ℓ = −log p_y + λ · M · (p_y − ½)²,    M = 1{ Σ top-k(p) < τ }   (no gradient through M)
    ∂ℓ/∂z = (1 − c) (p − e_y),            c = λ · M · (2 p_y − 1) · p_y

so the gradient is cross-entropy's, scaled per token by `1 − c`. `M` marks the tokens whose `k` most probable
candidates hold less than `τ` of the mass (the paper's proxy for a wide "exploration space"); there the penalty moves
`p_y` toward ½, down when the model is already sure of the target, up when it is not. The sum of the top-k values does
not depend on how ties among them are broken.

The authors' code (`pppa2019/SED-SFT`, `utils/sed_triton_loss.py`, `SEDLoss.forward`) computes exactly this (its
Triton kernel is flash-attention's cross-entropy; the mask and the penalty are plain PyTorch in the logits' dtype,
bf16 in their runs, float32 here). What their training script really runs, and how `τ` is obtained (calibrated on the
starting model, `trl_emo.training.sed_threshold`), is in `docs/losses.md`.
"""

from __future__ import annotations

import math

import torch

from ._common import check_number, check_positive_int, softmax_stats, target_log_prob, upcast
from ._triton import RowLaunch, row_inputs, softmax_pass, store_stats, tl, top_logits, triton, weighted_ce_grad
from .registry import LossSpec


def check(hp: dict) -> None:
    check_number("sed_lambda", hp["lam"], 0.0, math.inf)
    check_positive_int("sed_top_k", hp["top_k"])
    check_number("sed_threshold", hp["threshold"], 0.0, 1.0, low_open=True, allow_none=True)


def check_vocabulary(hp: dict, vocab_size: int) -> None:
    if hp["top_k"] > vocab_size:
        raise ValueError(f"sed_top_k={hp['top_k']} is larger than the model's vocabulary ({vocab_size} tokens).")


def _threshold(threshold) -> float:
    if threshold is None:
        raise ValueError(
            "SED's threshold (sed_threshold) is not set: trl_emo.SFTTrainer calibrates it on the starting model before "
            "the first step, as the authors' script does; outside the trainer, pass a number in (0, 1]."
        )
    return float(threshold)


@torch.no_grad()
def mask_of(z: torch.Tensor, lse: torch.Tensor, top_k: int, threshold: float) -> torch.Tensor:
    """`M = 1{Σ top-k softmax(z) < τ}` per row, from the logits and their log-normalizer (float `[n]`)."""
    mass = torch.exp(z.topk(top_k, dim=-1).values - lse[:, None]).sum(-1)
    return (mass < threshold).to(z.dtype)


def per_token(logits, targets, lam, top_k, threshold):
    """`−log p_y + λ M (p_y − ½)²` per position (the reference, through autograd)."""
    tau = _threshold(threshold)
    z = upcast(logits)
    logp = torch.log_softmax(z, dim=-1)
    logp_y = target_log_prob(logp, targets)
    p_y = logp_y.exp()  # -log(p_y) would be inf once p_y underflows (a target 104 nats down, in float32)
    with torch.no_grad():
        mass = logp.exp().topk(top_k, dim=-1).values.sum(-1)
        mask = (mass < tau).to(logp.dtype)
    return -logp_y + lam * mask * (p_y - 0.5) ** 2


def chunk(z, targets, want_grad, lam, top_k, threshold):
    tau = _threshold(threshold)
    mask = mask_of(z, torch.logsumexp(z, dim=-1), top_k, tau)
    s = softmax_stats(z, targets)
    p_y = s.nll.neg().exp()
    values = s.nll + lam * mask * (p_y - 0.5) ** 2
    grad = None
    if want_grad:
        scale = 1.0 - lam * mask * (2.0 * p_y - 1.0) * p_y
        grad = s.p
        grad[s.rows, targets] -= 1.0
        grad.mul_(scale[:, None])
    return s.result(values, grad, sed_mask=mask)


@triton.jit
def _rows(
    Z, z_stride, Y, ZY, BIAS, STATS, stats_stride, GRAD_SCALE, V, logit_scale, softcap,
    TOP, top_stride, top_k, lam, threshold,
    TOP_BLOCK: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, WRITE_GRAD: tl.constexpr, BLOCK: tl.constexpr,
):
    # TOP holds the row's k largest transformed logits (float32), taken before the launch: the mass of the top-k
    # probabilities is Σ exp(top - lse), and needs this row's lse, which the first pass gives.
    row, Z_row, y, z_y = row_inputs(Z, z_stride, Y, ZY)
    lse, entropy, idx = softmax_pass(Z_row, BIAS, V, logit_scale, softcap, HAS_BIAS, HAS_SOFTCAP, BLOCK)
    nll = lse - z_y
    p_y = tl.exp(-nll)
    offs = tl.arange(0, TOP_BLOCK)
    top = tl.load(TOP + row * top_stride + offs, mask=offs < top_k, other=-1.0e30)
    mass = tl.sum(tl.exp(top - lse), 0)
    mask = (mass < threshold).to(tl.float32)
    d = p_y - 0.5
    store_stats(STATS, stats_stride, row, nll + lam * mask * d * d, nll, entropy, (idx == y).to(tl.float32))
    tl.store(STATS + 4 * stats_stride + row, mask)
    if WRITE_GRAD:
        w = 1.0 - lam * mask * (2.0 * p_y - 1.0) * p_y
        weighted_ce_grad(Z_row, BIAS, V, lse, y, w, GRAD_SCALE, logit_scale, softcap, HAS_BIAS, HAS_SOFTCAP, BLOCK)


def rows(launch: RowLaunch, lam, top_k, threshold):
    top = top_logits(launch, int(top_k))
    _rows[(launch.rows,)](
        *launch.args(), top, top.stride(0), int(top_k), float(lam), _threshold(threshold),
        TOP_BLOCK=max(16, triton.next_power_of_2(int(top_k))), **launch.meta("sed"),
    )


LOSS = LossSpec(
    name="sed",
    per_token=per_token,
    chunk_kernel=chunk,
    row_kernel=rows,
    scratch_rows=0.25,
    config_fields={"lam": "sed_lambda", "top_k": "sed_top_k", "threshold": "sed_threshold"},
    # The values the authors' released run used: λ = 1 (their TrainingArguments default; SEDLoss's own default of 0.2
    # is never reached), k = 2, and τ calibrated on the starting model (None here: the trainer calibrates it, with
    # `sed_threshold_ratio` 0.7 over the top-10 mass, as their train.py does). See docs/losses.md.
    defaults={"lam": 1.0, "top_k": 2, "threshold": None},
    validate=check,
    validate_vocab=check_vocabulary,
    description="SED-SFT: cross-entropy + lambda (p_y - 1/2)^2 where the top-k mass is below tau (ACL 2026)",
    metrics=("sed_mask",),
)


@torch.no_grad()
def top_k_mass(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, transform, top_k: int,
               chunk_rows: int = 512) -> torch.Tensor:
    """`Σ top-k softmax(z)` at every position of `hidden` (`[..., H]`), chunk by chunk (float32 `[positions]`): the
    statistic the authors calibrate `τ` on (`trl_emo.training.sed_threshold`)."""
    flat = hidden.reshape(-1, hidden.shape[-1])
    out = torch.empty(flat.shape[0], device=flat.device, dtype=torch.float32)
    w = weight.t().float()  # once, not per chunk (a 128k x 4,096 head is 2 GiB in float32)
    for start in range(0, flat.shape[0], chunk_rows):
        end = min(start + chunk_rows, flat.shape[0])
        z = flat[start:end].float() @ w
        if bias is not None:
            z += bias.float()
        if transform is not None:
            transform.apply_(z)
        lse = torch.logsumexp(z, dim=-1)
        out[start:end] = torch.exp(z.topk(top_k, dim=-1).values - lse[:, None]).sum(-1)
    return out


def threshold_from_masses(masses: torch.Tensor, ratio: float) -> float:
    """The value that a share `ratio` of the positions reach or exceed: the authors' `sorted(values)[-int(ratio * n)]`
    (`train.py`, `compute_cumsum_threshold`), including its `[-0]`, the smallest value, when `ratio * n < 1`."""
    values = torch.sort(masses.flatten().double()).values
    if values.numel() == 0:
        raise ValueError("SED's threshold calibration saw no position (empty rows).")
    return float(values[-int(ratio * values.numel())])
