"""The reference model of ASFT and EKSFT: its final hidden states and head at the policy's positions, without gradient.

Three sources, chosen once when the trainer is built:

- `adapters_off` (PEFT, no `asft_ref_model` / `eksft_ref_model`): the policy's own base model with its adapters disabled for
  the reference pass. No second copy in memory: the reference is exactly the starting model, since the
  adapters are what trains (and under PEFT the head is frozen, so it is shared too).
- `copy` (full fine-tuning, no reference named): a frozen copy of the starting model, made once before
  training; its memory is logged.
- `model` (`asft_ref_model`, `eksft_ref_model`): another model with the same vocabulary, loaded once, frozen, on the
  policy's device and in its dtype.

The copy and the separate model are plain modules: they are not sharded, so they are refused under
DeepSpeed ZeRO-3 and FSDP (use LoRA there: the `adapters_off` reference shares the sharded model).
"""

from __future__ import annotations

import contextlib
import copy
import logging

import torch

from .trl_compat import head_parameters, logit_transform

logger = logging.getLogger(__name__)


class ReferenceModel:
    """Computes the reference's hidden states for a batch (`hidden_states`) or its logits (`logits`)."""

    def __init__(self, kind: str, model=None, peft_model=None):
        self.kind = kind
        self.model = model  # the frozen reference (copy / model), or None for adapters_off
        self.peft_model = peft_model

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def build(cls, trainer, source: str | None, field: str = "asft_ref_model", loss: str = "asft") -> ReferenceModel:
        """The reference of `loss` (ASFT, EKSFT): `source` (the value of its `field`, a folder or Hub id) or the
        starting model."""
        policy = trainer._base_model()
        sharded = trainer.is_deepspeed_enabled and _zero_stage(trainer) == 3 or trainer.is_fsdp_enabled
        is_peft = hasattr(trainer.model, "disable_adapter")
        if source is None and is_peft:
            logger.info("%s reference: the base model with the adapters disabled (no second copy in memory).", loss.upper())
            return cls("adapters_off", peft_model=trainer.model)
        if sharded:
            raise ValueError(
                f"loss_type={loss!r} with a separate reference model (a frozen copy, or {field}) is not supported "
                "under DeepSpeed ZeRO-3 or FSDP: the reference would not be sharded. Train with LoRA (use_peft: true; "
                "the reference is then the base model with the adapters disabled), or use DDP / ZeRO-2."
            )
        if source is None:
            reference = copy.deepcopy(policy)
            # TRL's fused-head patch is an instance attribute bound to the original model: left on the copy, a plain
            # call of the copy would run the policy's weights. The class's forward is the copy's own.
            reference.__dict__.pop("forward", None)
            kind = "copy"
        else:
            from ..core.hub import hub_errors
            from ..models.hub_ids import model_sources
            from ..models.sources import load_causal_lm

            parameter = next(policy.parameters())
            # A Hub failure (offline, gated, not found...) is one line naming the field (`asft_ref_model`...).
            with hub_errors(model_sources(field, source)):
                reference = load_causal_lm(
                    source, dtype=parameter.dtype, trust_remote_code=trainer.args.trust_remote_code
                )
            reference.to(parameter.device)
            kind = "model"
        reference.eval()
        reference.requires_grad_(False)
        if kind == "copy" and hasattr(reference, "gradient_checkpointing_disable"):
            reference.gradient_checkpointing_disable()
        check_reference_vocabulary(reference, policy, source, loss)
        size = sum(p.numel() * p.element_size() for p in reference.parameters())
        what = "a frozen copy of the starting model" if kind == "copy" else f"{source}, frozen"
        logger.warning("%s reference model: %s, %.2f GiB.", loss.upper(), what, size / 2**30)
        return cls(kind, model=reference)

    # -- use ----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _reference_pass(self):
        with torch.no_grad(), (self.peft_model.disable_adapter() if self.kind == "adapters_off" else contextlib.nullcontext()):
            yield

    def hidden_states(self, policy, args, kwargs):
        """`(hidden [B, T, H'], head weight, head bias, HeadTransform)` of the reference for the policy's batch."""
        source = policy if self.kind == "adapters_off" else self.model
        with self._reference_pass():
            outputs = source.base_model(*args, **kwargs)
        weight, bias = head_parameters(source)
        return outputs.last_hidden_state, weight, bias, logit_transform(source)

    def logits(self, policy, inputs: dict) -> torch.Tensor:
        """The reference's full logits `[B, T, V]` (the logits path)."""
        source = policy if self.kind == "adapters_off" else self.model
        with self._reference_pass():
            return source(**inputs).logits


def check_reference_vocabulary(reference, policy, source, loss: str = "asft") -> None:
    ref_vocab = reference.get_output_embeddings().weight.shape[0]
    vocab = policy.get_output_embeddings().weight.shape[0]
    if ref_vocab != vocab:
        raise ValueError(
            f"Vocabulary mismatch: the {loss.upper()} reference model ({source or 'the starting model'}) has {ref_vocab} "
            f"output tokens but the model being trained has {vocab}. The KL term compares the two distributions token by "
            "token: use a reference with the same tokenizer and vocabulary size."
        )


def _zero_stage(trainer) -> int | None:
    plugin = getattr(trainer.accelerator.state, "deepspeed_plugin", None)
    return getattr(plugin, "zero_stage", None) if plugin is not None else None
