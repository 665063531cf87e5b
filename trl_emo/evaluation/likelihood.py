"""Token log-likelihoods of a policy: held-out perplexity (`continuation`) and candidate scoring (`icl`)."""

from __future__ import annotations

import os

from ..models import sources
from .cache import file_signature
from .config import EvalConfig
from .errors import EvaluationError
from .loading import adapter_base, load_tokenizer, not_loadable, resolve_device, resolve_dtype


def policy_signature(path: str) -> dict:
    """What identifies a policy in a cache: its folder (weights' sizes and times) and, for an adapter, its base."""
    path = os.path.expanduser(path)
    signature = {"policy": file_signature(path)}
    base = adapter_base(path) if os.path.isdir(path) else None
    if base is not None:
        signature["base_model"] = file_signature(os.path.expanduser(base))
    return signature


def load_causal_lm(path: str, config: EvalConfig, what: str = "Policy"):
    """(model in eval mode on its device, tokenizer): a full model, or a LoRA adapter merged into its base, resized
    when the SFT run added tokens (`trl_emo.models.sources.load_causal_lm`, as generation and DPO load them)."""
    device = resolve_device(config.device)
    path = os.path.expanduser(path)
    base = adapter_base(path)
    tokenizer = load_tokenizer(path, config.trust_remote_code, what=what)
    try:
        model = sources.load_causal_lm(path, resolve_dtype(config.dtype, device), config.trust_remote_code)
    except OSError as exc:
        if os.path.isdir(os.path.expanduser(base or path)):
            raise
        raise not_loadable(what, base or path, exc) from exc
    return model.to(device).eval(), tokenizer


def max_sequence_length(model, tokenizer) -> int:
    """The longest input the model takes: its position limit, or the tokenizer's when that is smaller and sane."""
    limits = [getattr(model.config, "max_position_embeddings", None), getattr(model.config, "n_positions", None)]
    tokenizer_limit = getattr(tokenizer, "model_max_length", None)
    if tokenizer_limit and tokenizer_limit < 10**7:  # "no limit" is a huge sentinel
        limits.append(tokenizer_limit)
    limits = [int(limit) for limit in limits if limit]
    return min(limits) if limits else 2048


def token_nlls(model, sequences: list[list[int]], batch_size: int, pad_id: int = 0) -> list[list[float]]:
    """The negative log-likelihood of every token after the first of each sequence (float32, nats).

    Sequences are right-padded in batches; padding never changes a value (masked attention, causal
    model), which a test checks against one-at-a-time scoring. Sorting by length wastes little padding.
    """
    import torch

    if any(len(seq) < 2 for seq in sequences):
        raise EvaluationError("Cannot score a sequence of fewer than two tokens.")
    device = next(model.parameters()).device
    order = sorted(range(len(sequences)), key=lambda i: -len(sequences[i]))
    out: list[list[float] | None] = [None] * len(sequences)
    with torch.no_grad():
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            width = max(len(sequences[i]) for i in chunk)
            ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for row, i in enumerate(chunk):
                ids[row, : len(sequences[i])] = torch.tensor(sequences[i])
                mask[row, : len(sequences[i])] = 1
            ids, mask = ids.to(device), mask.to(device)
            logits = model(input_ids=ids, attention_mask=mask).logits
            for row, i in enumerate(chunk):
                # One row at a time in float32: a [batch, length, vocab] float32 copy would not fit for large vocabularies.
                length = len(sequences[i])
                nll = torch.nn.functional.cross_entropy(
                    logits[row, : length - 1].float(), ids[row, 1:length], reduction="none"
                )
                out[i] = nll.tolist()
            del logits
    return out
