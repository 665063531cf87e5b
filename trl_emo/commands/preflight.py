"""The Hub ids each training command loads, for the preflight (`trl_emo.core.hub.check_sources`): what the command
will load is known here, at the top, and the check below only reads the list."""

from __future__ import annotations

import os

from ..core.errors import HubSource
from ..models.hub_ids import dataset_sources, model_sources


def loss_sources(training_args) -> list[tuple[str, str]]:
    """`(field, value)` of each model or file the run's loss loads besides the model: EMO's cost embedding (a file,
    a model folder or a Hub id; not `frozen`/`lm_head`) and the reference model its `LossSpec.reference_field` names
    (`asft_ref_model`, `eksft_ref_model`)."""
    from ..losses import get_loss
    from ..losses.registry import TRL_LOSS_TYPES

    loss_type = getattr(training_args, "loss_type", None)
    if loss_type is None or loss_type in TRL_LOSS_TYPES:
        return []
    try:
        spec = get_loss(loss_type)
    except (KeyError, ValueError):
        return []
    found = []
    cost = getattr(training_args, "emo_cost_embedding", None)
    if spec.uses_cost_embedding and cost not in (None, "frozen", "lm_head"):
        found.append(("emo_cost_embedding", cost))
    reference = getattr(training_args, spec.reference_field, None) if spec.reference_field else None
    if reference:
        found.append((spec.reference_field, reference))
    return found


def sft_sources(script_args, training_args, model_args) -> list[HubSource]:
    """The Hub ids a `trl_emo.sft` run loads: the model (at `model_revision`), the tokenizer whose chat template it
    clones (`chat_template_path`), the dataset, and what its loss loads (`loss_sources`)."""
    sources = model_sources("model_name_or_path", model_args.model_name_or_path, model_args.model_revision,
                            "model_revision")
    # A `.jinja` file is a path whatever its shape (`trl_emo.core.hub.locate`).
    sources += model_sources("chat_template_path", training_args.chat_template_path, filename="tokenizer_config.json")
    sources += dataset_sources("dataset_name", script_args.dataset_name)
    for field, value in loss_sources(training_args):
        sources += model_sources(field, value)
    return sources


def local_model(field: str, value: str | None, allow_file: bool = False, allow_adapter: bool = True) -> str | None:
    """`value` of a model field, with a local path made absolute (an adapter trained from it records its base by this
    path, which `trl-emo eval` must find from any directory), after checking it before anything loads: a local path
    that does not exist is a one-line error (else it is read as a Hub id and fails in the loader with a message about
    repo ids), and a folder must be a model (`config.json`, or a LoRA adapter's `adapter_config.json`). With
    `allow_file`, a file is accepted (EMO's cost embedding tensor); without `allow_adapter`, an adapter folder is not
    (EMO's cost embedding reads a model's own head). Hub ids pass unchanged."""
    from ..core.errors import ConfigError
    from ..core.hub import locate

    if not value:
        return value
    kind, path = locate(value)
    what = "a tensor file, a model folder" if allow_file else "a model folder written by save_pretrained"
    if kind == "missing":
        raise ConfigError(f"{field}: {value} not found (expected {what}, or a Hub id like org/name).")
    if kind != "local":
        return value
    if os.path.isdir(path):
        configs = ("config.json", "adapter_config.json") if allow_adapter else ("config.json",)
        if not any(os.path.isfile(os.path.join(path, name)) for name in configs):
            raise ConfigError(f"{field}: {value} is not a model folder: no config.json (expected {what}, or a Hub id).")
    elif not allow_file:
        raise ConfigError(f"{field}: {value} is a file, not a model folder (expected {what}, or a Hub id).")
    return os.path.abspath(path)


def check_loss_paths(training_args) -> None:
    """The local paths of `loss_sources` exist and are what they must be (`local_model`)."""
    for field, value in loss_sources(training_args):
        cost = field == "emo_cost_embedding"
        local_model(field, value, allow_file=cost, allow_adapter=not cost)


def model_and_dataset_sources(script_args, model_args) -> list[HubSource]:
    """The Hub ids a `trl_emo.dpo` or `trl_emo.grpo` run loads: the starting model (or its adapter's base) and the
    dataset (DPO's preference pairs, GRPO's prompt set). GRPO's rewards load nothing from the Hub."""
    return [
        *model_sources("model_name_or_path", model_args.model_name_or_path, model_args.model_revision, "model_revision"),
        *dataset_sources("dataset_name", script_args.dataset_name),
    ]


# DPO and GRPO load the same two things; each command asks by its own name.
dpo_sources = grpo_sources = model_and_dataset_sources
