"""The adapters' outputs go through TRL's own dataset preparation with the right tokens unmasked.

Builds `trl.SFTTrainer` / `trl.DPOTrainer` with a tiny model and checks `labels` (SFT) and the prompt/answer split
(DPO) token by token against what each path must train on: the response (+ EOS for string completions, + the
end-of-turn token for chat turns), nothing of the prompt.
"""

import os

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest
from datasets import Dataset

from data_fixtures import fixture_rows
from trl_emo.data import format_example, format_preference_example
from trl_emo.models.tiny import END_OF_TURN, build_tiny_model, train_tokenizer

trl = pytest.importorskip("trl")


@pytest.fixture(scope="module")
def corpus():
    texts = [row["text"] for row in fixture_rows("alpaca", 16)]
    return texts + [message["content"] for row in fixture_rows("ultrafeedback", 8) for message in row["rejected"]]


@pytest.fixture(scope="module")
def chat_tokenizer(corpus):
    return train_tokenizer(corpus, vocab_size=400, chat_template=True)


@pytest.fixture(scope="module")
def base_tokenizer(corpus):
    return train_tokenizer(corpus, vocab_size=400, chat_template=False)


def sft_trainer(tokenizer, rows, tmp_path, **config):
    args = trl.SFTConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, max_steps=1, report_to="none", **config)
    return trl.SFTTrainer(
        model=build_tiny_model(tokenizer), processing_class=tokenizer, train_dataset=Dataset.from_list(rows), args=args
    )


def ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def chat_ids(tokenizer, messages):
    """Token ids of `messages` rendered up to and including the next assistant header."""
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)[
        "input_ids"
    ]


def test_alpaca_path_trains_on_response_and_eos_only(tmp_path, base_tokenizer):
    rows = [format_example(row, "alpaca", "alpaca") for row in fixture_rows("alpaca", 4)]
    trainer = sft_trainer(base_tokenizer, rows, tmp_path)
    eos = base_tokenizer.eos_token
    for index, row in enumerate(rows):
        example = trainer.train_dataset[index]
        prompt_ids = ids(base_tokenizer, row["prompt"])
        response_ids = ids(base_tokenizer, row["completion"] + eos)
        # The prompt is a token prefix of prompt + completion (the whitespace rule), so the split is exact.
        assert example["input_ids"] == prompt_ids + response_ids
        assert example["labels"] == [-100] * len(prompt_ids) + response_ids
        assert base_tokenizer.decode([t for t in example["labels"] if t != -100]) == row["completion"] + eos


def test_chat_template_prompt_completion_masks_the_prompt(tmp_path, chat_tokenizer):
    source = fixture_rows("alpaca", 4)
    rows = [format_example(row, "alpaca", "chat_template", system_prompt="Be brief.") for row in source]
    trainer = sft_trainer(chat_tokenizer, rows, tmp_path)
    for index, row in enumerate(rows):
        example = trainer.train_dataset[index]
        prompt_ids = chat_ids(chat_tokenizer, row["prompt"])
        n_prompt = len(prompt_ids)
        assert example["input_ids"][:n_prompt] == prompt_ids
        assert example["labels"][:n_prompt] == [-100] * n_prompt
        trained = chat_tokenizer.decode(example["labels"][n_prompt:])
        # The response and its end-of-turn token (the template's trailing newline belongs to the completion too).
        assert trained == source[index]["output"] + END_OF_TURN + "\n"
        assert "Be brief." in chat_tokenizer.decode(example["input_ids"])


def test_ultrafeedback_messages_train_on_assistant_turns_only(tmp_path, chat_tokenizer):
    source = fixture_rows("ultrafeedback", 4, "train_sft")
    rows = [format_example(row, "ultrafeedback", "chat_template") for row in source]
    trainer = sft_trainer(chat_tokenizer, rows, tmp_path, assistant_only_loss=True)
    for index, row in enumerate(rows):
        example = trainer.train_dataset[index]
        messages = row["messages"]
        # Expected labels: each assistant turn's content + end-of-turn, everything else masked.
        expected = [-100] * len(example["input_ids"])
        for turn, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            start = len(chat_ids(chat_tokenizer, messages[:turn]))
            answer = ids(chat_tokenizer, message["content"] + END_OF_TURN)
            assert example["input_ids"][start : start + len(answer)] == answer
            expected[start : start + len(answer)] = answer
        assert example["labels"] == expected
    # Row 3 is multi-turn: both answers are trained, the user turn between them is not.
    trained = chat_tokenizer.decode([t for t in trainer.train_dataset[3]["labels"] if t != -100])
    assert trained == "3 + 6 = 9." + END_OF_TURN + "Short: 3 + 6 = 9." + END_OF_TURN


def test_ultrafeedback_without_chat_template_uses_the_completion_mask(tmp_path, base_tokenizer):
    rows = [format_example(row, "ultrafeedback", "alpaca") for row in fixture_rows("ultrafeedback", 4, "train_sft")]
    trainer = sft_trainer(base_tokenizer, rows, tmp_path)
    trained = base_tokenizer.decode([t for t in trainer.train_dataset[3]["labels"] if t != -100])
    assert trained == "Short: 3 + 6 = 9." + base_tokenizer.eos_token


@pytest.mark.parametrize("prompt_format", ["chat_template", "alpaca"])
def test_dpo_trainer_accepts_ultrafeedback_prefs(tmp_path, chat_tokenizer, base_tokenizer, prompt_format):
    tokenizer = chat_tokenizer if prompt_format == "chat_template" else base_tokenizer
    source = fixture_rows("ultrafeedback", 4, "train_prefs")
    rows = [format_preference_example(row, prompt_format) for row in source]
    args = trl.DPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, max_steps=1, report_to="none")
    trainer = trl.DPOTrainer(
        model=build_tiny_model(tokenizer),
        ref_model=build_tiny_model(tokenizer),
        processing_class=tokenizer,
        train_dataset=Dataset.from_list(rows),
        args=args,
    )
    end = END_OF_TURN + "\n" if prompt_format == "chat_template" else tokenizer.eos_token
    for index, row in enumerate(source):
        example = trainer.train_dataset[index]
        assert tokenizer.decode(example["chosen_ids"]) == row["chosen"][-1]["content"] + end
        assert tokenizer.decode(example["rejected_ids"]) == row["rejected"][-1]["content"] + end
        prompt = tokenizer.decode(example["prompt_ids"])
        assert row["chosen"][-1]["content"] not in prompt and row["chosen"][-2]["content"] in prompt
