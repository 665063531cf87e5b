"""Held-out cross-entropy, entropy and top-1 accuracy of a model on SFT rows, prepared exactly as training prepares
them.

The demo and `benchmarks/real_model_study.py` compare losses by these numbers, so they are computed by one piece of
code for every loss (TRL's `nll` logs its own metrics through another path): rows are formatted by the schema's
adapter (`trl_emo.data.format_example`), tokenized and masked by TRL's own `_prepare_dataset`
(`trl_emo.training.trl_compat.prepare_sft_examples`), and every target token counts once (a token-weighted mean, not a mean
of per-row means).
"""

from __future__ import annotations

from collections.abc import Sequence


def prepare_rows(rows: Sequence[dict], tokenizer, schema: str, prompt_format: str, max_length: int = 1024,
                 system_prompt: str | None = None, training_args=None) -> list[dict]:
    """`rows` of `schema` as TRL's `SFTTrainer` would train on them: dicts of `input_ids` and `labels` (-100 where
    there is no loss, e.g. the prompt of prompt/completion data).

    Without `training_args` a CPU `SFTConfig` is built for the tokenization settings. Building any
    `TrainingArguments` resets accelerate's shared state, which breaks a trainer that is alive in the same process:
    there, pass that trainer's `args` (their `max_length` is then the one used)."""
    from datasets import Dataset

    from .trl_compat import prepare_sft_examples
    from .config import SFTConfig
    from ..data import format_example

    formatted = Dataset.from_list([format_example(row, schema, prompt_format, system_prompt) for row in rows])
    # Only the fields `_prepare_dataset` reads matter; the rest are CPU-safe defaults.
    args = training_args or SFTConfig(output_dir="heldout", use_cpu=True, bf16=False, report_to="none",
                                      max_length=max_length, activation_checkpointing=False)
    prepared = prepare_sft_examples(formatted, tokenizer, args, len(formatted))
    return [{"input_ids": list(row["input_ids"]), "labels": list(row["labels"])} for row in prepared]


def pad_batch(examples: Sequence[dict], pad_token_id: int = 0) -> dict:
    """`examples` (from `prepare_rows`) right-padded into `input_ids`, `attention_mask` and `labels` tensors (-100 on
    the padding, so it never counts)."""
    import torch

    width = max(len(row["input_ids"]) for row in examples)
    ids = torch.full((len(examples), width), pad_token_id, dtype=torch.long)
    labels = torch.full((len(examples), width), -100, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for i, row in enumerate(examples):
        n = len(row["input_ids"])
        ids[i, :n] = torch.tensor(row["input_ids"])
        labels[i, :n] = torch.tensor(row["labels"])
        mask[i, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def heldout_statistics(model, examples: Sequence[dict], batch_size: int = 16, pad_token_id: int = 0) -> dict:
    """Token-weighted means over the target tokens of `examples` (from `prepare_rows`): `cross_entropy` (nats),
    `entropy` of the next-token distribution (nats), `accuracy` (top-1, %), and `tokens` (the count).

    Batches are right-padded (`pad_batch`); padded positions carry no label, so they never count."""
    import torch

    from ..losses import select_targets, token_statistics

    if not examples:
        raise ValueError("heldout_statistics: no examples")
    device = next(model.parameters()).device
    totals = torch.zeros(3, dtype=torch.float64)
    count = 0
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for start in range(0, len(examples), batch_size):
                batch = pad_batch(examples[start : start + batch_size], pad_token_id)
                logits = model(input_ids=batch["input_ids"].to(device),
                               attention_mask=batch["attention_mask"].to(device)).logits[:, :-1].float()
                targets, valid = select_targets(batch["labels"].to(device))
                stats = token_statistics(logits[valid], targets[valid])
                totals += torch.stack([stats["nll"].sum(), stats["entropy"].sum(), stats["is_top1"].sum()]).double().cpu()
                count += int(valid.sum())
    finally:
        model.train(was_training)
    if count == 0:
        raise ValueError("heldout_statistics: the examples have no target token (every label is -100)")
    cross_entropy, entropy, correct = (totals / count).tolist()
    return {"cross_entropy": cross_entropy, "entropy": entropy, "accuracy": 100.0 * correct, "tokens": count}
