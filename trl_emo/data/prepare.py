"""Load, validate and convert the train/eval datasets handed to TRL's `SFTTrainer` and `DPOTrainer`."""

from __future__ import annotations

import logging

from .adapters import format_example, format_preference_example, output_format, read_field
from .info import DatasetInfo
from .loading import DataSource, load_split, resolve_source
from .schemas import (
    CONVERSATION,
    INSTRUCTION,
    PROMPT_COMPLETION,
    DataError,
    detect_schema,
    get_schema,
    validate_columns,
)

logger = logging.getLogger(__name__)


def has_chat_template(tokenizer) -> bool:
    return tokenizer is not None and bool(getattr(tokenizer, "chat_template", None))


def resolve_prompt_format(prompt_format: str, tokenizer) -> str:
    """"auto" -> "chat_template" when the tokenizer has a chat template, else "alpaca"; checks explicit choices."""
    if prompt_format == "auto":
        return "chat_template" if has_chat_template(tokenizer) else "alpaca"
    if prompt_format == "chat_template" and not has_chat_template(tokenizer):
        raise DataError(
            "prompt_format='chat_template' but the tokenizer has no chat template. Use prompt_format='alpaca' (or "
            "'auto'), or give the tokenizer a template before loading the data."
        )
    if prompt_format not in ("chat_template", "alpaca"):
        raise DataError(f"Invalid prompt_format {prompt_format!r}; valid values: auto, chat_template, alpaca.")
    return prompt_format


def take_first(dataset, n: int | None):
    """The first `n` rows (all of them when `n` is None or larger than the dataset)."""
    if n is None or n >= len(dataset):
        return dataset
    return dataset.select(range(n))


def _check_not_empty(dataset, source: DataSource, split: str) -> None:
    if len(dataset) == 0:
        raise DataError(f"Split {split!r} of {source.location} is empty.")


def _resolve_schema(requested: str, features, *, preference: bool) -> str:
    schema = detect_schema(features, preference=preference) if requested == "auto" else requested
    get_schema(schema)  # unknown name -> DataError listing the valid ones
    return schema


def convert_sft_dataset(dataset, schema: str, prompt_format: str, system_prompt: str | None = None):
    """Map every row with `format_example`, keeping only the columns of the output format."""
    return dataset.map(
        format_example,
        fn_kwargs={"schema": schema, "prompt_format": prompt_format, "system_prompt": system_prompt},
        remove_columns=dataset.column_names,
        desc=f"Formatting {schema} rows",
    )


def load_splits(script_args, data_args):
    if getattr(script_args, "dataset_streaming", False):
        raise DataError("dataset_streaming is not supported by trl_emo's dataset adapters; load the dataset in full.")
    source = resolve_source(script_args.dataset_name)
    config = getattr(script_args, "dataset_config", None)
    train_split = script_args.dataset_train_split
    train = load_split(source, train_split, config, required=True)
    _check_not_empty(train, source, train_split)
    eval_split = getattr(script_args, "dataset_test_split", None)
    evaluation = load_split(source, eval_split, config, required=False) if eval_split else None
    if evaluation is None:
        eval_split = None
    else:
        _check_not_empty(evaluation, source, eval_split)
    train = take_first(train, data_args.max_train_samples)
    if evaluation is not None:
        evaluation = take_first(evaluation, data_args.max_eval_samples)
    return source, train, train_split, evaluation, eval_split


def load_sft_datasets(script_args, data_args, tokenizer):
    """Load the train (and eval, when `script_args.dataset_test_split` exists in the source) splits of
    `script_args.dataset_name` (Hub id or local path), detect/validate the schema and convert them to TRL's format.

    Returns `(train_dataset, eval_dataset_or_None, DatasetInfo)`. Instruction schemas become prompt/completion data
    (conversational with the chat template, Alpaca strings otherwise); UltraFeedback/`messages` data stays
    conversational ("messages", needs `assistant_only_loss=True`) with the chat template and becomes Alpaca
    prompt/completion without one; `prompt_completion` and `text` data pass through.
    """
    source, train, train_split, evaluation, eval_split = load_splits(script_args, data_args)
    schema = _resolve_schema(data_args.dataset_schema, train.features, preference=False)
    if get_schema(schema).verifiable:
        raise DataError(
            f"Schema {schema!r} holds prompts with reference answers; use it for GRPO (trl_emo.grpo), not SFT."
        )
    if not get_schema(schema).sft:
        raise DataError(f"Schema {schema!r} holds preference pairs; use it for DPO (trl_emo.dpo), not SFT.")
    if schema == "plain_text":  # a dataset-level conversion (rows -> documents), not a per-row adapter
        from .plain_text import prepare_plain_text

        return prepare_plain_text(source, train, train_split, evaluation, eval_split, script_args, data_args)
    validate_columns(train.features, schema)
    if evaluation is not None:
        validate_columns(evaluation.features, schema)

    prompt_format = None
    declared = get_schema(schema)
    if declared.kind in (INSTRUCTION, CONVERSATION):
        prompt_format = resolve_prompt_format(data_args.prompt_format, tokenizer)
    elif declared.kind == PROMPT_COMPLETION and isinstance(read_field(train[0], declared, "prompt"), list):
        # Conversational pass-through data can only be tokenized with a chat template.
        prompt_format = resolve_prompt_format("chat_template", tokenizer)
    if data_args.system_prompt and prompt_format == "alpaca":
        logger.warning("system_prompt is ignored with the Alpaca prompt format (the Alpaca preamble plays its part).")

    train = convert_sft_dataset(train, schema, prompt_format, data_args.system_prompt)
    if evaluation is not None:
        evaluation = convert_sft_dataset(evaluation, schema, prompt_format, data_args.system_prompt)
    fmt = output_format(train[0])
    info = DatasetInfo.of_splits(source, train, train_split, evaluation, eval_split, schema=schema, output_format=fmt,
                                 prompt_format=prompt_format, assistant_only_loss=fmt == "messages")
    logger.info(info.summary())
    return train, evaluation, info


def load_dpo_datasets(script_args, data_args, tokenizer):
    """Load preference data (UltraFeedback `train_prefs`/`test_prefs`, or generic prompt/chosen/rejected files) as
    explicit-prompt rows for TRL's `DPOTrainer`: conversational {"prompt": [turns], "chosen": [answer], "rejected":
    [answer]} with the chat template, Alpaca strings without one; string rows pass through.

    UltraFeedback's string `prompt` column is dropped: TRL 1.16 keeps a `prompt` column as is, and a string prompt
    next to conversational chosen/rejected would make its format detection ambiguous.
    Returns `(train_dataset, eval_dataset_or_None)`.
    """
    source, train, _, evaluation, _ = load_splits(script_args, data_args)
    schema = _resolve_schema(data_args.dataset_schema, train.features, preference=True)
    if not get_schema(schema).preference:
        raise DataError(
            f"Schema {schema!r} has no preference pairs; DPO needs `chosen`/`rejected` columns "
            "(e.g. UltraFeedback's train_prefs/test_prefs splits)."
        )
    # UltraFeedback's SFT column `messages` is not needed for DPO: validate against the preference columns.
    for dataset in (train, evaluation):
        if dataset is not None:
            validate_columns(dataset.features, "preference")
    prompt_format = resolve_prompt_format(data_args.prompt_format, tokenizer)

    def convert(dataset):
        return dataset.map(
            format_preference_example,
            fn_kwargs={"prompt_format": prompt_format, "system_prompt": data_args.system_prompt},
            remove_columns=dataset.column_names,
            desc=f"Formatting {schema} preference rows",
        )

    train = convert(train)
    evaluation = convert(evaluation) if evaluation is not None else None
    logger.info(
        "DPO dataset %s (schema %s, prompt format %s): train %d rows, eval %s",
        source.location,
        schema,
        prompt_format,
        len(train),
        "none" if evaluation is None else f"{len(evaluation)} rows",
    )
    return train, evaluation
