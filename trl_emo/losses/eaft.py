"""EAFT, entropy-adaptive fine-tuning (arXiv 2601.02151).

Per target position `ℓ = -w log p_y` with the stop-gradient weight `w = (H / H_max) ** alpha`:
cross-entropy, down-weighted where the model is already confident (low entropy), so that SFT on
a narrow domain disturbs the rest of the model less. `∂ℓ/∂z = w (p - e_y)`.

`entropy="topk"` (default): `H` is the entropy of the softmax renormalised over the `topk`
largest logits and `H_max = ln(topk)`; `entropy="full"`: the full-vocabulary entropy and
`H_max = ln(V)`. LLaMA-Factory's `use_eaft_loss` divides the top-20 entropy by the constant 3.0
(≈ ln 20 = 2.996) instead of `ln(topk)`; axolotl's `eaft_k` is `topk`.
"""

from __future__ import annotations

import math

import torch

from ._common import ce_grad_, check_choice, check_number, softmax_stats, target_log_prob, upcast
from ._triton import RowLaunch, row_inputs, softmax_pass, store_stats, tl, top_logits, triton, weighted_ce_grad
from .registry import LossSpec

ENTROPY_CHOICES = ("topk", "full")


def check(hp: dict) -> None:
    check_number("eaft_alpha", hp["alpha"], 0.0, math.inf)
    check_choice("eaft_entropy", hp["entropy"], ENTROPY_CHOICES)
    topk = hp["topk"]
    if isinstance(topk, bool) or not isinstance(topk, int) or topk < 2:
        raise ValueError(f"eaft_topk must be an integer >= 2 (H_max = ln(eaft_topk)), got {topk!r}.")


def check_vocabulary(hp: dict, vocab_size: int) -> None:
    """`eaft_topk` larger than the vocabulary has no top-k to take."""
    if hp["entropy"] == "topk" and hp["topk"] > vocab_size:
        raise ValueError(
            f"eaft_topk={hp['topk']} is larger than the model's vocabulary ({vocab_size} tokens); "
            f"use eaft_topk <= {vocab_size} or eaft_entropy='full'."
        )


@torch.no_grad()
def topk_entropy(z: torch.Tensor, k: int) -> torch.Tensor:
    """Entropy of the softmax renormalised over each row's `k` largest logits (float32 `[n]`)."""
    logq = torch.log_softmax(z.topk(k, dim=-1).values.float(), dim=-1)
    return -(logq.exp() * logq).sum(-1)


def weight(normalized_entropy: torch.Tensor, alpha: float) -> torch.Tensor:
    # Rounding can put H / H_max a hair outside [0, 1]; `0 ** 0` is 1 (alpha = 0 is cross-entropy).
    return normalized_entropy.clamp(0.0, 1.0) ** alpha


def per_token(logits, targets, alpha, entropy, topk):
    check_choice("eaft entropy", entropy, ENTROPY_CHOICES)
    z = upcast(logits)
    logp = torch.log_softmax(z, dim=-1)
    with torch.no_grad():
        if entropy == "full":
            h = -(logp.exp() * logp).sum(-1) / math.log(z.shape[-1])
        else:
            h = topk_entropy(z, topk) / math.log(topk)
    return -weight(h, alpha) * target_log_prob(logp, targets)


def chunk(z, targets, want_grad, alpha, entropy, topk):
    s = softmax_stats(z, targets)
    h = s.entropy / math.log(z.shape[-1]) if entropy == "full" else topk_entropy(z, topk) / math.log(topk)
    w = weight(h, alpha)
    grad = ce_grad_(s, targets).mul_(w[:, None]) if want_grad else None
    return s.result(w * s.nll, grad)


@triton.jit
def _rows(
    Z, z_stride, Y, ZY, BIAS, STATS, stats_stride, GRAD_SCALE, V, logit_scale, softcap,
    W, alpha, inv_log_v,
    TOPK: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, WRITE_GRAD: tl.constexpr, BLOCK: tl.constexpr,
):
    # TOPK: the weights were computed from the top-k logits before the launch (W); otherwise from
    # this row's full entropy.
    row, Z_row, y, z_y = row_inputs(Z, z_stride, Y, ZY)
    lse, entropy, idx = softmax_pass(Z_row, BIAS, V, logit_scale, softcap, HAS_BIAS, HAS_SOFTCAP, BLOCK)
    nll = lse - z_y
    if TOPK:
        w = tl.load(W + row)
    else:
        h = tl.minimum(tl.maximum(entropy * inv_log_v, 0.0), 1.0)
        # h ** alpha, with 0 ** 0 = 1 (the unselected branch may be nan, never used)
        w = tl.where(alpha == 0.0, 1.0, tl.exp(alpha * tl.log(h)))
    store_stats(STATS, stats_stride, row, w * nll, nll, entropy, (idx == y).to(tl.float32))
    if WRITE_GRAD:
        weighted_ce_grad(Z_row, BIAS, V, lse, y, w, GRAD_SCALE, logit_scale, softcap, HAS_BIAS, HAS_SOFTCAP, BLOCK)


def _topk_weights(launch: RowLaunch, alpha: float, topk: int) -> torch.Tensor:
    """`(H_topk / ln k) ** alpha` per row, from the chunk's top-k logits (`_triton.top_logits`)."""
    logq = torch.log_softmax(top_logits(launch, topk), dim=-1)
    return weight(-(logq.exp() * logq).sum(-1) / math.log(topk), alpha)


def rows(launch: RowLaunch, alpha, entropy, topk):
    is_topk = entropy == "topk"
    w = _topk_weights(launch, alpha, topk) if is_topk else launch.stats
    _rows[(launch.rows,)](
        *launch.args(), w, float(alpha), 1.0 / math.log(launch.vocab), TOPK=is_topk, **launch.meta("eaft")
    )


LOSS = LossSpec(
    name="eaft",
    per_token=per_token,
    chunk_kernel=chunk,
    row_kernel=rows,
    scratch_rows=0.25,
    config_fields={"alpha": "eaft_alpha", "entropy": "eaft_entropy", "topk": "eaft_topk"},
    defaults={"alpha": 1.0, "entropy": "topk", "topk": 20},
    validate=check,
    validate_vocab=check_vocabulary,
    description="EAFT: cross-entropy weighted by normalised entropy, (H / H_max) ** alpha (arXiv 2601.02151)",
)
