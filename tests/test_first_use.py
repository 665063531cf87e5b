"""What a new user meets first: explicit flags kept, any chat template, --help, dry runs without a GPU, quiet output."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import CORPUS
from data_fixtures import write_fixture
from trl_emo.commands import main as cli, sft
from trl_emo.training.trl_compat import prepare_sft_examples
from trl_emo.commands.dry_run import MASK_CLOSE, MASK_OPEN

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tiny chat model whose template has `{% generation %}` markers, and the same model with a template
    without them that TRL cannot patch (it knows only the templates of published model families)."""
    from transformers import AutoTokenizer

    from trl_emo.models.tiny import CHAT_TEMPLATE, save_tiny_causal_lm

    root = tmp_path_factory.mktemp("first_use")
    chat = save_tiny_causal_lm(CORPUS, output_dir=root / "chat", vocab_size=320, hidden_size=32, intermediate_size=64)
    plain = save_tiny_causal_lm(CORPUS, output_dir=root / "plain", vocab_size=320, hidden_size=32, intermediate_size=64)
    tokenizer = AutoTokenizer.from_pretrained(plain)
    tokenizer.chat_template = CHAT_TEMPLATE.replace("{% generation %}", "").replace("{% endgeneration %}", "")
    tokenizer.save_pretrained(plain)
    return {
        "chat": chat,
        "plain": plain,
        "ultrafeedback": write_fixture("ultrafeedback", root),  # rows 3 and 7 have two assistant turns
        "single_turn": write_fixture("messages", root / "single", n_rows=3, splits=("train",)),
        "alpaca": write_fixture("alpaca", root),
    }


def _trained_text(out: str, example: int = 0) -> str:
    block = out.split(f"--- example {example}", 1)[1].split("\n", 1)[1].split("--- example", 1)[0]
    return "".join(part.split(MASK_CLOSE, 1)[-1] for part in block.split(MASK_OPEN))


# -- 1. an explicit flag wins ---------------------------------------------------------------------------------


def test_explicit_assistant_only_loss_false_is_kept(models, tmp_path, capsys):
    common = ["--recipe", "gem_ultrafeedback", "--model_name_or_path", models["chat"], "--chat_template_path", "",
              "--dataset_name", models["ultrafeedback"], "--output_dir", str(tmp_path), "--use_cpu", "true", "--dry_run"]
    assert sft.run([*common, "--assistant_only_loss", "false"]) == 0
    out = capsys.readouterr().out
    assert "assistant_only_loss=False" in out
    assert MASK_OPEN not in out.split("--- example 0", 1)[1]  # every token trained, the prompts included
    # Left unset (the recipe's `true` removed), the `messages` format still turns it on.
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text((ROOT / "recipes" / "gem_ultrafeedback.yaml").read_text().replace("assistant_only_loss: true\n", ""))
    assert sft.run([*common[2:], "--recipe", str(recipe)]) == 0
    out = capsys.readouterr().out
    assert "assistant_only_loss=True" in out and "Describe a red cat." not in _trained_text(out)


# -- 2. chat templates without generation markers ---------------------------------------------------------------


def test_the_fixture_template_is_one_trl_cannot_patch(models):
    from transformers import AutoTokenizer
    from trl.chat_template_utils import get_training_chat_template

    from trl_emo.data.chat_masking import template_masks_assistant_turns

    tokenizer = AutoTokenizer.from_pretrained(models["plain"])
    with pytest.raises(ValueError, match="patching is not supported"):
        get_training_chat_template(tokenizer)
    assert not template_masks_assistant_turns(tokenizer)
    assert template_masks_assistant_turns(AutoTokenizer.from_pretrained(models["chat"]))


def test_single_turn_conversations_train_with_the_prompt_masked(models, tmp_path, capsys):
    from datasets import Dataset
    from transformers import AutoTokenizer

    from trl_emo import SFTConfig
    from trl_emo.data.chat_masking import route_conversations

    tokenizer = AutoTokenizer.from_pretrained(models["plain"])
    rows = [{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"what is {i} plus 1?"},
                          {"role": "assistant", "content": f"The answer is {i + 1}."}]} for i in range(3)]
    train, _, routed = route_conversations(Dataset.from_list(rows), None, tokenizer)
    assert routed and set(train.column_names) == {"prompt", "completion"}
    args = SFTConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, activation_checkpointing=False, report_to="none")
    for row, prepared in zip(rows, prepare_sft_examples(train, tokenizer, args, 3)):
        ids, labels = prepared["input_ids"], prepared["labels"]
        prompt_ids = tokenizer.apply_chat_template(row["messages"][:-1], add_generation_prompt=True, tokenize=True,
                                                   return_dict=False)
        assert ids[: len(prompt_ids)] == prompt_ids
        assert all(label == -100 for label in labels[: len(prompt_ids)])  # system and user turns: no loss
        assert labels[len(prompt_ids):] == ids[len(prompt_ids):]  # the answer and its end-of-turn token: loss
        trained = tokenizer.decode(ids[len(prompt_ids):])
        assert trained.startswith(row["messages"][-1]["content"]) and "<|end|>" in trained

    # The command takes that route by itself, in a dry run and in training (TRL alone raises in __init__).
    argv = ["--recipe", "gem_ultrafeedback", "--model_name_or_path", models["plain"], "--chat_template_path", "",
            "--dataset_name", models["single_turn"], "--dataset_schema", "messages", "--dataset_train_split", "train",
            "--eval_strategy", "no", "--use_cpu", "true", "--bf16", "false",
            "--activation_checkpointing", "false", "--max_steps", "2", "--per_device_train_batch_size", "2",
            "--save_strategy", "no", "--output_dir", str(tmp_path / "out")]
    assert sft.run([*argv, "--dry_run"]) == 0
    out = capsys.readouterr().out
    assert "no {% generation %} markers" in out and "-> conversational_prompt_completion" in out
    assert _trained_text(out).strip() == "The cat is red and it likes to play.<|end|>"
    assert sft.run(argv) == 0
    assert (tmp_path / "out" / "model.safetensors").exists()


def test_multi_turn_conversations_fail_in_one_line_in_dry_run_and_training(models, tmp_path, capsys):
    argv = ["--recipe", "gem_ultrafeedback", "--model_name_or_path", models["plain"], "--chat_template_path", "",
            "--dataset_name", models["ultrafeedback"], "--use_cpu", "true", "--bf16", "false",
            "--output_dir", str(tmp_path)]
    def error_lines():  # stderr also holds the progress bars of the data preparation
        return [line for line in capsys.readouterr().err.splitlines() if "error" in line.lower()]

    assert sft.run([*argv, "--dry_run"]) == 2
    (dry,) = error_lines()
    assert sft.run(argv) == 2
    (training,) = error_lines()
    assert dry == training and dry.startswith("trl_emo.sft: error: ")
    assert "2 of 8 training conversations" in dry
    assert "--assistant_only_loss false" in dry and "--chat_template_path" in dry
    # Either fix works.
    assert sft.run([*argv, "--dry_run", "--assistant_only_loss", "false"]) == 0
    assert sft.run([*argv, "--dry_run", "--chat_template_path", models["chat"]]) == 0


# -- 4. --help ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["sft", "dpo", "eval", "demo", "losses", "recipes"])
def test_help_exits_0_for_every_command(command, capsys):
    try:
        status = cli.main([command, "--help"])
    except SystemExit as exc:  # argparse's way of finishing --help
        status = exc.code
    captured = capsys.readouterr()
    assert status in (0, None)
    assert "usage:" in captured.out and "error" not in captured.err.lower()


def test_trl_emo_help_lists_the_commands(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("sft", "dpo", "eval", "demo", "losses", "recipes", "--recipe NAME"))


def test_evaluate_module_help_exits_0():
    result = subprocess.run([sys.executable, "-m", "trl_emo.evaluate", "--help"], capture_output=True, text=True,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "--policies" in result.stdout and "error" not in result.stderr.lower()


# -- 5. dry runs need no GPU ---------------------------------------------------------------------------------


@pytest.fixture
def no_gpu(monkeypatch):
    """This machine as a CPU-only one, whatever it has."""
    import transformers.training_args

    import trl_emo.training.config

    monkeypatch.setattr(transformers.training_args, "is_torch_bf16_gpu_available", lambda: False)
    monkeypatch.setattr(trl_emo.training.config, "_has_bf16_accelerator", lambda: False)


def test_dry_run_of_a_bf16_recipe_needs_no_gpu(models, tmp_path, capsys, no_gpu):
    argv = ["--recipe", "emo_alpaca_gpt4", "--model_name_or_path", models["chat"], "--dataset_name", models["alpaca"],
            "--output_dir", str(tmp_path)]
    assert sft.run([*argv, "--dry_run"]) == 0
    out = capsys.readouterr().out
    assert "bf16: true" in out and "no GPU here" in out
    assert sft.run(argv) == 2  # training it is not possible here: one line that says what to do
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--bf16 false" in err


def test_bf16_false_on_the_command_line_trains_in_float32(models, tmp_path, capsys, no_gpu):
    """The advice of the line above works: `--bf16 false` loads the recipe's `dtype: bfloat16` model in float32 (and
    says so), unless `--dtype` is given too; a recipe's own `bf16: false` is left as written."""
    argv = ["--recipe", "emo_alpaca_gpt4", "--model_name_or_path", models["chat"], "--dataset_name", models["alpaca"],
            "--output_dir", str(tmp_path), "--dry_run", "--bf16", "false"]
    assert sft.run(argv) == 0
    out = capsys.readouterr().out
    assert "dtype: float32" in out and "bfloat16" not in out.split("model_init_kwargs:", 1)[1].split("\n\n", 1)[0]
    assert "--bf16 false: the model loads and trains in float32" in out
    assert sft.run([*argv, "--dtype", "bfloat16"]) == 0
    out = capsys.readouterr().out
    assert "dtype: bfloat16" in out and "--bf16 false: the model" not in out


def test_dpo_dry_run_of_a_bf16_recipe_needs_no_gpu(models, tmp_path, capsys, no_gpu):
    from trl_emo.commands import dpo

    argv = ["--recipe", "dpo_ultrafeedback", "--model_name_or_path", models["chat"], "--dataset_name",
            models["ultrafeedback"], "--output_dir", str(tmp_path), "--dry_run"]
    assert dpo.run(argv) == 0
    assert "--- pair 2 ---" in capsys.readouterr().out


# -- 6. quiet output ------------------------------------------------------------------------------------------

# bitsandbytes' missing-kernel notice, transformers' deprecated `gradient_checkpointing`, DeepSpeed's CPU fallback.
NOISE = ("kernels-community", "FutureWarning", "is deprecated", "Setting accelerator to CPU")


def test_a_command_prints_no_noise_from_unused_packages(models, tmp_path):
    """A paper recipe (activation checkpointing on, no quantization, no DeepSpeed) trained for one step in a fresh
    process: stdout and stderr hold no notice from bitsandbytes or DeepSpeed and no deprecation warning; `--bf16
    false` alone (the recipe says `dtype: bfloat16`) saves a float32 model; the package's own log lines show."""
    argv = [sys.executable, "-m", "trl_emo.sft", "--recipe", "gem_ultrafeedback", "--model_name_or_path", models["chat"],
            "--chat_template_path", "", "--dataset_name", models["ultrafeedback"], "--output_dir", str(tmp_path),
            "--use_cpu", "true", "--bf16", "false", "--max_steps", "1", "--eval_strategy", "no",
            "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "1", "--save_strategy", "no"]
    result = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    for noise in NOISE:
        assert noise not in result.stdout + result.stderr, result.stdout + result.stderr
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "float32"
    assert "(schema ultrafeedback" in result.stdout  # trl_emo's INFO line on the data, from the main process


def test_the_python_api_prints_no_noise_from_unused_packages():
    """The same notices held back in the Python API: importing `trl_emo.SFTTrainer` (which imports PEFT, which imports
    bitsandbytes) prints nothing."""
    code = "import trl_emo; trl_emo.SFTTrainer; import bitsandbytes, peft; print('ok')"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]
    for noise in NOISE:
        assert noise not in result.stderr, result.stderr


def test_an_empty_model_is_one_line(capsys):
    """`trl-emo demo --model "$(python -m trl_emo.real_model)"` when the real model is not installed: the inner
    command says what to install, and the empty --model is one line too, not a traceback."""
    from trl_emo.commands import demo

    assert demo.run(["--model", ""]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("trl-emo demo: error: --model is empty")


def test_the_deprecated_checkpointing_flag_still_overrides_the_recipe(models, tmp_path, capsys):
    argv = ["--recipe", "gem_ultrafeedback", "--model_name_or_path", models["chat"], "--chat_template_path", "",
            "--dataset_name", models["ultrafeedback"], "--output_dir", str(tmp_path), "--use_cpu", "true", "--dry_run"]
    assert sft.run(argv) == 0
    assert "activation_checkpointing: true" in capsys.readouterr().out  # the recipe's value
    for flag in (["--gradient_checkpointing", "false"], ["--gradient_checkpointing=false"], ["--no_gradient_checkpointing"],
                 ["--activation_checkpointing", "false"]):
        assert sft.run([*argv, *flag]) == 0
        out = capsys.readouterr().out
        assert "activation_checkpointing: false" in out and "gradient_checkpointing: false" in out, flag


def test_held_notices_come_back_when_the_run_uses_the_package(monkeypatch):
    import torch

    from trl_emo.core import noise

    seen = []

    class Collect(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    for package in list(noise._filters):  # a fresh start: earlier commands in this process installed the filters
        noise.release(package)
    name, text = noise.HELD_NOTICES["bitsandbytes"]
    logger = logging.getLogger(name)
    handler = Collect()
    logger.addHandler(handler)
    try:
        noise.quiet_optional_packages()
        logger.warning("Failed to load CPU gemm_4bit_forward from %s: no kernels", text)
        logger.warning("something else")
        assert seen == ["something else"]
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        noise.release_for(SimpleNamespace(load_in_4bit=False, load_in_8bit=False), SimpleNamespace(deepspeed=None))
        assert seen == ["something else"]  # no k-bit model: still held
        noise.release_for(SimpleNamespace(load_in_4bit=True, load_in_8bit=False), SimpleNamespace(deepspeed=None))
        assert seen[-1].startswith("Failed to load CPU gemm_4bit_forward")
        logger.warning("again from %s", text)
        assert seen[-1].startswith("again")
    finally:
        logger.removeHandler(handler)
        for package in list(noise._filters):
            noise.release(package)
