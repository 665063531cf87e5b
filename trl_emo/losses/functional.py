"""The objectives as pure tensor functions: the reference definitions.

Each `*_per_token` function takes logits `[N, V]` and target ids `[N]` (positions already
selected, no `-100`) and returns one differentiable loss value per position, written as literally
as possible from `docs/losses.md` (the shared reference). Their gradients come from autograd, so
these are what the fused kernels (`kernels.py`) are tested against.

`causal_lm_loss` and the `*_loss` wrappers take model-shaped logits `[B, T, V]` and *unshifted*
labels `[B, T]`, like a `transformers` model's own loss: they shift, drop `-100`, and reduce by
`num_items_in_batch` when given (gradient accumulation and several processes stay exact).

Math is done in float32 whatever the input dtype (float64 inputs stay float64, for gradcheck).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from .cost import CostEmbedding

IGNORE_INDEX = -100
GEM_H = ("linear", "logsigmoid")
EMO_WEIGHTINGS = ("mle", "emo", "none")
EMO_DEMD = ("reference", "paper")
# The stabilizer of the dynamic weights in EMO's reference code.
_RATIO_EPS = 1e-10
# The slope inside GEM's logsigmoid weight: small, so that h stays nearly linear.
_GEM_LOGSIGMOID_SLOPE = 0.01


def upcast(logits: torch.Tensor) -> torch.Tensor:
    """Float32 for half-precision inputs; float32/float64 inputs unchanged."""
    return logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits


def _target_log_prob(logp: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return logp.gather(-1, targets[:, None]).squeeze(-1)


def nll_per_token(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy: `-log p_y`."""
    return -_target_log_prob(F.log_softmax(upcast(logits), dim=-1), targets)


def gem_per_token(logits: torch.Tensor, targets: torch.Tensor, beta: float = 0.7, h: str = "linear") -> torch.Tensor:
    """GEM: `Σ_i q_i w_i (z_i - z_y)` with `q = sg(softmax(z / beta))`.

    `h="linear"`: `w = 1`; `h="logsigmoid"`: `w = sg(sigmoid(0.01 (z_i - z_y)))`.
    """
    if h not in GEM_H:
        raise ValueError(f"gem h must be one of {GEM_H}, got {h!r}.")
    z = upcast(logits)
    q = torch.softmax(z.detach() / beta, dim=-1)
    diff = z - z.gather(-1, targets[:, None])
    if h == "linear":
        return (q * diff).sum(-1)
    w = torch.sigmoid(_GEM_LOGSIGMOID_SLOPE * diff.detach())
    return (q * w * diff).sum(-1)


def _as_cost(cost_embedding) -> CostEmbedding:
    if cost_embedding is None:
        raise ValueError("The EMO loss needs a cost embedding ([vocab, dim] tensor or CostEmbedding).")
    return cost_embedding if isinstance(cost_embedding, CostEmbedding) else CostEmbedding(cost_embedding)


def emo_weighted_combination(
    nll: torch.Tensor, emo: torch.Tensor, weighting: str = "mle", ratio_cap: float | None = None
) -> torch.Tensor:
    """EMO's dynamic weighting of `nll` and the EMO term, per position (paper appendix A.2)."""
    if weighting == "none":
        return emo
    if weighting == "mle":
        ratio = (nll / (emo + _RATIO_EPS)).detach()
        if ratio_cap is not None:
            ratio = ratio.clamp(max=ratio_cap)
        return 0.5 * (nll + ratio * emo)
    if weighting == "emo":
        ratio = (emo / (nll + _RATIO_EPS)).detach()
        if ratio_cap is not None:
            ratio = ratio.clamp(max=ratio_cap)
        return emo + ratio * nll
    raise ValueError(f"emo weighting must be one of {EMO_WEIGHTINGS}, got {weighting!r}.")


def emo_per_token(
    logits: torch.Tensor,
    targets: torch.Tensor,
    cost_embedding: CostEmbedding | torch.Tensor | None = None,
    weighting: str = "mle",
    demd: str = "reference",
    ratio_cap: float | None = None,
) -> torch.Tensor:
    """EMO: DEMD `= 1 - Σ_i p_i cos(e_i, e_y)` mixed with `nll` by dynamic weighting.

    `demd="paper"` uses DEMD itself; `demd="reference"` uses `DEMD + sg(p_y)`, the value of the
    authors' code (the target's own mass removed from the transported distribution), which only
    changes the dynamic weight, not the gradient of the EMO term.
    """
    if demd not in EMO_DEMD:
        raise ValueError(f"emo demd must be one of {EMO_DEMD}, got {demd!r}.")
    cost = _as_cost(cost_embedding)
    z = upcast(logits)
    logp = F.log_softmax(z, dim=-1)
    p = logp.exp()
    e_hat = cost.normalized().to(device=z.device, dtype=z.dtype)
    c = e_hat[targets] @ e_hat.t()
    distance = 1.0 - (p * c).sum(-1)
    if demd == "reference":
        distance = distance + _target_log_prob(logp, targets).exp().detach()
    nll = -_target_log_prob(logp, targets)
    return emo_weighted_combination(nll, distance, weighting, ratio_cap)


def tailr_weight(p_y: torch.Tensor, gamma: float, min_weight: float | None = None) -> torch.Tensor:
    """TaiLr's weight `p_y / (γ + (1-γ) p_y)`, optionally floored at `min_weight` (the authors' script uses 0.2)."""
    weight = p_y / (gamma + (1.0 - gamma) * p_y)
    return weight if min_weight is None else weight.clamp(min=min_weight)


def tailr_per_token(
    logits: torch.Tensor, targets: torch.Tensor, gamma: float = 0.8, min_weight: float | None = None
) -> torch.Tensor:
    """TaiLr (EMO paper eq. 16): `-sg(p_y / (γ + (1-γ) p_y)) log p_y`, the weight optionally floored."""
    logp_y = _target_log_prob(F.log_softmax(upcast(logits), dim=-1), targets)
    return -tailr_weight(logp_y.exp().detach(), gamma, min_weight) * logp_y


def mixce_per_token(logits: torch.Tensor, targets: torch.Tensor, gamma: float = 0.8) -> torch.Tensor:
    """MixCE (EMO paper eq. 17): `-sg(γ + (1-γ) p_y) log p_y`."""
    logp_y = _target_log_prob(F.log_softmax(upcast(logits), dim=-1), targets)
    p_y = logp_y.exp().detach()
    return -(gamma + (1.0 - gamma) * p_y) * logp_y


def ce_entropy_per_token(logits: torch.Tensor, targets: torch.Tensor, coef: float = 0.1) -> torch.Tensor:
    """Cross-entropy minus an entropy bonus (GEM paper's baseline): `-log p_y - λ H(p)`."""
    logp = F.log_softmax(upcast(logits), dim=-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return -_target_log_prob(logp, targets) - coef * entropy


@torch.no_grad()
def token_statistics(logits: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-position cross-entropy, entropy and top-1 correctness (for logging), without gradient."""
    logp = F.log_softmax(upcast(logits), dim=-1)
    return {
        "nll": -_target_log_prob(logp, targets),
        "entropy": -(logp.exp() * logp).sum(-1),
        "is_top1": (logits.argmax(-1) == targets).to(logp.dtype),
    }


def select_targets(
    labels: torch.Tensor, shift_labels: torch.Tensor | None = None, ignore_index: int = IGNORE_INDEX
) -> tuple[torch.Tensor, torch.Tensor]:
    """Shifted labels `[B, T-1]` (or the given pre-shifted ones `[B, T]`) and their validity mask."""
    targets = shift_labels if shift_labels is not None else labels[:, 1:]
    return targets, targets != ignore_index


def causal_lm_loss(
    per_token: Callable[..., torch.Tensor],
    logits: torch.Tensor,
    labels: torch.Tensor,
    num_items_in_batch: int | torch.Tensor | None = None,
    ignore_index: int = IGNORE_INDEX,
    shift_labels: torch.Tensor | None = None,
    **hparams,
) -> torch.Tensor:
    """Reduce a per-token objective over a causal-LM batch: `Σ_t ℓ_t / N`.

    `logits` is `[B, T, V]`, `labels` the unshifted `[B, T]` (position `t` predicts `labels[t+1]`);
    pass `shift_labels` `[B, T]` instead when they are already aligned with the logits (context
    parallelism). `N` is `num_items_in_batch` when given, else the number of valid positions. An
    all-masked batch gives a zero that is still connected to `logits`.
    """
    targets, mask = select_targets(labels, shift_labels, ignore_index)
    aligned = logits if shift_labels is not None else logits[:, :-1]
    values = per_token(aligned[mask], targets[mask], **hparams)
    count = mask.sum() if num_items_in_batch is None else num_items_in_batch
    total = values.sum() + aligned.sum() * 0.0 if values.numel() == 0 else values.sum()
    return total / torch.as_tensor(count, device=total.device).clamp(min=1)


def nll_loss(logits, labels, num_items_in_batch=None, **kwargs):
    """Cross-entropy over a causal-LM batch (see `causal_lm_loss`)."""
    return causal_lm_loss(nll_per_token, logits, labels, num_items_in_batch, **kwargs)


def gem_loss(logits, labels, beta: float = 0.7, h: str = "linear", num_items_in_batch=None, **kwargs):
    """GEM over a causal-LM batch (see `gem_per_token`, `causal_lm_loss`)."""
    return causal_lm_loss(gem_per_token, logits, labels, num_items_in_batch, beta=beta, h=h, **kwargs)


def emo_loss(
    logits,
    labels,
    cost_embedding,
    weighting: str = "mle",
    demd: str = "reference",
    ratio_cap: float | None = None,
    num_items_in_batch=None,
    **kwargs,
):
    """EMO over a causal-LM batch (see `emo_per_token`, `causal_lm_loss`)."""
    return causal_lm_loss(
        emo_per_token,
        logits,
        labels,
        num_items_in_batch,
        cost_embedding=_as_cost(cost_embedding),
        weighting=weighting,
        demd=demd,
        ratio_cap=ratio_cap,
        **kwargs,
    )


def tailr_loss(logits, labels, gamma: float = 0.8, min_weight: float | None = None, num_items_in_batch=None, **kwargs):
    """TaiLr over a causal-LM batch."""
    return causal_lm_loss(tailr_per_token, logits, labels, num_items_in_batch, gamma=gamma, min_weight=min_weight, **kwargs)


def mixce_loss(logits, labels, gamma: float = 0.8, num_items_in_batch=None, **kwargs):
    """MixCE over a causal-LM batch."""
    return causal_lm_loss(mixce_per_token, logits, labels, num_items_in_batch, gamma=gamma, **kwargs)


def ce_entropy_loss(logits, labels, coef: float = 0.1, num_items_in_batch=None, **kwargs):
    """Cross-entropy with an entropy bonus over a causal-LM batch."""
    return causal_lm_loss(ce_entropy_per_token, logits, labels, num_items_in_batch, coef=coef, **kwargs)
