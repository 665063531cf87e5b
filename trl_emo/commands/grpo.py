"""`python -m trl_emo.grpo --recipe grpo_gsm8k --model_name_or_path <SFT output>`.

GRPO with TRL's own `GRPOTrainer` and verifiable rewards on top of an SFT run of `trl_emo.sft`, whether that run
saved a full model or a LoRA/QLoRA adapter. An adapter is first merged into its base model (saved once under
`<output_dir>/_sft-merged`, as `trl_emo.dpo` does), and GRPO trains that merged SFT model further: fully, or through a
new adapter with `use_peft`. The policy keeps the SFT model's chat template. The rewards (`reward_funcs`, weighted by
`reward_weights`) are the answer checks of `trl-emo eval` (`trl_emo.evaluation.rewards`) or functions of yours by
import path. Everything TRL logs is kept: reward and its std, each reward's mean, completion lengths, entropy.

In the shape of TRL's scripts (`trl/scripts/grpo.py`): `make_parser(subparsers=None)` and `main(args)` on the parsed
command line; `run(argv)` does both. The final configuration comes from `trl_emo.commands.grpo_run.resolve_grpo_run`.
"""

from __future__ import annotations

import logging

from .command_line import CommandLine, run_command
from .training_command import TrainingCommand, build_trainer, run_training

logger = logging.getLogger("trl_emo.grpo")

NAME = "trl_emo.grpo"
HELP = (
    "GRPO with TRL's GRPOTrainer and verifiable rewards (gsm8k_answer, math_answer, format, or package.module:function "
    "of yours) on top of an SFT output of trl_emo.sft (a full model or a LoRA/QLoRA adapter, merged first).\n"
    "Runs under `accelerate launch -m trl_emo.grpo` too. --dry_run prints the resolved configuration and prompts with "
    "their reference answers, without a model."
)


def make_parser(subparsers=None, prog: str | None = None):
    """The command's parser (`trl_emo.commands.parser.CommandParser`); with `subparsers`, registered there as `grpo`."""
    from .grpo_run import grpo_dataclass_types
    from .parser import command_parser

    return command_parser(grpo_dataclass_types(), subparsers, name="grpo", help=HELP.split(" (")[0],
                          prog=prog or f"{NAME} (trl-emo grpo)", description=HELP)


def _keep_freed_memory(grpo_run) -> None:
    if not (grpo_run.grpo_args.cpu_keep_freed_memory and grpo_run.training_args.device.type == "cpu"):
        return
    from .cpu_memory import keep_freed_memory

    # Before the model is loaded: every allocation that follows is served the kept way.
    if keep_freed_memory():
        logger.warning("CPU: glibc keeps the memory a step frees for the next one (cpu_keep_freed_memory; "
                       "docs/benchmarks.md, GRPO step time)")
    else:
        logger.warning("CPU: cpu_keep_freed_memory had no effect (glibc's mallopt is not available or refused "
                       "the settings); steps fault their buffers in again, a few seconds each.")


def _build_trainer(grpo_run):
    from trl import GRPOTrainer

    from ..training.atomic_checkpoints import with_atomic_checkpoints

    from ..training.reward_signal import RewardNeverFires

    trainer = build_trainer(with_atomic_checkpoints(GRPOTrainer), grpo_run, grpo_run.policy,
                            reward_funcs=grpo_run.reward_funcs)
    # A reward that never fires trains nothing, silently in TRL's log: warn once (trl_emo.training.reward_signal).
    trainer.add_callback(RewardNeverFires([getattr(f, "__name__", str(f)) for f in grpo_run.reward_funcs]))
    return trainer


def _save(trainer, grpo_run) -> None:
    from ..training.finish import save_outputs

    # The model (or the new adapter), its tokenizer and the SFT model's generation config (end-of-turn EOS), where
    # `trl-emo eval` reads them; trainer_state.json beside them: every step's reward, reward_std, lengths, entropy.
    save_outputs(trainer, grpo_run.training_args.output_dir)
    trainer.save_state()


def command() -> TrainingCommand:
    from .dry_run import print_grpo_dry_run
    from .grpo_run import resolve_grpo_run

    return TrainingCommand(NAME, resolve_grpo_run, print_grpo_dry_run, _build_trainer, _save,
                           describe=lambda run: f"started from {run.policy}", before_model=_keep_freed_memory)


def main(args: CommandLine) -> int:
    """Train with GRPO (or, with `--dry_run`, print the final configuration and prompts) from a parsed command line."""
    return run_training(command(), args)


def run(argv=None) -> int:
    """Parse `argv` (default: `sys.argv[1:]`), then `main`; the exit status (2 for a bad command line or data)."""
    return run_command(make_parser, main, argv, error_prefix=NAME, short_help=lambda: short_help("python -m trl_emo.grpo"))


def short_help(prog: str) -> str:
    """The short `--help` (the options changed most; `--help-all` for every one), without importing TRL."""
    from .short_help import short_help as text

    return text("grpo", prog)


if __name__ == "__main__":
    raise SystemExit(run())
