"""What every loss module shares: target selection, the batch reduction, and the PyTorch chunk helpers.

Each loss lives in its own module (`nll.py`, `gem.py`, `emo.py`, ...) with three definitions of the
same objective: `per_token` (the reference, differentiable, float32 math; float64 kept for
gradcheck), `chunk` (closed-form value and `∂ℓ/∂z` for a chunk of float32 logits, the CPU and
fallback path of `fused.py`) and a Triton row kernel (the GPU path, see `_triton.py`). The helpers
below are the pieces the PyTorch definitions have in common.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


def upcast(logits: torch.Tensor) -> torch.Tensor:
    """Float32 for half-precision inputs; float32/float64 inputs unchanged."""
    return logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits


def target_log_prob(logp: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return logp.gather(-1, targets[:, None]).squeeze(-1)


def log_softmax(logits: torch.Tensor) -> torch.Tensor:
    return F.log_softmax(upcast(logits), dim=-1)


@torch.no_grad()
def token_statistics(logits: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-position cross-entropy, entropy and top-1 correctness (for logging), without gradient."""
    logp = log_softmax(logits)
    return {
        "nll": -target_log_prob(logp, targets),
        "entropy": -(logp.exp() * logp).sum(-1),
        "is_top1": (logits.argmax(-1) == targets).to(logp.dtype),
    }


def select_targets(
    labels: torch.Tensor, shift_labels: torch.Tensor | None = None, ignore_index: int = IGNORE_INDEX
) -> tuple[torch.Tensor, torch.Tensor]:
    """Shifted labels `[B, T-1]` (or the given pre-shifted ones `[B, T]`) and their validity mask."""
    targets = shift_labels if shift_labels is not None else labels[:, 1:]
    return targets, targets != ignore_index


def select_label_rows(labels: torch.Tensor, ignore_index: int = IGNORE_INDEX, weights: torch.Tensor | None = None):
    """For a loss that also reads label rows (`LossSpec.label_rows`): over the `[B, T]` positions, the rows to hand it
    (target positions, whose next label is a token, and label positions, whose own label is one), their targets
    (`0` where a row has none) and their roles, a `RowTensors` with boolean `target` and `label`; with per-token
    `weights` (aligned with `labels`), also `label_weight`, the weight of each row's own label (0 where it has none).

    Returns `(rows [B, T] bool, targets [R], roles)`; the rows are taken in position order, so a target position's
    label row is the next row."""
    from .registry import RowTensors

    nxt = labels[:, 1:]
    is_target = torch.cat([nxt != ignore_index, torch.zeros_like(labels[:, :1], dtype=torch.bool)], dim=1)
    is_label = labels != ignore_index
    rows = is_target | is_label
    shifted = torch.cat([nxt, torch.zeros_like(labels[:, :1])], dim=1)
    targets = torch.where(is_target, shifted, torch.zeros_like(shifted))[rows]
    roles = {"target": is_target[rows], "label": is_label[rows]}
    if weights is not None:
        roles["label_weight"] = torch.where(is_label, weights, torch.zeros_like(weights))[rows]
    return rows, targets, RowTensors(roles)


def normalizer(count, device=None, dtype=None) -> torch.Tensor:
    """`N`, the loss's denominator, as a tensor: the count of target tokens, or the sum of their per-token weights;
    an empty count (0) gives 1, so an all-masked batch reduces to a finite zero rather than `0 / 0`. Not
    `clamp(min=1)`: a sum of weights below 1 is a true denominator (for whole counts the two are the same)."""
    count = torch.as_tensor(count, device=device, dtype=dtype)
    return torch.where(count > 0, count, torch.ones_like(count))


LABEL_ROWS_WITH_SHIFT_LABELS = (
    "This loss reads the position after each target (eksft_formula='authors'), which pre-shifted labels "
    "(`shift_labels`, context parallelism) do not give; use eksft_formula='paper' there."
)


@dataclass
class Positions:
    """The positions of a causal-LM batch a loss reads: `take(x)` gives their rows of any tensor aligned with the
    inputs (`[B, T, ...]`: hidden states, logits, a reference model's hidden states), `targets` their target ids,
    `roles` which rows are targets and which label rows when the loss reads label rows (`LossSpec.label_rows`).

    `mask` is over the aligned layout: the inputs without their last position when the labels are shifted here (it
    has no target), as they are for pre-shifted labels and for label rows."""

    mask: torch.Tensor
    targets: torch.Tensor
    roles: object = None  # a `registry.RowTensors`, or None
    drop_last: bool = False
    # Each row's per-token loss weight (the weight of its target; 0 on label rows without one), None without weights.
    weights: torch.Tensor | None = None

    def take(self, x: torch.Tensor) -> torch.Tensor:
        return (x[:, :-1] if self.drop_last else x)[self.mask.to(x.device)]

    def sequences(self, labels: torch.Tensor, position_ids: torch.Tensor | None = None):
        """Which sequence each row belongs to, as a loss that reads it takes it (`registry.SEQUENCES`): `labels` as
        given to `select_positions` (the unshifted or the pre-shifted ones), `position_ids` for packed rows."""
        from .registry import RowTensors

        return RowTensors({"id": self.take(sequence_ids(labels, position_ids).to(self.mask.device))})

    @property
    def target_rows(self) -> torch.Tensor | None:
        """Which of the rows are target positions (None: all of them)."""
        return None if self.roles is None else self.roles["target"]


def select_positions(
    labels: torch.Tensor | None,
    shift_labels: torch.Tensor | None = None,
    *,
    label_rows: bool = False,
    ignore_index: int = IGNORE_INDEX,
    device: torch.device | None = None,
    weights: torch.Tensor | None = None,
) -> Positions:
    """The positions to score: every position whose next label (`labels`, unshifted `[B, T]`) or own label
    (`shift_labels`, already aligned with the inputs, any shape) is not `ignore_index`; with `label_rows`, the target
    positions and the label positions together (`select_label_rows`, unshifted labels only). Tensors on `device`.

    `weights`: per-token loss weights aligned with the labels given (`labels` or `shift_labels`), the weight of each
    label token. A weight of 0 masks its token exactly as `ignore_index` does (so for every loss, the selecting ones
    included, weight 0 is masking); the rows' weights come back as `Positions.weights`."""
    if weights is not None:
        weights = weights.to(device)
        given = shift_labels if shift_labels is not None else labels
        given = given.to(device).masked_fill(weights == 0, ignore_index)
        labels, shift_labels = (labels, given) if shift_labels is not None else (given, None)
    if label_rows:
        if shift_labels is not None:
            raise ValueError(LABEL_ROWS_WITH_SHIFT_LABELS)
        mask, targets, roles = select_label_rows(labels.to(device), ignore_index, weights)
        row_weights = None
        if weights is not None:
            shifted = torch.cat([weights[:, 1:], torch.zeros_like(weights[:, :1])], dim=1)
            row_weights = torch.where(roles["target"], shifted[mask], torch.zeros_like(shifted[mask]))
        return Positions(mask, targets, roles, drop_last=False, weights=row_weights)
    targets, mask = select_targets(labels, shift_labels, ignore_index)
    targets, mask = targets.to(device), mask.to(device)
    row_weights = None
    if weights is not None:
        row_weights = (weights if shift_labels is not None else weights[:, 1:])[mask]
    return Positions(mask, targets[mask], None, drop_last=shift_labels is None, weights=row_weights)


def sequence_ids(labels: torch.Tensor, position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Which sequence each position of a batch belongs to (int64, shaped like `labels`), for a loss that reads it
    (`LossSpec.per_sequence`; take its rows with `Positions.take`): the batch row, or, in a packed row whose
    `position_ids` restart at 0 at each example (TRL's padding-free packing), the example. 1-D labels: one sequence."""
    if labels.dim() < 2:
        return torch.zeros(labels.shape, dtype=torch.long, device=labels.device)
    batch, length = labels.shape[0], labels.shape[1]
    rows = torch.arange(batch, device=labels.device)[:, None].expand(batch, length)
    if position_ids is None:
        return rows.contiguous()
    starts = (position_ids.to(labels.device).reshape(-1, length) == 0).long().cumsum(-1)
    return rows * (length + 1) + starts.expand(batch, length)


PER_SEQUENCE_WITH_SHIFT_LABELS = (
    "This loss reads whole sequences (iw_sft's per-sequence weight, slm_scope='sequence'), which pre-shifted labels "
    "(`shift_labels`, context parallelism) split across processes; train without context parallelism."
)


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
    all-masked batch gives a zero that is still connected to `logits`. `hparams` are the loss's
    hyper-parameters, all required (their defaults: `LossSpec.defaults`, which `trl_emo.SFTConfig` takes).
    """
    targets, mask = select_targets(labels, shift_labels, ignore_index)
    aligned = logits if shift_labels is not None else logits[:, :-1]
    values = per_token(aligned[mask], targets[mask], **hparams)
    count = mask.sum() if num_items_in_batch is None else num_items_in_batch
    total = values.sum() + aligned.sum() * 0.0 if values.numel() == 0 else values.sum()
    return total / normalizer(count, total.device)


# -- the PyTorch chunk kernels' shared pieces ------------------------------------------------


@dataclass
class ChunkResult:
    """What a chunk kernel returns for `n` positions (every tensor float32 and detached)."""

    values: torch.Tensor  # [n] the objective
    grad: torch.Tensor | None  # [n, V] ∂ℓ/∂z, None when no gradient was asked for
    nll: torch.Tensor  # [n] cross-entropy
    entropy: torch.Tensor  # [n] entropy of softmax(z)
    is_top1: torch.Tensor  # [n] 1.0 where the target is the argmax
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)  # [n] extra quantities to log


@dataclass
class SoftmaxStats:
    logp: torch.Tensor  # [n, V]
    p: torch.Tensor  # [n, V]
    nll: torch.Tensor  # [n]
    entropy: torch.Tensor  # [n]
    is_top1: torch.Tensor  # [n]
    rows: torch.Tensor  # [n] arange, to index the target column

    def result(self, values, grad, **metrics) -> ChunkResult:
        return ChunkResult(values=values, grad=grad, nll=self.nll, entropy=self.entropy, is_top1=self.is_top1, metrics=metrics)


def softmax_stats(z: torch.Tensor, targets: torch.Tensor) -> SoftmaxStats:
    logp = torch.log_softmax(z, dim=-1)
    p = logp.exp()
    rows = torch.arange(z.shape[0], device=z.device)
    return SoftmaxStats(
        logp=logp,
        p=p,
        nll=-logp[rows, targets],
        # `vecdot` reduces without materializing the [n, V] product
        entropy=-torch.linalg.vecdot(p, logp),
        is_top1=(z.argmax(-1) == targets).to(z.dtype),
        rows=rows,
    )


def ce_grad_(s: SoftmaxStats, targets: torch.Tensor) -> torch.Tensor:
    """`p - e_y`, written into `p`'s storage (`p` is not needed afterwards)."""
    grad = s.p
    grad[s.rows, targets] -= 1.0
    return grad


def weighted_nll_per_token(logits, targets, weight_of: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """`-sg(w(p_y)) log p_y`, the form of TaiLr and MixCE (and of DFT)."""
    logp_y = target_log_prob(log_softmax(logits), targets)
    return -weight_of(logp_y.exp().detach()) * logp_y


def weighted_nll_chunk(z, targets, want_grad, weight_of: Callable[[torch.Tensor], torch.Tensor]) -> ChunkResult:
    """Closed form of `weighted_nll_per_token`: `∂ℓ/∂z = w (p - e_y)`."""
    s = softmax_stats(z, targets)
    w = weight_of(s.nll.neg().exp())
    grad = ce_grad_(s, targets).mul_(w[:, None]) if want_grad else None
    return s.result(w * s.nll, grad)


def autograd_chunk(per_token: Callable[..., torch.Tensor]):
    """A chunk kernel for a loss registered without one: the gradient of its per-token function by autograd."""

    def chunk(z, targets, want_grad, **hparams):
        with torch.enable_grad():
            leaf = z.detach().requires_grad_(want_grad)
            values = per_token(leaf, targets, **hparams)
            grad = torch.autograd.grad(values.sum(), leaf)[0] if want_grad else None
        return softmax_stats(z, targets).result(values.detach(), grad)

    return chunk


def check_number(name: str, value, low: float, high: float, *, low_open: bool = False, allow_none: bool = False) -> None:
    """Raise a `ValueError` naming the `SFTConfig` field unless `value` is a number in the range."""
    if value is None and allow_none:
        return
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
    ok = ok and (value > low if low_open else value >= low) and value <= high
    if not ok:
        bracket = "(" if low_open else "["
        tail = " or null" if allow_none else ""
        raise ValueError(f"{name} must be in {bracket}{low}, {high}]{tail}, got {value!r}.")


def check_choice(name: str, value, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, got {value!r}.")


def check_positive_int(name: str, value, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}.")


def check_positive_number(name: str, value, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}.")


# How EMO's transport cost can be named (besides a path to a tensor file or a model).
COST_SOURCES = ("frozen", "lm_head")


def check_cost_source(name: str, value) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be 'frozen', 'lm_head' or a path, got {value!r}.")


def check_token_weights(weights, labels: torch.Tensor, name: str = "weights") -> None:
    """Per-token loss weights must be a tensor shaped like the labels, of finite non-negative numbers."""
    if not isinstance(weights, torch.Tensor):
        raise ValueError(f"{name} must be a tensor of per-token loss weights shaped like labels, got {type(weights).__name__}.")
    if tuple(weights.shape) != tuple(labels.shape):
        raise ValueError(f"{name} {tuple(weights.shape)} must have the labels' shape {tuple(labels.shape)}: one weight per label.")
    if weights.dtype == torch.bool or weights.is_complex():
        raise ValueError(f"{name} must hold real numbers (a float tensor), got dtype {weights.dtype}.")
    if weights.numel() and not bool(torch.isfinite(weights).all() & (weights >= 0).all()):
        bad = weights[~(torch.isfinite(weights) & (weights >= 0))][0].item()
        raise ValueError(f"{name} must be finite and non-negative (0 leaves a token out), got {bad!r}.")


def check_label_ids(targets: torch.Tensor, vocab_size: int) -> None:
    """A label id past the head's last row is a vocabulary mismatch, not an index error deep in a kernel."""
    if targets.numel() and int(targets.max()) >= vocab_size:
        raise ValueError(
            f"Vocabulary mismatch: a label id ({int(targets.max())}) is outside the model's output vocabulary "
            f"({vocab_size} tokens). The tokenizer has more tokens than the model: resize the model's token "
            "embeddings to the tokenizer."
        )
