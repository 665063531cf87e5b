"""The commands in TRL's script shape: `make_parser(subparsers=None)` and `main(parsed args)`, the final configuration
resolved in one function (`trl_emo.commands.run_config`) and printed by `--dry_run`."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

from conftest import CORPUS
from data_fixtures import write_fixture
from trl_emo.commands import demo, dpo, grpo, sft
from trl_emo.commands import evaluate as eval_cli


@pytest.fixture(scope="module")
def dry_run_argv(tmp_path_factory):
    from trl_emo.models.tiny import save_tiny_causal_lm

    root = tmp_path_factory.mktemp("commands")
    model = save_tiny_causal_lm(CORPUS, output_dir=root / "chat", vocab_size=320, hidden_size=32, intermediate_size=64)
    return ["--recipe", "demo", "--model_name_or_path", model, "--dataset_name", write_fixture("alpaca", root),
            "--output_dir", str(root / "out"), "--chat_template_path", "", "--dry_run"]


def test_every_command_registers_in_a_parent_parser_like_trls_scripts(dry_run_argv, capsys):
    from trl_emo.commands.parser import CommandParser

    parser = argparse.ArgumentParser(prog="my-tool")
    subparsers = parser.add_subparsers(dest="command", parser_class=CommandParser)
    for module in (sft, dpo, grpo, eval_cli, demo):
        module.make_parser(subparsers)
    assert set(subparsers.choices) == {"sft", "dpo", "grpo", "eval", "demo"}
    args = subparsers.choices["sft"].parse_command_line(dry_run_argv)
    assert sft.main(args) == 0
    assert "# trl_emo.sft --dry_run: resolved configuration" in capsys.readouterr().out
    assert subparsers.choices["demo"].parse_args(["--quick"]).quick


def test_main_takes_the_parsed_command_line(dry_run_argv):
    with pytest.raises(TypeError, match=r"trl_emo.sft.run\(argv\)"):
        sft.main(dry_run_argv)


def test_the_final_configuration_is_resolved_in_one_place_and_printed(dry_run_argv, capsys):
    from trl_emo.commands.run_config import resolve_sft_run

    args = sft.make_parser().parse_command_line(dry_run_argv)
    _, training_args, _, _, _ = args.values
    assert training_args.chat_template_path == "" and training_args.model_init_kwargs is None  # as parsed
    run = resolve_sft_run(args)
    assert run.training_args.chat_template_path is None
    assert run.training_args.model_init_kwargs["dtype"] == run.model_args.dtype
    assert run.trainer_kwargs == {"quantization_config": None, "peft_config": None}
    # One parser, two command lines: the recipe of the first is not the default of the second.
    parser = sft.make_parser()
    assert parser.parse_command_line(dry_run_argv).values[3].prompt_format == "alpaca"  # the recipe's
    assert parser.parse_command_line(dry_run_argv[2:]).values[3].prompt_format == "auto"  # no recipe
    assert sft.run(dry_run_argv) == 0
    out = capsys.readouterr().out
    assert "model_init_kwargs:" in out and "prompt_format: alpaca" in out


# -- help, version, the chain ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("module, name", [(sft, "sft"), (dpo, "dpo"), (grpo, "grpo")])
def test_short_help_lists_the_options_changed_most_and_every_registered_loss(module, name, capsys):
    """`--help` is a page (the full list, ~1,000 lines, is `--help-all`); each option it names is one of the full
    parser's; sft's lists every registered loss, read from the registry's own source."""
    from trl_emo import get_loss, list_losses
    from trl_emo.commands import short_help

    assert dict(short_help.registered_losses()) == {name_: get_loss(name_).description for name_ in list_losses()}
    assert module.run(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: python -m trl_emo.{name} --recipe NAME|FILE.yaml") and len(out.splitlines()) < 60
    assert "trl-emo recipes" in out and "--help-all" in out
    if name == "sft":
        assert all(f"      {loss} " in out for loss in list_losses())
    full = {option for action in module.make_parser()._actions for option in action.option_strings}
    assert set(short_help.option_names(name)) - {"--recipe"} <= full
    with pytest.raises(SystemExit):  # argparse's own --help, as before
        module.make_parser().parse_args(["--help"])
    assert "--gradient_accumulation_steps" in capsys.readouterr().out
    assert module.run(["--help-all"]) == 0
    assert len(capsys.readouterr().out.splitlines()) > 200


def test_short_help_and_version_import_neither_torch_nor_trl():
    """What makes `--help` answer in a fraction of a second: nothing heavy is imported for it."""
    code = ("import sys; from trl_emo.commands import main; main.main(['sft', '--help']); main.main(['grpo', '-h']); "
            "print('heavy:', sorted(m for m in ('torch', 'trl', 'transformers') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip().endswith("heavy: []"), result.stdout[-500:] + result.stderr
    version = subprocess.run([sys.executable, "-m", "trl_emo.cli", "--version"], capture_output=True, text=True,
                             timeout=60)
    import trl_emo

    assert version.returncode == 0 and version.stdout.strip() == f"trl-emo {trl_emo.__version__}"


def test_the_chain_runs_every_stage_offline_on_the_bundled_samples(tmp_path):
    """`trl-emo demo --chain` (one loss, every stage at its smallest): SFT -> DPO -> a reward model built on the fly
    -> best-of-n under it -> GRPO on the GSM8K-style problems -> their evaluation, each through its command; every
    stage says what it ran and where its output is."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRL_EMO_CACHE": str(tmp_path / "cache")}
    result = subprocess.run([sys.executable, "-m", "trl_emo.cli", "demo", "--chain", "--quick", "--losses", "gem",
                             "--output_dir", str(tmp_path / "chain")], capture_output=True, text=True, env=env,
                            timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out, chain = result.stdout, tmp_path / "chain"
    for stage in ("1/6 SFT (gem): trl-emo sft --recipe demo", "2/6 DPO (after gem): trl-emo dpo --recipe demo_dpo",
                  "3/6 reward model: held-out pair accuracy", "4/6 best-of-n: trl-emo eval", "5/6 GRPO (after gem): "
                  "trl-emo grpo --recipe demo_grpo", "5/6 GRPO (after gem): mean reward", "6/6 evaluation: trl-emo eval"):
        assert f"[chain] {stage}" in out, stage
    for folder in ("sft-gem", "dpo-gem", "reward-model", "grpo-gem"):
        assert (chain / folder / "config.json").is_file(), folder
    best_of_n = json.loads((chain / "eval-best-of-n" / "summary.json").read_text())
    assert set(best_of_n["models"]) == {"sft-gem", "dpo-gem"} and "bon" in best_of_n["models"]["dpo-gem"]
    problems = json.loads((chain / "eval-gsm8k" / "summary.json").read_text())
    assert set(problems["models"]) == {"dpo-gem", "grpo-gem"}
    assert "greedy_accuracy" in json.dumps(problems["models"]["grpo-gem"])
    assert [row["step"] for row in json.loads((chain / "grpo-gem" / "trainer_state.json").read_text())["log_history"]
            if "reward" in row] == [1, 2]
    assert f"every stage's output is under {chain}/" in out
