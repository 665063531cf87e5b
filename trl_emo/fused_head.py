"""Route a trl_emo loss through the model's own forward, without building the logits.

TRL 1.16 patches `model.forward` so that `model(..., fused_lm_head=True)` returns per-token
log-probabilities; the call still goes through DDP/FSDP/DeepSpeed wrappers, which is what keeps
their hooks (gradient reduction, parameter gathering) working. We wrap that patched forward once
more: `model(..., trl_emo_loss=True)` runs the backbone and hands the final hidden states of the
target positions and the output embedding to the objective. Without the flag the call is TRL's.
"""

from __future__ import annotations

import functools
import types
from dataclasses import dataclass

import torch
from transformers.utils import ModelOutput

from .losses.fused import HeadTransform
from .losses import select_targets


def head_transform(model) -> HeadTransform:
    """Logit scale and soft-capping the model applies after its head, read like TRL's fused head does."""
    config = model.config.get_text_config()
    softcap = getattr(config, "final_logit_softcapping", None)
    scale = getattr(config, "logit_scale", None)
    if scale is None:
        scale = getattr(config, "output_multiplier", None)
    if scale is None:
        scale = getattr(config, "lm_head_multiplier", None)
    if scale is None and getattr(config, "logits_scaling", None) is not None:
        # Granite/MiniCPM3 divide by `logits_scaling`; HyperCLOVA X multiplies by it.
        scale = config.logits_scaling if config.model_type == "hyperclovax" else 1 / config.logits_scaling
    return HeadTransform(logit_scale=1.0 if scale is None else float(scale), softcap=softcap)


@dataclass
class ObjectiveOutput(ModelOutput):
    """What `model(..., trl_emo_loss=True)` returns. Per-position tensors cover the target positions only."""

    loss: torch.Tensor | None = None
    token_losses: torch.Tensor | None = None  # not `values`: ModelOutput is a dict, and DDP calls .values()
    nll: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    is_top1: torch.Tensor | None = None
    metrics: dict | None = None
    label_mask: torch.Tensor | None = None
    aux_loss: torch.Tensor | None = None


def head_parameters(model) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The output embedding's weight and bias, looked up now (PEFT and FSDP replace modules after patching)."""
    from torch.distributed.tensor import DTensor

    head = model.get_output_embeddings()
    weight, bias = head.weight, head.bias
    # FSDP2 shards the head as DTensors; the objective needs the full matrix (gradients flow back
    # to the shards through `full_tensor`).
    if isinstance(weight, DTensor):
        weight = weight.full_tensor()
        if bias is not None:
            bias = bias.full_tensor()
    return weight, bias


def add_objective_head(model, objective) -> None:
    """Patch `model.forward` (already patched by TRL) to compute `objective` when `trl_emo_loss=True`.

    `objective(hidden [N, H], weight, bias, targets [N], num_items_in_batch, transform)` returns
    a `FusedLossOutput`. Call this on the base model (`get_base_model()` under PEFT), like TRL does.
    """
    from trl.trainer.utils import maybe_gather_lm_head_ctx

    # Everything below is looked up on `self` at call time, never through a closure over this
    # instance: `copy.deepcopy(model)` rebinds the method to the copy, which must then run its own
    # weights. (TRL's patch calls the original instance's forward for plain calls, so plain calls
    # go to the class's forward here, and only `fused_lm_head=True` calls to TRL's function.)
    previous = model.forward
    trl_fused_forward = getattr(previous, "__func__", None)
    transform = head_transform(model)

    @functools.wraps(type(model).forward)
    def forward(self, *args, trl_emo_loss=False, labels=None, shift_labels=None, num_items_in_batch=None, **kwargs):
        if not trl_emo_loss:
            passthrough = {"labels": labels, "shift_labels": shift_labels, "num_items_in_batch": num_items_in_batch}
            passthrough = {k: v for k, v in passthrough.items() if v is not None}
            if kwargs.get("fused_lm_head"):
                fused = previous if trl_fused_forward is None else functools.partial(trl_fused_forward, self)
                return fused(*args, **passthrough, **kwargs)
            kwargs.pop("fused_lm_head", None)
            return type(self).forward(self, *args, **passthrough, **kwargs)
        if objective is None:
            raise ValueError("This model was patched without a trl_emo objective (loss_type is TRL's own).")
        text_config = self.config.get_text_config()
        kwargs["use_cache"] = False
        if getattr(text_config, "output_router_logits", False):
            kwargs.setdefault("output_router_logits", True)
        backbone_outputs = self.base_model(*args, **kwargs)
        hidden = backbone_outputs.last_hidden_state
        if shift_labels is None:
            hidden = hidden[:, :-1]
        targets, mask = select_targets(labels, shift_labels)
        weight, bias = head_parameters(self)
        # With `device_map`, the backbone can end on another device than the head.
        hidden = hidden.to(weight.device)
        targets, mask = targets.to(weight.device), mask.to(weight.device)
        with maybe_gather_lm_head_ctx(weight, bias):
            # Masked positions are dropped before any product with the head.
            out = objective(hidden[mask], weight, bias, targets[mask], num_items_in_batch, transform)
        loss = out.loss
        aux_loss = None
        if kwargs.get("output_router_logits"):
            from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

            num_experts = getattr(text_config, "num_experts", None) or getattr(text_config, "num_local_experts", None)
            aux_loss = load_balancing_loss_func(
                backbone_outputs.router_logits,
                num_experts,
                text_config.num_experts_per_tok,
                kwargs.get("attention_mask"),
            )
        return ObjectiveOutput(
            loss=loss,
            token_losses=out.token_losses,
            nll=out.nll,
            entropy=out.entropy,
            is_top1=out.is_top1,
            metrics=out.metrics,
            label_mask=mask,
            aux_loss=aux_loss,
        )

    model.forward = types.MethodType(forward, model)
