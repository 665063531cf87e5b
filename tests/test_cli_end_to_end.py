"""The commands end to end on a tiny model: every loss from a recipe, QLoRA, SFT -> DPO, demo (kills and resumes, and
the DDP launch of `-m trl_emo.sft`: test_faults.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import CORPUS
from data_fixtures import write_fixture
from trl_emo.commands import main as cli, dpo, sft

ROOT = Path(__file__).resolve().parent.parent
DEMO_RECIPE = str(ROOT / "recipes" / "demo.yaml")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from trl_emo.models.tiny import save_tiny_causal_lm

    root = tmp_path_factory.mktemp("e2e")
    return {
        "chat": save_tiny_causal_lm(CORPUS, output_dir=root / "chat", vocab_size=320, hidden_size=64, intermediate_size=128),
        "alpaca": write_fixture("alpaca", root, n_rows=16),
        "ultrafeedback": write_fixture("ultrafeedback", root, n_rows=16),
    }


def short(tmp_path, **extra):
    args = ["--max_steps", "2", "--per_device_train_batch_size", "4", "--logging_steps", "1", "--output_dir", str(tmp_path)]
    for key, value in extra.items():
        args += [f"--{key}", str(value)]
    return args


def final_state(output_dir) -> dict:
    checkpoints = sorted(Path(output_dir).glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    return json.loads((checkpoints[-1] / "trainer_state.json").read_text())


@pytest.mark.parametrize("loss_type", ["nll", "dft", "gem", "emo", "tailr", "mixce", "ce_entropy", "sed", "eksft", "prob",
                                       "iw_sft", "gift", "slm"])
def test_sft_with_each_loss_from_a_recipe(tmp_path, tiny, loss_type):
    from transformers import AutoModelForCausalLM

    argv = ["--recipe", DEMO_RECIPE, "--model_name_or_path", tiny["chat"], "--dataset_name", tiny["alpaca"],
            "--loss_type", loss_type, *short(tmp_path / "out")]
    assert sft.run(argv) == 0
    model, info = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"), output_loading_info=True)
    assert not info["unexpected_keys"] and not info["missing_keys"]


def test_qlora_recipe_trains_on_cpu(tmp_path, tiny):
    argv = ["--recipe", str(ROOT / "recipes" / "gem_ultrafeedback_qlora.yaml"), "--model_name_or_path", tiny["chat"],
            "--chat_template_path", "", "--dataset_name", tiny["ultrafeedback"], "--use_cpu", "true", "--bf16", "false",
            "--dtype", "float32", "--gradient_checkpointing", "false", "--gradient_accumulation_steps", "1",
            "--eval_strategy", "no", "--save_strategy", "steps", "--save_steps", "2", *short(tmp_path / "out")]
    assert sft.run(argv) == 0
    out = tmp_path / "out"
    assert (out / "adapter_config.json").exists() and (out / "generation_config.json").exists()
    assert final_state(out)["global_step"] == 2


def test_resume_from_a_missing_checkpoint_is_a_clear_error(tmp_path, tiny, capsys):
    argv = ["--recipe", DEMO_RECIPE, "--model_name_or_path", tiny["chat"], "--dataset_name", tiny["alpaca"],
            "--resume_from_checkpoint", str(tmp_path / "checkpoint-9"), *short(tmp_path / "out")]
    assert sft.run(argv) == 2
    assert "checkpoint folder not found" in capsys.readouterr().err


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_sft_then_dpo(tmp_path, tiny, lora):
    from transformers import GenerationConfig

    sft_out = tmp_path / "sft"
    extra = ["--use_peft", "true", "--lora_target_modules", "all-linear"] if lora else []
    argv = ["--recipe", DEMO_RECIPE, "--model_name_or_path", tiny["chat"], "--dataset_name", tiny["ultrafeedback"],
            "--dataset_train_split", "train_sft", "--dataset_test_split", "test_sft", "--dataset_schema", "ultrafeedback",
            "--prompt_format", "auto", "--loss_type", "gem", *extra, *short(sft_out)]
    assert sft.run(argv) == 0
    assert (sft_out / "adapter_config.json").exists() == lora
    eos = GenerationConfig.from_pretrained(str(sft_out)).eos_token_id
    assert 7 in (eos if isinstance(eos, list) else [eos])  # <|end|>, the tiny template's end of turn

    dpo_out = tmp_path / "dpo"
    argv = ["--recipe", str(ROOT / "recipes" / "dpo_ultrafeedback.yaml"), "--model_name_or_path", str(sft_out),
            "--dataset_name", tiny["ultrafeedback"], "--use_cpu", "true", "--bf16", "false", "--dtype", "float32",
            "--gradient_checkpointing", "false", "--eval_strategy", "no", "--gradient_accumulation_steps", "1",
            "--learning_rate", "1e-4", "--report_to", "none", *extra, *short(dpo_out)]
    assert dpo.run(argv) == 0
    state = final_state(dpo_out)
    assert state["global_step"] == 2
    assert any("rewards/margins" in row for row in state["log_history"])
    assert (dpo_out / "_sft-merged").exists() == lora


def test_console_script_dispatch(capsys):
    assert cli.main(["losses"]) == 0
    listing = capsys.readouterr().out
    for name in ("gem", "emo", "tailr", "mixce", "ce_entropy", "eaft", "asft", "sed", "eksft", "dft"):
        assert name in listing
    assert cli.main(["frobnicate"]) == 2


def test_demo_runs_offline_and_prints_the_comparison(tmp_path, capsys):
    from trl_emo.commands import demo

    assert demo.run(["--output_dir", str(tmp_path), "--max_steps", "3", "--num_prompts", "2", "--samples_per_prompt", "2",
                      "--max_new_tokens", "8"]) == 0
    out = capsys.readouterr().out
    assert "held-out cross-entropy" in out and "nll" in out and "gem" in out
    summary = json.loads((tmp_path / "summary.json").read_text())
    for loss in ("nll", "gem"):
        values = summary["results"][loss]
        assert torch.isfinite(torch.tensor(values["held_out_cross_entropy"]))
        assert 0 <= values["ngram_diversity"] <= 100
    # A second run reuses the finished trainings.
    assert demo.run(["--output_dir", str(tmp_path), "--max_steps", "3", "--num_prompts", "2", "--samples_per_prompt", "2",
                      "--max_new_tokens", "8"]) == 0
    assert "reusing the finished run" in capsys.readouterr().out


def test_demo_fine_tunes_a_pretrained_model_with_lora_beside_the_untrained_one(tmp_path, capsys):
    """`--model`: the `demo_pretrained` recipe (LoRA, the model's chat template), and a `base` column."""
    from conftest import CORPUS
    from trl_emo.commands import demo
    from trl_emo.models.tiny import save_tiny_causal_lm

    model = save_tiny_causal_lm(CORPUS, output_dir=tmp_path / "pretrained", vocab_size=320, hidden_size=32,
                                intermediate_size=64)
    out = tmp_path / "demo"
    assert demo.run(["--model", model, "--quick", "--output_dir", str(out)]) == 0
    printed = capsys.readouterr().out
    header = [line.split() for line in printed.splitlines() if line.split()[-3:] == ["base", "nll", "gem"]]
    assert header, printed  # the table's header: the untrained model's column first
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["results"]) == ["base", "nll", "gem"] and summary["model"] == model
    for loss in ("nll", "gem"):
        assert (out / loss / "adapter_config.json").is_file()  # LoRA, from the recipe
        assert summary["results"][loss]["held_out_cross_entropy"] != summary["results"]["base"]["held_out_cross_entropy"]
    assert summary["training_seconds"]["base"] is None


def test_demo_model_errors_are_one_line(tmp_path, capsys):
    from trl_emo.commands import demo

    assert demo.run(["--model", "nobody/not-cached-model", "--quick", "--output_dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--model: 'nobody/not-cached-model'" in err[0] and "HF_HUB_OFFLINE" in err[0]
    assert demo.run(["--model", str(tmp_path / "missing.gguf"), "--quick", "--output_dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "GGUF file not found" in err[0]
