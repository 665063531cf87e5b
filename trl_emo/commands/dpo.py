"""`python -m trl_emo.dpo --recipe dpo_ultrafeedback --model_name_or_path <SFT output>`.

DPO with TRL's own `DPOTrainer` on top of an SFT run of `trl_emo.sft`, whether that run saved a
full model or a LoRA/QLoRA adapter. TRL's `DPOTrainer(model="<adapter folder>")` fails, and
training the SFT adapter further would make the *base* model the DPO reference. So an adapter is
first merged into its base model (saved once under `<output_dir>/_sft-merged`), and DPO starts from
that merged SFT model: with `use_peft` the new adapter's disabled state is the SFT model, the
correct reference; without it TRL copies the SFT model as reference.

In the shape of TRL's scripts (`trl/scripts/dpo.py`): `make_parser(subparsers=None)` and `main(args)` on the parsed
command line; `run(argv)` does both. The final configuration comes from `trl_emo.commands.run_config.resolve_dpo_run`.
"""

from __future__ import annotations

from .command_line import CommandLine, run_command
from .training_command import TrainingCommand, build_trainer, run_training

NAME = "trl_emo.dpo"
HELP = (
    "DPO with TRL's DPOTrainer on top of an SFT output of trl_emo.sft (a full model or a LoRA/QLoRA adapter, merged "
    "first).\n--dry_run prints the resolved configuration and preference pairs, without a model."
)


def make_parser(subparsers=None, prog: str | None = None):
    """The command's parser (`trl_emo.commands.parser.CommandParser`); with `subparsers`, registered there as `dpo`."""
    from .parser import command_parser
    from .run_config import dpo_dataclass_types

    return command_parser(
        dpo_dataclass_types(), subparsers, name="dpo", help="DPO on top of an SFT model or adapter",
        prog=prog or f"{NAME} (trl-emo dpo)", description=HELP,
    )


def _build_trainer(dpo_run):
    from trl import DPOTrainer

    from ..training.atomic_checkpoints import with_atomic_checkpoints

    return build_trainer(with_atomic_checkpoints(DPOTrainer), dpo_run, dpo_run.policy)


def _save(trainer, dpo_run) -> None:
    trainer.save_model(dpo_run.training_args.output_dir)


def command() -> TrainingCommand:
    from .dry_run import print_dpo_dry_run
    from .run_config import resolve_dpo_run

    return TrainingCommand(NAME, resolve_dpo_run, print_dpo_dry_run, _build_trainer, _save,
                           describe=lambda run: f"started from {run.policy}")


def main(args: CommandLine) -> int:
    """Train with DPO (or, with `--dry_run`, print the final configuration and pairs) from a parsed command line."""
    return run_training(command(), args)


def run(argv=None) -> int:
    """Parse `argv` (default: `sys.argv[1:]`), then `main`; the exit status (2 for a bad command line or data)."""
    return run_command(make_parser, main, argv, error_prefix=NAME, short_help=lambda: short_help("python -m trl_emo.dpo"))


def short_help(prog: str) -> str:
    """The short `--help` (the options changed most; `--help-all` for every one), without importing TRL."""
    from .short_help import short_help as text

    return text("dpo", prog)


if __name__ == "__main__":
    raise SystemExit(run())
