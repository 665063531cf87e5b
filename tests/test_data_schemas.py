import os

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest
from datasets import Dataset

from data_fixtures import FIXTURE_SCHEMAS, fixture_rows, write_jsonl
from trl_emo.data import SCHEMA_NAMES, SCHEMAS, DataArguments, DataError, detect_schema, validate_columns
from trl_emo.data.schemas import get_schema


def features_of(rows):
    return Dataset.from_list(rows).features


@pytest.mark.parametrize("schema", FIXTURE_SCHEMAS)
def test_auto_detection_on_each_schema(schema):
    split = "train_sft" if schema == "ultrafeedback" else "train"
    preference = schema == "preference"
    # `plain_text` is only chosen explicitly: a `text` column alone means TRL's pass-through `text`.
    expected = "text" if schema == "plain_text" else schema
    assert detect_schema(features_of(fixture_rows(schema, 2, split)), preference=preference) == expected


def test_hub_columns_of_the_fixtures_match_the_registry():
    # The fixtures must look like the Hub data: exactly the documented columns.
    for schema in FIXTURE_SCHEMAS:
        assert list(fixture_rows(schema, 1)[0]) == list(SCHEMAS[schema].hub_columns), schema


def test_detection_prefers_specific_schemas():
    # Alpaca-GPT4 also has `text`; UltraFeedback also has `prompt`.
    assert detect_schema({"instruction": 0, "input": 0, "output": 0, "text": 0}) == "alpaca"
    features = features_of(fixture_rows("ultrafeedback", 1))
    assert detect_schema(features) == "ultrafeedback"
    assert detect_schema(features, preference=True) == "ultrafeedback"
    assert detect_schema({"prompt": 0, "chosen": 0, "rejected": 0}, preference=True) == "preference"


def test_a_string_data_column_is_not_evol_instruct():
    assert detect_schema(features_of([{"data": "x", "text": "y"}])) == "text"


def test_undetectable_columns_list_found_and_expected():
    with pytest.raises(DataError) as info:
        detect_schema({"question": 0, "answer": 0})
    message = str(info.value)
    assert "answer, question" in message
    for name in ("alpaca", "evol_instruct", "ultrafeedback", "metamath", "magicoder"):
        assert f"'{name}'" in message
    assert "query (string), response (string)" in message


def test_preference_only_data_is_pointed_to_dpo():
    with pytest.raises(DataError, match="DPO"):
        detect_schema({"prompt": 0, "chosen": 0, "rejected": 0})


def test_missing_column_error_names_column_schema_and_found_columns():
    features = features_of([{"instruction": "x", "input": ""}])
    with pytest.raises(DataError) as info:
        validate_columns(features, "alpaca")
    message = str(info.value)
    assert "Missing column 'output'" in message
    assert "vicgalle/alpaca-gpt4" in message and "instruction (string)" in message
    assert "Columns found: instruction (string), input (string)" in message


def test_missing_nested_field_of_evol_instruct():
    features = features_of([{"data": {"instruction": "x", "input": ""}}])
    with pytest.raises(DataError, match=r"Missing field data.'output'"):
        validate_columns(features, "evol_instruct")


def test_wrong_column_type_is_reported():
    with pytest.raises(DataError, match="Column 'messages' must be messages .* found string"):
        validate_columns(features_of([{"messages": "not a list"}]), "messages")
    with pytest.raises(DataError, match="Column 'data' must be struct"):
        validate_columns(features_of([{"data": "flat"}]), "evol_instruct")


def test_optional_null_column_is_accepted():
    # An all-empty `input` column read from CSV has type null.
    features = features_of([{"instruction": "x", "input": None, "output": "y"}])
    validate_columns(features, "alpaca")


def test_unknown_schema_lists_valid_values():
    with pytest.raises(DataError, match="valid values: auto, alpaca"):
        get_schema("alpacca")


def test_data_arguments_defaults_and_validation():
    args = DataArguments()
    assert (args.dataset_schema, args.prompt_format, args.system_prompt) == ("auto", "auto", None)
    for schema in SCHEMA_NAMES:
        DataArguments(dataset_schema=schema)
    with pytest.raises(ValueError, match="Invalid dataset_schema 'alpacca'; valid values: auto, alpaca, evol_"):
        DataArguments(dataset_schema="alpacca")
    with pytest.raises(ValueError, match="Invalid prompt_format 'chatml'"):
        DataArguments(prompt_format="chatml")
    with pytest.raises(ValueError, match="max_train_samples must be a positive integer"):
        DataArguments(max_train_samples=0)


def test_data_arguments_parse_with_trl_parser(tmp_path):
    from trl import ScriptArguments, TrlParser

    recipe = tmp_path / "r.yaml"
    recipe.write_text("dataset_name: x.jsonl\ndataset_schema: metamath\nprompt_format: alpaca\nmax_train_samples: 5\n")
    script_args, data_args = TrlParser([ScriptArguments, DataArguments]).parse_args_and_config(
        args=["--config", str(recipe), "--system_prompt", "Be brief."]
    )
    assert script_args.dataset_name == "x.jsonl"
    assert (data_args.dataset_schema, data_args.prompt_format) == ("metamath", "alpaca")
    assert data_args.max_train_samples == 5
    assert data_args.system_prompt == "Be brief."
    bad = tmp_path / "bad.yaml"
    bad.write_text("dataset_schema: nope\n")
    with pytest.raises(ValueError, match="Invalid dataset_schema 'nope'"):
        TrlParser([ScriptArguments, DataArguments]).parse_args_and_config(args=["--config", str(bad)])


def test_an_instruction_schema_is_one_declaration(tmp_path):
    """A new instruction-style dataset (Dolly's columns) needs its `Schema` entry and nothing else: detection,
    validation, both prompt formats and the dry run's formatting follow from the declaration."""
    from types import SimpleNamespace

    from trl_emo.data import Column, Schema, load_sft_datasets, register_schema, unregister_schema
    from trl_emo.data.schemas import INSTRUCTION
    from trl_emo.models.tiny import train_tokenizer

    dolly = Schema(
        name="dolly",
        description="databricks-dolly-15k: instruction, optional context, response",
        kind=INSTRUCTION,
        fields={"input": "context", "output": "response"},
        columns=(Column("instruction"), Column("context", required=False), Column("response"), Column("category")),
        hub_id="databricks/databricks-dolly-15k",
        hub_columns=("instruction", "context", "response", "category"),
    )
    register_schema(dolly)
    try:
        rows = [{"instruction": "Name a colour.", "context": "", "response": "Red.", "category": "open_qa"},
                {"instruction": "Summarize.", "context": "Cats sleep a lot.", "response": "Cats nap.", "category": "summ"}]
        path = write_jsonl(tmp_path / "dolly.jsonl", rows)
        assert detect_schema(features_of(rows)) == "dolly"  # `auto` finds it from its declared columns
        DataArguments(dataset_schema="dolly")
        script = SimpleNamespace(dataset_name=str(path), dataset_config=None, dataset_train_split="train",
                                 dataset_test_split=None)
        for prompt_format, tokenizer in (("alpaca", None), ("chat_template", train_tokenizer(["a b c"] * 4, vocab_size=270))):
            train, _, info = load_sft_datasets(script, DataArguments(prompt_format=prompt_format), tokenizer)
            assert info.schema == "dolly"
            if prompt_format == "alpaca":
                assert train[1]["prompt"].endswith("### Instruction:\nSummarize.\n\n### Input:\nCats sleep a lot.\n\n### Response:\n")
                assert train[1]["completion"] == "Cats nap."
            else:
                assert train[1]["prompt"] == [{"role": "user", "content": "Summarize.\n\nCats sleep a lot."}]
                assert train[0]["completion"] == [{"role": "assistant", "content": "Red."}]
        with pytest.raises(DataError, match="Missing column 'response' for dataset schema 'dolly'"):
            validate_columns(features_of([{"instruction": "x", "category": "y"}]), "dolly")
    finally:
        unregister_schema("dolly")
    with pytest.raises(ValueError, match="not a declared column"):
        register_schema(Schema(name="broken", description="", kind=INSTRUCTION, columns=(Column("q"),),
                               fields={"instruction": "q", "output": "a"}))
