"""The losses outside TRL: a `torch.nn.Module` and a function in the shape of Liger's
`LigerFusedLinearCrossEntropyLoss`.

```python
from trl_emo.losses import FusedLinearLoss

loss_fn = FusedLinearLoss("gem", beta=0.7)                 # any registered loss, `nll` and `dft` included
hidden = model.model(input_ids, attention_mask=mask).last_hidden_state   # the backbone: no logits built
loss = loss_fn(hidden, model.lm_head.weight, labels)       # labels: -100 ignored, shifted here
loss.backward()
```

Takes the final hidden states, the output embedding (and bias), the labels, optionally `num_items_in_batch`, a
reference model's hidden states and head (ASFT, EKSFT, iw-SFT, GIFT, SLM; PSFT's old policy, CurioSFT's teacher),
PSFT's old log-probabilities and each position's sequence (iw-SFT); computes the loss chunk by chunk
(`fused.fused_linear_loss`), never the whole `[tokens, vocab]` logits. Imports nothing but torch (and Triton on a GPU
when installed): no TRL, transformers, PEFT, accelerate or datasets, so it installs beside any framework
(`packaging/trl-emo-losses`).

The hyper-parameters are the loss's keywords (`beta`, or its `SFTConfig` field name `gem_beta`), their defaults the
loss's own (`LossSpec.defaults`, which `trl_emo.SFTConfig` also takes), checked by the same code as `SFTConfig` with the
same one-line `ValueError`s, which name the `SFTConfig` field.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

from ._common import (
    IGNORE_INDEX,
    check_choice,
    check_cost_source,
    check_label_ids,
    check_positive_int,
    check_positive_number,
    check_token_weights,
    select_positions,
)
from ._common import sequence_ids as sequence_ids_of
from .asft import ReferenceHead
from .cost import CostEmbedding, load_cost_embedding
from .fused import BACKENDS, FusedLossOutput, HeadAdapter, HeadTransform, fused_linear_loss
from .registry import ROLES, SEQUENCES, TOKEN_WEIGHTS, LossSpec, RowTensors, get_loss

# Keywords of a loss's functions that are inputs, not hyper-parameters.
_INPUTS = ("reference", "cost_embedding", ROLES, SEQUENCES, "weights", "old_logp", TOKEN_WEIGHTS)


@dataclass
class FusedLinearLossOutput(FusedLossOutput):
    """What `return_stats=True` returns: the loss and, per scored position, the objective (`token_losses`),
    cross-entropy (`nll`), entropy, top-1 correctness and the loss's extra metrics (`FusedLossOutput`).

    `positions` is a boolean mask over the input layout, `[B, T-1]` when the labels were shifted here (the last
    position has no target), else the labels' shape: the statistics are its `True` entries in order, so
    `full = torch.zeros(positions.shape); full[positions] = out.nll` lays them out per position."""

    positions: torch.Tensor | None = None


def check_fused_options(chunk_size, backend, chunk_memory_mb, *, prefix: str = "") -> None:
    """The fused path's options, named `{prefix}chunk_size`, `{prefix}backend`, `{prefix}chunk_memory_mb` in the
    messages (`SFTConfig`'s fields have the prefix `fused_`, `FusedLinearLoss`'s arguments none)."""
    check_positive_int(f"{prefix}chunk_size", chunk_size, allow_none=True)
    check_choice(f"{prefix}backend", backend, BACKENDS)
    check_positive_number(f"{prefix}chunk_memory_mb", chunk_memory_mb, allow_none=True)


def logit_transform_of(config) -> HeadTransform:
    """The logit scale and soft-cap a model applies after its head, read from its (text) config as TRL 1.16's fused
    head reads them (`trl/trainer/utils.py`, `add_fused_lm_head`): Gemma's `final_logit_softcapping`, Cohere's
    `logit_scale`, `output_multiplier`, `lm_head_multiplier`, Granite/MiniCPM3's `logits_scaling` (a divisor; a
    multiplier for HyperCLOVA X). Read by attribute, so any config object works."""
    if hasattr(config, "get_text_config"):
        config = config.get_text_config()
    softcap = getattr(config, "final_logit_softcapping", None)
    scale = getattr(config, "logit_scale", None)
    if scale is None:
        scale = getattr(config, "output_multiplier", None)
    if scale is None:
        scale = getattr(config, "lm_head_multiplier", None)
    if scale is None and getattr(config, "logits_scaling", None) is not None:
        # Granite/MiniCPM3 divide by `logits_scaling`; HyperCLOVA X multiplies by it.
        hyperclovax = getattr(config, "model_type", None) == "hyperclovax"
        scale = config.logits_scaling if hyperclovax else 1 / config.logits_scaling
    return HeadTransform(logit_scale=1.0 if scale is None else float(scale), softcap=softcap)


def _keywords(spec: LossSpec) -> tuple[str, ...] | None:
    """The hyper-parameters a loss takes: its `SFTConfig`-mapped keywords, else its per-token function's keyword
    arguments (a third-party loss); None when that function takes `**kwargs` (anything goes)."""
    if spec.config_fields:
        return tuple(spec.config_fields)
    params = list(inspect.signature(spec.per_token).parameters.values())[2:]
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return tuple(p.name for p in params if p.kind is not inspect.Parameter.VAR_POSITIONAL and p.name not in _INPUTS)


def resolve_hyperparameters(spec: LossSpec, given: Mapping[str, Any]) -> dict[str, Any]:
    """The loss's keyword arguments: its defaults (`LossSpec.defaults`) with `given` on top, each named by its keyword
    (`beta`) or its `SFTConfig` field (`gem_beta`), checked by the loss's `validate` (what `SFTConfig` runs)."""
    by_field = {field: keyword for keyword, field in spec.config_fields.items()}
    accepted = _keywords(spec)
    hparams = dict(spec.defaults)
    named_by: dict[str, str] = {}
    for name, value in given.items():
        keyword = by_field.get(name, name)
        if keyword in _INPUTS or (accepted is not None and keyword not in accepted):
            takes = ", ".join(
                f"{k} ({spec.config_fields[k]})" if k in spec.config_fields else k for k in accepted or ()
            ) or "none"
            raise ValueError(f"loss {spec.name!r} has no hyper-parameter {name!r}; it takes: {takes}.")
        if keyword in named_by:
            raise ValueError(f"{named_by[keyword]} and {name} both set {spec.name!r}'s {keyword}; pass one of them.")
        named_by[keyword] = name
        hparams[keyword] = value
    if spec.validate is not None:
        spec.validate(hparams)
    return hparams


def _check_layout(hidden, weight, labels, shift_labels: bool, bias, reference) -> None:
    if hidden.dim() < 2 or hidden.shape[-1] != weight.shape[-1] or weight.dim() != 2:
        raise ValueError(
            f"hidden [..., H] and weight [V, H] must share H: got hidden {tuple(hidden.shape)} and weight "
            f"{tuple(weight.shape)} (weight is the output embedding, e.g. model.lm_head.weight)."
        )
    if shift_labels and (labels.dim() != 2 or hidden.dim() != 3):
        raise ValueError(
            f"shift_labels=True takes labels [batch, sequence] and hidden [batch, sequence, H], got labels "
            f"{tuple(labels.shape)} and hidden {tuple(hidden.shape)}; pass shift_labels=False for labels already "
            "aligned with hidden."
        )
    if tuple(labels.shape) != tuple(hidden.shape[:-1]):
        raise ValueError(f"labels {tuple(labels.shape)} must have the shape of hidden without its last dimension, "
                         f"{tuple(hidden.shape[:-1])}.")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"bias must be [V] = ({weight.shape[0]},), got {tuple(bias.shape)}.")
    if reference is not None:
        if not isinstance(reference, ReferenceHead):
            raise ValueError(
                "reference must be a trl_emo.losses.ReferenceHead(hidden, weight, bias), got "
                f"{type(reference).__name__}."
            )
        if tuple(reference.hidden.shape[:-1]) != tuple(hidden.shape[:-1]):
            raise ValueError(f"reference.hidden {tuple(reference.hidden.shape)} must cover the same positions as "
                             f"hidden {tuple(hidden.shape)}.")


def _check_lora(lora, weight) -> tuple:
    ok = isinstance(lora, (tuple, list)) and len(lora) == 3
    lora_a, lora_b, scaling = lora if ok else (None, None, None)
    ok = ok and isinstance(lora_a, torch.Tensor) and isinstance(lora_b, torch.Tensor) and lora_a.dim() == 2
    ok = ok and lora_b.dim() == 2 and lora_a.shape[0] == lora_b.shape[1] and lora_a.shape[1] == weight.shape[1]
    ok = ok and lora_b.shape[0] == weight.shape[0] and isinstance(scaling, (int, float)) and not isinstance(scaling, bool)
    if not ok:
        raise ValueError(
            f"lora must be (A [r, {weight.shape[1]}], B [{weight.shape[0]}, r], scaling), PEFT's lora_A.weight, "
            "lora_B.weight and scaling of the head's adapter."
        )
    return lora_a, lora_b, float(scaling)


class FusedLinearLoss(torch.nn.Module):
    """A registered loss computed from the final hidden states and the output embedding, never the full logits.

    Args:
        loss_type: the loss's registered name: `"nll"`, `"dft"`, `"gem"`, `"emo"`, `"tailr"`, `"mixce"`,
            `"ce_entropy"`, `"eaft"`, `"asft"`, `"sed"`, `"eksft"`, `"psft"`, `"curio_sft"`, `"prob"`, `"iw_sft"`,
            `"gift"`, `"slm"` or one registered with `trl_emo.register_loss` (`trl_emo.losses.list_losses()` lists
            them).
        logit_scale: the factor the model applies to its logits (`z = scale * (h W^T + b)`); `for_model` reads it
            from the model's config.
        softcap: the model's final-logit soft-cap (`z = c tanh(y / c)`, Gemma 2 and 3), None without one.
        shift_labels: `True` (default): `labels` are the model's unshifted `[batch, sequence]` labels and position
            `t` predicts `labels[:, t + 1]` (what Hugging Face models do with `labels=`). `False`: `labels` are
            already aligned with `hidden` (any shape: `[batch, sequence]` or flattened `[tokens]`).
        ignore_index: the label of positions without a target (`-100`).
        cost_embedding: EMO only: its transport cost's token embedding. `"frozen"` (default): a snapshot of the
            output embedding taken at the first call (the paper's setting; a frozen head is read as it is),
            `"lm_head"`: the current output embedding at every call (detached), a `[V, d']` tensor or
            `CostEmbedding`, or a path to a tensor file (`.safetensors`, `.pt`, `.npy`).
        chunk_size: positions per chunk; default: as many as fit `chunk_memory_mb`.
        chunk_memory_mb: MiB for one chunk's `[positions, vocab]` buffers (default 320 with Triton, 512 without).
        backend: `"auto"` (Triton kernels on CUDA when Triton is installed, PyTorch otherwise), `"triton"` or
            `"torch"`.
        fp32_head_grad: on the Triton path with a half-precision head, accumulate the head's gradient in float32
            (more accurate, twice the head's memory).
        **hyperparameters: the loss's hyper-parameters, by keyword (`beta=0.7`) or by `SFTConfig` field
            (`gem_beta=0.7`); unset ones take the loss's defaults. `trl-emo losses` lists each loss's fields and
            `trl_emo.SFTConfig`'s docstring documents them.

    Call it as `loss_fn(hidden, weight, labels, bias=None, *, num_items_in_batch=None, reference=None,
    old_log_probs=None, sequence_ids=None, weights=None, lora=None, return_stats=False)` (see `forward`). Every bad
    argument raises a one-line `ValueError` naming it and the fix.
    """

    def __init__(
        self,
        loss_type: str = "nll",
        *,
        logit_scale: float = 1.0,
        softcap: float | None = None,
        shift_labels: bool = True,
        ignore_index: int = IGNORE_INDEX,
        cost_embedding: str | torch.Tensor | CostEmbedding = "frozen",
        chunk_size: int | None = None,
        chunk_memory_mb: float | None = None,
        backend: str = "auto",
        fp32_head_grad: bool = False,
        **hyperparameters: Any,
    ):
        super().__init__()
        self.spec = get_loss(loss_type)
        self.hyperparameters = resolve_hyperparameters(self.spec, hyperparameters)
        check_positive_number("logit_scale", logit_scale)
        check_positive_number("softcap", softcap, allow_none=True)
        check_fused_options(chunk_size, backend, chunk_memory_mb)
        self.transform = HeadTransform(float(logit_scale), None if softcap is None else float(softcap))
        self.shift_labels = bool(shift_labels)
        self.ignore_index = int(ignore_index)
        self.chunk_size = chunk_size
        self.chunk_memory = None if chunk_memory_mb is None else int(chunk_memory_mb * 2**20)
        self.backend = backend
        self.fp32_head_grad = bool(fp32_head_grad)
        # EMO's cost: a source name until the first call (`"frozen"`, `"lm_head"`), or the table itself. Never a
        # buffer: it is training state, not part of the model (and so never in a `state_dict`).
        self.cost_source: str | None = None
        self.cost: CostEmbedding | None = None
        if self.spec.uses_cost_embedding:
            if isinstance(cost_embedding, CostEmbedding):
                self.cost = cost_embedding
            elif isinstance(cost_embedding, torch.Tensor):
                self.cost = CostEmbedding(cost_embedding, source="the cost_embedding tensor")
            else:
                check_cost_source("cost_embedding", cost_embedding)
                if cost_embedding in ("frozen", "lm_head"):
                    self.cost_source = cost_embedding
                else:
                    self.cost = load_cost_embedding(cost_embedding)
        self._vocab_checked: int | None = None

    @classmethod
    def for_model(cls, model, loss_type: str = "nll", **kwargs: Any) -> FusedLinearLoss:
        """The loss with the logit scale and soft-cap of `model` (a Hugging Face model, a PEFT model, or anything
        with a `config`), read as TRL does (`logit_transform_of`); other arguments as for the constructor."""
        transform = logit_transform_of(model.config)
        kwargs.setdefault("logit_scale", transform.logit_scale)
        kwargs.setdefault("softcap", transform.softcap)
        return cls(loss_type, **kwargs)

    def extra_repr(self) -> str:
        hparams = ", ".join(f"{k}={v!r}" for k, v in self.hyperparameters.items())
        return f"{self.spec.name!r}" + (f", {hparams}" if hparams else "")

    def _cost_embedding(self, weight: torch.Tensor) -> CostEmbedding:
        if self.cost is None:
            if self.cost_source == "lm_head" or not weight.requires_grad:
                # A frozen head (LoRA) never changes: it is its own snapshot, read at each call instead of copied.
                return CostEmbedding(weight.detach(), source="the output embedding")
            self.cost = CostEmbedding(weight.detach().clone(), source="a frozen snapshot of the output embedding")
        self.cost.check_vocab(weight.shape[0])
        self.cost = self.cost.to(weight.device)  # once, not at every call (the fused path would copy it each time)
        return self.cost

    def forward(
        self,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        labels: torch.Tensor,
        bias: torch.Tensor | None = None,
        *,
        num_items_in_batch: int | torch.Tensor | None = None,
        reference: ReferenceHead | None = None,
        old_log_probs: torch.Tensor | None = None,
        sequence_ids: torch.Tensor | None = None,
        weights: torch.Tensor | None = None,
        lora: tuple | None = None,
        return_stats: bool = False,
    ) -> torch.Tensor | FusedLinearLossOutput:
        """The loss, `Σ_t w_t ℓ_t / N` over the positions with a target (`w_t = 1` without `weights`).

        Args:
            hidden: the model's final hidden states (after the final norm: what the head multiplies),
                `[batch, sequence, H]` (or, with `shift_labels=False`, any `[..., H]` matching `labels`).
            weight: the output embedding `[V, H]` (`model.get_output_embeddings().weight`; under FSDP2 its
                `full_tensor()`, under ZeRO-3 gathered: see the README's "Outside TRL").
            labels: target token ids, `ignore_index` where there is none (see `shift_labels`).
            bias: the head's bias `[V]`, if it has one.
            num_items_in_batch: `N`, the number of target tokens the loss is normalized by (Hugging Face's
                `num_items_in_batch`: all micro-batches of the optimizer step, for gradient accumulation); default:
                the target tokens of this call.
            reference: ASFT, EKSFT, iw-SFT, GIFT and SLM: the reference model's final hidden states over the same
                positions as `hidden` and its head, `ReferenceHead(ref_hidden, ref_weight, ref_bias, logit_scale,
                softcap)`, computed without gradient. Not needed when the loss's settings run no reference
                (`asft_alpha=0`, `eksft_ratio=0`). PSFT: the old policy's (or pass `old_log_probs`); CurioSFT: the
                teacher's. For these two it is optional: without it the old policy / teacher is the model itself
                (PSFT: `r = 1`).
            old_log_probs: PSFT: the old policy's log-probability of each target, laid out like `hidden` without its
                last dimension (entry `t` for the token position `t` predicts; other entries are not read), no
                gradient. The negative of `fused_lm_loss(old_hidden, weight, labels, "nll", return_stats=True).nll`
                laid out by its `positions` is that (or pass `reference=ReferenceHead(old_hidden, weight)`).
            sequence_ids: iw-SFT (and SLM with `slm_scope="sequence"`): which sequence each position belongs to,
                shaped like `labels` (for packed rows, e.g. the example index within the row). Default: each row of
                2-D labels is a sequence; 1-D labels are one sequence.
            weights: per-token loss weights, a tensor shaped like `labels` (each label's weight, non-negative): the
                weight multiplies its token's term and gradient (for a loss that selects tokens, EKSFT, it weighs the
                token in the selection's means: docs/losses.md), 0 leaves the token out like `ignore_index`, and `N`
                defaults to the sum of the weights of the target tokens. Weights of 1 give the unweighted loss bit for
                bit. With gradient accumulation pass `num_items_in_batch`, the sum of the weights of the step.
            lora: a LoRA adapter on the head, `(A [r, H], B [V, r], scaling)` (PEFT's `lora_A.weight`,
                `lora_B.weight`, `scaling`; `weight` is then the frozen base head): the logits are
                `h W^T + scaling · (h A^T) B^T`, chunk by chunk, and `A` and `B` get their gradients. No dropout
                here (PEFT's `lora_dropout` is applied by `trl_emo.SFTTrainer`, which runs PEFT's own dropout).
            return_stats: return a `FusedLinearLossOutput` (the loss and per-position statistics) instead of the
                loss alone.
        """
        spec, hparams = self.spec, self.hyperparameters
        _check_layout(hidden, weight, labels, self.shift_labels, bias, reference)
        if old_log_probs is not None:
            if "old_logp" not in inspect.signature(spec.per_token).parameters:
                raise ValueError(f"loss {spec.name!r} reads no old log-probabilities; drop old_log_probs=.")
            if tuple(old_log_probs.shape) != tuple(hidden.shape[:-1]):
                raise ValueError(f"old_log_probs {tuple(old_log_probs.shape)} must have the shape of hidden without its "
                                 f"last dimension, {tuple(hidden.shape[:-1])}.")
        if weights is not None:
            check_token_weights(weights, labels)
        vocab = weight.shape[0]
        if spec.validate_vocab is not None and self._vocab_checked != vocab:
            spec.validate_vocab(hparams, vocab)
            self._vocab_checked = vocab
        positions = select_positions(
            labels if self.shift_labels else None,
            None if self.shift_labels else labels,
            label_rows=spec.reads_label_rows(hparams),
            ignore_index=self.ignore_index,
            device=weight.device,
            weights=weights,
        )
        check_label_ids(positions.targets, vocab)
        kwargs = dict(hparams)
        if spec.uses_cost_embedding:
            kwargs["cost_embedding"] = self._cost_embedding(weight)
        if spec.needs_reference:
            kwargs["reference"] = None
            # A lagged reference (PSFT, CurioSFT) is optional: None is the model itself.
            if spec.wants_reference(hparams) or (spec.lagged_reference is not None and reference is not None):
                if reference is None:
                    raise ValueError(
                        f"loss {spec.name!r} with {hparams} reads a reference model: pass reference=ReferenceHead("
                        "ref_hidden, ref_model.lm_head.weight) from the reference model's forward without gradient."
                    )
                kwargs["reference"] = replace(reference, hidden=positions.take(reference.hidden.to(weight.device)))
        elif reference is not None:
            raise ValueError(f"loss {spec.name!r} reads no reference model; drop reference=.")
        if positions.roles is not None:
            kwargs[ROLES] = positions.roles
        if old_log_probs is not None:
            kwargs["old_logp"] = RowTensors({"old_logp": positions.take(old_log_probs.detach().to(weight.device))})
        if spec.reads_sequences(hparams):
            if sequence_ids is not None and tuple(sequence_ids.shape) != tuple(labels.shape):
                raise ValueError(f"sequence_ids {tuple(sequence_ids.shape)} must have the shape of labels "
                                 f"{tuple(labels.shape)}.")
            ids = sequence_ids if sequence_ids is not None else sequence_ids_of(labels)
            kwargs[SEQUENCES] = RowTensors({"id": positions.take(ids.to(weight.device))})
        rows = positions.take(hidden.to(weight.device))
        adapter = None
        if lora is not None:
            lora_a, lora_b, scaling = _check_lora(lora, weight)
            adapter = HeadAdapter((rows @ lora_a.to(rows.dtype).t()) * scaling, lora_b)
        out = fused_linear_loss(
            rows,
            weight,
            positions.targets,
            spec,
            kwargs,
            bias=bias,
            num_items_in_batch=num_items_in_batch,
            chunk_size=self.chunk_size,
            chunk_memory=self.chunk_memory,
            transform=self.transform,
            backend=self.backend,
            fp32_weight_grad=self.fp32_head_grad,
            weights=positions.weights,
            adapter=adapter,
        )
        if not return_stats:
            return out.loss
        return FusedLinearLossOutput(**vars(out), positions=positions.mask)


def fused_lm_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    loss_type: str = "nll",
    *,
    bias: torch.Tensor | None = None,
    num_items_in_batch: int | torch.Tensor | None = None,
    reference: ReferenceHead | None = None,
    old_log_probs: torch.Tensor | None = None,
    sequence_ids: torch.Tensor | None = None,
    weights: torch.Tensor | None = None,
    lora: tuple | None = None,
    cost_embedding: str | torch.Tensor | CostEmbedding | None = None,
    logit_scale: float = 1.0,
    softcap: float | None = None,
    shift_labels: bool = True,
    ignore_index: int = IGNORE_INDEX,
    chunk_size: int | None = None,
    chunk_memory_mb: float | None = None,
    backend: str = "auto",
    fp32_head_grad: bool = False,
    return_stats: bool = False,
    **hyperparameters: Any,
) -> torch.Tensor | FusedLinearLossOutput:
    """`FusedLinearLoss(loss_type, ...)(hidden, weight, labels, ...)` in one call; every argument as documented there.

    A function keeps nothing between calls, so EMO's `cost_embedding` has no `"frozen"` snapshot here: pass the
    table (a `[V, d']` tensor or `CostEmbedding`, the paper's setting is the starting model's output embedding),
    `"lm_head"` or a file path; or use `FusedLinearLoss`, which keeps the snapshot.
    """
    spec = get_loss(loss_type)
    no_table = cost_embedding is None or isinstance(cost_embedding, str) and cost_embedding == "frozen"
    if spec.uses_cost_embedding and no_table:
        raise ValueError(
            f"loss {loss_type!r} needs cost_embedding=: a [V, d'] tensor (the paper's: the starting model's output "
            "embedding), 'lm_head' or a file path; FusedLinearLoss keeps a frozen snapshot itself."
        )
    loss_fn = FusedLinearLoss(
        loss_type,
        logit_scale=logit_scale,
        softcap=softcap,
        shift_labels=shift_labels,
        ignore_index=ignore_index,
        cost_embedding="lm_head" if cost_embedding is None else cost_embedding,
        chunk_size=chunk_size,
        chunk_memory_mb=chunk_memory_mb,
        backend=backend,
        fp32_head_grad=fp32_head_grad,
        **hyperparameters,
    )
    return loss_fn(hidden, weight, labels, bias, num_items_in_batch=num_items_in_batch, reference=reference,
                   old_log_probs=old_log_probs, sequence_ids=sequence_ids, weights=weights, lora=lora,
                   return_stats=return_stats)
