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
TORN_PREFIX = "_torn-"  # a torn checkpoint moved aside (never deleted) when the same step is saved again
TRAINER_STATE = "trainer_state.json"
_CHECKPOINT = re.compile(rf"^{PREFIX}-(\d+)$")
# What a value of `resume_from_checkpoint` means besides a folder.
RESUME_NEWEST = ("true", "yes", "latest", "last")
RESUME_AUTO = "auto"
RESUME_NONE = ("", "false", "no", "none", "null")


class CheckpointSaveError(OSError):
    """A checkpoint could not be written (disk full, permission): the earlier checkpoints are untouched."""

    def __init__(self, folder: str, cause: OSError):
        reason = cause.strerror or str(cause) or type(cause).__name__
        where = f" ({cause.filename})" if getattr(cause, "filename", None) else ""
        super().__init__(
            cause.errno,
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
    """Rename the fully written `staged` checkpoint to `final`. A folder already there (the same step saved by a run
    that was then resumed from an earlier checkpoint) is replaced when complete, as transformers overwrites it, and
    moved aside as `_torn-checkpoint-N` (kept) when torn."""
    _fsync_tree(staged)
    if os.path.isdir(final):
        if missing_parts(final):
            aside = os.path.join(os.path.dirname(final), TORN_PREFIX + os.path.basename(final))
            shutil.rmtree(aside, ignore_errors=True)
            os.replace(final, aside)
            logger.warning("%s was torn (no %s): moved aside to %s, kept", final, ", ".join(missing_parts(aside)), aside)
        else:
            old = staged + ".replaced"
            os.replace(final, old)
            os.replace(staged, final)
            shutil.rmtree(old, ignore_errors=True)
            _fsync_dir(os.path.dirname(final))
            return
    os.replace(staged, final)
    _fsync_dir(os.path.dirname(final))


class AtomicCheckpoints:
    """Mixin for a `transformers.Trainer` subclass, first among the bases: checkpoints written under a staging name
    and renamed when complete (module docstring), `resume_from_checkpoint` resolved to the newest complete checkpoint.

    Subclasses write the loss's own state next to a checkpoint in `_write_side_files(folder)` (called inside the
    staged save, before the model) and name what a checkpoint must hold for them in `_checkpoint_side_files()`."""

    _saving_checkpoint = False

    def _checkpoint_side_files(self) -> list[str]:
        return []

    def _write_side_files(self, folder: str) -> None:
        """Write this trainer's own state into the checkpoint `folder` (the main process only)."""

    def resolve_checkpoint(self, resume_from_checkpoint, announce: bool = True) -> str | None:
        return resolve_checkpoint(resume_from_checkpoint, self.args.output_dir, self.args.save_only_model,
                                  self._checkpoint_side_files(), announce=announce and self.args.should_log)

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        checkpoint = self.resolve_checkpoint(resume_from_checkpoint)
        if self.args.should_save:
            removed = clear_unfinished_saves(self.args.output_dir)
            if removed:
                logger.warning("removed the unfinished save(s) %s from %s", ", ".join(removed),
                               os.path.join(self.args.output_dir, STAGING_DIR))
        return super().train(checkpoint, *args, **kwargs)

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
        except OSError as exc:
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
            _rotate(run_dir, self.args.save_total_limit, self.state.best_model_checkpoint)
        self.accelerator.wait_for_everyone()  # nobody reads `checkpoint-N` (or pushes it) before it exists


def _rotate(run_dir: str, save_total_limit, best_model_checkpoint) -> None:
    """transformers' rotation of `save_total_limit`, on the real folder (it ran on the staging one)."""
    from transformers.trainer_utils import rotate_checkpoints

    rotate_checkpoints(output_dir=run_dir, save_total_limit=save_total_limit, best_model_checkpoint=best_model_checkpoint,
                       use_mtime=True)


_ATOMIC_CLASSES: dict[type, type] = {}


def with_atomic_checkpoints(trainer_class: type) -> type:
    """`trainer_class` (TRL's `DPOTrainer`, `GRPOTrainer`...) with `AtomicCheckpoints` mixed in, one class per base."""
    if issubclass(trainer_class, AtomicCheckpoints):
        return trainer_class
    if trainer_class not in _ATOMIC_CLASSES:
        _ATOMIC_CLASSES[trainer_class] = type(trainer_class.__name__, (AtomicCheckpoints, trainer_class),
                                              {"__module__": __name__, "__doc__": trainer_class.__doc__})
    return _ATOMIC_CLASSES[trainer_class]
