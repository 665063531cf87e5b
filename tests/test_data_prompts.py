import os

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest

from trl_emo.data.prompts import alpaca_completion, alpaca_prompt, conversation_to_alpaca, split_conversation

# Written out by hand from ../shared/docs/datasets.md (not built from the module's constants).
WITH_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n"
    "\n"
    "### Instruction:\n"
    "Translate to French.\n"
    "\n"
    "### Input:\n"
    "Good morning\n"
    "\n"
    "### Response:\n"
)
WITHOUT_INPUT = (
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.\n"
    "\n"
    "### Instruction:\n"
    "Name a primary color.\n"
    "\n"
    "### Response:\n"
)


def test_alpaca_prompt_with_input_is_exact():
    assert alpaca_prompt("Translate to French.", "Good morning") == WITH_INPUT


def test_alpaca_prompt_without_input_is_exact():
    assert alpaca_prompt("Name a primary color.") == WITHOUT_INPUT
    assert alpaca_prompt("Name a primary color.", "") == WITHOUT_INPUT


@pytest.mark.parametrize("blank", [None, "   ", "\n"])
def test_blank_input_gives_the_no_input_prompt(blank):
    assert alpaca_prompt("Name a primary color.", blank) == WITHOUT_INPUT


def test_braces_in_fields_are_kept_verbatim():
    prompt = alpaca_prompt("Fill {x} in", "{instruction}")
    assert "### Instruction:\nFill {x} in\n\n### Input:\n{instruction}\n\n" in prompt


def test_completion_drops_leading_newlines_only():
    assert alpaca_completion("\n\nHello\n") == "Hello\n"
    assert alpaca_completion("  indented") == "  indented"
    assert alpaca_completion(None) == ""


def test_single_turn_conversation_is_a_plain_instruction():
    messages = [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}]
    assert conversation_to_alpaca(messages) == ("Hi?", "", "Hello.")


def test_multi_turn_conversation_puts_earlier_turns_in_the_input():
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "And of Italy?"},
        {"role": "assistant", "content": "Rome."},
    ]
    instruction, context, output = conversation_to_alpaca(messages)
    assert instruction == "And of Italy?"
    assert context == "System: Be brief.\n\nUser: Capital of France?\n\nAssistant: Paris."
    assert output == "Rome."


def test_turns_after_the_last_answer_are_dropped():
    messages = [
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "A"},
        {"role": "user", "content": "unanswered"},
    ]
    context, answer = split_conversation(messages)
    assert context == [{"role": "user", "content": "Q"}] and answer["content"] == "A"


def test_conversation_without_assistant_turn_is_an_error():
    with pytest.raises(ValueError, match="no assistant turn"):
        conversation_to_alpaca([{"role": "user", "content": "Q"}])
    with pytest.raises(ValueError, match="no user turn"):
        conversation_to_alpaca([{"role": "assistant", "content": "A"}])
