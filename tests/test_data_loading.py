import os

os.environ["HF_HUB_OFFLINE"] = "1"

import json
from types import SimpleNamespace

import pytest

from data_fixtures import write_fixture, write_fixture_file
from trl_emo.data import (
    DataArguments,
    DataError,
    DataPathError,
    load_dpo_datasets,
    load_sft_datasets,
    resolve_prompt_format,
    resolve_source,
)
from trl_emo.data.loading import looks_like_path
from trl_emo.models.tiny import train_tokenizer

CORPUS = ["Below is an instruction. Describe a red cat. Add the numbers 1 + 2 = 3."] * 4


@pytest.fixture(scope="module")
def chat_tokenizer():
    return train_tokenizer(CORPUS, vocab_size=300, chat_template=True)


@pytest.fixture(scope="module")
def base_tokenizer():
    return train_tokenizer(CORPUS, vocab_size=300, chat_template=False)


def script_args(name, train="train", test="test", config=None):
    # The fields of TRL's ScriptArguments that the loaders read.
    return SimpleNamespace(
        dataset_name=str(name), dataset_config=config, dataset_train_split=train, dataset_test_split=test
    )


# --- sources ---------------------------------------------------------------------------------------------------------


def test_hub_ids_and_paths_are_told_apart():
    assert not looks_like_path("vicgalle/alpaca-gpt4")
    assert not looks_like_path("HuggingFaceH4/ultrafeedback_binarized")
    assert resolve_source("meta-math/MetaMathQA").kind == "hub"
    for name in ("data/train.jsonl", "./x", "/abs/folder", "~/d.parquet", "a/b/c"):
        assert looks_like_path(name), name


def test_missing_path_is_a_file_not_found_error(tmp_path):
    with pytest.raises(DataPathError, match="Dataset path not found: .*nothing.jsonl") as info:
        resolve_source(str(tmp_path / "nothing.jsonl"))
    assert isinstance(info.value, FileNotFoundError) and isinstance(info.value, ValueError)


def test_unsupported_extension(tmp_path):
    path = tmp_path / "data.tsv"  # (.txt is read as plain text, one row per line)
    path.write_text("hello")
    with pytest.raises(DataError, match=r"Unsupported dataset file extension '.tsv'.*\.jsonl"):
        resolve_source(str(path))


def test_folder_without_data_files(tmp_path):
    (tmp_path / "README.md").write_text("no data")
    with pytest.raises(DataError, match="No dataset files found in folder"):
        resolve_source(str(tmp_path))


def test_hub_sharded_parquet_layout_is_understood(tmp_path):
    folder = tmp_path / "uf"
    for split in ("train_sft", "test_sft"):
        write_fixture_file("ultrafeedback", folder / "data" / f"{split}-00000-of-00001.parquet", n_rows=3, split=split)
    source = resolve_source(str(folder))
    assert sorted(source.split_files) == ["test_sft", "train_sft"]


# --- end to end: every schema, every file layout ---------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["jsonl", "json", "parquet", "disk"])
def test_ultrafeedback_sft_splits(tmp_path, fmt, chat_tokenizer):
    path = write_fixture("ultrafeedback", tmp_path, n_rows=6, fmt=fmt)
    args = script_args(path, "train_sft", "test_sft")
    train, evaluation, info = load_sft_datasets(args, DataArguments(), chat_tokenizer)
    assert train.column_names == ["messages"] and len(train) == 6 and len(evaluation) == 6
    assert "(test_sft)" in evaluation[0]["messages"][0]["content"]  # the eval rows come from the test split
    assert (info.schema, info.output_format, info.assistant_only_loss) == ("ultrafeedback", "messages", True)
    assert (info.train_split, info.eval_split, info.source, info.is_local) == ("train_sft", "test_sft", path, True)


@pytest.mark.parametrize(
    ("schema", "fmt"),
    [
        ("alpaca", "jsonl"),
        ("alpaca", "csv"),
        ("evol_instruct", "parquet"),
        ("metamath", "json"),
        ("magicoder", "disk"),
    ],
)
def test_instruction_schemas_both_prompt_formats(tmp_path, schema, fmt, chat_tokenizer, base_tokenizer):
    path = write_fixture(schema, tmp_path, n_rows=4, fmt=fmt)
    train, evaluation, info = load_sft_datasets(script_args(path), DataArguments(), chat_tokenizer)
    assert evaluation is None  # the Hub dataset has only `train`; a missing test split is not an error
    assert info.schema == schema and info.output_format == "conversational_prompt_completion"
    assert train.column_names == ["prompt", "completion"] and info.assistant_only_loss is False
    assert train[0]["prompt"][0]["role"] == "user" and train[0]["completion"][0]["role"] == "assistant"

    train, _, info = load_sft_datasets(script_args(path), DataArguments(), base_tokenizer)
    assert info.output_format == "prompt_completion" and info.prompt_format == "alpaca"
    assert train[0]["prompt"].startswith("Below is an instruction") and train[0]["prompt"].endswith("### Response:\n")


def test_csv_empty_input_reads_as_no_input(tmp_path, base_tokenizer):
    path = write_fixture("alpaca", tmp_path, n_rows=2, fmt="csv")
    train, _, _ = load_sft_datasets(script_args(path), DataArguments(), base_tokenizer)
    assert "### Input:" not in train[0]["prompt"] and "### Input:" in train[1]["prompt"]


def test_forced_prompt_format_overrides_the_template(tmp_path, chat_tokenizer, base_tokenizer):
    path = write_fixture("alpaca", tmp_path, n_rows=2)
    _, _, info = load_sft_datasets(script_args(path), DataArguments(prompt_format="alpaca"), chat_tokenizer)
    assert info.output_format == "prompt_completion"
    with pytest.raises(DataError, match="tokenizer has no chat template"):
        load_sft_datasets(script_args(path), DataArguments(prompt_format="chat_template"), base_tokenizer)


def test_resolve_prompt_format(chat_tokenizer, base_tokenizer):
    assert resolve_prompt_format("auto", chat_tokenizer) == "chat_template"
    assert resolve_prompt_format("auto", base_tokenizer) == "alpaca"
    assert resolve_prompt_format("alpaca", chat_tokenizer) == "alpaca"


def test_single_json_list_file_is_the_train_split(tmp_path, base_tokenizer):
    path = write_fixture_file("alpaca", tmp_path / "alpaca.json", n_rows=5)
    assert json.loads((tmp_path / "alpaca.json").read_text())[0]["instruction"]  # a JSON list, not JSON lines
    args = script_args(path, "train_sft", "test")
    train, evaluation, info = load_sft_datasets(args, DataArguments(), base_tokenizer)
    assert len(train) == 5 and evaluation is None and info.eval_split is None


def test_generic_schemas_pass_through(tmp_path, base_tokenizer, chat_tokenizer):
    path = write_fixture("prompt_completion", tmp_path, n_rows=3)
    train, evaluation, info = load_sft_datasets(script_args(path), DataArguments(), base_tokenizer)
    assert train[0] == {"prompt": "Q: Describe a red cat.\nA:", "completion": " The cat is red and it likes to play."}
    assert info.output_format == "prompt_completion" and info.prompt_format is None and len(evaluation) == 3
    path = write_fixture("text", tmp_path, n_rows=3)
    train, _, info = load_sft_datasets(script_args(path), DataArguments(), base_tokenizer)
    assert train.column_names == ["text"] and info.output_format == "text" and info.assistant_only_loss is False
    path = write_fixture("messages", tmp_path, n_rows=3)
    train, _, info = load_sft_datasets(script_args(path), DataArguments(), chat_tokenizer)
    assert info.output_format == "messages" and info.assistant_only_loss is True


def test_explicit_schema_is_validated(tmp_path, base_tokenizer):
    path = write_fixture("alpaca", tmp_path, n_rows=2)
    with pytest.raises(DataError) as info:
        load_sft_datasets(script_args(path), DataArguments(dataset_schema="metamath"), base_tokenizer)
    message = str(info.value)
    assert "Missing column 'query' for dataset schema 'metamath'" in message
    assert "Columns found: instruction (string), input (string), output (string), text (string)" in message


def test_max_samples_take_the_first_rows(tmp_path, chat_tokenizer):
    path = write_fixture("ultrafeedback", tmp_path, n_rows=6)
    args = DataArguments(max_train_samples=2, max_eval_samples=1)
    train, evaluation, info = load_sft_datasets(script_args(path, "train_sft", "test_sft"), args, chat_tokenizer)
    assert (len(train), len(evaluation), info.num_train, info.num_eval) == (2, 1, 2, 1)
    assert train[0]["messages"][0]["content"].startswith("Describe a red")  # row 0 of the fixture, not shuffled


def test_missing_train_split_lists_splits_and_hints(tmp_path, chat_tokenizer):
    path = write_fixture("ultrafeedback", tmp_path, n_rows=2)
    with pytest.raises(DataError) as info:
        load_sft_datasets(script_args(path, "train", "test"), DataArguments(), chat_tokenizer)
    message = str(info.value)
    assert "Split 'train' not found" in message
    assert "splits found: test_prefs, test_sft, train_prefs, train_sft" in message
    assert "dataset_train_split='train_sft'" in message


def test_missing_split_in_saved_dataset_dict(tmp_path, chat_tokenizer):
    path = write_fixture("messages", tmp_path, n_rows=2, fmt="disk")
    with pytest.raises(DataError, match="Split 'validation' not found .* splits found: train, test"):
        load_sft_datasets(script_args(path, "validation"), DataArguments(), chat_tokenizer)


def test_empty_dataset_is_an_error(tmp_path, chat_tokenizer):
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    with pytest.raises(DataError, match="is empty"):
        load_sft_datasets(script_args(path), DataArguments(), chat_tokenizer)


def test_missing_column_in_a_file(tmp_path, chat_tokenizer):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"query": "q", "type": "GSM"}) + "\n")
    with pytest.raises(DataError, match="Missing column 'response' for dataset schema 'metamath'"):
        load_sft_datasets(script_args(path), DataArguments(dataset_schema="metamath"), chat_tokenizer)
    with pytest.raises(DataError, match="Could not detect the dataset schema from its columns: query, type"):
        load_sft_datasets(script_args(path), DataArguments(), chat_tokenizer)


def test_preference_data_is_refused_for_sft(tmp_path, chat_tokenizer):
    path = write_fixture("preference", tmp_path, n_rows=2)
    with pytest.raises(DataError, match="DPO"):
        load_sft_datasets(script_args(path), DataArguments(dataset_schema="preference"), chat_tokenizer)


def test_streaming_is_refused(tmp_path, chat_tokenizer):
    args = script_args(write_fixture("alpaca", tmp_path, n_rows=2))
    args.dataset_streaming = True
    with pytest.raises(DataError, match="streaming"):
        load_sft_datasets(args, DataArguments(), chat_tokenizer)


# --- DPO -------------------------------------------------------------------------------------------------------------


def test_ultrafeedback_prefs_for_dpo(tmp_path, chat_tokenizer, base_tokenizer):
    path = write_fixture("ultrafeedback", tmp_path, n_rows=4, fmt="parquet")
    args = script_args(path, "train_prefs", "test_prefs")
    train, evaluation = load_dpo_datasets(args, DataArguments(), chat_tokenizer)
    assert train.column_names == ["prompt", "chosen", "rejected"] and len(evaluation) == 4
    assert train[0]["prompt"] == [{"role": "user", "content": "Describe a red cat."}]
    assert train[0]["chosen"] == [{"role": "assistant", "content": "The cat is red and it likes to play."}]
    assert train[0]["rejected"] == [{"role": "assistant", "content": "I do not know, maybe blue."}]

    train, _ = load_dpo_datasets(args, DataArguments(), base_tokenizer)
    assert isinstance(train[0]["prompt"], str) and train[0]["prompt"].endswith("### Response:\n")
    assert train[0]["chosen"] == "The cat is red and it likes to play."


def test_dpo_refuses_sft_only_data(tmp_path, chat_tokenizer):
    path = write_fixture("alpaca", tmp_path, n_rows=2)
    with pytest.raises(DataError, match="Could not detect"):
        load_dpo_datasets(script_args(path), DataArguments(), chat_tokenizer)
    with pytest.raises(DataError, match="no preference pairs"):
        load_dpo_datasets(script_args(path), DataArguments(dataset_schema="alpaca"), chat_tokenizer)


def test_generic_string_preference_file(tmp_path, base_tokenizer):
    path = write_fixture("preference", tmp_path, n_rows=3)
    train, evaluation = load_dpo_datasets(script_args(path), DataArguments(), base_tokenizer)
    assert train[0] == {
        "prompt": "Q: Describe a red cat.\nA:",
        "chosen": " The cat is red and it likes to play.",
        "rejected": " I do not know.",
    }
    assert len(evaluation) == 3


def test_malformed_file_names_the_file(tmp_path, chat_tokenizer):
    path = tmp_path / "broken.jsonl"
    path.write_text('{"instruction": "x", "output": \n')
    with pytest.raises(DataError, match="Could not read .*broken.jsonl"):
        load_sft_datasets(script_args(path), DataArguments(), chat_tokenizer)
