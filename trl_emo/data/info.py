"""What the dataset loaders found (`DatasetInfo`), in a module of its own: the instruction and the plain-text loaders
(`prepare`, `plain_text`) both build one, and neither imports the other for it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DatasetInfo:
    """What `load_sft_datasets` produced, for the trainer configuration and the logs.

    Attributes:
        schema: the source schema (detected or given).
        output_format: "prompt_completion", "conversational_prompt_completion", "messages" or "text".
        prompt_format: "chat_template" or "alpaca" (None for pass-through string data, where it does not apply).
        assistant_only_loss: whether the trainer needs `SFTConfig(assistant_only_loss=True)` (the "messages" format:
            the loss on assistant turns only). Prompt/completion data is masked by TRL's completion-only loss, which
            is on by default for it.
        source: the Hub id or the local path used; `is_local` tells which.
        train_split / eval_split: the split names read (eval_split is None when there is no eval set).
        num_train / num_eval: row counts after `max_*_samples`.
    """

    schema: str
    output_format: str
    prompt_format: str | None
    assistant_only_loss: bool
    source: str
    is_local: bool
    train_split: str
    eval_split: str | None
    num_train: int
    num_eval: int | None

    @classmethod
    def of_splits(cls, source, train, train_split: str, evaluation, eval_split: str | None, *, schema: str,
                  output_format: str, prompt_format: str | None, assistant_only_loss: bool) -> DatasetInfo:
        """What a loader found, the source and the splits filled in from `load_splits`' results: `source` (a
        `DataSource`), the train split and its name, the eval split (or None) and its name; the row counts are the
        splits' as converted."""
        return cls(
            schema=schema, output_format=output_format, prompt_format=prompt_format,
            assistant_only_loss=assistant_only_loss, source=source.location, is_local=source.is_local,
            train_split=train_split, eval_split=eval_split, num_train=len(train),
            num_eval=None if evaluation is None else len(evaluation),
        )

    def summary(self) -> str:
        eval_part = f", eval {self.eval_split!r} ({self.num_eval} rows)" if self.eval_split else ", no eval split"
        prompt = f", prompt format {self.prompt_format}" if self.prompt_format else ""
        return (
            f"dataset {self.source} (schema {self.schema}{prompt}) -> {self.output_format}; "
            f"train {self.train_split!r} ({self.num_train} rows){eval_part}; "
            f"assistant_only_loss={self.assistant_only_loss}"
        )
