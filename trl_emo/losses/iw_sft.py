"""iw-SFT, importance-weighted SFT (Qin & Springenberg, arXiv 2507.12856), as the authors' code computes it
(`emmyqin/iw_sft` at 9a3e4e4, `bounding_trainers.py`: `IwSFTLoss.__call__` L29-72 and `BoundingTrainer.compute_loss`
L184-211; the repository has no licence, so this is re-derived from what it computes, not copied).

Per target token `t` of a sequence `s`, with `q` a frozen reference (their trainer loads the starting model again,
`main.py` L78-81):

    ℓ_t = w_s · (−log p_θ(y_t)),    w_s = clamp(exp(τ · mean_{t' ∈ s} (log p_θ(y_t') − log q(y_t'))), 0, C)
    ∂ℓ_t/∂z = w_s (p − e_y)         (no gradient through `w_s`: their weight is computed under `torch.no_grad`)

The mean is over the sequence's target tokens (their `sum_over_time` branch, L48-54). `τ` (`iw_sft_temperature`) is 1:
their trainer calls the loss with `temp=1.0` (L211), the class default 2.0 (L30) is never reached; `C` (`iw_sft_clip`)
is their 16 (L54). With `iw_sft_sum_over_time: false`, their other branch: a weight per token,
`clamp(exp(log p_θ(y_t) − log q(y_t)), 0.2, 1.8)` (L55-57). The loss is `Σ_t ℓ_t / num_items_in_batch` (L68-69), the
trainer's reduction here.

Their weight broadcasts correctly only at batch size 1, their setting (a `[B, 1]` weight times the `[B, T, 1]`
per-token loss aligns `B` with `T`): here every sequence of any batch gets its own weight, which equals their loss run
one sequence at a time. A sequence is a batch row, or an example of a packed row (`LossSpec.per_sequence`: the callers
pass each row's sequence; without it every row is of one sequence). Each weight depends on its own sequence alone, so
gradient accumulation and several processes give exactly the loss of one large batch. In evaluation their trainer
returns the model's own cross-entropy (no `num_items_in_batch` there, L213-214); `eval_loss` is the objective here, and
`eval_cross_entropy` is logged beside it.

Fused, two passes over the chunks: the first (`target_stats`) computes every row's `log p_θ(y)` and `log q(y)` from
the policy's and the reference's logits chunk by chunk (the reference's from its final hidden states and head), and the
per-sequence weights; the second is weighted cross-entropy (`prob.launch_rows` at `q = 0`).
"""

from __future__ import annotations

import math

import torch

from ._common import check_number, log_softmax, target_log_prob, upcast
from ._triton import RowLaunch
from .asft import ReferenceHead
from .prob import weighted_ce_chunk, weighted_ce_rows
from .registry import SEQUENCES, LossSpec, RowTensors
from .target_stats import target_log_probs

# Their per-token branch's clamp, `1 - 0.8` and `1 + 0.8` (L57).
TOKEN_LOW, TOKEN_HIGH = 0.2, 1.8
METRICS = ("iw_sft_weight",)


def check(hp: dict) -> None:
    check_number("iw_sft_temperature", hp["temperature"], 0.0, math.inf)
    if not math.isfinite(hp["temperature"]):
        raise ValueError(f"iw_sft_temperature must be a finite number >= 0, got {hp['temperature']!r}.")
    check_number("iw_sft_clip", hp["clip"], 0.0, math.inf, low_open=True)
    if not isinstance(hp["sum_over_time"], bool):
        raise ValueError(f"iw_sft_sum_over_time must be true or false, got {hp['sum_over_time']!r}.")


def _sequence_ids(sequences) -> torch.Tensor | None:
    return sequences["id"] if isinstance(sequences, RowTensors) else None


@torch.no_grad()
def weights_of(logp: torch.Tensor, ref_logp: torch.Tensor, sequence: torch.Tensor | None, temperature: float,
               clip: float, sum_over_time: bool) -> torch.Tensor:
    """Each row's weight: its sequence's `clamp(exp(τ · mean(log p − log q)), 0, C)`, or per token
    `clamp(exp(log p − log q), 0.2, 1.8)` (`sum_over_time=False`). `sequence`: each row's sequence id (None: one)."""
    diff = logp - ref_logp.to(logp.dtype)
    if not sum_over_time:
        return torch.exp(diff).clamp(TOKEN_LOW, TOKEN_HIGH)
    if diff.numel() == 0:
        return diff
    if sequence is None:
        group = torch.zeros(diff.shape, dtype=torch.long, device=diff.device)
    else:
        group = torch.unique(sequence.to(diff.device), return_inverse=True)[1]
    count = int(group.max()) + 1
    sums = torch.zeros(count, dtype=diff.dtype, device=diff.device).index_add_(0, group, diff)
    sizes = torch.bincount(group, minlength=count).to(diff.dtype)
    return torch.exp(temperature * (sums / sizes)).clamp(0.0, clip)[group]


def _reference_log_probs(reference, targets: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    if reference is None:
        raise ValueError("iw_sft needs the reference model's logits or hidden states.")
    logits = reference.logits() if isinstance(reference, ReferenceHead) else upcast(reference)
    return target_log_prob(torch.log_softmax(logits.detach().to(like.dtype), dim=-1), targets)


# -- the logits path (the reference implementation) -------------------------------------------------------------------


def per_token(logits, targets, temperature, clip, sum_over_time, reference=None, sequences=None):
    """`w (−log p_y)` per row, the weights from this call's rows. `reference`: the reference logits (logits path) or a
    `ReferenceHead`; `sequences`: each row's sequence (`registry.SEQUENCES`; None: one sequence)."""
    logp_y = target_log_prob(log_softmax(logits), targets)
    if logp_y.numel() == 0:
        return -logp_y
    ref_logp = _reference_log_probs(reference, targets, logp_y)
    w = weights_of(logp_y.detach(), ref_logp, _sequence_ids(sequences), temperature, clip, sum_over_time)
    return -w * logp_y


# -- the fused path ---------------------------------------------------------------------------------------------------


def prepare(statistics, hparams: dict) -> dict:
    """The first pass: every row's target log-probability under the policy and the reference, the weights."""
    reference = hparams.get("reference")
    if reference is None:
        raise ValueError("iw_sft needs the reference model's hidden states (reference=ReferenceHead(...)).")
    logp, ref_logp = target_log_probs(statistics, "iw_sft", reference)
    w = weights_of(logp, ref_logp, _sequence_ids(hparams.get(SEQUENCES)), hparams["temperature"], hparams["clip"],
                   hparams["sum_over_time"])
    return {**hparams, "weights": RowTensors({"w": w, "iw_sft_weight": w})}


def chunk(z, targets, want_grad, temperature, clip, sum_over_time, reference=None, sequences=None, weights=None):
    return weighted_ce_chunk("iw_sft", z, targets, want_grad, weights, METRICS)


def rows(launch: RowLaunch, temperature, clip, sum_over_time, reference=None, sequences=None, weights=None):
    """The loss pass of a chunk (`weights` from `prepare`); without them, the first pass's (`prob.weighted_ce_rows`)."""
    weighted_ce_rows("iw_sft", launch, reference, weights, METRICS)


LOSS = LossSpec(
    name="iw_sft",
    per_token=per_token,
    chunk_kernel=chunk,
    row_kernel=rows,
    config_fields={"temperature": "iw_sft_temperature", "clip": "iw_sft_clip", "sum_over_time": "iw_sft_sum_over_time"},
    # What their trainer passes (bounding_trainers.py L208-211): temp=1.0, sum_over_time=True; the clamp at 16 (L54).
    defaults={"temperature": 1.0, "clip": 16.0, "sum_over_time": True},
    validate=check,
    description="iw-SFT: cross-entropy weighted per sequence by clamp(exp(mean log p - log p_ref), 0, 16) against a "
    "frozen reference (arXiv 2507.12856)",
    metrics=METRICS,
    needs_reference=True,
    reference_field="iw_sft_ref_model",
    prepare=prepare,
    prepared_rows=("w",) + METRICS,
    per_sequence=lambda hp: hp["sum_over_time"],
)
