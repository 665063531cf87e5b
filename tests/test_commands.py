"""The commands in TRL's script shape: `make_parser(subparsers=None)` and `main(parsed args)`, the final configuration
resolved in one function (`trl_emo.commands.run_config`) and printed by `--dry_run`."""

from __future__ import annotations

import argparse

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
