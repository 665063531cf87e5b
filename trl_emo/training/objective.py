"""A selected loss bound to its hyper-parameters and, for EMO, its cost embedding.

This is the training state the trainer keeps beside the model: it is never a module of the
model, so it never reaches `state_dict()` or a saved model folder. A frozen cost snapshot of a
trainable head is saved next to checkpoints (`trl_emo_cost_embedding.safetensors`) so that a
resumed run uses the snapshot of the original start, not of the resumed weights.
"""

from __future__ import annotations

import contextlib
import logging
import os

import torch

from .trl_compat import gather_lm_head, head_parameters
from ..losses import CostEmbedding, fused_linear_loss, get_loss, load_cost_embedding, token_statistics
from ..losses._common import check_label_ids, normalizer, select_positions
from ..losses.fused import FusedLossOutput, HeadTransform
from ..losses.registry import ROLES, SEQUENCES, TOKEN_WEIGHTS, token_weight_rows

logger = logging.getLogger(__name__)

COST_EMBEDDING_FILE = "trl_emo_cost_embedding.safetensors"


def output_vocab_size(model) -> int:
    """Rows of the output embedding, also when DeepSpeed ZeRO-3 has partitioned it (then `shape` is empty)."""
    weight = model.get_output_embeddings().weight
    return tuple(getattr(weight, "ds_shape", None) or weight.shape)[0]


class Objective:
    """`loss_type` + hyper-parameters + cost embedding, computed fused or from logits."""

    def __init__(
        self,
        loss_type: str,
        hparams: dict,
        cost_source: str = "frozen",
        chunk_size: int | None = None,
        trust_remote_code: bool = False,
        chunk_memory: int | None = None,
        backend: str = "auto",
        fp32_head_grad: bool = False,
    ):
        self.spec = get_loss(loss_type)
        self.hparams = dict(hparams)
        self.cost_source = cost_source if self.spec.uses_cost_embedding else None
        self.chunk_size = chunk_size
        self.chunk_memory = chunk_memory
        self.backend = backend
        self.fp32_head_grad = fp32_head_grad
        self.trust_remote_code = trust_remote_code
        self.cost: CostEmbedding | None = None
        # Set when a frozen snapshot was asked for but the head itself is frozen (see prepare_cost).
        self.head_is_snapshot = False

    # -- cost embedding -------------------------------------------------------------------
    @property
    def needs_cost(self) -> bool:
        return self.cost_source is not None

    @property
    def live_cost(self) -> bool:
        return self.cost_source == "lm_head"

    @property
    def reads_head(self) -> bool:
        """The cost is the head as it is at each step (detached), not a stored table."""
        return self.live_cost or self.head_is_snapshot

    def prepare_cost(self, model) -> None:
        """Take the frozen snapshot or load the cost file, once; check its vocabulary."""
        if not self.needs_cost or self.reads_head or self.cost is not None:
            return
        weight = model.get_output_embeddings().weight
        if self.cost_source == "frozen":
            if not weight.requires_grad:
                # A frozen head (LoRA, QLoRA) never changes, so it is its own snapshot: it is read at
                # each step like the live cost (inside the gather the loss already makes under
                # ZeRO-3) instead of being copied, which would cost another head's worth of memory
                # (1 GiB for Llama-3-8B in bf16).
                self.head_is_snapshot = True
                return
            with gather_lm_head(weight):
                full = weight.full_tensor() if hasattr(weight, "full_tensor") else weight
                # The snapshot keeps the head's dtype: widening to float32 later is exact.
                self.cost = CostEmbedding(full.detach().clone(), source="a frozen snapshot of the output embedding")
        else:
            self.cost = load_cost_embedding(self.cost_source, trust_remote_code=self.trust_remote_code).to(weight.device)
        self.cost.check_vocab(output_vocab_size(model))

    def snapshot_must_be_saved(self, model) -> bool:
        """A frozen snapshot is worth saving only if the head trains (a frozen head can be re-read)."""
        return self.cost_source == "frozen" and self.cost is not None and model.get_output_embeddings().weight.requires_grad

    def save_cost(self, folder: str) -> None:
        from safetensors.torch import save_file

        os.makedirs(folder, exist_ok=True)
        save_file({"cost_embedding": self.cost.weight.contiguous().cpu()}, os.path.join(folder, COST_EMBEDDING_FILE))

    def load_cost(self, folder: str, model) -> bool:
        """Restore the snapshot saved with a checkpoint; False when the checkpoint has none."""
        path = os.path.join(folder, COST_EMBEDDING_FILE)
        if self.cost_source != "frozen" or not os.path.isfile(path):
            return False
        weight = model.get_output_embeddings().weight
        self.cost = load_cost_embedding(path).to(weight.device)
        self.cost.source = f"the snapshot saved in {folder}"
        self.cost.check_vocab(output_vocab_size(model))
        return True

    def _kwargs(self, weight: torch.Tensor) -> dict:
        if not self.needs_cost:
            return self.hparams
        cost = CostEmbedding(weight.detach(), source="the live output embedding") if self.reads_head else self.cost
        if cost is None:
            raise RuntimeError("The EMO cost embedding was not prepared; call `prepare_cost(model)` first.")
        return {**self.hparams, "cost_embedding": cost}

    # -- the loss --------------------------------------------------------------------------
    @property
    def wants_reference(self) -> bool:
        """A reference model must run (ASFT with `asft_alpha > 0`)."""
        return self.spec.wants_reference(self.hparams)

    @property
    def reads_sequences(self) -> bool:
        """The loss reads each row's sequence (iw-SFT's per-sequence weight; `LossSpec.per_sequence`)."""
        return self.spec.reads_sequences(self.hparams)

    @property
    def reads_label_rows(self) -> bool:
        """The loss also reads the label rows (EKSFT's authors' formula; `LossSpec.label_rows`)."""
        return self.spec.reads_label_rows(self.hparams)

    def fused(
        self, hidden, weight, bias, targets, num_items_in_batch=None, transform: HeadTransform | None = None,
        reference=None, roles=None, sequences=None, weights=None, adapter=None,
    ):
        """The objective from hidden states of the target positions (see `fused_linear_loss`); `reference`: the
        reference model's `ReferenceHead` at the same positions (ASFT, EKSFT, iw-SFT, GIFT, SLM); `roles`: when the loss
        reads label rows too, which rows are targets and which are label rows (`select_label_rows`); `sequences`: when
        it reads sequences, each row's (`Positions.sequences`); `weights`: each row's per-token loss weight; `adapter`:
        a LoRA adapter's term in the head (`HeadAdapter`)."""
        check_label_ids(targets, weight.shape[0])
        kwargs = self._kwargs(weight)
        if self.spec.needs_reference:
            kwargs = {**kwargs, "reference": reference}
        if roles is not None:
            kwargs = {**kwargs, ROLES: roles}
        if sequences is not None:
            kwargs = {**kwargs, SEQUENCES: sequences}
        return fused_linear_loss(
            hidden,
            weight,
            targets,
            self.spec,
            kwargs,
            bias=bias,
            num_items_in_batch=num_items_in_batch,
            chunk_size=self.chunk_size,
            chunk_memory=self.chunk_memory,
            transform=transform,
            backend=self.backend,
            fp32_weight_grad=self.fp32_head_grad,
            weights=weights,
            adapter=adapter,
        )

    def from_logits(
        self, logits, labels, model, num_items_in_batch=None, shift_labels=None, reference_logits=None,
        position_ids=None, weights=None,
    ) -> FusedLossOutput:
        """The reference path: the objective from the model's full logits `[B, T, V]` (and, for ASFT, the reference
        model's logits of the same batch; `position_ids` of packed rows for a loss that reads sequences; `weights`:
        per-token loss weights aligned with the labels)."""
        weight, _ = head_parameters(model)
        extra = {}
        positions = select_positions(labels, shift_labels, label_rows=self.reads_label_rows, weights=weights)
        roles, selected_targets = positions.roles, positions.targets
        if roles is not None:
            extra[ROLES] = roles
        if self.reads_sequences:
            if shift_labels is not None:
                from ..losses._common import PER_SEQUENCE_WITH_SHIFT_LABELS

                raise ValueError(PER_SEQUENCE_WITH_SHIFT_LABELS)
            extra[SEQUENCES] = positions.sequences(labels, position_ids)
        selected = positions.take(logits)
        check_label_ids(selected_targets, logits.shape[-1])
        if self.spec.needs_reference:
            extra["reference"] = None if reference_logits is None else positions.take(reference_logits)
        row_weights = positions.weights
        if row_weights is not None and not self.spec.scales_by_weight:
            extra[TOKEN_WEIGHTS] = token_weight_rows(row_weights, roles)
        # The live cost reads the head outside its module's forward: under ZeRO-3 that needs a gather (read only,
        # detached, so no gradient has to reach the shards).
        with gather_lm_head(weight) if self.reads_head else contextlib.nullcontext():
            values = self.spec.per_token(selected, selected_targets, **self._kwargs(weight), **extra)
        if row_weights is not None and self.spec.scales_by_weight:
            values = values * row_weights.to(values.dtype)
        target_rows = positions.target_rows
        if num_items_in_batch is not None:
            count = num_items_in_batch
        elif row_weights is not None:  # the weight of the target positions
            count = row_weights.sum()
        else:  # the target positions (label rows that are not targets are no tokens)
            count = positions.mask.sum() if target_rows is None else target_rows.sum()
        total = values.sum() if values.numel() else logits.sum() * 0.0
        loss = total / normalizer(count, total.device)
        stats = token_statistics(selected, selected_targets)
        return FusedLossOutput(
            loss, values.detach(), stats["nll"], stats["entropy"], stats["is_top1"], {}, target_rows, row_weights
        )
