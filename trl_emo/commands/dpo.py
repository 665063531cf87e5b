"""`python -m trl_emo.dpo --recipe dpo_ultrafeedback --model_name_or_path <SFT output>`.

DPO with TRL's own `DPOTrainer` on top of an SFT run of `trl_emo.sft`, whether that run saved a
full model or a LoRA/QLoRA adapter. TRL's `DPOTrainer(model="<adapter folder>")` fails, and
training the SFT adapter further would make the *base* model the DPO reference. So an adapter is
first merged into its base model (saved once under `<output_dir>/sft-merged`), and DPO starts from
that merged SFT model: with `use_peft` the new adapter's disabled state is the SFT model, the
correct reference; without it TRL copies the SFT model as reference.

In the shape of TRL's scripts (`trl/scripts/dpo.py`): `make_parser(subparsers=None)` and `main(args)` on the parsed
command line; `run(argv)` does both. The final configuration comes from `trl_emo.commands.run_config.resolve_dpo_run`.
"""

from __future__ import annotations

import sys

from .command_line import CommandLine, check_parsed, run_command
from ..core.errors import ConfigError

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


def main(args: CommandLine) -> int:
    """Train with DPO (or, with `--dry_run`, print the final configuration and pairs) from a parsed command line."""
    from ..data import DataError
    from .dry_run import print_dpo_dry_run
    from ..core.errors import HubAccessError
    from ..core.hub import hub_errors
    from ..core.noise import quiet_optional_packages, release_for
    from ..training.finish import end_run
    from .run_config import resolve_dpo_run
    from ..models.sources import SourceError

    check_parsed(args, NAME)
    quiet_optional_packages()
    try:
        dpo_run = resolve_dpo_run(args)
        if dpo_run.run_args.dry_run:
            print_dpo_dry_run(dpo_run)
            return 0
    except (ConfigError, DataError, SourceError, FileNotFoundError, HubAccessError) as exc:
        print(f"{NAME}: error: {exc}", file=sys.stderr)
        return 2
    release_for(dpo_run.model_args, dpo_run.training_args)

    from trl import DPOTrainer

    try:
        # A checked Hub model can still fail here (offline, weights not cached although its config is).
        with hub_errors(dpo_run.hub_sources):
            trainer = DPOTrainer(
                model=dpo_run.policy,
                args=dpo_run.training_args,
                train_dataset=dpo_run.train_dataset,
                eval_dataset=dpo_run.eval_dataset,
                processing_class=dpo_run.tokenizer,
                **dpo_run.trainer_kwargs,
            )
    except HubAccessError as exc:
        print(f"{NAME}: error: {exc}", file=sys.stderr)
        return 2
    trainer.train(resume_from_checkpoint=dpo_run.training_args.resume_from_checkpoint)
    trainer.save_model(dpo_run.training_args.output_dir)
    trainer.accelerator.print(f"{NAME}: model saved to {dpo_run.training_args.output_dir} (started from {dpo_run.policy}).")
    end_run(trainer)
    return 0


def run(argv=None) -> int:
    """Parse `argv` (default: `sys.argv[1:]`), then `main`; the exit status (2 for a bad command line or data)."""
    return run_command(make_parser, main, argv, error_prefix=NAME)


if __name__ == "__main__":
    raise SystemExit(run())
