"""The Hub ids each training command loads, for the preflight (`trl_emo.core.hub.check_sources`): what the command
will load is known here, at the top, and the check below only reads the list."""

from __future__ import annotations

from ..core.errors import HubSource
from ..models.hub_ids import dataset_sources, model_sources


def _cost_embedding_sources(training_args) -> list[HubSource]:
    from ..losses import get_loss
    from ..losses.registry import TRL_LOSS_TYPES

    value = getattr(training_args, "emo_cost_embedding", None)
    loss_type = getattr(training_args, "loss_type", None)
    if value in (None, "frozen", "lm_head") or loss_type in TRL_LOSS_TYPES:
        return []
    try:
        uses_cost = get_loss(loss_type).uses_cost_embedding
    except (KeyError, ValueError):
        return []
    return model_sources("emo_cost_embedding", value) if uses_cost else []


def sft_sources(script_args, training_args, model_args) -> list[HubSource]:
    """The Hub ids a `trl_emo.sft` run loads: the model (at `model_revision`), the tokenizer whose chat template it
    clones (`chat_template_path`), the dataset, EMO's cost embedding and the loss's reference model (the field its
    `LossSpec.reference_field` names: `asft_ref_model`, `eksft_ref_model`)."""
    sources = model_sources("model_name_or_path", model_args.model_name_or_path, model_args.model_revision,
                            "model_revision")
    # A `.jinja` file is a path whatever its shape (`trl_emo.core.hub.locate`).
    sources += model_sources("chat_template_path", training_args.chat_template_path, filename="tokenizer_config.json")
    sources += dataset_sources("dataset_name", script_args.dataset_name)
    sources += _cost_embedding_sources(training_args)
    sources += _reference_sources(training_args)
    return sources


def _reference_sources(training_args) -> list[HubSource]:
    from ..losses import get_loss
    from ..losses.registry import TRL_LOSS_TYPES

    loss_type = getattr(training_args, "loss_type", None)
    if loss_type is None or loss_type in TRL_LOSS_TYPES:
        return []
    try:
        field = get_loss(loss_type).reference_field
    except (KeyError, ValueError):
        return []
    return model_sources(field, getattr(training_args, field, None)) if field else []


def dpo_sources(script_args, model_args) -> list[HubSource]:
    """The Hub ids a `trl_emo.dpo` run loads: the starting model (or its adapter's base) and the dataset."""
    return [
        *model_sources("model_name_or_path", model_args.model_name_or_path, model_args.model_revision, "model_revision"),
        *dataset_sources("dataset_name", script_args.dataset_name),
    ]


def grpo_sources(script_args, model_args) -> list[HubSource]:
    """The Hub ids a `trl_emo.grpo` run loads: the starting model (or its adapter's base) and the prompt set. The
    rewards load nothing from the Hub."""
    return [
        *model_sources("model_name_or_path", model_args.model_name_or_path, model_args.model_revision, "model_revision"),
        *dataset_sources("dataset_name", script_args.dataset_name),
    ]
