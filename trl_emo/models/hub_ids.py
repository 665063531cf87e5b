"""The Hub ids behind a model or dataset name, for the preflight (`trl_emo.core.hub.check_sources`).

A model name may be a local LoRA adapter folder whose base model is a Hub id (its `adapter_config.json` names it): the
preflight checks that base, under a field that says where it came from.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..core.errors import HubSource
from ..core.hub import check_sources, hub_id
from .sources import SourceError, adapter_base


def model_sources(field: str, name, revision: str | None = None, revision_field: str | None = None,
                  filename: str = "config.json") -> list[HubSource]:
    """`name` as a Hub model id; and when it is a LoRA adapter (a local folder or a Hub repository, detected through
    PEFT: `trl_emo.models.sources.adapter_base`), the adapter's base model when that is a Hub id."""
    repo_id = hub_id(name)
    if not isinstance(name, str) or not name:
        return []
    try:
        base = adapter_base(name)
    except SourceError:
        base = None  # reported where the adapter is loaded
    own = []
    if repo_id is not None:
        # A Hub adapter repository has an adapter_config.json where a model has its config.json.
        own = [HubSource(field, repo_id, revision=revision, revision_field=revision_field,
                         filename="adapter_config.json" if base else filename)]
    base_id = hub_id(base) if base else None
    if base_id is None:
        return own
    config = os.path.join(os.path.expanduser(name), "adapter_config.json") if repo_id is None else \
        f"{repo_id}'s adapter_config.json"
    return own + [HubSource(f"the base model of the adapter in {field}", base_id,
                            fix=f"base_model_name_or_path in {config}")]


def dataset_sources(field: str, name) -> list[HubSource]:
    repo_id = hub_id(name)
    return [HubSource(field, repo_id, repo_type="dataset")] if repo_id else []


def check_hub_ids(fields: Mapping[str, str | None], repo_type: str = "model") -> None:
    """The preflight of a command with options of its own: `{field: name}`, each name a local path (not checked) or
    a Hub id of `repo_type`. E.g. `check_hub_ids({"--model": args.model})`."""
    sources = []
    for field, name in fields.items():
        sources += dataset_sources(field, name) if repo_type == "dataset" else model_sources(field, name)
    check_sources(sources)
