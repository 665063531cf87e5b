"""Devices, dtypes and evaluation-flavoured errors around `trl_emo.models.sources` (paths, models, LoRA adapters), shared
by generation and scoring."""

from __future__ import annotations

import gc
import os

from ..core.hub import locate
from ..models import sources
from .errors import EvaluationError


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


def check_model_source(path: str, what: str) -> None:
    """Fail early, before anything is generated, on a model folder that does not exist (`trl_emo.core.hub.locate`)."""
    kind, location = locate(path)
    if kind == "local" and not os.path.isdir(location):
        raise EvaluationError(f"{what} {path!r} is a file; expected a model folder or a Hub id.")
    if kind == "missing":
        raise EvaluationError(f"{what} folder not found: {path}")


def adapter_base(path: str) -> str | None:
    """The base model of a LoRA adapter folder, or None when `path` is a full model (`trl_emo.models.sources`)."""
    try:
        return sources.adapter_base(path)
    except sources.SourceError as exc:
        raise EvaluationError(str(exc)) from None


def not_loadable(what: str, path: str, exc: Exception) -> EvaluationError:
    return EvaluationError(
        f"{what}: {path!r} could not be loaded: it is not a local folder, and as a Hub id it needs network access "
        f"or a copy in the Hugging Face cache ({type(exc).__name__}: {exc})"
    )


def load_tokenizer(path: str, trust_remote_code: bool, what: str = "Model"):
    """`trl_emo.models.sources.load_tokenizer` (an adapter's own tokenizer, else its base's), with a clear error for a Hub id
    that cannot be loaded."""
    adapter_base(path)  # an adapter that names no base: a clear error
    try:
        return sources.load_tokenizer(path, trust_remote_code)
    except OSError as exc:
        location = sources.tokenizer_location(path)
        if os.path.isdir(location):
            raise
        raise not_loadable(what, location, exc) from exc


def free_memory() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
