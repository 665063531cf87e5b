"""The objectives: pure reference functions, closed-form chunk kernels, the fused path, the registry.

Importing this package registers the built-in losses: `nll` (reference only: the trainer leaves
`nll` and `dft` to TRL), `gem`, `emo`, `tailr`, `mixce` and `ce_entropy`.
"""

from __future__ import annotations

import math

from . import kernels
from .cost import CostEmbedding, load_cost_embedding
from .functional import (
    EMO_DEMD,
    EMO_WEIGHTINGS,
    GEM_H,
    causal_lm_loss,
    ce_entropy_loss,
    ce_entropy_per_token,
    emo_loss,
    emo_per_token,
    gem_loss,
    gem_per_token,
    mixce_loss,
    mixce_per_token,
    nll_loss,
    nll_per_token,
    tailr_loss,
    tailr_per_token,
    token_statistics,
)
from .fused import FusedLossOutput, HeadTransform, fused_linear_loss
from .registry import TRL_LOSS_TYPES, LossSpec, UnknownLossError, get_loss, list_losses, register_loss, unregister_loss


def _check_gem(hp):
    if not (isinstance(hp["beta"], (int, float)) and 0.0 < hp["beta"] <= 1.0):
        raise ValueError(f"gem_beta must be in (0, 1], got {hp['beta']!r}.")
    if hp["h"] not in GEM_H:
        raise ValueError(f"gem_h must be one of {', '.join(GEM_H)}, got {hp['h']!r}.")


def _check_emo(hp):
    if hp["weighting"] not in EMO_WEIGHTINGS:
        raise ValueError(f"emo_weighting must be one of {', '.join(EMO_WEIGHTINGS)}, got {hp['weighting']!r}.")
    if hp["demd"] not in EMO_DEMD:
        raise ValueError(f"emo_demd must be one of {', '.join(EMO_DEMD)}, got {hp['demd']!r}.")
    cap = hp["ratio_cap"]
    if cap is not None and not (isinstance(cap, (int, float)) and cap > 0 and math.isfinite(cap)):
        raise ValueError(f"emo_ratio_cap must be a positive number or null, got {cap!r}.")


def _check_gamma(field_name):
    def check(hp):
        gamma = hp["gamma"]
        if not (isinstance(gamma, (int, float)) and 0.0 <= gamma <= 1.0):
            raise ValueError(f"{field_name} must be in [0, 1], got {gamma!r}.")

    return check


def _check_tailr(hp):
    _check_gamma("tailr_gamma")(hp)
    floor = hp["min_weight"]
    if floor is not None and not (isinstance(floor, (int, float)) and 0.0 <= floor <= 1.0):
        raise ValueError(f"tailr_min_weight must be in [0, 1] or null, got {floor!r}.")


def _check_entropy(hp):
    coef = hp["coef"]
    if not (isinstance(coef, (int, float)) and math.isfinite(coef)):
        raise ValueError(f"entropy_coef must be a finite number, got {coef!r}.")


register_loss("nll", nll_per_token, chunk_kernel=kernels.nll_kernel, description="cross-entropy")
register_loss(
    "gem",
    gem_per_token,
    chunk_kernel=kernels.gem_kernel,
    config_fields={"beta": "gem_beta", "h": "gem_h"},
    validate=_check_gem,
    description="GEM: entropy-regularized reverse-KL distribution matching (Li et al., ICLR 2025)",
)
register_loss(
    "emo",
    emo_per_token,
    chunk_kernel=kernels.emo_kernel,
    config_fields={"weighting": "emo_weighting", "demd": "emo_demd", "ratio_cap": "emo_ratio_cap"},
    uses_cost_embedding=True,
    validate=_check_emo,
    description="EMO: earth mover distance optimization with dynamic weighting (Ren et al., ICLR 2024)",
    metrics=("emo_distance",),
)
register_loss(
    "tailr",
    tailr_per_token,
    chunk_kernel=kernels.tailr_kernel,
    config_fields={"gamma": "tailr_gamma", "min_weight": "tailr_min_weight"},
    validate=_check_tailr,
    description="TaiLr: total-variation-guided weighting of nll (Ji et al., 2023)",
)
register_loss(
    "mixce",
    mixce_per_token,
    chunk_kernel=kernels.mixce_kernel,
    config_fields={"gamma": "mixce_gamma"},
    validate=_check_gamma("mixce_gamma"),
    description="MixCE: mixed forward/reverse cross-entropy (Zhang et al., 2023)",
)
register_loss(
    "ce_entropy",
    ce_entropy_per_token,
    chunk_kernel=kernels.ce_entropy_kernel,
    config_fields={"coef": "entropy_coef"},
    validate=_check_entropy,
    description="cross-entropy minus an entropy bonus (GEM paper's baseline)",
)

__all__ = [
    "TRL_LOSS_TYPES",
    "CostEmbedding",
    "FusedLossOutput",
    "HeadTransform",
    "LossSpec",
    "UnknownLossError",
    "causal_lm_loss",
    "ce_entropy_loss",
    "ce_entropy_per_token",
    "emo_loss",
    "emo_per_token",
    "fused_linear_loss",
    "gem_loss",
    "gem_per_token",
    "get_loss",
    "list_losses",
    "load_cost_embedding",
    "mixce_loss",
    "mixce_per_token",
    "nll_loss",
    "nll_per_token",
    "register_loss",
    "tailr_loss",
    "tailr_per_token",
    "token_statistics",
    "unregister_loss",
]
