"""How a training command runs, written once for `trl_emo.sft`, `trl_emo.dpo` and `trl_emo.grpo`.

Each command names what is its own in a `TrainingCommand` (how its run is resolved, its dry run, its trainer, how it
saves); `run_training` does the rest, in TRL's script shape: parse (done by the caller), resolve, dry run, notes,
trainer, train (resuming as `resume_from_checkpoint` says), save, push, end. What can go wrong ends the same way for
all three:

- an input the run cannot use (a recipe field, a path, a Hub id, the data, a checkpoint to resume from): one line on
  stderr naming the field, the value and the fix, exit status 2, before any model is loaded where it can be known then;
- a save that fails (disk full, permission; a checkpoint or the final model, whatever library raised it): one line
  naming the folder and the cause, exit status 1; the earlier checkpoints are untouched
  (`trl_emo.training.checkpoints`), so the run resumes from the last of them;
- a checkpoint that passed its checks and still fails to load: one warning naming it and the cause, the checkpoint
  marked unusable (kept), and the run goes back to the previous complete one in the same launch;
- another live run on the same `output_dir`: one line naming it, exit status 2 (`trl_emo.training.output_lock`).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .command_line import CommandLine, check_parsed, one_line

logger = logging.getLogger("trl_emo.commands")

# Exit statuses (docs/reliability.md).
EXIT_BAD_INPUT = 2
EXIT_RUN_FAILED = 1


def fail(name: str, exc: BaseException, status: int = EXIT_BAD_INPUT) -> int:
    _close_progress_bars()
    print(f"{name}: error: {one_line(exc)}", file=sys.stderr)
    return status


def _close_progress_bars() -> None:
    """End the progress bars a failed run left open (the Trainer closes its bar only when training ends), so that the
    error starts a line of its own instead of following the bar's last `\r` frame."""
    tqdm = sys.modules.get("tqdm")
    for bar in list(getattr(getattr(tqdm, "tqdm", None), "_instances", ()) or ()):
        try:
            bar.close()
        except Exception:  # a bar whose stream is gone: nothing to end
            pass


def input_errors() -> tuple[type[BaseException], ...]:
    """What resolving a run raises for an input it cannot use (each one line, exit status 2)."""
    from ..core.errors import ConfigError, HubAccessError
    from ..data import DataError
    from ..models.sources import SourceError

    return (ConfigError, DataError, SourceError, FileNotFoundError, HubAccessError)


@dataclass(frozen=True)
class TrainingCommand:
    """What one training command does its own way; `run_training` does the rest.

    Attributes:
        name: the command as messages name it (`trl_emo.sft`).
        resolve: the parsed command line to the run's final configuration (`SFTRun`, `DPORun`, `GRPORun`: each has
            `script_args`, `training_args`, `model_args`, `run_args`, `notes`, `hub_sources`); raises the
            `input_errors` for what it cannot use.
        print_dry_run: prints a resolved run for `--dry_run`.
        build_trainer: the trainer for a resolved run (called inside the Hub-error translation).
        save: writes the final model where the next stage reads it, `(trainer, run)`.
        describe: what the last line says of the run (`loss_type=gem`, `started from ...`).
        before_model: called before the model loads (GRPO's CPU memory setting), or None.
        prompt_lengths: the token counts of the first rows' prompts, for the message when `max_length` cuts every
            row's completion away (`check_kept_rows`), or None.
    """

    name: str
    resolve: Callable[[CommandLine], Any]
    print_dry_run: Callable[[Any], None]
    build_trainer: Callable[[Any], Any]
    save: Callable[[Any, Any], None]
    describe: Callable[[Any], str]
    before_model: Callable[[Any], None] | None = None
    prompt_lengths: Callable[[Any], list[int]] | None = None


def build_trainer(trainer_class, run, model, **extra):
    """`trainer_class` built from a resolved run as every command builds it: the model, the training arguments, the
    datasets, the tokenizer (`processing_class`), the run's quantization/PEFT settings and `extra` (GRPO's rewards)."""
    return trainer_class(model=model, args=run.training_args, train_dataset=run.train_dataset,
                         eval_dataset=run.eval_dataset, processing_class=run.tokenizer, **extra, **run.trainer_kwargs)


def run_training(command: TrainingCommand, args: CommandLine) -> int:
    """Run `command` on a parsed command line; the exit status (0, `EXIT_BAD_INPUT`, `EXIT_RUN_FAILED`). The
    `output_dir` lock that resolving the run takes is given back however the run ends."""
    from ..training import checkpoints, output_lock

    try:
        return _run_training(command, args)
    finally:
        output_lock.release_all()
        checkpoints.forget_choices()


def _run_training(command: TrainingCommand, args: CommandLine) -> int:
    from ..core.errors import ConfigError, HubAccessError
    from ..core.noise import quiet_optional_packages, release_for
    from ..core.logs import process_log_level, setup_command_logging
    from ..core.optional import require
    from ..training.atomic_checkpoints import save_errors
    from ..training.checkpoints import CheckpointLoadError, CheckpointSaveError
    from ..training.finish import end_run

    check_parsed(args, command.name)
    quiet_optional_packages()
    training_args = next(v for v in args.values if hasattr(v, "get_process_log_level"))
    setup_command_logging(process_log_level(training_args))  # before the data is read: its summary is logged
    try:
        run = command.resolve(args)
        if run.run_args.dry_run:
            command.print_dry_run(run)
            return 0
        require(required_packages(run))
    except input_errors() as exc:
        return fail(command.name, exc)
    for note in run.notes:
        logger.warning(note)
    release_for(run.model_args, run.training_args)
    if command.before_model is not None:
        command.before_model(run)
    output_dir = run.training_args.output_dir
    try:
        trainer = _build(command, run)
        check_kept_rows(command, run, trainer)
        resume = run.training_args.resume_from_checkpoint
        while True:
            try:
                # EMO's cost embedding is loaded at the first step, under the trainer's own translation.
                trainer.train(resume_from_checkpoint=resume)
                break
            except CheckpointLoadError as exc:
                failed, resume = str(exc), exc.asked  # the text only: the exception's traceback holds the trainer
            # A checkpoint that passed its checks and still failed to load (on some process) is marked unusable; the
            # run goes back to the previous complete one, on a trainer built afresh (the failed load may have
            # touched the weights or the optimizer), in this same launch. A folder named explicitly is an error.
            if not (resume is True or resume == "auto"):
                raise ConfigError(f"resume_from_checkpoint: {failed}; it is marked unusable, kept; pass another "
                                  "checkpoint folder, or auto to take the newest complete one")
            if run.training_args.should_log:
                logger.warning("%s; it is marked unusable (kept), going back to the previous complete checkpoint",
                               failed)
            _let_go(trainer)
            trainer = None
            _collect_garbage()
            trainer = _build(command, run)
    except (HubAccessError, ConfigError) as exc:
        return fail(command.name, exc)
    except CheckpointSaveError as exc:
        return fail(command.name, exc, EXIT_RUN_FAILED)
    try:
        command.save(trainer, run)
    except save_errors() as exc:
        # OSError, torch.save's RuntimeError and safetensors' error on a full disk: one line, the checkpoints intact.
        cause = getattr(exc, "strerror", None) or one_line(exc)
        return fail(command.name, OSError(f"could not save the final model to {output_dir}: {cause}; the checkpoints "
                                          "there are intact (relaunch with --resume_from_checkpoint auto)"),
                    EXIT_RUN_FAILED)
    trainer.accelerator.print(f"{command.name}: model saved to {output_dir} ({command.describe(run)}).")
    if run.training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=run.script_args.dataset_name)
    end_run(trainer)
    return 0


def required_packages(run) -> list:
    """The optional packages a resolved run needs (`trl_emo.core.optional`): bitsandbytes for a 4-/8-bit model,
    DeepSpeed for a DeepSpeed configuration. Checked before the model loads (a dry run loads none and needs neither)."""
    from ..core import optional

    needed = []
    if getattr(run.model_args, "load_in_4bit", False) or getattr(run.model_args, "load_in_8bit", False):
        needed.append(optional.BITSANDBYTES)
    if getattr(run.training_args, "deepspeed", None):
        needed.append(optional.DEEPSPEED)
    return needed
def _build(command: TrainingCommand, run):
    from ..core.errors import ConfigError
    from ..core.hub import hub_errors

    # The checked ids can still fail here (offline, the weights of a model whose config alone is cached).
    with hub_errors(run.hub_sources):
        try:
            return command.build_trainer(run)
        except ValueError as exc:
            # TRL's and transformers' trainers check their configuration when built (DPO's `loss_type`, a
            # vocabulary the head cannot score...) and say so in a ValueError: the user's input, one line.
            raise ConfigError(str(exc)) from exc


def _let_go(trainer) -> None:
    """What a trainer holds beyond itself, before another is built in the same process: accelerate's references to
    its model and optimizer, and accelerate's per-process state (with DeepSpeed, accelerate refuses a second
    `Accelerator` built with its plugin while the first one's state stands). The process group stays."""
    from accelerate.state import AcceleratorState, GradientState

    trainer.accelerator.free_memory()
    AcceleratorState._reset_state()
    GradientState._reset_state()


def _collect_garbage() -> None:
    """Free a dropped trainer's model, optimizer and engine before another is built (one model's memory at a time)."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def check_kept_rows(command: TrainingCommand, run, trainer) -> None:
    """The training rows the trainer kept after preparing them: TRL drops a row whose completion `max_length` cuts
    away entirely (it would train nothing). None kept is a one-line `ConfigError` (the sampler would fail on an
    empty dataset with a traceback) naming the rows, the prompts' lengths and the fix; some dropped, a warning with
    the count (packing rejoins rows, so only an empty result is counted then)."""
    from ..core.errors import ConfigError

    given, prepared = run.train_dataset, trainer.train_dataset
    if not (hasattr(given, "__len__") and hasattr(prepared, "__len__")):
        return  # streaming datasets: no count
    max_length = getattr(run.training_args, "max_length", None)
    if len(prepared) == 0 and len(given) > 0:
        lengths = command.prompt_lengths(run) if command.prompt_lengths is not None else []
        raise ConfigError(no_rows_left(max_length, len(given), lengths))
    if len(prepared) < len(given) and not getattr(run.training_args, "packing", False):
        logger.warning(rows_dropped(max_length, len(given) - len(prepared), len(given)))


def no_rows_left(max_length, rows: int, prompt_lengths: list[int]) -> str:
    span = f"; the prompts are {min(prompt_lengths)} to {max(prompt_lengths)} tokens long" if prompt_lengths else ""
    return (f"max_length={max_length} cuts the completion out of every one of the {rows} training rows, so none is "
            f"left to train on{span}; raise max_length above the prompts' length (or use truncation_mode: keep_end), "
            "or shorten the prompts.")


def rows_dropped(max_length, dropped: int, rows: int) -> str:
    return (f"{dropped} of {rows} training rows dropped: max_length={max_length} leaves no completion token in them "
            "(raise max_length to keep them)")


def check_output_dir(output_dir: str | None) -> None:
    """`output_dir` can hold the run: not a file, and (the nearest folder that exists on its path) writable. Checked
    before anything loads, so a typo is not found after an adapter merge or the first save."""
    from ..core.errors import ConfigError

    if not output_dir:
        raise ConfigError("output_dir is required (in the recipe or as --output_dir).")
    path = os.path.abspath(os.path.expanduser(output_dir))
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"output_dir: {output_dir} is a file, not a folder; choose a folder for the run's outputs.")
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise ConfigError(f"output_dir: cannot create {output_dir}: {existing} is a file.")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"output_dir: cannot write to {existing} (permission denied); choose a folder you can write "
                          "to.")
