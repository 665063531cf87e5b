"""Training commands killed (or failed) at a chosen moment, in child processes that cost no import.

A command killed with SIGKILL must run in its own process; a new Python process importing torch, transformers, TRL and
trl_emo takes 8-20 s here, which a dozen kills would multiply. So the children are forked from a multiprocessing
"forkserver" that imported the stack once (`preload`): each child starts with everything imported, runs the command's
`run(argv)`, and the fault (`Fault`) is installed in the child alone by wrapping a Trainer method:

- `kill`: SIGKILL at the start of the optimizer step `step` (after step - 1 finished and its checkpoint, if any, was
  saved), the moment a preemption hits mid-training;
- `kill_in_save`: SIGKILL in the save of the checkpoint of `step`, after the model is written and before the optimizer:
  a save cut short;
- `fail_save`: an `OSError` (no space left on device) at the same point: a save that fails;
- `kill_before_publish`: SIGKILL after every file of the checkpoint of `step` and its manifest are written, before
  the rename that publishes it: a complete checkpoint left in the staging folder;
- `fail_staging`: no space left to create the staging folder of the checkpoint of `step`;
- `fail_final_save`: safetensors' own error (not an `OSError`) while the final model is written.

The forkserver imports before any child runs anything (no OpenMP thread pool exists yet to be lost in a fork).
"""

from __future__ import annotations

import errno
import multiprocessing
import os
import signal
import sys
from dataclasses import dataclass

PRELOAD = ["torch", "transformers", "trl", "trl_emo.commands.sft", "trl_emo.commands.dpo", "trl_emo.commands.grpo",
           "trl_emo.training.trainer"]


@dataclass(frozen=True)
class Fault:
    kind: str  # "kill", "kill_in_save", "fail_save", "kill_before_publish", "fail_staging", "fail_final_save"
    step: int = 0


def _install(fault: Fault | None) -> None:
    from transformers import Trainer

    if fault is None:
        return
    if fault.kind == "kill":
        original = Trainer.training_step

        def training_step(self, *args, **kwargs):
            # global_step counts finished optimizer steps; the first micro-batch of step `fault.step` is starting.
            if self.state.global_step == fault.step - 1:
                os.kill(os.getpid(), signal.SIGKILL)
            return original(self, *args, **kwargs)

        Trainer.training_step = training_step
        return
    if fault.kind in ("kill_before_publish", "fail_staging", "fail_final_save"):
        _install_around_publish(fault)
        return
    original_save = Trainer._save_optimizer_and_scheduler

    def save_optimizer_and_scheduler(self, output_dir):
        if self.state.global_step == fault.step:
            if fault.kind == "kill_in_save":
                os.kill(os.getpid(), signal.SIGKILL)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.path.join(output_dir, "optimizer.pt"))
        return original_save(self, output_dir)

    Trainer._save_optimizer_and_scheduler = save_optimizer_and_scheduler


def _install_around_publish(fault: Fault) -> None:
    from transformers import Trainer

    from trl_emo.training import atomic_checkpoints, checkpoints

    if fault.kind == "kill_before_publish":
        original_publish = atomic_checkpoints.publish

        def publish(staged, final, *args, **kwargs):
            if checkpoints.checkpoint_step(final) == fault.step:
                os.kill(os.getpid(), signal.SIGKILL)
            return original_publish(staged, final, *args, **kwargs)

        atomic_checkpoints.publish = publish  # where the trainer's save looks it up
    elif fault.kind == "fail_staging":
        original_makedirs = os.makedirs

        def makedirs(path, *args, **kwargs):
            if checkpoints.STAGING_DIR in str(path) and checkpoints.checkpoint_step(path) == fault.step:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
            return original_makedirs(path, *args, **kwargs)

        os.makedirs = makedirs  # in this child alone
    else:
        from safetensors import SafetensorError

        original_save = Trainer._save

        def _save(self, output_dir=None, state_dict=None):
            if checkpoints.STAGING_DIR not in str(output_dir):
                raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
            return original_save(self, output_dir, state_dict)

        Trainer._save = _save


def _child(command: str, argv: list[str], fault: Fault | None, log_path: str | None) -> None:
    import importlib

    if log_path is not None:  # what the command prints, for the test to read
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    _install(fault)
    module = importlib.import_module(f"trl_emo.commands.{command}")
    sys.stdout.flush()
    os._exit(module.run(argv))  # no atexit handlers of the forkserver's imports


_CONTEXT = None


def _context():
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = multiprocessing.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(PRELOAD)
    return _CONTEXT


def run_with_fault(command: str, argv: list[str], fault: Fault | None = None, log_path=None, timeout: float = 300) -> int:
    """Run `trl_emo.<command>` on `argv` in a forked child with `fault`, its output to `log_path`; its exit code (-9
    when it was killed)."""
    process = _context().Process(target=_child, args=(command, list(argv), fault, None if log_path is None else str(log_path)))
    process.start()
    process.join(timeout)
    if process.is_alive():
        process.kill()
        process.join()
        raise TimeoutError(f"trl_emo.{command} {' '.join(argv)} ran past {timeout} s")
    return process.exitcode
