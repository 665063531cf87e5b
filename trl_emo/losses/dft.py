"""DFT, dynamic fine-tuning (Wu et al., 2025, arXiv 2508.05629), exactly as TRL's `SFTTrainer` computes it.

TRL 1.16 (`trl/trainer/sft_trainer.py`, `compute_loss`): `per_token_loss = -log_probs * log_probs.exp().detach()`,
summed and divided by the number of target tokens (or `num_items_in_batch`), clamped at 1: per position
`ℓ = -sg(p_y) log p_y`, `∂ℓ/∂z = p_y (p - e_y)`, the same reduction as every loss here.

That is MixCE's weight `γ + (1 - γ) p_y` at `γ = 0` (`0.0 + 1.0 * p_y` is `p_y` exactly in floating point), so DFT
runs MixCE's three definitions with `γ = 0` rather than a copy of them. `trl_emo.SFTTrainer` still hands
`loss_type="dft"` to TRL (`registry.TRL_LOSS_TYPES`); this is what computes it outside TRL (`standalone.py`).
"""

from __future__ import annotations

from . import mixce
from ._triton import RowLaunch
from .registry import LossSpec

_GAMMA = 0.0


def per_token(logits, targets):
    """`-sg(p_y) log p_y` per position."""
    return mixce.per_token(logits, targets, gamma=_GAMMA)


def chunk(z, targets, want_grad):
    return mixce.chunk(z, targets, want_grad, gamma=_GAMMA)


def rows(launch: RowLaunch):
    mixce.rows(launch, gamma=_GAMMA)


LOSS = LossSpec(
    name="dft",
    per_token=per_token,
    chunk_kernel=chunk,
    row_kernel=rows,
    description="DFT: cross-entropy weighted by the detached probability of the target (Wu et al., 2025)",
)
