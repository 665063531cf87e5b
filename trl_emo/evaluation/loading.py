"""Model-loading helpers shared by generation and scoring: devices, dtypes, paths, LoRA adapters."""

from __future__ import annotations

import gc
import json
import os

from .config import EvaluationError


def resolve_device(device: str | None) -> str:
    import torch

    if device:
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_dtype(dtype: str, device: str):
    import torch

    if dtype == "auto":
        # bfloat16 halves memory on GPUs; CPUs are slow at it, so they keep float32.
        if device.startswith("cuda") and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]


def looks_like_hub_id(path: str) -> bool:
    parts = path.split("/")
    return (
        not path.startswith((".", "/", "~"))
        and os.sep not in path.replace("/", "")
        and 1 <= len(parts) <= 2
        and all(parts)
    )


def check_model_source(path: str, what: str) -> None:
    """Fail early, before anything is generated, on a model folder that does not exist."""
    if os.path.isdir(os.path.expanduser(path)):
        return
    if os.path.exists(os.path.expanduser(path)):
        raise EvaluationError(f"{what} {path!r} is a file; expected a model folder or a Hub id.")
    if not looks_like_hub_id(path):
        raise EvaluationError(f"{what} folder not found: {path}")


def adapter_base(path: str) -> str | None:
    """The base model of a LoRA adapter folder, or None when `path` is a full model."""
    config_path = os.path.join(os.path.expanduser(path), "adapter_config.json")
    if not os.path.isfile(config_path):
        return None
    with open(config_path, encoding="utf-8") as handle:
        config = json.load(handle)
    base = config.get("base_model_name_or_path")
    if not base:
        raise EvaluationError(f"{config_path} names no base model (`base_model_name_or_path`).")
    return base


def adapter_rank(path: str) -> int:
    with open(os.path.join(os.path.expanduser(path), "adapter_config.json"), encoding="utf-8") as handle:
        config = json.load(handle)
    ranks = [config.get("r") or 8, *(config.get("rank_pattern") or {}).values()]
    return int(max(ranks))


def has_tokenizer(path: str) -> bool:
    return any(
        os.path.isfile(os.path.join(os.path.expanduser(path), name))
        for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
    )


def not_loadable(what: str, path: str, exc: Exception) -> EvaluationError:
    return EvaluationError(
        f"{what}: {path!r} could not be loaded: it is not a local folder, and as a Hub id it needs network access "
        f"or a copy in the Hugging Face cache ({type(exc).__name__}: {exc})"
    )


def load_tokenizer(path: str, trust_remote_code: bool, what: str = "Model"):
    from transformers import AutoTokenizer

    base = adapter_base(path) if os.path.isdir(os.path.expanduser(path)) else None
    source = path if base is None or has_tokenizer(path) else base
    try:
        return AutoTokenizer.from_pretrained(os.path.expanduser(source), trust_remote_code=trust_remote_code)
    except OSError as exc:
        if os.path.isdir(os.path.expanduser(source)):
            raise
        raise not_loadable(what, source, exc) from exc


def free_memory() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
