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

import logging
import sys

from .command_line import CommandLine, check_parsed, run_command
from ..core.errors import ConfigError

logger = logging.getLogger("trl_emo.sft")

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


def main(args: CommandLine) -> int:
    """Train (or, with `--dry_run`, print the final configuration and examples) from a parsed command line."""
    from ..data import DataError
    from .dry_run import print_sft_dry_run
    from ..core.errors import HubAccessError
    from ..core.hub import hub_errors
    from ..core.noise import quiet_optional_packages, release_for
    from ..training.finish import end_run, save_outputs
    from .run_config import resolve_sft_run

    check_parsed(args, NAME)
    quiet_optional_packages()
    try:
        sft_run = resolve_sft_run(args)
        if sft_run.run_args.dry_run:
            print_sft_dry_run(sft_run)
            return 0
    except (ConfigError, DataError, FileNotFoundError, HubAccessError) as exc:
        print(f"{NAME}: error: {exc}", file=sys.stderr)
        return 2
    for note in sft_run.notes:
        logger.warning(note)
    release_for(sft_run.model_args, sft_run.training_args)

    from ..training.trainer import SFTTrainer

    try:
        # The checked ids can still fail here (offline, the weights of a model whose config alone is cached).
        with hub_errors(sft_run.hub_sources):
            trainer = SFTTrainer(
                model=sft_run.model_args.model_name_or_path,
                args=sft_run.training_args,
                train_dataset=sft_run.train_dataset,
                eval_dataset=sft_run.eval_dataset,
                processing_class=sft_run.tokenizer,
                **sft_run.trainer_kwargs,
            )
        trainer.train(resume_from_checkpoint=sft_run.training_args.resume_from_checkpoint)
    except HubAccessError as exc:  # EMO's cost embedding is loaded at the first step
        print(f"{NAME}: error: {exc}", file=sys.stderr)
        return 2
    save_outputs(trainer, sft_run.training_args.output_dir)
    trainer.accelerator.print(f"{NAME}: model saved to {sft_run.training_args.output_dir} (loss_type={sft_run.training_args.loss_type}).")
    if sft_run.training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=sft_run.script_args.dataset_name)
    end_run(trainer)
    return 0


def run(argv=None) -> int:
    """Parse `argv` (default: `sys.argv[1:]`), then `main`; the exit status (2 for a bad command line or data)."""
    return run_command(make_parser, main, argv, error_prefix=NAME)


if __name__ == "__main__":
    raise SystemExit(run())
