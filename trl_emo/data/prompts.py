"""The prompt formats (`PROMPT_FORMATS`, shared by training and evaluation), the Alpaca prompt (exact wording of the
EMO paper / Stanford Alpaca) and how a conversation is rendered into it.

Whitespace rule: the prompt ends with "### Response:\\n" and the completion is the bare response. At inference, the
same `alpaca_prompt(...)` string is given to the model, which then writes the response directly; the text seen in
training (prompt + completion + EOS) is exactly the Hub's `text` column of Alpaca-GPT4 plus EOS. Ending the prompt on
the newline also keeps the tokenized prompt a token prefix of prompt + completion for the common tokenizers (a prompt
ending in "### Response:" followed by a completion starting with "\\n" is not one for Llama-3/Qwen tokenizers, which
merge ":\\n" into one token), so TRL's completion mask falls exactly on the response.
"""

from __future__ import annotations

import warnings

# How instructions are presented to the model, in training (`DataArguments.prompt_format`) and evaluation
# (`EvalConfig.prompt_format`): the tokenizer's chat template, the Alpaca prompt, or the first when the tokenizer has
# one (`resolve_prompt_format`).
PROMPT_FORMATS = ("auto", "chat_template", "alpaca")
# Older evaluation recipes spell the chat template "chat".
DEPRECATED_PROMPT_FORMATS = {"chat": "chat_template"}

ALPACA_PREAMBLE_WITH_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request."
)
ALPACA_PREAMBLE_NO_INPUT = (
    "Below is an instruction that describes a task. Write a response that appropriately completes the request."
)
ALPACA_PROMPT_WITH_INPUT = (
    ALPACA_PREAMBLE_WITH_INPUT + "\n\n### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
)
ALPACA_PROMPT_NO_INPUT = ALPACA_PREAMBLE_NO_INPUT + "\n\n### Instruction:\n{instruction}\n\n### Response:\n"


def check_prompt_format(value: str) -> str:
    """`value` if it is one of `PROMPT_FORMATS`; the new name of a deprecated one, with a warning; else a
    `ValueError` listing the valid values."""
    if value in DEPRECATED_PROMPT_FORMATS:
        new = DEPRECATED_PROMPT_FORMATS[value]
        warnings.warn(
            f"prompt_format {value!r} is deprecated: it is now called {new!r} in training and evaluation alike; "
            f"write prompt_format: {new}.",
            FutureWarning,
            stacklevel=3,
        )
        return new
    if value not in PROMPT_FORMATS:
        raise ValueError(f"Invalid prompt_format {value!r}; valid values: {', '.join(PROMPT_FORMATS)}.")
    return value


# Role names used when earlier turns of a conversation are rendered as the Alpaca `input`.
_ROLE_LABELS = {"system": "System", "user": "User", "assistant": "Assistant"}


def alpaca_prompt(instruction: str, input: str = "") -> str:  # noqa: A002 - the Alpaca field is called `input`
    """The Alpaca prompt for `instruction` (and `input` when it is not blank), ending with "### Response:\\n"."""
    instruction = "" if instruction is None else instruction
    if input is not None and input.strip():
        return ALPACA_PROMPT_WITH_INPUT.format(instruction=instruction, input=input)
    return ALPACA_PROMPT_NO_INPUT.format(instruction=instruction)


def alpaca_completion(output: str | None) -> str:
    """The completion paired with `alpaca_prompt`: the response without leading newlines.

    The prompt already ends with a newline; a response starting with another one would merge with it into a single
    token for some tokenizers, and the prompt would no longer be a token prefix of prompt + completion.
    """
    return ("" if output is None else output).lstrip("\r\n")


def render_turns(messages: list[dict]) -> str:
    """Render turns as "User: ...", "Assistant: ..." paragraphs (the Alpaca `input` of a multi-turn row)."""
    return "\n\n".join(
        f"{_ROLE_LABELS.get(message['role'], str(message['role']).capitalize())}: {message['content']}"
        for message in messages
    )


def split_conversation(messages: list[dict]) -> tuple[list[dict], dict]:
    """Split a conversation into (turns before the last assistant turn, last assistant turn).

    Turns after the last assistant turn (a trailing user message) are dropped: there is no response to train on.
    """
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].get("role") == "assistant":
            return list(messages[:index]), messages[index]
    roles = ", ".join(str(message.get("role")) for message in messages) or "(empty)"
    raise ValueError(f"The conversation has no assistant turn to train on (roles: {roles}).")


def user_content(instruction: str, input: str = "") -> str:  # noqa: A002
    """The user turn of an instruction row: the instruction, then the input after a blank line when there is one."""
    return f"{instruction}\n\n{input}" if input and input.strip() else instruction


def instruction_and_input(turns: list[dict]) -> tuple[str, str]:
    """A conversation's turns before the answer as an Alpaca (instruction, input): the last user turn is the
    instruction; any other turns (system prompt, previous exchanges) are the input, rendered as "Role: content"
    paragraphs in order, since the Alpaca input is "an input that provides further context"."""
    for index in range(len(turns) - 1, -1, -1):
        if turns[index].get("role") == "user":
            return turns[index]["content"], render_turns(turns[:index] + turns[index + 1 :])
    raise ValueError("The conversation has no user turn before its last assistant turn; it cannot be an instruction.")


def conversation_to_alpaca(messages: list[dict]) -> tuple[str, str, str]:
    """Map a conversation to Alpaca (instruction, input, output) for models without a chat template.

    Rule: the last assistant turn is the output, the turns before it give the instruction and the input
    (`instruction_and_input`). A single-turn conversation therefore gives the plain Alpaca prompt without input.
    """
    context, answer = split_conversation(messages)
    instruction, input_ = instruction_and_input(context)
    return instruction, input_, answer["content"]
