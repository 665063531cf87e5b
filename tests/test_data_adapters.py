import os

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest

from trl_emo.data import DataError, format_example, format_preference_example, output_format

ALPACA_NO_INPUT = (
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{}\n\n### Response:\n"
)
ALPACA_WITH_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further context. Write a "
    "response that appropriately completes the request.\n\n### Instruction:\n{}\n\n### Input:\n{}\n\n### Response:\n"
)

ALPACA_ROW = {"instruction": "Sum the numbers.", "input": "2 and 3", "output": "5", "text": "IGNORED"}
ALPACA_ROW_NO_INPUT = {"instruction": "Say hi.", "input": "", "output": "Hi!", "text": "IGNORED"}


def user(content):
    return {"role": "user", "content": content}


def assistant(content):
    return {"role": "assistant", "content": content}


# --- instruction schemas ---------------------------------------------------------------------------------------------


def test_alpaca_row_with_alpaca_prompt():
    assert format_example(ALPACA_ROW, "alpaca", "alpaca") == {
        "prompt": ALPACA_WITH_INPUT.format("Sum the numbers.", "2 and 3"),
        "completion": "5",
    }
    assert format_example(ALPACA_ROW_NO_INPUT, "alpaca", "alpaca") == {
        "prompt": ALPACA_NO_INPUT.format("Say hi."),
        "completion": "Hi!",
    }


def test_alpaca_row_with_chat_template():
    assert format_example(ALPACA_ROW, "alpaca", "chat_template") == {
        "prompt": [user("Sum the numbers.\n\n2 and 3")],
        "completion": [assistant("5")],
    }
    assert format_example(ALPACA_ROW_NO_INPUT, "alpaca", "chat_template") == {
        "prompt": [user("Say hi.")],
        "completion": [assistant("Hi!")],
    }


def test_system_prompt_only_with_the_chat_template():
    chat = format_example(ALPACA_ROW_NO_INPUT, "alpaca", "chat_template", system_prompt="Be kind.")
    assert chat["prompt"] == [{"role": "system", "content": "Be kind."}, user("Say hi.")]
    alpaca = format_example(ALPACA_ROW_NO_INPUT, "alpaca", "alpaca", system_prompt="Be kind.")
    assert "Be kind." not in alpaca["prompt"]


def test_the_text_column_is_not_used():
    row = dict(ALPACA_ROW_NO_INPUT, text="something else entirely")
    assert "something else" not in str(format_example(row, "alpaca", "alpaca"))


def test_alpaca_without_input_column_and_none_input():
    assert format_example({"instruction": "Say hi.", "output": "Hi!"}, "alpaca", "alpaca")["prompt"] == (
        ALPACA_NO_INPUT.format("Say hi.")
    )
    row = dict(ALPACA_ROW_NO_INPUT, input=None)
    assert format_example(row, "alpaca", "chat_template")["prompt"] == [user("Say hi.")]


def test_alpaca_completion_loses_leading_newlines():
    row = dict(ALPACA_ROW_NO_INPUT, output="\nHi!")
    assert format_example(row, "alpaca", "alpaca")["completion"] == "Hi!"


def test_evol_instruct_reads_the_nested_struct():
    row = {"data": {"instruction": "Explain X.", "input": "context", "output": "X is Y."}}
    assert format_example(row, "evol_instruct", "alpaca") == {
        "prompt": ALPACA_WITH_INPUT.format("Explain X.", "context"),
        "completion": "X is Y.",
    }
    assert format_example(row, "evol_instruct", "chat_template") == {
        "prompt": [user("Explain X.\n\ncontext")],
        "completion": [assistant("X is Y.")],
    }


def test_metamath_query_and_response():
    row = {"query": "What is 2+2?", "response": "2+2=4.\nThe answer is: 4", "type": "GSM_AnsAug"}
    assert format_example(row, "metamath", "alpaca") == {
        "prompt": ALPACA_NO_INPUT.format("What is 2+2?"),
        "completion": "2+2=4.\nThe answer is: 4",
    }
    assert format_example(row, "metamath", "chat_template")["completion"] == [assistant("2+2=4.\nThe answer is: 4")]


def test_magicoder_problem_and_solution():
    row = {"problem": "Write f.", "solution": "def f(): pass", "lang": "python", "seed": "", "index": 1}
    assert format_example(row, "magicoder", "chat_template") == {
        "prompt": [user("Write f.")],
        "completion": [assistant("def f(): pass")],
    }
    assert format_example(row, "magicoder", "alpaca")["prompt"] == ALPACA_NO_INPUT.format("Write f.")


# --- conversations ---------------------------------------------------------------------------------------------------

ULTRAFEEDBACK_ROW = {
    "prompt": "Hello?",
    "prompt_id": "abc",
    "chosen": [user("Hello?"), assistant("Hi there.")],
    "rejected": [user("Hello?"), assistant("Go away.")],
    "messages": [user("Hello?"), assistant("Hi there.")],
    "score_chosen": 9.0,
    "score_rejected": 2.0,
}


def test_ultrafeedback_with_chat_template_keeps_only_messages():
    assert format_example(ULTRAFEEDBACK_ROW, "ultrafeedback", "chat_template") == {
        "messages": [user("Hello?"), assistant("Hi there.")]
    }


def test_ultrafeedback_without_chat_template_is_alpaca_prompt_completion():
    assert format_example(ULTRAFEEDBACK_ROW, "ultrafeedback", "alpaca") == {
        "prompt": ALPACA_NO_INPUT.format("Hello?"),
        "completion": "Hi there.",
    }


def test_multi_turn_messages_without_chat_template():
    row = {"messages": [user("A?"), assistant("a."), user("B?"), assistant("b.")]}
    assert format_example(row, "messages", "alpaca") == {
        "prompt": ALPACA_WITH_INPUT.format("B?", "User: A?\n\nAssistant: a."),
        "completion": "b.",
    }


def test_messages_system_prompt_not_doubled():
    row = {"messages": [{"role": "system", "content": "S"}, user("A?"), assistant("a.")]}
    assert format_example(row, "messages", "chat_template", system_prompt="other")["messages"][0]["content"] == "S"
    row = {"messages": [user("A?"), assistant("a.")]}
    assert format_example(row, "messages", "chat_template", system_prompt="S2")["messages"][0] == {
        "role": "system",
        "content": "S2",
    }


def test_none_keys_added_by_arrow_are_dropped():
    row = {"messages": [{"role": "user", "content": "A?", "name": None}, assistant("a.")]}
    assert format_example(row, "messages", "chat_template")["messages"][0] == user("A?")


# --- generic pass-through --------------------------------------------------------------------------------------------


def test_generic_schemas_pass_through():
    assert format_example({"prompt": "P", "completion": "C", "x": 1}, "prompt_completion", None) == {
        "prompt": "P",
        "completion": "C",
    }
    assert format_example({"text": "T", "meta": 0}, "text", None) == {"text": "T"}


def test_output_format_names():
    assert output_format({"prompt": "p", "completion": "c"}) == "prompt_completion"
    assert output_format({"prompt": [user("p")], "completion": [assistant("c")]}) == "conversational_prompt_completion"
    assert output_format({"messages": []}) == "messages"
    assert output_format({"text": ""}) == "text"


# --- errors ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "row", "column"),
    [
        ("alpaca", {"instruction": "x", "input": ""}, "output"),
        ("alpaca", {"output": "x"}, "instruction"),
        ("evol_instruct", {"instruction": "x", "output": "y"}, "data"),
        ("evol_instruct", {"data": {"instruction": "x"}}, "data.output"),
        ("metamath", {"query": "x"}, "response"),
        ("magicoder", {"solution": "x"}, "problem"),
        ("ultrafeedback", {"chosen": []}, "messages"),
        ("prompt_completion", {"prompt": "x"}, "completion"),
        ("text", {"content": "x"}, "text"),
    ],
)
def test_missing_column_names_the_column_and_schema(schema, row, column):
    with pytest.raises(DataError) as info:
        format_example(row, schema, "alpaca")
    message = str(info.value)
    assert f"Missing column {column!r}" in message
    assert f"schema {schema!r}" in message
    assert "row has:" in message


def test_unresolved_prompt_format_is_rejected():
    with pytest.raises(DataError, match="resolved"):
        format_example(ALPACA_ROW, "alpaca", "auto")


# --- preference rows (DPO) -------------------------------------------------------------------------------------------


def test_ultrafeedback_preference_row_with_chat_template():
    # The string `prompt` column is dropped: the prompt is the shared user turn.
    assert format_preference_example(ULTRAFEEDBACK_ROW, "chat_template") == {
        "prompt": [user("Hello?")],
        "chosen": [assistant("Hi there.")],
        "rejected": [assistant("Go away.")],
    }


def test_ultrafeedback_preference_row_with_alpaca():
    assert format_preference_example(ULTRAFEEDBACK_ROW, "alpaca") == {
        "prompt": ALPACA_NO_INPUT.format("Hello?"),
        "chosen": "Hi there.",
        "rejected": "Go away.",
    }


def test_identical_chosen_and_rejected_keep_their_answers():
    row = {"chosen": [user("Q"), assistant("A")], "rejected": [user("Q"), assistant("A")]}
    assert format_preference_example(row, "chat_template") == {
        "prompt": [user("Q")],
        "chosen": [assistant("A")],
        "rejected": [assistant("A")],
    }


def test_explicit_prompt_with_answer_only_conversations():
    row = {"prompt": "Q", "chosen": [assistant("A")], "rejected": [assistant("B")]}
    assert format_preference_example(row, "chat_template")["prompt"] == [user("Q")]
    row = {"prompt": [user("Q")], "chosen": [assistant("A")], "rejected": [assistant("B")]}
    expected = {"prompt": ALPACA_NO_INPUT.format("Q"), "chosen": "A", "rejected": "B"}
    assert format_preference_example(row, "alpaca") == expected


def test_string_preference_rows():
    row = {"prompt": "Q:", "chosen": " yes", "rejected": " no"}
    assert format_preference_example(row, "alpaca") == row
    implicit = format_preference_example({"chosen": "Q: yes", "rejected": "Q: no"}, "alpaca")
    assert implicit["prompt"] + implicit["chosen"] == "Q: yes" and implicit["prompt"] + implicit["rejected"] == "Q: no"
    assert implicit["prompt"].startswith("Q:")


def test_mixed_preference_row_is_an_error():
    with pytest.raises(DataError, match="both must be conversations or both strings"):
        format_preference_example({"chosen": [user("Q"), assistant("A")], "rejected": "B"}, "chat_template")
