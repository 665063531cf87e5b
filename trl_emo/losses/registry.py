"""The loss registry: every objective `trl_emo.SFTTrainer` can train with, by name.

A loss is registered with a *per-token* function of float logits and targets. That function is
the reference (the logits path uses it directly, through autograd). A loss may also provide a
*chunk kernel*, a closed-form value-and-gradient for one chunk of positions, which the fused path
uses on the CPU, and a Triton *row kernel*, which it uses on a GPU; a loss without them still
runs fused, through autograd on each chunk. The built-in losses are one module each
(`nll.py`, `gem.py`, ...), registered by one line in `__init__.py`.

Third-party packages register the same way, either by calling `register_loss` before building
`SFTConfig`, or through the `trl_emo.losses` entry-point group (loaded on the first lookup).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ..core.plugins import load_plugins

# Losses TRL's own SFTTrainer computes: `trl_emo.SFTTrainer` hands these back to TRL untouched.
TRL_LOSS_TYPES = ("nll", "dft")


class TokenAligned:
    """A hyper-parameter with one entry per target position (ASFT's reference hidden states).

    The fused path hands each chunk its own rows, `rows(start, end)`, and moves it to the loss's
    device with `to(device)`.
    """

    def rows(self, start: int, end: int) -> TokenAligned:
        raise NotImplementedError

    def to(self, device) -> TokenAligned:
        raise NotImplementedError


@dataclass
class RowTensors(TokenAligned):
    """Named per-position tensors (`[N]` each) handed to a loss as one hyper-parameter, sliced with the chunks.

    Used for the roles of the positions (`ROLES`: which rows have a target, which are label rows, when a loss reads
    more rows than the target positions, see `LossSpec.label_rows`) and for per-position weights a loss computes
    before its chunks run (`LossSpec.prepare`)."""

    tensors: dict = field(default_factory=dict)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.tensors[name]

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def rows(self, start: int, end: int) -> RowTensors:
        return RowTensors({k: v[start:end] for k, v in self.tensors.items()})

    def to(self, device) -> RowTensors:
        return RowTensors({k: v.to(device) for k, v in self.tensors.items()})


# The hyper-parameter under which the roles of the rows reach a loss that reads label rows (`LossSpec.label_rows`).
ROLES = "roles"
# The hyper-parameter under which each row's sequence reaches a loss that reads it (`LossSpec.per_sequence`): a
# `RowTensors` with `id` (int64), equal for the rows of one sequence. Without it every row is of one sequence.
SEQUENCES = "sequences"
# The hyper-parameter under which per-token loss weights reach a loss that applies them itself
# (`LossSpec.token_weights == "loss"`): a `RowTensors` with `target` (each row's weight, 0 on rows without a target)
# and, when the loss reads label rows, `label` (the weight of each row's own label token, 0 on rows without one).
TOKEN_WEIGHTS = "token_weights"
# How per-token weights apply to a loss (`LossSpec.token_weights`).
WEIGHTINGS = ("scale", "loss")


def token_weight_rows(weights: torch.Tensor, roles: RowTensors | None = None) -> RowTensors:
    """`hparams[TOKEN_WEIGHTS]` for a loss that applies per-token weights itself: each row's target weight, and with
    label rows (`roles`) each row's own label weight (`label_weight`, from `_common.select_label_rows`; 1 on every label
    row when the roles carry none)."""
    rows = {"target": weights}
    if roles is not None:
        rows["label"] = roles["label_weight"] if "label_weight" in roles else roles["label"].to(weights.dtype)
    return RowTensors(rows)


class UnknownLossError(ValueError):
    """Raised for a `loss_type` nobody registered."""


@dataclass(frozen=True)
class LossSpec:
    """A registered objective.

    Attributes:
        name: the `loss_type` value that selects it.
        per_token: `per_token(logits [N, V], targets [N], **hparams) -> [N]`, differentiable,
            the reference definition of the loss (one value per target position).
        chunk_kernel: optional `kernel(z [n, V] float32, targets [n], want_grad, **hparams) ->
            ChunkResult`, the same loss with a closed-form gradient, used by the fused path.
        row_kernel: optional `rows(launch: RowLaunch, **hparams)`, launching a Triton kernel that
            writes the statistics and `∂ℓ/∂y` of one chunk in place (see `_triton.py`); the
            fused path uses it on CUDA devices when Triton is installed.
        scratch_rows: rows of an extra `[rows, V]` buffer the row kernel needs per row of the chunk
            (`launch.scratch`), counted in the fused path's memory budget (EMO: 0.25, its cost
            products for a quarter of the chunk at a time).
        config_fields: maps each keyword of `per_token` to the `SFTConfig` field it is read from.
        defaults: each keyword's default (the paper's or the authors' value), written here once: the `SFTConfig`
            fields take their defaults from it, and tools that launch a loss without a configuration (the
            ahead-of-time compile) read it.
        needs_reference: whether `per_token`/`chunk_kernel` take a `reference=` keyword (a
            reference model's logits, or its hidden states and head as an `asft.ReferenceHead`), or a
            function of the hyper-parameters saying it (ASFT: only when `alpha != 0`); the trainer
            runs the reference model only then.
        validate_vocab: optional check of the hyper-parameters against the model's vocabulary size,
            `validate_vocab(hparams, vocab_size)`, called when the trainer is built.
        uses_cost_embedding: whether `per_token`/`chunk_kernel` take a `cost_embedding=` keyword
            (EMO's transport cost); the trainer builds it from `emo_cost_embedding`.
        validate: optional check of the resolved hyper-parameters; raise `ValueError` if bad.
        description: one line shown by `trl-emo losses`.
        metrics: names of the extra per-token quantities the chunk kernel reports (logged as means).
        reference_field: the `SFTConfig` field that names this loss's reference model (`asft_ref_model`,
            `eksft_ref_model`); None: the starting model (or a loss without reference).
        prepare: optional `prepare(pass_, hparams) -> hparams`, run by the fused path before the chunks that compute
            the loss, without gradient: `pass_` (a `fused.StatisticsPass`) computes per-position statistics over every
            chunk (a loss whose terms depend on the whole micro-batch, as EKSFT's top-ratio selection does, reads them
            there and returns the per-position weights as a `RowTensors`). The logits path gets all positions at once
            and needs no such pass.
        prepared_rows: the names of the per-row tensors `prepare` hands the loss pass (a `RowTensors` under the
            hyper-parameter `weights`), so that the ahead-of-time compile can launch the loss pass's kernel too; the
            row kernel launched without them is the first pass's.
        lagged_reference: for a loss whose reference follows the policy instead of staying frozen (PSFT's old policy,
            CurioSFT's teacher), `lagged_reference(hparams) -> (every, mixup)`: every `every` optimizer steps the
            reference's trainable weights become `(1 - mixup) * reference + mixup * policy` (a copy when `mixup` is 1).
            The trainer keeps those weights (`training/lagged_policy.py`: the adapters alone under PEFT), saves them with
            each checkpoint and hands the loss `reference=None` while they equal the policy's; such a loss reads
            `reference=None` as "the policy itself", so its `needs_reference` says no reference model must run.
        label_rows: whether the loss also reads the positions whose *input-aligned* label is a target token (the
            convention of LLaMA-Factory's labels, one position after each target position), or a function of the
            hyper-parameters saying it (EKSFT with `eksft_formula="authors"`). The rows then handed to the loss are
            the union of both, in order, with their roles in `hparams[ROLES]` (a `RowTensors` with boolean
            `target` and `label`); rows without a target carry target id 0 and must not count as tokens.
        per_sequence: whether the loss reads which sequence each row belongs to (iw-SFT's per-sequence weight), or a
            function of the hyper-parameters saying it. The callers then pass `hparams[SEQUENCES]` (a `RowTensors`
            with `id`: a batch row, or a packed row's segment).
        token_weights: how per-token loss weights (`fused_linear_loss(weights=)`, the data's `loss_weights` and
            per-message `weight`) apply. `"scale"` (the default, right for any loss that is a sum of one term per
            target position): the fused and logits paths multiply each row's term and its gradient by the row's
            weight and divide by the sum of the weights, with nothing to do in the loss. `"loss"`: the loss's terms
            are not such a sum (EKSFT selects rows and takes a mean over each selection), so it takes the weights
            itself, as `hparams[TOKEN_WEIGHTS]`, in every definition (`per_token`, `chunk_kernel`, `row_kernel`,
            `prepare`); the paths then only normalize by their sum. docs/losses.md says what each loss does with them.
    """

    name: str
    per_token: Callable[..., Any]
    chunk_kernel: Callable[..., Any] | None = None
    row_kernel: Callable[..., Any] | None = None
    scratch_rows: float = 0.0
    config_fields: Mapping[str, str] = field(default_factory=dict)
    defaults: Mapping[str, Any] = field(default_factory=dict)
    uses_cost_embedding: bool = False
    validate: Callable[[dict], None] | None = None
    description: str = ""
    metrics: tuple[str, ...] = ()
    needs_reference: bool | Callable[[dict], bool] = False
    validate_vocab: Callable[[dict, int], None] | None = None
    reference_field: str | None = None
    prepare: Callable[..., dict] | None = None
    prepared_rows: tuple[str, ...] = ()
    label_rows: bool | Callable[[dict], bool] = False
    lagged_reference: Callable[[dict], tuple[int, float]] | None = None
    per_sequence: bool | Callable[[dict], bool] = False
    token_weights: str = "scale"

    def __post_init__(self):
        if self.token_weights not in WEIGHTINGS:
            raise ValueError(f"LossSpec.token_weights must be one of {', '.join(WEIGHTINGS)}, got {self.token_weights!r}.")

    @property
    def scales_by_weight(self) -> bool:
        """Whether the paths apply per-token weights to this loss's rows themselves (`token_weights == "scale"`)."""
        return self.token_weights == "scale"

    def wants_reference(self, hparams: dict) -> bool:
        """Whether a reference model must run for these hyper-parameters."""
        return bool(self.needs_reference(hparams) if callable(self.needs_reference) else self.needs_reference)

    def reads_label_rows(self, hparams: dict) -> bool:
        """Whether the rows handed to the loss include the label rows (see `label_rows`)."""
        return bool(self.label_rows(hparams) if callable(self.label_rows) else self.label_rows)

    def reads_sequences(self, hparams: dict) -> bool:
        """Whether the loss reads each row's sequence (see `per_sequence`)."""
        return bool(self.per_sequence(hparams) if callable(self.per_sequence) else self.per_sequence)


_REGISTRY: dict[str, LossSpec] = {}


def register_loss(
    name: str,
    per_token: Callable[..., Any] | None = None,
    *,
    chunk_kernel: Callable[..., Any] | None = None,
    row_kernel: Callable[..., Any] | None = None,
    scratch_rows: float = 0.0,
    config_fields: Mapping[str, str] | None = None,
    defaults: Mapping[str, Any] | None = None,
    uses_cost_embedding: bool = False,
    validate: Callable[[dict], None] | None = None,
    description: str = "",
    metrics: tuple[str, ...] = (),
    overwrite: bool = False,
):
    """Register a loss under `name`; usable as a decorator on the per-token function.

    Hyper-parameters of a third-party loss that have no `SFTConfig` field come from
    `SFTConfig.loss_kwargs` (a dict, or a JSON string on the command line).

    ```python
    @trl_emo.register_loss("focal", description="focal loss, gamma from loss_kwargs")
    def focal(logits, targets, gamma=2.0):
        logp = logits.log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)
        return -((1 - logp.exp()) ** gamma) * logp
    ```
    """

    def _register(fn):
        add_loss(
            LossSpec(
                name=name,
                per_token=fn,
                chunk_kernel=chunk_kernel,
                row_kernel=row_kernel,
                scratch_rows=scratch_rows,
                config_fields=dict(config_fields or {}),
                defaults=dict(defaults or {}),
                uses_cost_embedding=uses_cost_embedding,
                validate=validate,
                description=description,
                metrics=tuple(metrics),
            ),
            overwrite=overwrite,
        )
        return fn

    if per_token is None:
        return _register
    _register(per_token)
    return _REGISTRY[name]


def add_loss(spec: LossSpec, overwrite: bool = False) -> LossSpec:
    """Register a complete `LossSpec` (what the built-in loss modules export as `LOSS`)."""
    name = spec.name
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"A loss name must be a Python identifier, got {name!r}.")
    if name in TRL_LOSS_TYPES and name in _REGISTRY:
        # `nll` and `dft` are registered by trl_emo itself (outside TRL nobody else computes them; in training
        # `trl_emo.SFTTrainer` hands them to TRL): they are never replaced, not even with `overwrite=True`.
        raise ValueError(f"{name!r} is one of TRL's own loss types; pick another name.")
    if name in _REGISTRY and not overwrite:
        raise ValueError(f"A loss named {name!r} is already registered; pass overwrite=True to replace it.")
    _REGISTRY[name] = spec
    return spec


def unregister_loss(name: str) -> None:
    """Remove a registered loss (tests and interactive sessions)."""
    _REGISTRY.pop(name, None)


def _load_entry_points() -> None:
    load_plugins("trl_emo.losses")


def list_losses(include_trl: bool = True) -> list[str]:
    """Names accepted as `loss_type`: TRL's own (`nll`, `dft`) and every registered loss."""
    _load_entry_points()
    names = set(_REGISTRY)
    if include_trl:
        names.update(TRL_LOSS_TYPES)
    return sorted(names)


def get_loss(name: str) -> LossSpec:
    """The registered loss called `name`; an `UnknownLossError` listing the valid names otherwise."""
    if name not in _REGISTRY:
        _load_entry_points()
    if name not in _REGISTRY:
        if name in TRL_LOSS_TYPES:
            # Listed as a valid `loss_type` (TRL computes it in training) yet not registered: it was unregistered.
            raise UnknownLossError(
                f"loss_type {name!r} is TRL's own and its trl_emo implementation is not registered (unregister_loss "
                f"removed it); re-register it with add_loss(trl_emo.losses.{name}.LOSS)."
            )
        valid = list_losses()
        # Never suggest the name itself (it can be listed without being registered: TRL's own names).
        close = difflib.get_close_matches(str(name), [v for v in valid if v != name], n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise UnknownLossError(f"Unknown loss_type {name!r}.{hint} Registered loss types: {', '.join(valid)}.")
    return _REGISTRY[name]
