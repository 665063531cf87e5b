"""`python -m trl_emo.grpo --recipe grpo_gsm8k --model_name_or_path <SFT output>`.

GRPO with TRL's own `GRPOTrainer` and verifiable rewards on top of an SFT run of `trl_emo.sft`, whether that run
saved a full model or a LoRA/QLoRA adapter. An adapter is first merged into its base model (saved once under
`<output_dir>/sft-merged`, as `trl_emo.dpo` does), and GRPO trains that merged SFT model further: fully, or through a
new adapter with `use_peft`. The policy keeps the SFT model's chat template. The rewards (`reward_funcs`, weighted by
`reward_weights`) are the answer checks of `trl-emo eval` (`trl_emo.evaluation.rewards`) or functions of yours by
import path. Everything TRL logs is kept: reward and its std, each reward's mean, completion lengths, entropy.

In the shape of TRL's scripts (`trl/scripts/grpo.py`): `make_parser(subparsers=None)` and `main(args)` on the parsed
command line; `run(argv)` does both. The final configuration comes from `trl_emo.commands.grpo_run.resolve_grpo_run`.
"""

from __future__ import annotations

import logging
import sys

from .command_line import CommandLine, check_parsed, run_command
from ..core.errors import ConfigError

logger = logging.getLogger("trl_emo.grpo")

NAME = "trl_emo.grpo"
HELP = (
    "GRPO with TRL's GRPOTrainer and verifiable rewards (gsm8k_answer, math_answer, format, or package.module:function "
    "of yours) on top of an SFT output of trl_emo.sft (a full model or a LoRA/QLoRA adapter, merged first).\n"
    "Runs under `accelerate launch -m trl_emo.grpo` too. --dry_run prints the resolved configuration and prompts with "
    "their reference answers, without a model."
)


def one_line(exc: BaseException) -> str:
    """An error's message on one line (an unknown recipe key's or a missing dataset column's message spans several)."""
    return " ".join(line.strip() for line in str(exc).splitlines() if line.strip())


def make_parser(subparsers=None, prog: str | None = None):
    """The command's parser (a `trl_emo.commands.parser.CommandParser` whose errors are one line); with `subparsers`,
    registered there as `grpo`."""
    from .grpo_run import grpo_dataclass_types
    from .parser import CommandParser, command_parser

    class GRPOParser(CommandParser):
        def parse_command_line(self, argv=None):
            try:
                return super().parse_command_line(argv)
            except ConfigError as exc:
                raise ConfigError(one_line(exc)) from exc

    kwargs = dict(prog=prog or f"{NAME} (trl-emo grpo)", description=HELP)
    if subparsers is not None:  # the parent's parser class, as TRL's scripts register theirs
        return command_parser(grpo_dataclass_types(), subparsers, name="grpo", help=HELP.split(" (")[0], **kwargs)
    return GRPOParser(grpo_dataclass_types(), **kwargs)


def main(args: CommandLine) -> int:
    """Train with GRPO (or, with `--dry_run`, print the final configuration and prompts) from a parsed command line."""
    from ..core.errors import HubAccessError
    from ..core.hub import hub_errors
    from ..core.noise import quiet_optional_packages, release_for
    from ..data import DataError
    from ..models.sources import SourceError
    from ..training.finish import end_run, save_outputs
    from .dry_run import print_grpo_dry_run
    from .grpo_run import resolve_grpo_run

    check_parsed(args, NAME)
    quiet_optional_packages()
    try:
        grpo_run = resolve_grpo_run(args)
        if grpo_run.run_args.dry_run:
            print_grpo_dry_run(grpo_run)
            return 0
    except (ConfigError, DataError, SourceError, FileNotFoundError, HubAccessError) as exc:
        print(f"{NAME}: error: {one_line(exc)}", file=sys.stderr)
        return 2
    for note in grpo_run.notes:
        logger.warning(note)
    release_for(grpo_run.model_args, grpo_run.training_args)
    if grpo_run.grpo_args.cpu_keep_freed_memory and grpo_run.training_args.device.type == "cpu":
        from .cpu_memory import keep_freed_memory

        # Before the model is loaded: every allocation that follows is served the kept way.
        if keep_freed_memory():
            logger.warning("CPU: glibc keeps the memory a step frees for the next one (cpu_keep_freed_memory; "
                           "docs/benchmarks.md, GRPO step time)")
        else:
            logger.warning("CPU: cpu_keep_freed_memory had no effect (glibc's mallopt is not available or refused "
                           "the settings); steps fault their buffers in again, a few seconds each.")

    from trl import GRPOTrainer

    try:
        # A checked Hub model can still fail here (offline, weights not cached although its config is).
        with hub_errors(grpo_run.hub_sources):
            trainer = GRPOTrainer(
                model=grpo_run.policy,
                reward_funcs=grpo_run.reward_funcs,
                args=grpo_run.training_args,
                train_dataset=grpo_run.train_dataset,
                eval_dataset=grpo_run.eval_dataset,
                processing_class=grpo_run.tokenizer,
                **grpo_run.trainer_kwargs,
            )
    except HubAccessError as exc:
        print(f"{NAME}: error: {exc}", file=sys.stderr)
        return 2
    trainer.train(resume_from_checkpoint=grpo_run.training_args.resume_from_checkpoint)
    # The model (or the new adapter), its tokenizer and the SFT model's generation config (end-of-turn EOS), where
    # `trl-emo eval` reads them.
    save_outputs(trainer, grpo_run.training_args.output_dir)
    trainer.save_state()  # trainer_state.json beside the model: every step's reward, reward_std, lengths, entropy...
    output_dir = grpo_run.training_args.output_dir
    trainer.accelerator.print(f"{NAME}: model saved to {output_dir} (started from {grpo_run.policy}).")
    if grpo_run.training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=grpo_run.script_args.dataset_name)
    end_run(trainer)
    return 0


def run(argv=None) -> int:
    """Parse `argv` (default: `sys.argv[1:]`), then `main`; the exit status (2 for a bad command line or data)."""
    return run_command(make_parser, main, argv, error_prefix=NAME)


if __name__ == "__main__":
    raise SystemExit(run())
