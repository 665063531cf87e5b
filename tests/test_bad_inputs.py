"""Every bad input of the training commands is one line naming the field, the value and the fix, exit status 2, no
traceback: a table of (command, what is wrong, the expected words), run in this process (each case stops before any
training; the few that need the trainer built load a tiny model)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from conftest import CORPUS
from data_fixtures import write_fixture

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    from trl_emo.models.tiny import save_tiny_causal_lm

    root = tmp_path_factory.mktemp("bad")
    model = save_tiny_causal_lm(CORPUS, output_dir=root / "chat", vocab_size=320, hidden_size=32, intermediate_size=64)
    no_config = root / "weights-only"
    no_config.mkdir()
    (no_config / "model.safetensors").write_bytes(b"")
    a_file = root / "a-file"
    a_file.write_text("x")
    recipe = root / "typo.yaml"
    recipe.write_text("lerning_rate: 0.1\nloss_type: gem\n")
    return {"model": model, "alpaca": write_fixture("alpaca", root, n_rows=8),
            "ultrafeedback": write_fixture("ultrafeedback", root, n_rows=8), "gsm8k": write_fixture("gsm8k", root),
            "no_config": str(no_config), "file": str(a_file), "recipe": str(recipe), "root": root}


def base(command, assets, out):
    common = ["--output_dir", str(out), "--max_steps", "1", "--use_cpu", "true", "--bf16", "false", "--report_to", "none"]
    if command == "sft":
        return ["--recipe", "demo", "--model_name_or_path", assets["model"], "--dataset_name", assets["alpaca"], *common]
    if command == "dpo":
        return ["--model_name_or_path", assets["model"], "--dataset_name", assets["ultrafeedback"],
                "--dataset_train_split", "train_prefs", "--dataset_test_split", "test_prefs", *common]
    return ["--model_name_or_path", assets["model"], "--dataset_name", assets["gsm8k"], "--cpu_keep_freed_memory",
            "false", *common]


# (command, case, the flags added, a function of the assets giving them, the words the error must hold)
CASES = [
    ("sft", "model folder without config.json", lambda a: ["--model_name_or_path", a["no_config"]],
     ["model_name_or_path: ", "is not a model folder: no config.json"]),
    ("sft", "model path that does not exist", lambda a: ["--model_name_or_path", str(a["root"] / "nope" / "model")],
     ["model_name_or_path: ", "nope/model not found"]),
    ("sft", "max_length cuts every completion", lambda a: ["--max_length", "8"],
     ["max_length=8 cuts the completion out of every one of the 8 training rows", "tokens long", "raise max_length"]),
    ("sft", "missing EMO cost embedding file", lambda a: ["--loss_type", "emo", "--emo_cost_embedding",
                                                          str(a["root"] / "cost.safetensors")],
     ["emo_cost_embedding: ", "cost.safetensors not found"]),
    ("sft", "missing ASFT reference folder", lambda a: ["--loss_type", "asft", "--asft_ref_model",
                                                        str(a["root"] / "refs" / "asft" / "model")],
     ["asft_ref_model: ", "refs/asft/model not found"]),
    ("sft", "missing EKSFT reference folder", lambda a: ["--loss_type", "eksft", "--eksft_ref_model", "./ref-model"],
     ["eksft_ref_model: ./ref-model not found"]),
    ("sft", "reference folder that is not a model", lambda a: ["--loss_type", "eksft", "--eksft_ref_model",
                                                               a["no_config"]],
     ["eksft_ref_model: ", "no config.json"]),
    ("sft", "missing SLM reference folder", lambda a: ["--loss_type", "slm", "--slm_ref_model", "./ref-model"],
     ["slm_ref_model: ./ref-model not found"]),
    ("sft", "threshold without the side it keeps", lambda a: ["--loss_type", "prob", "--prob_threshold", "0.3"],
     ["prob_threshold is set (0.3) but prob_only is null", "set prob_only to top or bottom"]),
    ("sft", "output_dir is a file", lambda a: ["--output_dir", a["file"]], ["output_dir: ", "is a file"]),
    ("sft", "unknown loss", lambda a: ["--loss_type", "gemm"], ["gemm"]),
    ("sft", "hyper-parameter out of range", lambda a: ["--loss_type", "gem", "--gem_beta", "-1"], ["gem_beta"]),
    ("sft", "flag missing its value", lambda a: ["--learning_rate"], ["--learning_rate", "expected one argument"]),
    ("sft", "value of the wrong type", lambda a: ["--max_steps", "many"], ["--max_steps", "invalid int value: 'many'"]),
    ("sft", "unknown flag", lambda a: ["--lerning_rate", "0.1"], ["unknown option(s): --lerning_rate (did you mean --learning_rate"]),
    ("sft", "unknown recipe key", lambda a: ["--recipe", a["recipe"]], ["lerning_rate", "did you mean"]),
    ("sft", "recipe not found", lambda a: ["--recipe", "no_such_recipe"], ["no_such_recipe"]),
    ("sft", "dataset not found", lambda a: ["--dataset_name", str(a["root"] / "nope.jsonl")], ["nope.jsonl"]),
    ("sft", "resume from a folder that does not exist", lambda a: ["--resume_from_checkpoint", str(a["root"] / "ck-9")],
     ["resume_from_checkpoint: checkpoint folder not found"]),
    ("dpo", "model folder without config.json", lambda a: ["--model_name_or_path", a["no_config"]],
     ["model_name_or_path: ", "no config.json"]),
    ("dpo", "flag missing its value", lambda a: ["--beta"], ["--beta", "expected one argument"]),
    ("dpo", "output_dir is a file", lambda a: ["--output_dir", a["file"]], ["output_dir: ", "is a file"]),
    ("dpo", "batch size 0", lambda a: ["--per_device_train_batch_size", "0"],
     ["per_device_train_batch_size must be at least 1, got 0"]),
    ("dpo", "loss the trainer does not know", lambda a: ["--loss_type", "sigmoidd"], ["loss_type: unknown DPO loss 'sigmoidd' (did you mean 'sigmoid'?)"]),
    ("dpo", "max_length cuts every completion", lambda a: ["--max_length", "4"],
     ["max_length=4 cuts the completion out of every one of the 8 training rows"]),
    ("grpo", "model folder without config.json", lambda a: ["--model_name_or_path", a["no_config"]],
     ["model_name_or_path: ", "no config.json"]),
    ("grpo", "reward_funcs without a value", lambda a: ["--reward_funcs"], ["--reward_funcs", "expected at least one"]),
    ("grpo", "unknown reward", lambda a: ["--reward_funcs", "gsm8k_anwser"], ["gsm8k_anwser", "did you mean"]),
    ("grpo", "one weight for two rewards", lambda a: ["--reward_funcs", "gsm8k_answer", "format", "--reward_weights",
                                                      "1.0"], ["reward_weights has 1 value(s) for 2"]),
    ("grpo", "no token to generate", lambda a: ["--max_completion_length", "0"],
     ["max_completion_length must be at least 1, got 0"]),
    ("grpo", "temperature 0", lambda a: ["--temperature", "0"], ["temperature must be above 0"]),
    ("grpo", "vLLM asked for, not installed", lambda a: ["--use_vllm", "true"], ["use_vllm: true needs vLLM"]),
    ("sft", "batch size 0", lambda a: ["--per_device_train_batch_size", "0"],
     ["per_device_train_batch_size must be at least 1, got 0"]),
    ("sft", "no gradient accumulation", lambda a: ["--gradient_accumulation_steps", "0"],
     ["gradient_accumulation_steps must be at least 1"]),
    ("sft", "LoRA rank 0", lambda a: ["--use_peft", "true", "--lora_r", "0"], ["lora_r must be at least 1, got 0"]),
    ("sft", "chat template file missing", lambda a: ["--chat_template_path", "/no/such/template.jinja"],
     ["chat_template_path: /no/such/template.jinja not found"]),
    ("grpo", "resume true without a checkpoint", lambda a: ["--resume_from_checkpoint", "true"],
     ["resume_from_checkpoint: true, but", "holds no complete checkpoint", "auto"]),
]

# Lines other than the error that the libraries print on stderr (progress bars of datasets).
NOISE = re.compile(r"^(Generating |Map|Formatting |Tokenizing |Adding EOS|Building labels|Truncating|Dropping|Loading|"
                   r"Writing|Applying chat|Extracting|\s*\d+%)")


@pytest.mark.parametrize("command, case, flags, words", CASES, ids=[f"{c}: {case}" for c, case, _, _ in CASES])
def test_a_bad_input_is_one_line_with_exit_status_2(assets, tmp_path, capsys, command, case, flags, words):
    module = importlib.import_module(f"trl_emo.commands.{command}")
    argv, extra = base(command, assets, tmp_path / "out"), flags(assets)
    if "--recipe" in extra:  # the case's recipe instead of the base one
        argv = argv[2:]
    code = module.run([*argv, *extra])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.strip().splitlines() if line.strip() and not NOISE.match(line)
             and "WARNING" not in line and not line.startswith("resume_from_checkpoint: ")]
    assert code == 2, err[-2000:]
    assert len(lines) == 1 and lines[0].startswith(f"trl_emo.{command}: error: "), lines
    for word in words:
        assert word in lines[0], (word, lines[0])


# -- GRPO (and DPO) after a LoRA SFT run: everything checked before the adapter is merged -----------------------------


@pytest.fixture(scope="module")
def sft_adapter(assets):
    from trl_emo.commands import sft

    out = assets["root"] / "sft-lora"
    argv = ["--recipe", "demo", "--model_name_or_path", assets["model"], "--dataset_name", assets["alpaca"],
            "--max_steps", "1", "--per_device_train_batch_size", "2", "--use_peft", "true", "--lora_target_modules",
            "all-linear", "--output_dir", str(out)]
    assert sft.run(argv) == 0
    return out


@pytest.mark.parametrize("command, flags, words", [
    ("grpo", ["--eval_strategy", "steps", "--dataset_test_split", "nope"], ["no 'nope' split"]),
    ("grpo", ["--dataset_name", "ALPACA"], ["Could not detect the dataset schema"]),
    ("dpo", ["--eval_strategy", "steps", "--dataset_test_split", "nope"], ["no 'nope' split"]),
])
def test_a_run_after_sft_fails_before_merging_the_adapter(assets, sft_adapter, tmp_path, capsys, command, flags, words):
    from trl_emo.commands.run_config import LEGACY_MERGED_DIR, MERGED_DIR

    module = importlib.import_module(f"trl_emo.commands.{command}")
    argv = [*base(command, assets, tmp_path / "out"), "--model_name_or_path", str(sft_adapter)]
    flags = [assets["alpaca"] if flag == "ALPACA" else flag for flag in flags]
    assert module.run([*argv, *flags]) == 2
    err = capsys.readouterr().err
    assert all(word in err for word in words), err[-1000:]
    for name in (MERGED_DIR, LEGACY_MERGED_DIR):  # the merge (minutes for an 8B model) never started
        assert not (tmp_path / "out" / name).exists()


def test_a_new_adapter_names_its_base_by_an_absolute_path(assets, tmp_path, monkeypatch):
    """`use_peft` from an SFT folder given relative to the current directory: the policy (which a new adapter records
    as its base) is absolute, so `trl-emo eval` finds it from anywhere."""
    from trl_emo.commands import grpo
    from trl_emo.commands.grpo_run import resolve_grpo_run

    monkeypatch.chdir(Path(assets["model"]).parent)
    argv = [*base("grpo", assets, tmp_path / "out"), "--model_name_or_path", Path(assets["model"]).name,
            "--use_peft", "true", "--dry_run", "true"]
    run = resolve_grpo_run(grpo.make_parser().parse_command_line(argv))
    assert run.policy == assets["model"] and Path(run.policy).is_absolute()
