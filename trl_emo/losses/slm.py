"""SLM, the selective language modeling of Rho-1 (Lin et al., arXiv 2404.07965, NeurIPS 2024): cross-entropy on the
tokens a reference model finds easiest relative to the model being trained. Rho-1's training code was never released
(three issues on microsoft/rho ask for it): this is the paper's formula.

    excess_t = (−log p_θ(y_t)) − (−log p_ref(y_t))                (a ranking, no gradient)
    L = (1 / K) Σ_{t ∈ S} −log p_θ(y_t),   S = the K tokens of largest excess loss   (Eq. 4)
    ∂ℓ_t/∂z = (T / K) (p − e_y) on the selected rows, 0 elsewhere

`K = ⌈keep_ratio · N⌉` of the `N` target tokens (`slm_keep_ratio`: the paper keeps 60 % for its 1B models and 70 % for
7B; at least one token when the ratio is positive). The paper ranks "in a batch" (`slm_scope: batch`, the default) while
Eq. 4 is written per sequence (`slm_scope: sequence`: each sequence keeps `⌈ratio · N_s⌉` of its own tokens; the loss is
still the mean over every selected token). The batch is one micro-batch on one process, as EKSFT's selection: in the
trainer's token mean each selected row gets the weight `T / K` (`T` target tokens of the micro-batch), so a micro-batch
alone is exactly Eq. 4, and under gradient accumulation or several processes each micro-batch's mean is weighted by its
share of the step's tokens. Excess losses are ranked rounded to a multiple of `eksft.TIE_QUANTUM` (2⁻¹² nats), earlier
positions first among equal keys, so both backends and every chunk size select the same tokens; when the reference is
the starting model (the default, as for ASFT's and EKSFT's) every excess loss is exactly 0 at the first step and the
earliest tokens are taken: name the paper's reference, a model trained on the data you trust, in `slm_ref_model`.

Fused, two passes over the chunks as `iw_sft`: the first computes both log-probabilities of every row's target
(`target_stats`) and selects; the second is weighted cross-entropy (`prob.launch_rows` at `q = 0`).
"""

from __future__ import annotations

import math

import torch

from ._common import check_choice, check_number, log_softmax, target_log_prob
from ._triton import RowLaunch
from .eksft import TIE_QUANTUM
from .iw_sft import _reference_log_probs, _sequence_ids
from .prob import share, weighted_ce_chunk, weighted_ce_rows
from .registry import SEQUENCES, LossSpec, RowTensors
from .target_stats import target_log_probs

SCOPES = ("batch", "sequence")
METRICS = ("slm_selected", "slm_excess_loss")


def check(hp: dict) -> None:
    check_number("slm_keep_ratio", hp["keep_ratio"], 0.0, 1.0, low_open=True)
    check_choice("slm_scope", hp["scope"], SCOPES)


def kept_count(n: int, ratio: float) -> int:
    """`⌈ratio · n⌉`, the product rounded to 9 decimals first (0.6 · 5 is 3.0000000000000004 in floating point)."""
    return min(n, math.ceil(round(ratio * n, 9)))


@torch.no_grad()
def select(excess: torch.Tensor, ratio: float, sequence: torch.Tensor | None = None) -> torch.Tensor:
    """The rows of largest excess loss, `⌈ratio · N⌉` of them over all rows, or of each sequence's rows when `sequence`
    (each row's sequence id) is given. Ranked by the value rounded to a multiple of `TIE_QUANTUM`, earlier rows first
    among equal keys (stable sorts)."""
    n = excess.numel()
    mask = torch.zeros(n, dtype=torch.bool, device=excess.device)
    if n == 0:
        return mask
    key = torch.round(excess.double() / TIE_QUANTUM) + 0.0  # + 0.0: -0.0 is 0.0 for every sort
    order = torch.sort(key, descending=True, stable=True).indices
    if sequence is None:
        group = torch.zeros(n, dtype=torch.long, device=excess.device)
    else:
        group = torch.unique(sequence.to(excess.device), return_inverse=True)[1]
    # Grouped by sequence, each group in the order above.
    order = order[torch.sort(group[order], stable=True).indices]
    sizes = torch.bincount(group)
    starts = torch.cumsum(sizes, 0) - sizes
    grouped = group[order]
    rank = torch.arange(n, device=excess.device) - starts[grouped]
    keep = torch.tensor([kept_count(int(size), ratio) for size in sizes.tolist()], device=excess.device)
    mask[order[rank < keep[grouped]]] = True
    return mask


def plan(logp: torch.Tensor, ref_logp: torch.Tensor, hp: dict, sequences) -> RowTensors:
    """The selection of one micro-batch as per-row weights (`w`) and the logged metrics."""
    excess = ref_logp.to(logp.dtype) - logp  # (−log p_θ) − (−log p_ref)
    per_sequence = _sequence_ids(sequences) if hp["scope"] == "sequence" else None
    selected = select(excess, hp["keep_ratio"], per_sequence)
    return RowTensors({"w": share(selected, logp.dtype), "slm_selected": selected.to(logp.dtype),
                       "slm_excess_loss": excess})


# -- the logits path (the reference implementation) -------------------------------------------------------------------


def per_token(logits, targets, keep_ratio, scope, reference=None, sequences=None):
    """`T / K · (−log p_y)` on the selected rows of this call (one micro-batch), 0 elsewhere. `reference`: the reference
    logits (logits path) or a `ReferenceHead`; `sequences`: each row's sequence (`slm_scope: sequence`)."""
    logp_y = target_log_prob(log_softmax(logits), targets)
    if logp_y.numel() == 0:
        return -logp_y
    ref_logp = _reference_log_probs(reference, targets, logp_y)
    weights = plan(logp_y.detach(), ref_logp, {"keep_ratio": keep_ratio, "scope": scope}, sequences)
    return -weights["w"] * logp_y


# -- the fused path ---------------------------------------------------------------------------------------------------


def prepare(statistics, hparams: dict) -> dict:
    """The first pass: both target log-probabilities of every row, the selection, the weights."""
    reference = hparams.get("reference")
    if reference is None:
        raise ValueError("slm needs the reference model's hidden states (reference=ReferenceHead(...)).")
    logp, ref_logp = target_log_probs(statistics, "slm", reference)
    return {**hparams, "weights": plan(logp, ref_logp, hparams, hparams.get(SEQUENCES))}


def chunk(z, targets, want_grad, keep_ratio, scope, reference=None, sequences=None, weights=None):
    return weighted_ce_chunk("slm", z, targets, want_grad, weights, METRICS)


def rows(launch: RowLaunch, keep_ratio, scope, reference=None, sequences=None, weights=None):
    """The loss pass of a chunk (`weights` from `prepare`); without them, the first pass's (`prob.weighted_ce_rows`)."""
    weighted_ce_rows("slm", launch, reference, weights, METRICS)


LOSS = LossSpec(
    name="slm",
    per_token=per_token,
    chunk_kernel=chunk,
    row_kernel=rows,
    config_fields={"keep_ratio": "slm_keep_ratio", "scope": "slm_scope"},
    # The paper's 1B setting (60 % of the tokens kept; 70 % for 7B), ranked over the batch.
    defaults={"keep_ratio": 0.6, "scope": "batch"},
    validate=check,
    description="SLM (Rho-1): cross-entropy on the keep_ratio of a micro-batch's tokens with the largest excess loss "
    "over a reference model (arXiv 2404.07965)",
    metrics=METRICS,
    needs_reference=True,
    reference_field="slm_ref_model",
    prepare=prepare,
    prepared_rows=("w",) + METRICS,
    per_sequence=lambda hp: hp["scope"] == "sequence",
)
