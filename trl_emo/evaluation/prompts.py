"""Loading the prompt set (Hub id or local data, read like the training data), AlpacaEval / UltraFeedback / messages /
GSM8K layouts, and rendering a prompt for a policy in the training prompt formats."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field

from ..core.hub import locate
from ..data.prepare import resolve_prompt_format
from ..data.adapters import reference_text
from ..data.prompts import alpaca_prompt, instruction_and_input, user_content
from ..data.schemas import DataError
from .config import EvalConfig
from .errors import EvaluationError
from .final_answers import reference_number

PROMPT_COLUMNS = ("messages", "prompt", "instruction", "question")

@dataclass
class PromptExample:
    """One prompt: the conversation to answer, plus what some metrics compare against."""

    index: int
    id: str
    messages: list[dict]
    # Alpaca fields, kept apart so base models get the Alpaca prompt they were trained on, input block included.
    instruction: str
    input: str = ""
    reference: str | None = None
    gold: str | None = None
    # The dataset row as read, for tasks that need more columns (e.g. IFEval's instruction ids).
    row: dict = field(default_factory=dict, repr=False)


@dataclass
class PromptSet:
    examples: list[PromptExample]
    source: dict = field(default_factory=dict)

    @property
    def has_references(self) -> bool:
        return any(e.reference is not None for e in self.examples)

    @property
    def has_gold(self) -> bool:
        return any(e.gold is not None for e in self.examples)

    def fingerprint(self) -> str:
        payload = [[e.messages, e.instruction, e.input, e.reference, e.gold] for e in self.examples]
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


# Files a task may look for by name (e.g. `icl`'s `<folder>/<benchmark>/<split>.jsonl`).
LOCAL_SUFFIXES = (".json", ".jsonl", ".parquet", ".csv")


def is_local(path: str) -> bool:
    """Whether `path` names local data rather than a Hub dataset (`trl_emo.core.hub.locate`, the one rule)."""
    return locate(path)[0] != "hub"


def read_rows(source: str, config_name: str | None = None, split: str | None = None) -> list[dict]:
    """Rows of a prompt set: a Hub dataset split, or a local file, folder of split files or `save_to_disk` folder,
    read by `trl_emo.data.loading` like the training data. A single file is the whole prompt set, whatever `split`
    says; elsewhere `split=None` takes the only split, or `test` when there are several."""
    from ..data.loading import available_splits, load_split, resolve_source
    from ..data.schemas import DataError, DataPathError

    try:
        data_source = resolve_source(source)
    except DataPathError:
        raise EvaluationError(f"Prompt file not found: {source}") from None
    except DataError as exc:
        raise EvaluationError(str(exc)) from None
    try:
        if data_source.kind == "file":
            split = "train"
        elif data_source.is_local:
            split = _pick_split_name(available_splits(data_source), split, source)
        elif split is None:
            import datasets

            # Ask for the split names first: downloading every split of a large set to use one is wasteful.
            split = _pick_split_name(datasets.get_dataset_split_names(source, config_name), None, source)
        return list(load_split(data_source, split, config_name))
    except EvaluationError:
        raise
    except DataError as exc:
        raise EvaluationError(f"Prompt set {source!r}: {exc}") from None
    except Exception as exc:  # offline, unknown id or split, script-based repo...
        if data_source.is_local:
            raise
        raise EvaluationError(f"Could not load the prompt set {source!r} from the Hub: {exc}") from exc


def _pick_split_name(names: list[str], split: str | None, source: str) -> str:
    if split is None:
        if len(names) == 1:
            split = names[0]
        elif "test" in names:
            split = "test"
        else:
            raise EvaluationError(f"{source} has splits {names}; choose one with `prompts_split`.")
    if split not in names:
        raise EvaluationError(f"{source} has no split {split!r}; it has {names}.")
    return split


def _last_assistant(messages) -> str | None:
    for message in reversed(messages or []):
        if message.get("role") == "assistant":
            return message.get("content")
    return None


def _as_messages(value, column: str, index: int) -> list[dict]:
    if not isinstance(value, list) or not all(isinstance(m, dict) and "role" in m and "content" in m for m in value):
        raise EvaluationError(f"Row {index}: column {column!r} must be a list of {{role, content}} messages.")
    messages = [{"role": m["role"], "content": m["content"]} for m in value]
    # The conversation must end on the user's turn: that is what the policy answers.
    while messages and messages[-1]["role"] == "assistant":
        messages.pop()
    if not messages:
        raise EvaluationError(f"Row {index}: column {column!r} has no user turn.")
    return messages


def _reference(value, column: str, index: int) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return _last_assistant(value)
    raise EvaluationError(
        f"Row {index}: reference column {column!r} must hold text or messages, got {type(value).__name__}."
    )


def gsm8k_answer_column(rows: list[dict], columns: list[str]) -> str | None:
    """`answer` when it holds GSM8K gold answers (`... #### 42`), else None."""
    # An `answer` column of free text is not a gold answer.
    if "answer" in columns and any(isinstance(r.get("answer"), str) and "####" in r["answer"] for r in rows):
        return "answer"
    return None


def gsm8k_gold(text: str) -> str | None:
    """The canonical number of a GSM8K gold answer (`... #### 42`), or of a bare number (`"42"`, `"\\frac{1}{2}"`):
    `final_answers.reference_number`, the reading of the `gsm8k_answer` reward."""
    return reference_number(text)


def load_prompt_set(
    config: EvalConfig,
    find_answer_column=gsm8k_answer_column,
    parse_gold=gsm8k_gold,
    prompt_columns: tuple[str, ...] = PROMPT_COLUMNS,
) -> PromptSet:
    """The prompts of `config.prompts`, with references and gold answers where the columns exist.

    `find_answer_column(rows, columns)` picks the gold-answer column when `answer_column` is unset,
    `parse_gold(text)` turns a cell into the gold answer the task compares with (default: GSM8K's), and
    the prompt column is the first of `prompt_columns` present when `prompt_column` is unset.
    """
    rows = read_rows(config.prompts, config.prompts_config, config.prompts_split)
    if not rows:
        raise EvaluationError(f"The prompt set {config.prompts!r} is empty.")
    if config.max_prompts is not None:
        rows = rows[: config.max_prompts]
    columns = list(rows[0].keys())

    prompt_column = config.prompt_column
    if prompt_column is None:
        prompt_column = next((c for c in prompt_columns if c in columns), None)
        if prompt_column is None:
            raise EvaluationError(
                f"No prompt column in {config.prompts!r}: it has columns {columns}; accepted are "
                f"{', '.join(prompt_columns)} (or name one with `prompt_column`)."
            )
    named = {
        "prompt_column": prompt_column,
        "reference_column": config.reference_column,
        "answer_column": config.answer_column,
    }
    for name, column in named.items():
        if column is not None and column not in columns:
            raise EvaluationError(
                f"{name} {column!r} is not a column of {config.prompts!r}; it has columns {columns}."
            )

    answer_column = config.answer_column
    if answer_column is None:
        answer_column = find_answer_column(rows, columns)

    examples = []
    for index, row in enumerate(rows):
        value = row.get(prompt_column)
        extra_input = row.get("input") if prompt_column == "instruction" else None
        extra_input = extra_input if isinstance(extra_input, str) else ""
        if isinstance(value, list):
            messages = _as_messages(value, prompt_column, index)
            # As in training: the last user turn is the instruction, the other turns the input.
            try:
                instruction, extra_input = instruction_and_input(messages)
            except ValueError:
                raise EvaluationError(f"Row {index}: column {prompt_column!r} has no user turn.") from None
        elif isinstance(value, str):
            instruction = value
            messages = [{"role": "user", "content": user_content(value, extra_input)}]
        else:
            raise EvaluationError(
                f"Row {index}: prompt column {prompt_column!r} must be text or messages, got {type(value).__name__}."
            )
        reference = None
        if config.reference_column:
            reference = _reference(row.get(config.reference_column), config.reference_column, index)
        gold = None
        if answer_column is not None and row.get(answer_column) is not None:
            gold = parse_gold(reference_text(row[answer_column]))  # a JSON 0.00001 as "0.00001", not "1e-05"
        prompt_id = row.get("prompt_id", row.get("id", index))
        examples.append(
            PromptExample(
                index=index,
                id=str(prompt_id),
                messages=messages,
                instruction=instruction,
                input=extra_input,
                reference=reference,
                gold=gold,
                row=row,
            )
        )
    if config.reference_column and not any(e.reference is not None for e in examples):
        raise EvaluationError(f"reference_column {config.reference_column!r} holds no reference response.")
    # Absolute for local files, so the cache fingerprint does not depend on the working directory.
    location = os.path.abspath(os.path.expanduser(config.prompts)) if is_local(config.prompts) else config.prompts
    source = {
        "prompts": location,
        "config": config.prompts_config,
        "split": config.prompts_split,
        "prompt_column": prompt_column,
        "reference_column": config.reference_column,
        "answer_column": answer_column,
        "num_prompts": len(examples),
    }
    return PromptSet(examples=examples, source=source)


def render_policy_prompt(tokenizer, example: PromptExample, prompt_format: str = "auto") -> str:
    """The text the policy continues: its chat template, or the Alpaca prompt for base models (`prompt_format`
    resolved against the tokenizer as in training, by `trl_emo.data.resolve_prompt_format`)."""
    try:
        prompt_format = resolve_prompt_format(prompt_format, tokenizer)
    except DataError as exc:
        raise EvaluationError(f"The policy's tokenizer: {exc}") from None
    if prompt_format == "chat_template":
        return tokenizer.apply_chat_template(example.messages, tokenize=False, add_generation_prompt=True)
    # The training side's own function, so evaluation prompts match the fine-tuning prompts exactly.
    return alpaca_prompt(example.instruction, example.input)


def encode_once(tokenizer, text: str, **kwargs):
    """Tokenize `text`, letting the tokenizer add special tokens unless the text already starts with BOS.

    Chat templates usually write the BOS token themselves; tokenizing their output with special
    tokens on would give two BOS tokens, which shifts rewards and generations.
    """
    bos = getattr(tokenizer, "bos_token", None)
    add_special = not (bos and text.startswith(bos))
    return tokenizer(text, add_special_tokens=add_special, **kwargs)
