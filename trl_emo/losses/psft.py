"""PSFT, Proximal SFT (Zhu et al., arXiv 2508.17784, ICLR 2026): cross-entropy as a policy gradient with advantage 1,
clipped like PPO against an "old policy".

Per target token, with `log π_old(y)` the old policy's log-probability of the same target:

    r = exp(clamp(log p_y − log π_old(y), −20, 20))
    ℓ = −min(r, clip(r, 1 − ε_lo, 1 + ε_hi))  =  −min(r, 1 + ε_hi)
    ∂ℓ/∂z = w (p − e_y),   w = r  where −20 ≤ log p_y − log π_old(y) and r ≤ 1 + ε_hi,  else 0

That is verl's `compute_policy_loss_vanilla` (`verl/trainer/ppo/core_algos.py` L816-890 in `zwhong714/PSFT` at 569b1ba)
with the advantage the PSFT estimator sets, 1 on every response token (`verl/trainer/ppo/ray_trainer.py` L274-276):
with a positive advantage the lower clip never binds (`min(r, 1 − ε_lo) = r` below it) and the dual clip (`clip_ratio_c`)
only acts on negative advantages, so `ε_lo` changes nothing. A token whose ratio passed `1 + ε_hi` gives no gradient
(its probability rose enough since the old policy); elsewhere the gradient is cross-entropy's scaled by `r`. At `r ≤
1 + ε_hi` inclusive the gradient flows, as through their `torch.maximum` and `torch.clamp` at equal values.

The old policy is the model as it was at the start of each window of `psft_old_policy_steps` optimizer steps (verl
computes the old log-probabilities of a whole batch of 64 prompts once, then takes 8 optimizer steps on mini-batches of
8: `recipe/psft/run_psft.sh`). The trainer keeps those weights (`LossSpec.lagged_reference`, `training/lagged_policy.py`)
and hands the loss their hidden states and head (`reference`, a `ReferenceHead`), or nothing at the first step of a
window, where the old policy is the current model: then `log π_old(y) = log p_y` exactly, `r = 1` and the gradient is
cross-entropy's, with no extra forward. Outside the trainer the caller passes the old log-probabilities (`old_logp`) or
the old policy's hidden states and head (`reference`).

Fused: a first pass (`prepare`) turns the old policy's hidden states into `log π_old(y)` per row, chunk by chunk (its
logits are never whole: the PyTorch path's log-softmax per chunk, the Triton path cross-entropy's own row kernel on the
old policy's chunk); the loss pass is cross-entropy's two reads of each row with the per-row weight `w`.
"""

from __future__ import annotations

import math

import torch

from ._common import ce_grad_, check_number, check_positive_int, log_softmax, softmax_stats, target_log_prob, upcast
from ._triton import (
    RowLaunch,
    register_launch_config,
    row_inputs,
    softmax_pass,
    store_stats,
    tl,
    triton,
    weighted_ce_grad,
)
from .asft import ReferenceHead
from .nll import rows as nll_rows
from .registry import LossSpec, RowTensors

# verl clamps the log-ratio "for stability" before the exponential (core_algos.py L863-865).
LOG_RATIO_CLAMP = 20.0
METRICS = ("psft_ratio", "psft_clipped")
# The row kernel's launch configuration, chosen as `_triton.LAUNCH_CONFIGS`' (2,048 columns x 4 warps on every target:
# 56-64 registers, no spill, 8-9 programs per SM by `python -m trl_emo.losses.aot_compile --losses psft`).
register_launch_config("psft", {80: (2048, 4), 86: (2048, 4), 89: (2048, 4), 90: (2048, 4)})


def check(hp: dict) -> None:
    check_number("psft_clip_low", hp["clip_low"], 0.0, 1.0)
    check_number("psft_clip_high", hp["clip_high"], 0.0, math.inf)
    check_positive_int("psft_old_policy_steps", hp["old_policy_steps"])


def _old_log_probs(logp: torch.Tensor, targets: torch.Tensor, reference=None, old_logp=None) -> torch.Tensor:
    """`log π_old(y)` per row, detached: given (`old_logp`, a tensor or the `RowTensors` of `prepare`), from the old
    policy's logits or `ReferenceHead` (`reference`), or the policy's own (`log p_y`) when neither is given."""
    if old_logp is not None:
        old = old_logp["old_logp"] if isinstance(old_logp, RowTensors) else old_logp
        return old.detach().to(logp.dtype)
    if reference is not None:
        ref_logits = reference.logits() if isinstance(reference, ReferenceHead) else upcast(reference)
        return target_log_prob(torch.log_softmax(ref_logits.detach().to(logp.dtype), dim=-1), targets)
    return logp.detach()


def ratio_terms(logp: torch.Tensor, old: torch.Tensor, clip_high: float):
    """`(value, weight, ratio, clipped)` per row from `log p_y` and `log π_old(y)` (see the module docstring)."""
    delta = logp - old
    ratio = torch.exp(delta.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    bound = 1.0 + clip_high
    clipped = ratio > bound
    value = -torch.where(clipped, torch.full_like(ratio, bound), ratio)
    weight = torch.where(clipped | (delta < -LOG_RATIO_CLAMP), torch.zeros_like(ratio), ratio)
    return value, weight, ratio, clipped


def per_token(logits, targets, clip_low, clip_high, old_policy_steps, reference=None, old_logp=None):
    """`−min(r, clip(r, 1 − ε_lo, 1 + ε_hi))` per position, through autograd. `reference`: the old policy's logits `[N,
    V]` (logits path) or `ReferenceHead`; `old_logp`: its target log-probabilities `[N]` instead; neither: the old policy
    is the current model (`r = 1`). `old_policy_steps` is the trainer's schedule, not read here."""
    logp = target_log_prob(log_softmax(logits), targets)
    old = _old_log_probs(logp, targets, reference, old_logp)
    ratio = torch.exp((logp - old).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    bound = 1.0 + clip_high
    # `where`, not `minimum`: at `r = 1 + ε_hi` exactly the whole gradient flows, as through verl's max/clamp pair.
    return -torch.where(ratio > bound, torch.full_like(ratio, bound), ratio)


# -- the fused path ---------------------------------------------------------------------------------------------------


def prepare(statistics, hparams: dict) -> dict:
    """`log π_old(y)` of every row (`LossSpec.prepare`): given, or from the old policy's `ReferenceHead` chunk by chunk;
    None when the old policy is the current model."""
    old, reference = hparams.get("old_logp"), hparams.get("reference")
    if old is not None:
        rows = old["old_logp"] if isinstance(old, RowTensors) else old
        return {**hparams, "weights": RowTensors({"old_logp": rows})}
    if reference is None:
        return {**hparams, "weights": None}
    targets = statistics.targets
    if statistics.backend == "triton":
        rows = _triton_old_log_probs(statistics, reference)
    else:
        parts = []
        for start, end in statistics.chunks():
            zr = reference.rows(start, end).logits()
            parts.append(target_log_prob(torch.log_softmax(zr, dim=-1), targets[start:end]))
            del zr
        rows = torch.cat(parts)
    return {**hparams, "weights": RowTensors({"old_logp": rows})}


def _triton_old_log_probs(statistics, reference: ReferenceHead) -> torch.Tensor:
    """The old policy's `log π_old(y)` with cross-entropy's own row kernel on its chunks (no gradient written)."""
    from .fused import HeadTransform, _target_logits

    n, vocab = statistics.n_rows, statistics.vocab
    device, cd = statistics.hidden.device, statistics.compute_dtype
    buffer = torch.empty(min(statistics.chunk_size, n), vocab, device=device, dtype=cd)
    stats = torch.empty(4, n, device=device, dtype=torch.float32)
    transform = HeadTransform(reference.logit_scale, reference.softcap)
    weight = reference.weight_as(cd)
    for start, end in statistics.chunks():
        hidden = reference.hidden[start:end].to(cd)
        z = buffer[: end - start]
        torch.mm(hidden, weight.t(), out=z)
        targets = statistics.targets[start:end]
        nll_rows(RowLaunch(
            z=z, targets=targets, target_logits=_target_logits(hidden, weight, reference.bias, targets, transform),
            bias=reference.bias, stats=stats[:, start:end], grad_scale=z.new_ones(1, dtype=torch.float32),
            logit_scale=reference.logit_scale, softcap=reference.softcap, write_grad=False,
        ))
    return -stats[1]


def chunk(z, targets, want_grad, clip_low, clip_high, old_policy_steps, reference=None, old_logp=None, weights=None):
    s = softmax_stats(z, targets)
    logp = -s.nll
    old = _old_log_probs(logp, targets, reference, weights if weights is not None else old_logp)
    values, weight, ratio, clipped = ratio_terms(logp, old, clip_high)
    grad = ce_grad_(s, targets).mul_(weight[:, None]) if want_grad else None
    return s.result(values, grad, psft_ratio=ratio, psft_clipped=clipped.to(z.dtype))


@triton.jit
def _rows(
    Z, z_stride, Y, ZY, BIAS, STATS, stats_stride, GRAD_SCALE, V, logit_scale, softcap, OLD, bound,
    HAS_OLD: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, WRITE_GRAD: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # OLD: log π_old(y) per row (HAS_OLD); without it the old policy is the current model and r = 1.
    row, Z_row, y, z_y = row_inputs(Z, z_stride, Y, ZY)
    lse, entropy, idx = softmax_pass(Z_row, BIAS, V, logit_scale, softcap, HAS_BIAS, HAS_SOFTCAP, BLOCK)
    nll = lse - z_y
    if HAS_OLD:
        delta = -nll - tl.load(OLD + row).to(tl.float32)
    else:
        delta = nll * 0.0
    ratio = tl.exp(tl.minimum(tl.maximum(delta, -20.0), 20.0))  # LOG_RATIO_CLAMP
    clipped = ratio > bound
    weight = tl.where(clipped | (delta < -20.0), 0.0, ratio)
    store_stats(STATS, stats_stride, row, -tl.where(clipped, bound, ratio), nll, entropy, (idx == y).to(tl.float32))
    tl.store(STATS + 4 * stats_stride + row, ratio)
    tl.store(STATS + 5 * stats_stride + row, clipped.to(tl.float32))
    if WRITE_GRAD:
        weighted_ce_grad(Z_row, BIAS, V, lse, y, weight, GRAD_SCALE, logit_scale, softcap, HAS_BIAS, HAS_SOFTCAP, BLOCK)


def rows(launch: RowLaunch, clip_low, clip_high, old_policy_steps, reference=None, old_logp=None, weights=None):
    """The loss pass of one chunk: `weights` (from `prepare`) holds `log π_old(y)`; without them the old policy is the
    current model."""
    old = weights["old_logp"] if weights is not None else None
    table = old.to(torch.float32) if old is not None else launch.stats
    _rows[(launch.rows,)](*launch.args(), table, float(1.0 + clip_high), HAS_OLD=old is not None, **launch.meta("psft"))


LOSS = LossSpec(
    name="psft",
    per_token=per_token,
    chunk_kernel=chunk,
    row_kernel=rows,
    config_fields={"clip_low": "psft_clip_low", "clip_high": "psft_clip_high",
                   "old_policy_steps": "psft_old_policy_steps"},
    # Their script (recipe/psft/run_psft.sh): clip_ratio_low 0.2, clip_ratio_high 0.28; 64 prompts per batch in
    # mini-batches of 8 (ppo_epochs 1): 8 optimizer steps per old policy.
    defaults={"clip_low": 0.2, "clip_high": 0.28, "old_policy_steps": 8},
    validate=check,
    description="PSFT: cross-entropy as a PPO-clipped policy gradient against the model of K steps ago "
    "(arXiv 2508.17784)",
    metrics=METRICS,
    # The old policy is optional: None is the current model (the first step of each window needs no forward).
    needs_reference=lambda hp: False,
    prepare=prepare,
    prepared_rows=("old_logp",),
    lagged_reference=lambda hp: (hp["old_policy_steps"], 1.0),
)
