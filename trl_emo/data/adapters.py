"""Row adapters: one source row of a known schema -> one example in a format TRL's trainers prepare themselves.

SFT outputs (TRL then tokenizes, appends EOS to string completions, and masks):
  - "prompt_completion": {"prompt": str, "completion": str} (the Alpaca prompt; TRL's completion-only loss);
  - "conversational_prompt_completion": {"prompt": [turns], "completion": [assistant turn]} (chat template);
  - "messages": {"messages": [turns]} (multi-turn chat; needs `assistant_only_loss=True`);
  - "text": {"text": str} (plain language modeling).
DPO outputs: explicit-prompt preference rows {"prompt", "chosen", "rejected"}, all conversational or all strings.
GRPO outputs: prompt-only rows with the reference answer, {"prompt", "answer"} (`format_verifiable_example`).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from decimal import Decimal

from .prompts import (
    PROMPT_FORMATS,  # noqa: F401 - re-exported: the prompt formats the adapters take
    alpaca_completion,
    alpaca_prompt,
    conversation_to_alpaca,
    instruction_and_input,
    split_conversation,
    user_content,
)
from .schemas import CONVERSATION, INSTRUCTION, PROMPT_COMPLETION, TEXT, VERIFIABLE, DataError, Schema, get_schema
from .token_weights import message_weights

OUTPUT_FORMATS = ("prompt_completion", "conversational_prompt_completion", "messages", "text")


def _field(row: dict, column: str, schema: str, container: str | None = None):
    source = row if container is None else row.get(container)
    if not isinstance(source, Mapping) or column not in source:
        name = column if container is None else f"{container}.{column}"
        raise DataError(
            f"Missing column {name!r} for dataset schema {schema!r} (expects {get_schema(schema).expected()}); "
            f"row has: {', '.join(row) or '(none)'}."
        )
    return source[column]


def read_field(row: dict, schema: Schema, name: str):
    """The value of the kind's field `name` in `row`, through the schema's field map; a missing optional column or
    struct field (or a field the schema has no column for) reads as None."""
    path = schema.column_of(name)
    if path is None:
        return None
    column, _, inner = path.partition(".")
    if not schema.is_required(path):
        source = row.get(column) if inner else row
        return source.get(inner or column) if isinstance(source, Mapping) else None
    if inner:
        _field(row, column, schema.name)
        return _field(row, inner, schema.name, column)
    return _field(row, column, schema.name)


def instruction_fields(row: dict, schema: str) -> tuple[str, str, str]:
    """(instruction, input, output) of a row of an instruction-style schema; a missing/None input is ""."""
    declared = get_schema(schema)
    if declared.kind != INSTRUCTION:
        raise DataError(f"Schema {schema!r} is not an instruction schema (its rows are {declared.kind!r}).")
    values = (read_field(row, declared, name) for name in ("instruction", "input", "output"))
    return tuple("" if value is None else str(value) for value in values)


def clean_messages(messages) -> list[dict]:
    """Drop the None-valued keys Arrow adds when turns of one column have different keys."""
    if not isinstance(messages, list) or not all(isinstance(m, Mapping) and "role" in m for m in messages):
        raise DataError(f"Expected a conversation (a list of {{role, content}} turns), got: {str(messages)[:200]}")
    return [{key: value for key, value in message.items() if value is not None} for message in messages]


def with_system(messages: list[dict], system_prompt: str | None) -> list[dict]:
    """Prepend a system turn, unless there is no system prompt or the conversation already starts with one."""
    if not system_prompt or (messages and messages[0].get("role") == "system"):
        return messages
    return [{"role": "system", "content": system_prompt}, *messages]


def _check_prompt_format(prompt_format: str) -> None:
    if prompt_format not in ("chat_template", "alpaca"):
        raise DataError(
            f"prompt_format must be resolved to 'chat_template' or 'alpaca' here, got {prompt_format!r} "
            "(use `resolve_prompt_format` with the tokenizer to resolve 'auto')."
        )


def format_example(row: dict, schema: str, prompt_format: str, system_prompt: str | None = None) -> dict:
    """Convert one row of `schema` to TRL's SFT format (see the module docstring).

    `prompt_format` is "chat_template" (conversational output, TRL applies the tokenizer's template) or "alpaca"
    (string prompt/completion with the Alpaca prompt; `system_prompt` is not used there, the Alpaca preamble plays
    its part). The schema's declaration (`trl_emo.data.schemas`) says which adapter applies (its `kind`) and where each
    field is (its `fields`); prompt/completion and text rows pass through unchanged.
    """
    declared = get_schema(schema)
    if declared.kind == INSTRUCTION:
        _check_prompt_format(prompt_format)
        instruction, input_, output = instruction_fields(row, schema)
        if prompt_format == "chat_template":
            prompt = with_system([{"role": "user", "content": user_content(instruction, input_)}], system_prompt)
            return {"prompt": prompt, "completion": [{"role": "assistant", "content": output}]}
        return {"prompt": alpaca_prompt(instruction, input_), "completion": alpaca_completion(output)}
    if declared.kind == CONVERSATION:
        _check_prompt_format(prompt_format)
        messages = clean_messages(read_field(row, declared, "messages"))
        if prompt_format == "chat_template":
            return {"messages": with_system(messages, system_prompt)}
        if any(weight != 1.0 for weight in message_weights(messages)):
            # The Alpaca prompt folds the turns into one prompt and one answer: no message is left to weigh.
            raise DataError(
                f"A {schema!r} row has per-message weights, which need the chat template (prompt_format chat_template): "
                "the Alpaca prompt folds the turns into one prompt and one answer."
            )
        try:
            instruction, input_, output = conversation_to_alpaca(messages)
        except ValueError as exc:
            raise DataError(f"Cannot render a {schema!r} row with the Alpaca prompt: {exc}") from None
        return {"prompt": alpaca_prompt(instruction, input_), "completion": alpaca_completion(output)}
    if declared.kind == PROMPT_COMPLETION:
        prompt, completion = read_field(row, declared, "prompt"), read_field(row, declared, "completion")
        if isinstance(prompt, list):
            prompt = with_system(clean_messages(prompt), system_prompt)
            completion = clean_messages(completion)
        return {"prompt": prompt, "completion": completion}
    if declared.kind == TEXT:
        return {"text": read_field(row, declared, "text")}
    if declared.kind == VERIFIABLE:
        raise DataError(
            f"Schema {schema!r} holds prompts with reference answers: use `format_verifiable_example` (GRPO)."
        )
    raise DataError(f"Schema {schema!r} holds preference pairs: use `format_preference_example` (DPO).")


def output_format(example: dict) -> str:
    """Which of `OUTPUT_FORMATS` a converted example is in."""
    if "text" in example:
        return "text"
    if "messages" in example:
        return "messages"
    return "conversational_prompt_completion" if isinstance(example["prompt"], list) else "prompt_completion"


def _is_conversation(value) -> bool:
    return isinstance(value, list) and bool(value) and isinstance(value[0], Mapping) and "role" in value[0]


def format_preference_example(row: dict, prompt_format: str, system_prompt: str | None = None) -> dict:
    """Convert one preference row to an explicit-prompt row {"prompt", "chosen", "rejected"} for TRL's DPOTrainer.

    Conversational `chosen`/`rejected` (UltraFeedback: full conversations, prompt turns included; a string `prompt`
    column next to them is only a copy of the first user turn and is dropped) become, with "chat_template", prompt =
    the turns shared before the last assistant turns, chosen/rejected = the rest (the last assistant turn); with
    "alpaca", the same split rendered as strings (`conversation_to_alpaca`). Conversations that start at the answer
    take their prompt from the `prompt` column (a string becomes a user turn). String rows pass through; without a
    `prompt`, the shared prefix of chosen and rejected is extracted, as TRL does.
    """
    _check_prompt_format(prompt_format)
    chosen, rejected = _field(row, "chosen", "preference"), _field(row, "rejected", "preference")
    prompt = row.get("prompt")
    if _is_conversation(chosen) and _is_conversation(rejected):
        chosen, rejected = clean_messages(chosen), clean_messages(rejected)
        try:
            chosen_context, _ = split_conversation(chosen)
            rejected_context, _ = split_conversation(rejected)
        except ValueError as exc:
            raise DataError(f"Invalid preference row: {exc}") from None
        if not chosen_context and not rejected_context:
            # The conversations start at the answer: the prompt comes from the `prompt` column.
            if prompt is None:
                raise DataError(
                    "Preference row without prompt: chosen/rejected hold only the answers and there is no `prompt`."
                )
            if isinstance(prompt, list):
                prompt_turns = clean_messages(prompt)
            else:
                prompt_turns = [{"role": "user", "content": prompt}]
        else:
            # The shared turns before the last answers are the prompt (as TRL's `extract_prompt`, but never eating
            # into an answer when chosen and rejected are identical).
            shared = 0
            limit = min(len(chosen_context), len(rejected_context))
            while shared < limit and chosen[shared] == rejected[shared]:
                shared += 1
            prompt_turns, chosen, rejected = chosen[:shared], chosen[shared:], rejected[shared:]
        if prompt_format == "chat_template":
            return {"prompt": with_system(prompt_turns, system_prompt), "chosen": chosen, "rejected": rejected}
        if len(chosen) != 1 or len(rejected) != 1:
            raise DataError(
                "Cannot render a preference row with the Alpaca prompt: chosen and rejected differ in more than their "
                "last assistant turn."
            )
        try:
            instruction, input_, _ = conversation_to_alpaca([*prompt_turns, chosen[0]])
        except ValueError as exc:
            raise DataError(f"Cannot render a preference row with the Alpaca prompt: {exc}") from None
        return {
            "prompt": alpaca_prompt(instruction, input_),
            "chosen": alpaca_completion(chosen[0]["content"]),
            "rejected": alpaca_completion(rejected[0]["content"]),
        }
    if isinstance(chosen, str) and isinstance(rejected, str):
        if isinstance(prompt, str):
            return {"prompt": prompt, "chosen": chosen, "rejected": rejected}
        from trl.data_utils import extract_prompt

        return extract_prompt({"chosen": chosen, "rejected": rejected})
    raise DataError(
        "Preference row with `chosen`/`rejected` of different kinds: both must be conversations or both strings."
    )


# The column of a GRPO row that holds the reference answer; the verifiable rewards (`trl_emo.evaluation.rewards`)
# receive it as their `answer` keyword (TRL passes every dataset column to a reward function by name).
REFERENCE_COLUMN = "answer"


def reference_text(value) -> str:
    """A reference answer as the text the rewards read: a string as it is, None as "" (no reference: the row is not
    scored), a number written out in plain decimals. A JSON `0.00001` arrives as the float 1e-05, whose `str` is
    "1e-05"; read back as a number, that would be 1."""
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return str(value)
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, Decimal):
        return format(value, "f")
    value = float(value)
    if not math.isfinite(value):
        return str(value)
    text = format(Decimal(repr(value)), "f")  # repr: the shortest decimal that reads back as this float
    return text[:-2] if text.endswith(".0") else text


def format_verifiable_example(row: dict, schema: str, prompt_format: str, system_prompt: str | None = None) -> dict:
    """Convert one row of a GRPO prompt set (kind `verifiable`) to TRL's GRPO format: `{"prompt", "answer"}`.

    The prompt is what the policy answers: with "chat_template", one user turn (after `system_prompt`), which TRL
    renders with the policy's chat template and its generation prompt; with "alpaca", the Alpaca prompt as a string.
    A conversational `prompt` column (schema `prompt_answer`) keeps its turns; a string `prompt` of your own becomes
    the user turn with "chat_template" and passes through as you wrote it with "alpaca". The answer is the reference as the dataset gives
    it (GSM8K's worked solution ending in `#### 72`, MATH's solution with its `\\boxed{}`; a number written out by
    `reference_text`): the rewards read the final answer out of it, so the dry run and the logs show what the data
    holds. A row without a reference (None or blank) keeps its prompt with the answer "": its completions are not
    scored (every built-in reward gives None), and `load_grpo_datasets` counts such rows in a warning.
    """
    declared = get_schema(schema)
    if declared.kind != VERIFIABLE:
        raise DataError(f"Schema {schema!r} has no reference answers (its rows are {declared.kind!r}); GRPO needs one.")
    _check_prompt_format(prompt_format)
    prompt, answer = read_field(row, declared, "prompt"), read_field(row, declared, "answer")
    answer = reference_text(answer)
    if not answer.strip():
        answer = ""
    if isinstance(prompt, list):
        turns = clean_messages(prompt)
        if prompt_format == "alpaca":  # the Alpaca preamble plays the system prompt's part, as in SFT
            try:
                instruction, input_ = instruction_and_input(turns)
            except ValueError as exc:
                raise DataError(f"Cannot render a {schema!r} prompt with the Alpaca prompt: {exc}") from None
            return {"prompt": alpaca_prompt(instruction, input_), REFERENCE_COLUMN: answer}
        return {"prompt": with_system(turns, system_prompt), REFERENCE_COLUMN: answer}
    prompt = "" if prompt is None else str(prompt)
    if not prompt.strip():
        raise DataError(f"A row of dataset schema {schema!r} has an empty prompt: {str(row)[:200]}")
    if prompt_format == "chat_template":
        turns = with_system([{"role": "user", "content": prompt}], system_prompt)
        return {"prompt": turns, REFERENCE_COLUMN: answer}
    if declared.name == "prompt_answer":
        return {"prompt": prompt, REFERENCE_COLUMN: answer}  # a string prompt of your own, as you wrote it
    return {"prompt": alpaca_prompt(prompt, ""), REFERENCE_COLUMN: answer}
