"""Checkpoints that a kill cannot tear, checked by content when a run resumes, and one choice for every process.

Transformers writes `checkpoint-N` in place, and `get_last_checkpoint` takes the highest number whatever is inside: a
process killed during a save (minutes for an 8B model and its optimizer) leaves a folder that the next resume picks and
dies on. Here (`AtomicCheckpoints`, a mixin for any `transformers.Trainer` subclass) a checkpoint is written under a
staging folder of `output_dir` (`_trl_emo_saving/checkpoint-N`: neither `get_last_checkpoint`, nor the rotation of
`save_total_limit`, nor the Hub upload, which skips `_*`, sees it), then renamed to `checkpoint-N` once every process
has written its part (after an agreement of every process: ZeRO-3 and FSDP shards, per-rank RNG states) and its
manifest (`checkpoint_manifest`: every file's size and checksums) is written and every file is on disk. A rename within
one folder is atomic, so a `checkpoint-N` folder is complete or absent, whenever the process dies.

What happens to a folder after it is published (a copy cut short, a disk fault, a file truncated or overwritten) is
caught when a run resumes: a checkpoint with a manifest is complete only if every file matches it (read once); one
without (TRL's scripts, an older trl_emo, a copy) is checked by its files' structure (`checkpoint_structure`). `auto`
and `true` take the newest complete one (`newest_complete_checkpoint`), naming each one they skip and why; nothing is
deleted. A checkpoint that passes those checks and still fails to load is marked (`trl_emo_unusable.json`, kept) and
the run goes back to the previous complete one in the same launch (`CheckpointLoadError`, caught by the commands'
runner). `resume_from_checkpoint` takes `true` (the newest complete checkpoint, an error when there is none), `auto`
(the same, or a start from scratch when there is none: one command for the first launch and every relaunch), `false`,
or a checkpoint folder (which must be complete).

Several processes: the process that saves takes the `output_dir` lock (`output_lock`) before anything is written,
publishes what a kill left complete in the staging folder and clears the rest; the main process alone chooses the
checkpoint and sends its name to every process, and each one checks that its own disk holds it (`save_on_each_node`:
each node its own copy), so every rank resumes from the same step or the launch stops with one line naming the node.
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ..core.errors import ConfigError
from . import checkpoint_manifest as manifest
from . import output_lock, ranks
from .checkpoint_structure import structure_problems

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
_OPTIMIZER_FILES = ("optimizer.pt", "optimizer.bin", "optimizer_*", "global_step*/*optim_states.pt")


class CheckpointSaveError(OSError):
    """A checkpoint could not be written (disk full, permission): the earlier checkpoints are untouched."""

    def __init__(self, folder: str, cause: BaseException | None = None, text: str | None = None):
        if text is None:
            # An OSError names the file; torch.save says "PytorchStreamWriter failed writing file" (a RuntimeError) on
            # a full disk, safetensors raises its own error: their text is the cause.
            text = (f"could not save {folder}: {cause_text(cause)}; the earlier checkpoints in {os.path.dirname(folder)} "
                    "are intact (free space or fix the permission, then relaunch with --resume_from_checkpoint auto)")
        super().__init__(getattr(cause, "errno", None), text)

    def __str__(self) -> str:
        return self.strerror


class CheckpointLoadError(RuntimeError):
    """The checkpoint a run resumes from passed the checks and still failed to load (on some process): it is marked
    unusable (kept), and the run can go back to the previous complete one."""

    def __init__(self, folder: str, cause: str, asked=None):
        self.folder, self.cause = folder, cause
        self.asked = folder if asked is None else asked  # what `resume_from_checkpoint` asked for: auto, true, a folder
        super().__init__(f"checkpoint {folder} failed to load ({cause})")


def cause_text(cause: BaseException | None) -> str:
    if cause is None:
        return "unknown error"
    text = str(cause).strip()
    reason = getattr(cause, "strerror", None) or (text.splitlines()[0] if text else type(cause).__name__)
    where = f" ({cause.filename})" if getattr(cause, "filename", None) else ""
    return f"{reason}{where}"


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
                return f"readable {index}"
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


def holds_optimizer(folder: str) -> bool:
    return _has_any(folder, _OPTIMIZER_FILES)


def unusable_reason(folder: str) -> str | None:
    """Why `folder` was marked unusable (it failed to load once), or None when it is not marked."""
    path = os.path.join(folder, manifest.UNUSABLE)
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
        return f"it failed to load on {data.get('when', '?')}: {data.get('cause', '?')}"
    except (OSError, ValueError, AttributeError):
        return "it failed to load before"


def mark_unusable(folder: str, cause: str) -> bool:
    """Mark `folder` so that no resume chooses it again; it is kept (delete `trl_emo_unusable.json` to allow it
    again). False when the mark cannot be written (a read-only copy): the run goes on, and a later launch finds the
    same failure again."""
    try:
        manifest._write_json(os.path.join(folder, manifest.UNUSABLE),
                             {"cause": cause, "when": time.strftime("%Y-%m-%d %H:%M:%S"), "host": ranks.node()})
        return True
    except OSError as exc:
        logger.warning("could not mark %s as unusable (%s)", folder, exc)
        return False


def checkpoint_problems(folder: str, save_only_model: bool = False, side_files: Sequence[str] = (),
                        content: bool = True) -> list[str]:
    """Why `folder` cannot be resumed from (empty: complete). A checkpoint trl_emo wrote (its record or manifest is
    there) is judged by its manifest: every file there, of its size, and (with `content`) of its checksum. Any other
    is judged by what it holds (`missing_parts`) and by its files' structure (`checkpoint_structure`). In both cases
    the parts this run needs must be there (`save_only_model`, `side_files`)."""
    missing = [f"no {part}" for part in missing_parts(folder, save_only_model, side_files)]
    if manifest.has_records(folder):
        return manifest.manifest_problems(folder, content=content and not missing) or missing
    return missing + structure_problems(folder)


@dataclass
class CheckpointScan:
    """What `newest_complete_checkpoint` found: the checkpoint to resume from (None: none is complete) and each newer
    one it skipped, with why."""

    checkpoint: str | None
    skipped: list[tuple[str, list[str]]] = field(default_factory=list)

    def warn_skipped(self) -> None:
        for folder, problems in self.skipped:
            logger.warning("skipping torn checkpoint %s (%s); it is kept, not deleted", folder, "; ".join(problems))


def newest_complete_checkpoint(output_dir: str, save_only_model: bool = False, side_files: Sequence[str] = (),
                               content: bool = True) -> CheckpointScan:
    """The newest `checkpoint-N` of `output_dir` that is complete (`checkpoint_problems`) and not marked unusable,
    and the newer ones it skipped. Each is read once (`content`) only when its cheaper checks pass, newest first."""
    scan = CheckpointScan(None)
    for folder in checkpoints(output_dir):
        marked = unusable_reason(folder)
        problems = [f"marked unusable: {marked}"] if marked else checkpoint_problems(folder, save_only_model,
                                                                                      side_files, content)
        if not problems:
            scan.checkpoint = folder
            break
        scan.skipped.append((folder, problems))
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


# The checkpoint folders this process chose in this launch (checked, agreed on by every process), by real path, with
# what `resume_from_checkpoint` asked (`"auto"`, True, or the folder): the commands choose before the model loads, and
# the trainer they then pass the folder to does not check it again; a fallback after a failed load asks again.
_CHOSEN: dict[str, object] = {}


def _was_chosen(value) -> bool:
    return isinstance(value, str) and value != RESUME_AUTO and os.path.realpath(value) in _CHOSEN


def forget_choices() -> None:
    _CHOSEN.clear()


def asked_for(folder: str | None):
    """What `resume_from_checkpoint` asked when `folder` was chosen in this launch (the folder itself when it was not),
    forgotten once read: the trainer that resumes from it reads it once."""
    return _CHOSEN.pop(os.path.realpath(folder), folder) if folder else None


def _choose(value, output_dir: str, save_only_model: bool, side_files: Sequence[str], announce: bool) -> str | None:
    """The main process's choice for `value` (see `resolve_checkpoint`)."""
    if value is True or value == RESUME_AUTO:
        scan = newest_complete_checkpoint(output_dir, save_only_model, side_files)
        if announce:
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
        folder = scan.checkpoint
        if announce:
            logger.warning("resume_from_checkpoint: resuming from %s (step %s)", folder, checkpoint_step(folder))
    else:
        folder = os.path.expanduser(value)
        if not os.path.isdir(folder):
            raise ConfigError(f"resume_from_checkpoint: checkpoint folder not found: {value} (pass auto to resume from "
                              "the newest complete checkpoint of output_dir, or start from scratch)")
        # A folder named explicitly may lack the loss's own state (written by TRL's scripts, or with another loss):
        # the trainer says what it does instead (EMO re-takes its cost embedding, SED recalibrates), where `auto`
        # skips it.
        marked = unusable_reason(folder)
        problems = [f"marked unusable: {marked}"] if marked else checkpoint_problems(folder, save_only_model)
        if problems:
            raise ConfigError(f"resume_from_checkpoint: {value} is not a complete checkpoint ({'; '.join(problems)}); "
                              "pick another, or pass auto to take the newest complete one")
    if announce and not holds_optimizer(folder):
        logger.warning("resume_from_checkpoint: %s holds the weights only (saved with save_only_model): the optimizer, "
                       "the learning-rate schedule and the random state start fresh, so the run will not be the "
                       "uninterrupted run's, bit for bit", folder)
    return folder


def resolve_checkpoint(value, output_dir: str, save_only_model: bool = False, side_files: Sequence[str] = (),
                       announce: bool = True, saves: bool = True) -> str | None:
    """The checkpoint folder a run resumes from (None: from scratch), from `resume_from_checkpoint`'s `value`, the
    same on every process.

    `true`: the newest complete checkpoint (a `ConfigError` when there is none); `auto`: the same, or None when there
    is none; a folder: itself, which must be complete (its side files aside: the trainer warns about those). Newer
    checkpoints that are torn, damaged or marked unusable are skipped with a warning naming each and why. The main
    process chooses and sends the checkpoint's name to every process; each one that saves (`saves`: its node's copy,
    with `save_on_each_node`) checks its own copy by content, the others that it is there. One of them lacking it is a
    `ConfigError` naming its node and the folder, on every process. With `announce`, one line says what was chosen.
    A folder this process already chose in this launch is returned as it is."""
    value = resume_keyword(value)
    if value is None or _was_chosen(value):
        return value
    outcome = None
    if ranks.rank() == 0:
        try:
            outcome = ("chosen", _choose(value, output_dir, save_only_model, side_files, announce))
        except ConfigError as exc:
            outcome = ("error", str(exc))
    kind, chosen = ranks.broadcast(outcome)
    if kind == "error":
        raise ConfigError(chosen)
    if chosen is None:
        return None
    # Each process reads the checkpoint of the same name under its own output_dir (per-node disks), or the folder given.
    local = os.path.join(output_dir, os.path.basename(chosen)) if isinstance(value, bool) or value == RESUME_AUTO \
        else chosen
    failure = None
    if ranks.rank() != 0:
        if not os.path.isdir(local):
            problems = [f"{local} is not there"]
        elif saves:
            marked = unusable_reason(local)
            problems = [f"marked unusable: {marked}"] if marked else checkpoint_problems(local, save_only_model,
                                                                                          side_files)
            problems = [f"{local}: {'; '.join(problems)}"] if problems else []
        else:
            problems = []
        failure = f"{ranks.node()} cannot resume from it: {problems[0]}" if problems else None
    failure = ranks.first_failure(failure)
    if failure:
        raise ConfigError(f"resume_from_checkpoint: the main process chose {os.path.basename(chosen)}, but {failure}; "
                          "give every node a whole copy of it (save_on_each_node writes each node's copy to its own "
                          "disk), or pass a checkpoint folder every node holds.")
    _CHOSEN[os.path.realpath(local)] = value
    return local


# -- one run per output_dir, and what a kill left in its staging folder ----------------------------------------------


def take_output_dir(output_dir: str, saves: bool) -> None:
    """Every process of the launch: the process(es) that save take the `output_dir` lock (`output_lock`); any refusal
    is an `OutputDirLocked` on every process (the other ranks wait for the answer)."""
    failure = None
    if saves:
        try:
            output_lock.take(output_dir)
        except output_lock.OutputDirLocked as exc:
            failure = str(exc)
        except OSError as exc:
            failure = f"output_dir: cannot create the lock file in {output_dir} ({exc.strerror or exc})."
    failure = ranks.first_failure(failure)
    if failure:
        raise output_lock.OutputDirLocked(failure)


def recover_staged(output_dir: str) -> tuple[list[str], list[str]]:
    """What saves cut short left in the staging folder: a checkpoint whose manifest is whole and matches every file
    (killed between its last write and its rename) is published; the rest is removed (never a `checkpoint-N`).
    `(published, removed)`, as names."""
    staging = os.path.join(output_dir, STAGING_DIR)
    if not os.path.isdir(staging):
        return [], []
    published, removed = [], []
    for name in sorted(os.listdir(staging)):
        path = os.path.join(staging, name)
        if (checkpoint_step(name) is not None and os.path.isfile(os.path.join(path, manifest.MANIFEST))
                and not manifest.manifest_problems(path)):
            try:
                publish(path, os.path.join(output_dir, name), synced=True)
                published.append(name)
            except OSError as exc:  # kept where it is: a complete checkpoint is never deleted
                logger.warning("could not publish the complete %s from %s (%s); it is left there", name, staging,
                               cause_text(exc))
            continue
        shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) else _remove(path)
        removed.append(name)
    with contextlib.suppress(OSError):
        os.rmdir(staging)
    return published, removed


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.remove(path)


def start_run(args, value, side_files: Sequence[str] = (), lock: bool = True) -> str | None:
    """What a launch does before anything loads, for `TrainingArguments` `args`: with `lock`, take the `output_dir`
    (`take_output_dir`) and settle its staging folder (`recover_staged`); then resolve `resume_from_checkpoint`'s
    `value` (`resolve_checkpoint`). Without `lock` (a dry run) nothing is written."""
    saves = args.should_save
    if lock:  # taken again by the trainer after the command took it: the same lock, an empty staging folder
        take_output_dir(args.output_dir, saves)
        if saves:
            published, removed = recover_staged(args.output_dir)
            staging = os.path.join(args.output_dir, STAGING_DIR)
            for name in published:
                logger.warning("published %s, left complete in %s by a run stopped before its rename", name, staging)
            if removed:
                logger.warning("removed the unfinished save(s) %s from %s", ", ".join(removed), staging)
    return resolve_checkpoint(value, args.output_dir, args.save_only_model, side_files, announce=args.should_log,
                              saves=saves)


# -- writing them --------------------------------------------------------------------------------------------------


def publish(staged: str, final: str, synced: bool = False) -> None:
    """Rename the fully written `staged` checkpoint to `final` (every file fsynced first, unless `synced`: its
    manifest's pass did it). A folder already there (the same step saved before, by a run that was then resumed from
    an earlier checkpoint: a torn one `auto` skipped, or one the user went back past) is moved aside as
    `_replaced-checkpoint-N` (`.1`, `.2`... when taken), kept, never deleted."""
    if not synced:
        manifest.fsync_tree(staged)
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
    manifest.fsync_dir(os.path.dirname(final))


def rotate_checkpoints(run_dir: str, save_total_limit: int | None, run: str, protected: Iterable[str | None]) -> list[str]:
    """`save_total_limit` over the checkpoints of this run only: those whose manifest names `run` and whose files are
    all there at their sizes (no checksum: the rotation runs after every save). Torn, foreign (another run's, TRL's,
    a copy's) and unusable folders are neither counted nor deleted, so they never push out a complete checkpoint. The
    oldest (by the time their manifest was written) go first; `protected` (the checkpoint just saved, the best
    model's) are kept. The folders deleted."""
    if not save_total_limit or save_total_limit <= 0:
        return []
    keep = {os.path.normpath(folder) for folder in protected if folder}
    ours = []
    for folder in checkpoints(run_dir):
        try:
            written = manifest.read_manifest(folder)
        except manifest.ManifestError:
            continue
        if written.run != run or unusable_reason(folder) or manifest.manifest_problems(folder, content=False):
            continue
        ours.append((written.saved_at, checkpoint_step(folder), os.path.normpath(folder)))
    ours.sort()
    remaining, keep_count = len(ours), max(save_total_limit, len(keep & {folder for *_, folder in ours}))
    deleted = []
    for *_, folder in ours:
        if remaining <= keep_count:
            break
        if folder not in keep:
            shutil.rmtree(folder, ignore_errors=True)
            deleted.append(folder)
            remaining -= 1
    return deleted
