"""Checkpoints that a kill cannot tear, and the newest complete one to resume from.

Transformers writes `checkpoint-N` in place, and `get_last_checkpoint` takes the highest number whatever is inside: a
process killed during a save (minutes for an 8B model and its optimizer) leaves a folder that the next resume picks and
dies on. Here (`AtomicCheckpoints`, a mixin for any `transformers.Trainer` subclass) a checkpoint is written under a
staging folder of `output_dir` (`_trl_emo_saving/checkpoint-N`: neither `get_last_checkpoint`, nor the rotation of
`save_total_limit`, nor the Hub upload, which skips `_*`, sees it), then renamed to `checkpoint-N` once every process
has written its part (after a barrier: ZeRO-3 and FSDP shards, per-rank RNG states) and every file is on disk. A rename
within one folder is atomic, so a `checkpoint-N` folder is complete or absent, whenever the process dies.

For folders written by anything else (an older trl_emo, TRL's own scripts, a copy cut short), a resume checks what a
complete checkpoint holds (`missing_parts`) and takes the newest complete one (`newest_complete_checkpoint`), naming
each torn one it skips; nothing is deleted. `resume_from_checkpoint` takes `true` (the newest complete checkpoint, an
error when there is none), `auto` (the same, or a start from scratch when there is none: one command for the first
launch and every relaunch), `false`, or a checkpoint folder (which must be complete).
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import re
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ..core.errors import ConfigError

logger = logging.getLogger(__name__)

PREFIX = "checkpoint"  # transformers' PREFIX_CHECKPOINT_DIR
STAGING_DIR = "_trl_emo_saving"
REPLACED_PREFIX = "_replaced-"  # a checkpoint moved aside (never deleted) when the same step is saved again
TRAINER_STATE = "trainer_state.json"
_CHECKPOINT = re.compile(rf"^{PREFIX}-(\d+)$")
# What a value of `resume_from_checkpoint` means besides a folder.
RESUME_NEWEST = ("true", "yes", "latest", "last")
RESUME_AUTO = "auto"
RESUME_NONE = ("", "false", "no", "none", "null")


class CheckpointSaveError(OSError):
    """A checkpoint could not be written (disk full, permission): the earlier checkpoints are untouched."""

    def __init__(self, folder: str, cause: BaseException):
        # An OSError names the file; torch.save says "PytorchStreamWriter failed writing file" (a RuntimeError) on a full
        # disk, safetensors raises its own error: their text is the cause.
        text = str(cause).strip()
        reason = getattr(cause, "strerror", None) or (text.splitlines()[0] if text else type(cause).__name__)
        where = f" ({cause.filename})" if getattr(cause, "filename", None) else ""
        super().__init__(
            getattr(cause, "errno", None),
            f"could not save {folder}: {reason}{where}; the earlier checkpoints in {os.path.dirname(folder)} are intact "
            "(free space or fix the permission, then relaunch with --resume_from_checkpoint auto)",
        )

    def __str__(self) -> str:
        return self.strerror


# -- what a complete checkpoint holds ------------------------------------------------------------------------------


def _has_any(folder: str, patterns: Iterable[str]) -> bool:
    return any(glob.glob(os.path.join(glob.escape(folder), pattern)) for pattern in patterns)


def _weights_missing(folder: str) -> str | None:
    """None when the folder holds model weights (whole, every shard of an index, an adapter, FSDP or DeepSpeed's own
    layout), else what is missing."""
    for name in ("model.safetensors", "pytorch_model.bin", "adapter_model.safetensors", "adapter_model.bin"):
        if os.path.isfile(os.path.join(folder, name)):
            return None
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        path = os.path.join(folder, index)
        if os.path.isfile(path):
            try:
                with open(path, encoding="utf-8") as handle:
                    shards = set(json.load(handle)["weight_map"].values())
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                return f"{index} (unreadable)"
            absent = sorted(s for s in shards if not os.path.isfile(os.path.join(folder, s)))
            return f"weight shards {', '.join(absent)}" if absent else None
    if _has_any(folder, ("pytorch_model_fsdp_*", "global_step*/*model_states.pt")):
        return None
    return "model weights"


def _deepspeed(folder: str) -> bool:
    return _has_any(folder, ("global_step*",))


def missing_parts(folder: str, save_only_model: bool = False, side_files: Sequence[str] = ()) -> list[str]:
    """What `folder` lacks to be resumed from: its trainer state, its weights, and unless `save_only_model` its
    optimizer, scheduler and RNG states (DeepSpeed's and FSDP's own layouts count), plus `side_files` (the loss's own
    state: GEM's beta, SED's threshold, EMO's cost embedding). Empty: complete."""
    missing = []
    if not os.path.isfile(os.path.join(folder, TRAINER_STATE)):
        missing.append(TRAINER_STATE)
    weights = _weights_missing(folder)
    if weights:
        missing.append(weights)
    if not save_only_model:
        if not _has_any(folder, ("optimizer.pt", "optimizer.bin", "optimizer_*", "global_step*/*optim_states.pt")):
            missing.append("optimizer state")
        # DeepSpeed keeps its own scheduler in its folder when its configuration defines one.
        if not os.path.isfile(os.path.join(folder, "scheduler.pt")) and not _deepspeed(folder):
            missing.append("scheduler.pt")
        if not _has_any(folder, ("rng_state*.pth",)):
            missing.append("RNG state")
    missing += [name for name in side_files if not os.path.exists(os.path.join(folder, name))]
    return missing


def checkpoint_step(folder: str) -> int | None:
    match = _CHECKPOINT.match(os.path.basename(os.path.normpath(folder)))
    return int(match.group(1)) if match else None


def checkpoints(output_dir: str) -> list[str]:
    """The `checkpoint-N` folders of `output_dir`, newest (highest N) first."""
    if not os.path.isdir(output_dir):
        return []
    found = [
        os.path.join(output_dir, name) for name in os.listdir(output_dir)
        if _CHECKPOINT.match(name) and os.path.isdir(os.path.join(output_dir, name))
    ]
    return sorted(found, key=checkpoint_step, reverse=True)


@dataclass
class CheckpointScan:
    """What `newest_complete_checkpoint` found: the checkpoint to resume from (None: none is complete) and each newer
    torn one it skipped, with what it lacks."""

    checkpoint: str | None
    skipped: list[tuple[str, list[str]]] = field(default_factory=list)

    def warn_skipped(self) -> None:
        for folder, missing in self.skipped:
            logger.warning("skipping torn checkpoint %s (no %s); it is kept, not deleted", folder, ", ".join(missing))


def newest_complete_checkpoint(output_dir: str, save_only_model: bool = False, side_files: Sequence[str] = ()) -> CheckpointScan:
    """The newest `checkpoint-N` of `output_dir` that `missing_parts` finds complete, and the newer ones it skipped."""
    scan = CheckpointScan(None)
    for folder in checkpoints(output_dir):
        missing = missing_parts(folder, save_only_model, side_files)
        if not missing:
            scan.checkpoint = folder
            break
        scan.skipped.append((folder, missing))
    return scan


def resume_keyword(value) -> str | bool | None:
    """`resume_from_checkpoint` as given: None (no resume), True (the newest complete checkpoint), `"auto"`, or a
    folder path (a string); a bool or any spelling of them is accepted."""
    if value is None or value is False:
        return None
    if value is True:
        return True
    text = str(value).strip()
    if text.lower() in RESUME_NONE:
        return None
    if text.lower() in RESUME_NEWEST:
        return True
    if text.lower() == RESUME_AUTO:
        return RESUME_AUTO
    return text


def resolve_checkpoint(value, output_dir: str, save_only_model: bool = False, side_files: Sequence[str] = (),
                       announce: bool = True) -> str | None:
    """The checkpoint folder a run resumes from (None: from scratch), from `resume_from_checkpoint`'s `value`.

    `true`: the newest complete checkpoint (a `ConfigError` when there is none); `auto`: the same, or None when there
    is none; a folder: itself, which must hold what `missing_parts` asks (its side files aside: the trainer warns about
    those). Torn newer checkpoints are skipped with a warning naming each. With `announce`, one line says what was
    chosen."""
    value = resume_keyword(value)
    if value is None:
        return None
    if value is True or value == RESUME_AUTO:
        scan = newest_complete_checkpoint(output_dir, save_only_model, side_files)
        scan.warn_skipped()
        if scan.checkpoint is None:
            torn = f" ({len(scan.skipped)} torn, skipped)" if scan.skipped else ""
            if value is True:
                raise ConfigError(
                    f"resume_from_checkpoint: true, but {output_dir} holds no complete checkpoint{torn}; pass "
                    "--resume_from_checkpoint auto to start from scratch when there is none (one command for the first "
                    "launch and every relaunch), or false."
                )
            if announce:
                logger.warning("resume_from_checkpoint: auto: no complete checkpoint in %s%s, starting from scratch",
                               output_dir, torn)
            return None
        if announce:
            logger.warning("resume_from_checkpoint: resuming from %s (step %s)", scan.checkpoint,
                           checkpoint_step(scan.checkpoint))
        return scan.checkpoint
    folder = os.path.expanduser(value)
    if not os.path.isdir(folder):
        raise ConfigError(f"resume_from_checkpoint: checkpoint folder not found: {value} (pass auto to resume from the "
                          "newest complete checkpoint of output_dir, or start from scratch)")
    missing = missing_parts(folder, save_only_model)
    if missing:
        raise ConfigError(f"resume_from_checkpoint: {value} is not a complete checkpoint (no {', '.join(missing)}); "
                          "pick another, or pass auto to take the newest complete one")
    # A folder named explicitly may lack the loss's own state (written by TRL's scripts, or with another loss): the
    # trainer says what it does instead (EMO re-takes its cost embedding, SED recalibrates), where `auto` skips it.
    return folder


# -- writing them --------------------------------------------------------------------------------------------------


def _fsync_tree(folder: str) -> None:
    """Every file and folder of `folder` on disk before the rename publishes it: the rename is atomic for a process
    killed at any moment, this makes it so for a machine that loses power (a preempted VM's disk) too."""
    for root, _dirs, files in os.walk(folder):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(root)


def _fsync_dir(folder: str) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # a filesystem that cannot open folders: the rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def clear_unfinished_saves(output_dir: str) -> list[str]:
    """Remove what saves cut short left in the staging folder (never a `checkpoint-N`): the names removed."""
    staging = os.path.join(output_dir, STAGING_DIR)
    if not os.path.isdir(staging):
        return []
    removed = sorted(os.listdir(staging))
    shutil.rmtree(staging, ignore_errors=True)
    return removed


def publish(staged: str, final: str) -> None:
    """Rename the fully written `staged` checkpoint to `final`. A folder already there (the same step saved before,
    by a run that was then resumed from an earlier checkpoint: a torn one `auto` skipped, or one the user went back
    past) is moved aside as `_replaced-checkpoint-N` (`.1`, `.2`... when taken), kept, never deleted."""
    _fsync_tree(staged)
    if os.path.isdir(final):
        aside = os.path.join(os.path.dirname(final), REPLACED_PREFIX + os.path.basename(final))
        suffix = 0
        while os.path.exists(aside + (f".{suffix}" if suffix else "")):
            suffix += 1
        aside += f".{suffix}" if suffix else ""
        os.replace(final, aside)
        logger.warning("%s is saved again: the one there before is kept as %s (delete it when no longer needed)",
                       final, aside)
    os.replace(staged, final)
    _fsync_dir(os.path.dirname(final))


class AtomicCheckpoints:
    """Mixin for a `transformers.Trainer` subclass, first among the bases: checkpoints written under a staging name
    and renamed when complete (module docstring), `resume_from_checkpoint` resolved to the newest complete checkpoint.

    Subclasses write the loss's own state next to a checkpoint in `_write_side_files(folder)` (called inside the
    staged save, before the model), read it back in `_restore_side_files(checkpoint)` (called once the checkpoint to
    resume from is resolved) and name what a checkpoint must hold for them in `_checkpoint_side_files()`."""

    _saving_checkpoint = False
    _push_pending = False

    def _checkpoint_side_files(self) -> list[str]:
        return []

    def _write_side_files(self, folder: str) -> None:
        """Write this trainer's own state into the checkpoint `folder` (the main process only)."""

    def _restore_side_files(self, checkpoint: str | None) -> None:
        """Read this trainer's own state back from the checkpoint training resumes from (None: from scratch), before
        training starts."""

    def resolve_checkpoint(self, resume_from_checkpoint, announce: bool = True) -> str | None:
        return resolve_checkpoint(resume_from_checkpoint, self.args.output_dir, self.args.save_only_model,
                                  self._checkpoint_side_files(), announce=announce and self.args.should_log)

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        checkpoint = self.resolve_checkpoint(resume_from_checkpoint)
        self._restore_side_files(checkpoint)
        if self.args.should_save:
            removed = clear_unfinished_saves(self.args.output_dir)
            if removed:
                logger.warning("removed the unfinished save(s) %s from %s", ", ".join(removed),
                               os.path.join(self.args.output_dir, STAGING_DIR))
        return super().train(checkpoint, *args, **kwargs)

    def _push_from_checkpoint(self, checkpoint_folder):
        # transformers pushes the folder it just wrote (in the background): the staged one, which the rename takes away
        # mid-upload. The push waits for the published folder (`_save_checkpoint`).
        if self._saving_checkpoint:
            self._push_pending = True
            return None
        return super()._push_from_checkpoint(checkpoint_folder)

    def _get_output_dir(self, trial):
        run_dir = super()._get_output_dir(trial)
        # While a checkpoint is saved, transformers (and TRL's GRPO, for its entropy state) write into the staging
        # folder, and the rotation of `save_total_limit` it runs there sees only the new checkpoint.
        return os.path.join(run_dir, STAGING_DIR) if self._saving_checkpoint else run_dir

    def _save_checkpoint(self, model, trial):
        run_dir = super()._get_output_dir(trial)
        name = f"{PREFIX}-{self.state.global_step}"
        staging = os.path.join(run_dir, STAGING_DIR)
        staged, final = os.path.join(staging, name), os.path.join(run_dir, name)
        if self.args.should_save:
            shutil.rmtree(staged, ignore_errors=True)
            os.makedirs(staged, exist_ok=True)
        self.accelerator.wait_for_everyone()
        self._saving_checkpoint = True
        try:
            if self.args.should_save:
                self._write_side_files(staged)
            super()._save_checkpoint(model, trial)
        except _SAVE_ERRORS as exc:
            if self.args.should_save:
                shutil.rmtree(staged, ignore_errors=True)
            raise CheckpointSaveError(final, exc) from exc
        finally:
            self._saving_checkpoint = False
        best = self.state.best_model_checkpoint
        if best and os.path.dirname(os.path.normpath(best)) == os.path.normpath(staging):
            # transformers names the best checkpoint by the folder it just wrote: the staging one.
            self.state.best_model_checkpoint = os.path.join(run_dir, os.path.basename(os.path.normpath(best)))
            if self.args.should_save:
                self.state.save_to_json(os.path.join(staged, TRAINER_STATE))
        self.accelerator.wait_for_everyone()  # every process's shards and RNG state are written
        if self.args.should_save:
            try:
                publish(staged, final)
            except OSError as exc:
                raise CheckpointSaveError(final, exc) from exc
            with contextlib.suppress(OSError):
                os.rmdir(staging)  # empty now: no clutter in output_dir between saves
            self._rotate(run_dir)
        self.accelerator.wait_for_everyone()  # nobody reads `checkpoint-N` (or pushes it) before it exists
        if self._push_pending:
            self._push_pending = False
            super()._push_from_checkpoint(final)

    def _rotate(self, run_dir: str) -> None:
        """transformers' rotation of `save_total_limit`, on the real folder (it ran on the staging one)."""
        try:
            from transformers.trainer_utils import rotate_checkpoints
        except ImportError:  # transformers before the function moved out of the Trainer
            self._rotate_checkpoints(use_mtime=True, output_dir=run_dir)
            return
        rotate_checkpoints(output_dir=run_dir, save_total_limit=self.args.save_total_limit,
                           best_model_checkpoint=self.state.best_model_checkpoint, use_mtime=True)


def _save_errors() -> tuple[type[BaseException], ...]:
    """What a save that cannot write raises: an OSError, torch.save's RuntimeError ("PytorchStreamWriter failed
    writing file" on a full disk), safetensors' own error."""
    errors: tuple[type[BaseException], ...] = (OSError, RuntimeError)
    try:
        from safetensors import SafetensorError

        errors += (SafetensorError,)
    except ImportError:
        pass
    return errors


_SAVE_ERRORS = _save_errors()


_ATOMIC_CLASSES: dict[type, type] = {}


def with_atomic_checkpoints(trainer_class: type) -> type:
    """`trainer_class` (TRL's `DPOTrainer`, `GRPOTrainer`...) with `AtomicCheckpoints` mixed in, one class per base."""
    if issubclass(trainer_class, AtomicCheckpoints):
        return trainer_class
    if trainer_class not in _ATOMIC_CLASSES:
        _ATOMIC_CLASSES[trainer_class] = type(trainer_class.__name__, (AtomicCheckpoints, trainer_class),
                                              {"__module__": __name__, "__doc__": trainer_class.__doc__})
    return _ATOMIC_CLASSES[trainer_class]
