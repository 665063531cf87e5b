import os

os.environ["HF_HUB_OFFLINE"] = "1"

import json
from types import SimpleNamespace

from trl_emo.data import DataArguments, alpaca_prompt, alpaca_sample_path, load_sft_datasets
from trl_emo.data.make_samples import make_rows, render
from trl_emo.models.tiny import train_tokenizer


def read_sample():
    with open(alpaca_sample_path(), encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def test_bundled_sample_is_what_the_generator_writes():
    # If this fails, run `python -m trl_emo.data.make_samples` and commit the file.
    with open(alpaca_sample_path(), encoding="utf-8") as handle:
        assert handle.read() == render(make_rows())
    assert make_rows() == make_rows()  # deterministic


def test_the_chain_samples_are_what_their_generator_writes_in_the_hub_schemas():
    """`trl-emo demo --chain`'s samples: as `python -m trl_emo.data.chain_samples` writes them (run it and commit the
    files if this fails), in UltraFeedback's and GSM8K's schemas, every rejected answer wrong, no problem shared."""
    from trl_emo.data import chain_samples, gsm8k_sample_path, ultrafeedback_sample_path
    for path, content in chain_samples.make_files().items():
        assert path.read_text(encoding="utf-8") == content, path
    assert chain_samples.main(["--check"]) == 0
    prefs = [json.loads(line) for line in open(f"{ultrafeedback_sample_path()}/train_prefs.jsonl", encoding="utf-8")]
    assert set(prefs[0]) == {"prompt", "prompt_id", "chosen", "rejected", "messages", "score_chosen", "score_rejected"}
    assert all(r["chosen"][0] == r["rejected"][0] and r["chosen"][1] != r["rejected"][1] for r in prefs)
    problems = [json.loads(line) for line in open(f"{gsm8k_sample_path()}/train.jsonl", encoding="utf-8")]
    assert all(set(r) == {"question", "answer"} and "\n#### " in r["answer"] for r in problems)
    assert not {r["question"] for r in problems} & {r["prompt"] for r in prefs}


def test_bundled_sample_has_the_alpaca_gpt4_schema():
    rows = read_sample()
    assert 400 <= len(rows) <= 800
    assert os.path.getsize(alpaca_sample_path()) < 300_000
    assert all(list(row) == ["instruction", "input", "output", "text"] for row in rows)
    assert all(isinstance(value, str) and value != "" for row in rows for key, value in row.items() if key != "input")
    with_input = sum(1 for row in rows if row["input"]) / len(rows)
    assert 0.2 <= with_input <= 0.3
    # `text` is the full Alpaca example, as on the Hub.
    assert all(row["text"] == alpaca_prompt(row["instruction"], row["input"]) + row["output"] for row in rows)


def test_bundled_sample_has_open_ended_instructions():
    # Some instructions have several valid outputs, so that output diversity can be measured on the demo.
    outputs = {}
    for row in read_sample():
        outputs.setdefault((row["instruction"], row["input"]), set()).add(row["output"])
    assert sum(1 for answers in outputs.values() if len(answers) >= 2) >= 20


def test_bundled_sample_loads_and_prompts_are_token_prefixes():
    rows = read_sample()
    tokenizer = train_tokenizer([row["text"] for row in rows], vocab_size=512, chat_template=False)
    script_args = SimpleNamespace(
        dataset_name=alpaca_sample_path(), dataset_config=None, dataset_train_split="train", dataset_test_split="test"
    )
    train, evaluation, info = load_sft_datasets(script_args, DataArguments(), tokenizer)
    assert (info.schema, info.output_format, len(train)) == ("alpaca", "prompt_completion", len(rows))
    assert evaluation is None
    for example in train:
        prompt_ids = tokenizer(example["prompt"])["input_ids"]
        full_ids = tokenizer(example["prompt"] + example["completion"] + tokenizer.eos_token)["input_ids"]
        assert full_ids[: len(prompt_ids)] == prompt_ids
