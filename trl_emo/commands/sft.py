"""`python -m trl_emo.sft --recipe FILE.yaml [--field value ...]`: supervised fine-tuning with any loss.

The same command runs under `accelerate launch` (one process, DDP, DeepSpeed, FSDP2; see
`recipes/accelerate/`). The recipe is a YAML mapping of fields of TRL's `ScriptArguments` and
`ModelConfig`, of `trl_emo.SFTConfig` and of `trl_emo.data.DataArguments`; command-line flags
override it. `--dry_run` prints the resolved configuration and three formatted training examples
(the masked part marked) and exits without loading the model.

In the shape of TRL's scripts (`trl/scripts/sft.py`): `make_parser(subparsers=None)` and `main(args)` on the parsed
command line; `run(argv)` does both and returns the exit status. The final configuration comes from
`trl_emo.commands.run_config.resolve_sft_run`.
"""

from __future__ import annotations

from .command_line import CommandLine, run_command
from .training_command import TrainingCommand, build_trainer, run_training

NAME = "trl_emo.sft"
HELP = """Supervised fine-tuning with any loss (loss_type: nll, dft, gem, emo, tailr, mixce, ce_entropy; see
`trl-emo losses`), through trl_emo.SFTTrainer. Runs under `accelerate launch -m trl_emo.sft` too.
--dry_run prints the resolved configuration and formatted training examples (the part without loss in « »)
and exits without loading the model; it needs no GPU."""


def make_parser(subparsers=None, prog: str | None = None):
    """The command's parser (`trl_emo.commands.parser.CommandParser`); with `subparsers`, registered there as `sft`."""
    from .parser import command_parser
    from .run_config import sft_dataclass_types

    return command_parser(
        sft_dataclass_types(), subparsers, name="sft", help="supervised fine-tuning with any loss",
        prog=prog or f"{NAME} (trl-emo sft)", description=HELP,
    )


def _build_trainer(sft_run):
    from ..training.trainer import SFTTrainer

    return build_trainer(SFTTrainer, sft_run, sft_run.model_args.model_name_or_path)


def _save(trainer, sft_run) -> None:
    from ..training.finish import save_outputs

    save_outputs(trainer, sft_run.training_args.output_dir)


def command() -> TrainingCommand:
    from .dry_run import print_sft_dry_run
    from .run_config import resolve_sft_run

    return TrainingCommand(NAME, resolve_sft_run, print_sft_dry_run, _build_trainer, _save,
                           describe=lambda run: f"loss_type={run.training_args.loss_type}", prompt_lengths=_prompt_lengths)


def _prompt_lengths(sft_run) -> list[int]:
    from ..training.trl_compat import prompt_token_counts

    return prompt_token_counts(sft_run.train_dataset, sft_run.tokenizer, sft_run.training_args)


def main(args: CommandLine) -> int:
    """Train (or, with `--dry_run`, print the final configuration and examples) from a parsed command line."""
    return run_training(command(), args)


def run(argv=None) -> int:
    """Parse `argv` (default: `sys.argv[1:]`), then `main`; the exit status (2 for a bad command line or data)."""
    return run_command(make_parser, main, argv, error_prefix=NAME, short_help=lambda: short_help("python -m trl_emo.sft"))


def short_help(prog: str) -> str:
    """The short `--help` (the options changed most; `--help-all` for every one), without importing TRL."""
    from .short_help import short_help as text

    return text("sft", prog)


if __name__ == "__main__":
    raise SystemExit(run())
