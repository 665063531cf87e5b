"""GRPO prompt sets: prompts with a reference answer (GSM8K, MATH, your own), loaded for TRL's `GRPOTrainer`.

A GRPO row is a prompt the policy answers and the reference its rewards compare the answers with: `{"prompt",
"answer"}` (`trl_emo.data.adapters.format_verifiable_example`). TRL renders a conversational prompt with the policy's
chat template (the tokenizer saved in the SFT folder) and passes the `answer` column to every reward function as its
`answer` keyword; the rewards (`trl_emo.evaluation.rewards`) read the final answer out of it. The schemas are declared
with the others (`trl_emo.data.schemas`, kind `verifiable`) and are never taken for SFT data.
"""

from __future__ import annotations

import logging

from .adapters import REFERENCE_COLUMN, format_verifiable_example
from .info import DatasetInfo
from .prepare import load_splits, resolve_prompt_format
from .schemas import SCHEMAS, DataError, detect_schema, get_schema, validate_columns

logger = logging.getLogger(__name__)

__all__ = ["REFERENCE_COLUMN", "convert_verifiable_dataset", "load_grpo_datasets"]


# The reference's column while the rows are mapped: `datasets` casts a new column that takes a removed column's name
# back to that column's type, so a numeric `answer` written out as "0.00001" would become the float 1e-05 again.
_REFERENCE_TEXT = "__trl_emo_reference"


def _verifiable_row(row: dict, **kwargs) -> dict:
    example = format_verifiable_example(row, **kwargs)
    return {"prompt": example["prompt"], _REFERENCE_TEXT: example[REFERENCE_COLUMN]}


def convert_verifiable_dataset(dataset, schema: str, prompt_format: str, system_prompt: str | None = None):
    """Map every row with `format_verifiable_example`, keeping only `prompt` and `answer` (text)."""
    converted = dataset.map(
        _verifiable_row,
        fn_kwargs={"schema": schema, "prompt_format": prompt_format, "system_prompt": system_prompt},
        remove_columns=dataset.column_names,
        desc=f"Formatting {schema} prompts",
    )
    return converted.rename_column(_REFERENCE_TEXT, REFERENCE_COLUMN)


def _check_references(dataset, split: str) -> None:
    """Rows without a reference answer are kept but not scored (every built-in reward gives them None, which TRL
    leaves out of the reward means and gives no advantage): one such row must not stop a run. A warning names how
    many; a split where no row has one is a `DataError`, since nothing in it could be scored."""
    missing = sum(1 for answer in dataset[REFERENCE_COLUMN] if not answer)
    if missing == len(dataset) and missing:
        raise DataError(
            f"No row of split {split!r} has a reference answer (column {REFERENCE_COLUMN!r} is empty in all "
            f"{missing} rows): the rewards have nothing to compare with; fill in the answers."
        )
    if missing:
        logger.warning(
            "%d of %d rows of split %r have no reference answer: their completions are not scored (reward None, no "
            "advantage). Fill in column %r to train on them.", missing, len(dataset), split, REFERENCE_COLUMN,
        )


def load_grpo_datasets(script_args, data_args, tokenizer):
    """Load the train (and eval, when `script_args.dataset_test_split` exists) splits of `script_args.dataset_name`
    (Hub id or local path), detect or check the schema among the GRPO prompt sets and convert the rows to
    `{"prompt", "answer"}`: conversational prompts with the chat template, Alpaca strings without one.

    Returns `(train_dataset, eval_dataset_or_None, DatasetInfo)`. A missing column or a schema that is not a GRPO
    prompt set is a `DataError` naming the columns expected and found. Rows with an empty reference answer are kept,
    not scored, and counted in a warning (`_check_references`).
    """
    source, train, train_split, evaluation, eval_split = load_splits(script_args, data_args)
    requested = data_args.dataset_schema
    schema = detect_schema(train.features, verifiable=True) if requested == "auto" else requested
    declared = get_schema(schema)
    if not declared.verifiable:
        grpo = ", ".join(name for name, known in SCHEMAS.items() if known.verifiable)
        raise DataError(
            f"Schema {schema!r} has no reference answers, which GRPO's verifiable rewards need; use a GRPO prompt set "
            f"({grpo}) or dataset_schema: auto."
        )
    for dataset in (train, evaluation):
        if dataset is not None:
            validate_columns(dataset.features, schema)
    prompt_format = resolve_prompt_format(data_args.prompt_format, tokenizer)
    if data_args.system_prompt and prompt_format == "alpaca":
        logger.warning("system_prompt is ignored with the Alpaca prompt format (the Alpaca preamble plays its part).")
    train = convert_verifiable_dataset(train, schema, prompt_format, data_args.system_prompt)
    _check_references(train, train_split)
    if evaluation is not None:
        evaluation = convert_verifiable_dataset(evaluation, schema, prompt_format, data_args.system_prompt)
        _check_references(evaluation, eval_split)
    info = DatasetInfo.of_splits(
        source, train, train_split, evaluation, eval_split, schema=schema,
        output_format="conversational_prompt" if isinstance(train[0]["prompt"], list) else "prompt",
        prompt_format=prompt_format, assistant_only_loss=False,
    )
    logger.info(info.summary())
    return train, evaluation, info
