"""Where models and adapters come from: one way to load a model or a LoRA adapter.

- `load_causal_lm(path)`: a full model, or a LoRA/QLoRA adapter folder merged into its base model once, the base's
  token embeddings resized first when the SFT run added tokens (a cloned chat template), as the adapter was trained
  on the resized model. `merge_adapter_to` saves such a merge (DPO starts from it). `load_tokenizer(path)`: the
  adapter's own tokenizer when it saved one, else its base's.

Whether a name is a local path or a Hub id is `trl_emo.core.hub.locate`'s rule (re-exported here), the one every
layer follows; datasets are read by `trl_emo.data.loading` (`resolve_source`, `load_split`).
Nothing here imports trainer code or heavy packages at module level.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os

from ..core.hub import PATH_SUFFIXES, locate, looks_like_path  # noqa: F401 - re-exported: the one path-or-Hub rule

logger = logging.getLogger(__name__)

ADAPTER_CONFIG = "adapter_config.json"
MERGE_STAMP = "trl_emo_merged_from.json"


class SourceError(ValueError):
    """A model or adapter that cannot be used as given (an adapter naming no base model...)."""


# -- adapters ---------------------------------------------------------------------------------------------------------


def adapter_config(path: str) -> dict | None:
    """The configuration of the PEFT adapter at `path`, as PEFT reads it (`PeftConfig.from_pretrained`): a local
    adapter folder or a Hub adapter repository; None for anything else (a full model, a missing path).

    A Hub id is looked up as transformers and PEFT look files up, offline-safe: a cached `adapter_config.json` is read
    from the cache; one the cache knows the repository lacks means a full model; offline with neither, the id is not
    taken for an adapter (the Hub preflight says in one line that it is not cached); online, PEFT fetches the file if
    the repository has one."""
    kind, _ = locate(path)
    if kind == "local":
        folder = os.path.expanduser(path)
        return _peft_config(folder) if os.path.isfile(os.path.join(folder, ADAPTER_CONFIG)) else None
    if kind != "hub":
        return None
    from huggingface_hub import constants, try_to_load_from_cache

    cached = try_to_load_from_cache(path, ADAPTER_CONFIG)
    if isinstance(cached, str):
        return _peft_config(path)
    if cached is not None or constants.HF_HUB_OFFLINE:  # known absent, or offline and unknown
        return None
    try:
        return _peft_config(path)
    except SourceError:
        return None  # no adapter_config.json in the repository: a full model (or an id the preflight reports)


def _peft_config(source: str) -> dict:
    from peft import PeftConfig

    try:
        return PeftConfig.from_pretrained(source).to_dict()
    except (TypeError, ValueError, OSError) as exc:
        raise SourceError(f"{source}: its {ADAPTER_CONFIG} is not a PEFT adapter configuration PEFT can read "
                          f"({' '.join(str(exc).split())})") from None


def is_adapter(path: str) -> bool:
    return adapter_config(path) is not None


def adapter_base(path: str) -> str | None:
    """The base model of a LoRA adapter (a local folder or a Hub id), or None when `path` is not one."""
    config = adapter_config(path)
    if config is None:
        return None
    base = config.get("base_model_name_or_path")
    if not base:
        raise SourceError(f"The adapter in {path} does not name its base model (`base_model_name_or_path`).")
    return base


def adapter_rank(path: str) -> int:
    """The largest LoRA rank of an adapter folder (vLLM needs it ahead of loading)."""
    config = adapter_config(path) or {}
    ranks = [config.get("r") or 8, *(config.get("rank_pattern") or {}).values()]
    return int(max(ranks))


def has_tokenizer(path: str) -> bool:
    return any(
        os.path.isfile(os.path.join(os.path.expanduser(path), name))
        for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
    )


def tokenizer_location(path: str) -> str:
    """Where the tokenizer of `path` is: an adapter's own folder when it saved one (trl_emo.sft does), else its base
    model; a model folder or Hub id itself."""
    base = adapter_base(path)
    if base is None or has_tokenizer(path):
        return os.path.expanduser(path)
    return os.path.expanduser(base)


def load_tokenizer(path: str, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_location(path), trust_remote_code=trust_remote_code)


def _dtype(dtype):
    """A torch dtype from `dtype` (a torch dtype, a name such as "bfloat16", or "auto"/None for the checkpoint's)."""
    import torch

    if dtype is None or dtype == "auto":
        return "auto"
    return getattr(torch, dtype) if isinstance(dtype, str) else dtype


def load_causal_lm(path: str, dtype=None, trust_remote_code: bool = False):
    """A causal LM from a model folder or Hub id, or from a LoRA/QLoRA adapter folder, merged into its base.

    The base of an adapter is loaded unquantized (a 4-bit base cannot absorb the update exactly). When the adapter's
    tokenizer has more tokens than the base's embeddings (the SFT run added tokens, e.g. by cloning a chat template),
    the base is resized to it first: the adapter was trained on the resized model. The adapter folder's
    `generation_config.json` (the end-of-turn EOS written by trl_emo.sft) replaces the base's.
    """
    from transformers import AutoModelForCausalLM, GenerationConfig

    path = os.path.expanduser(path)
    base = adapter_base(path)
    model = AutoModelForCausalLM.from_pretrained(
        os.path.expanduser(base or path), dtype=_dtype(dtype), trust_remote_code=trust_remote_code
    )
    if base is None:
        return model
    from peft import PeftModel

    if has_tokenizer(path):
        tokenizer = load_tokenizer(path, trust_remote_code)
        if len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
            model.resize_token_embeddings(len(tokenizer))
    merged = PeftModel.from_pretrained(model, path).merge_and_unload()
    if os.path.isfile(os.path.join(path, "generation_config.json")):
        merged.generation_config = GenerationConfig.from_pretrained(path)
    return merged


def _fingerprint(adapter_dir: str) -> str:
    digest = hashlib.sha256()
    for name in (ADAPTER_CONFIG, "adapter_model.safetensors", "adapter_model.bin"):
        path = os.path.join(adapter_dir, name)
        if os.path.isfile(path):
            digest.update(name.encode())
            digest.update(str(os.path.getsize(path)).encode())
            digest.update(str(os.path.getmtime(path)).encode())
    return digest.hexdigest()


def merge_adapter_to(adapter_dir: str, target: str, dtype=None, trust_remote_code: bool = False) -> str:
    """Save `load_causal_lm(adapter_dir)` (and its tokenizer) in `target`, once: a merge whose stamp matches the
    adapter's files is reused."""
    adapter_dir = os.path.expanduser(adapter_dir)
    stamp = os.path.join(target, MERGE_STAMP)
    fingerprint = _fingerprint(adapter_dir)
    if os.path.isfile(stamp):
        with open(stamp) as handle:
            if json.load(handle).get("fingerprint") == fingerprint:
                logger.info("Reusing the merged model in %s", target)
                return target
    base = adapter_base(adapter_dir)
    merged = load_causal_lm(adapter_dir, dtype, trust_remote_code)
    merged.save_pretrained(target)
    load_tokenizer(adapter_dir, trust_remote_code).save_pretrained(target)
    with open(stamp, "w") as handle:
        json.dump({"adapter": os.path.abspath(adapter_dir), "base": base, "fingerprint": fingerprint}, handle)
    logger.info("Merged adapter %s into %s -> %s", adapter_dir, base, target)
    return target
