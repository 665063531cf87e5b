"""`AtomicCheckpoints`: the trainer side of `trl_emo.training.checkpoints`, mixed into `trl_emo.SFTTrainer` and, by the
commands, into TRL's `DPOTrainer` and `GRPOTrainer` (`with_atomic_checkpoints`).

It saves each checkpoint under the staging folder with its record and manifest and publishes it by a rename, every
process agreeing at each stage (a failure anywhere is the same one-line `CheckpointSaveError` everywhere); it takes the
`output_dir` and resolves `resume_from_checkpoint` the same way on every process when a library user calls
`train("auto")` (the commands did it already, before the model loaded); it turns any error while loading the chosen
checkpoint into a marked checkpoint and a `CheckpointLoadError` on every process (the commands then go back to the
previous one); and it applies `save_total_limit` to this run's complete checkpoints only.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import uuid

from . import checkpoint_manifest as manifest
from . import output_lock, ranks
from .checkpoints import (
    PREFIX, STAGING_DIR, TRAINER_STATE, CheckpointLoadError, CheckpointSaveError, asked_for, cause_text, mark_unusable,
    publish, resolve_checkpoint, rotate_checkpoints, start_run,
)

logger = logging.getLogger(__name__)


class AtomicCheckpoints:
    """Mixin for a `transformers.Trainer` subclass, first among the bases: checkpoints written under a staging name,
    with a manifest, and renamed when complete; `resume_from_checkpoint` resolved to the newest complete checkpoint,
    the same for every process; `save_total_limit` applied to this run's complete checkpoints only; a checkpoint that
    fails to load marked and reported as `CheckpointLoadError` on every process (module docstring).

    Subclasses write the loss's own state next to a checkpoint in `_write_side_files(folder)` (called inside the
    staged save, before the model; every file of the folder is in its manifest), read it back in
    `_restore_side_files(checkpoint)` (called once the checkpoint to resume from is resolved; an error there counts as
    a failed load) and name what a checkpoint must hold for them in `_checkpoint_side_files()`."""

    _saving_checkpoint = False
    _push_pending = False
    _run_id: str | None = None
    _resuming: str | None = None  # the checkpoint being loaded, until the first training step
    _load_failure: str | None = None  # what failed to load on this process (several processes: said at the step)
    _asked = None  # what `resume_from_checkpoint` asked for the checkpoint being loaded

    def _checkpoint_side_files(self) -> list[str]:
        return []

    def _write_side_files(self, folder: str) -> None:
        """Write this trainer's own state into the checkpoint `folder` (the main process only)."""

    def _restore_side_files(self, checkpoint: str | None) -> None:
        """Read this trainer's own state back from the checkpoint training resumes from (None: from scratch), before
        training starts."""

    def resolve_checkpoint(self, resume_from_checkpoint, announce: bool = True) -> str | None:
        return resolve_checkpoint(resume_from_checkpoint, self.args.output_dir, self.args.save_only_model,
                                  self._checkpoint_side_files(), announce=announce and self.args.should_log,
                                  saves=self.args.should_save)

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        # The commands have taken the output_dir and chosen the checkpoint already (`checkpoints.asked_for`); a library
        # user's `train("auto")` does it here, and gives the lock back when training ends.
        locked_here = self.args.should_save and output_lock.held(self.args.output_dir) is None
        try:
            checkpoint = start_run(self.args, resume_from_checkpoint, self._checkpoint_side_files())
            self._asked = asked_for(checkpoint)
            self._run_id = ranks.broadcast((manifest.run_of(checkpoint) if checkpoint else None) or uuid.uuid4().hex)
            self._resuming, self._load_failure = checkpoint, None
            with self._loading("the loss's own state"):
                self._restore_side_files(checkpoint)
            if checkpoint:
                from transformers.trainer_callback import TrainerState

                with self._loading(TRAINER_STATE):
                    TrainerState.load_from_json(os.path.join(checkpoint, TRAINER_STATE))
                self._agree_on_load()
            with self._deepspeed_load_guarded():
                output = super().train(checkpoint, *args, **kwargs)
            if self._resuming is not None:
                # No training step ran (the checkpoint was the last step's): what failed to load is said now, before
                # the final model is saved from it.
                self._agree_on_load()
            return output
        finally:
            self._resuming = None
            lock = output_lock.held(self.args.output_dir) if locked_here else None
            if lock is not None:
                lock.release()

    # -- a checkpoint that fails to load -------------------------------------------------------------------------
    @contextlib.contextmanager
    def _loading(self, what: str):
        """Around each part of loading the checkpoint being resumed. An error: with one process, the checkpoint is
        marked and `CheckpointLoadError` raised at once; with several, this process carries on (every process must
        reach the same collectives) and the failure is said by every process at the first training step."""
        if self._resuming is None:
            yield
            return
        try:
            yield
        except _NOT_THE_CHECKPOINTS:
            raise
        except Exception as exc:  # noqa: BLE001 - any other error while loading a checkpoint is the checkpoint's
            cause = f"{what}: {cause_text(exc) if isinstance(exc, OSError) else _one_line(exc)}"
            if ranks.world_size() == 1:
                raise self._load_error(cause) from exc
            self._load_failure = self._load_failure or cause

    def _agree_on_load(self) -> None:
        local = f"{ranks.node()}: {self._load_failure}" if self._load_failure else None
        failure = ranks.first_failure(local) if ranks.world_size() > 1 else self._load_failure
        if failure:
            raise self._load_error(failure)

    def _load_error(self, cause: str) -> CheckpointLoadError:
        folder, self._resuming = self._resuming, None
        if self.args.should_save:
            mark_unusable(folder, cause)
        return CheckpointLoadError(folder, cause, self._asked)

    def training_step(self, *args, **kwargs):
        if self._resuming is not None:
            # Loading is over (model, optimizer, scheduler, RNG states): every process says whether it went well.
            self._agree_on_load()
            self._resuming = None
        return super().training_step(*args, **kwargs)

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        with self._loading("model weights"):
            return super()._load_from_checkpoint(resume_from_checkpoint, model)

    def _load_optimizer_and_scheduler(self, checkpoint):
        with self._loading("optimizer and scheduler"):
            return super()._load_optimizer_and_scheduler(checkpoint)

    def _load_scaler(self, checkpoint):
        with self._loading("gradient scaler"):
            return super()._load_scaler(checkpoint)

    def _load_rng_state(self, checkpoint):
        with self._loading("RNG state"):
            return super()._load_rng_state(checkpoint)

    def _load_callback_state(self):
        with self._loading("callback state"):
            return super()._load_callback_state()

    @contextlib.contextmanager
    def _deepspeed_load_guarded(self):
        """transformers calls its module's `deepspeed_load_checkpoint` directly inside `_prepare_for_training`: it is
        wrapped in `_loading` for this `train()` call only."""
        if self._resuming is None or not getattr(self, "is_deepspeed_enabled", False):
            yield
            return
        import transformers.trainer as trainer_module

        original = getattr(trainer_module, "deepspeed_load_checkpoint", None)
        if original is None:  # another transformers: its load is then not guarded
            yield
            return

        def guarded(*args, **kwargs):
            with self._loading("DeepSpeed state"):
                return original(*args, **kwargs)

        trainer_module.deepspeed_load_checkpoint = guarded
        try:
            yield
        finally:
            trainer_module.deepspeed_load_checkpoint = original

    # -- saving --------------------------------------------------------------------------------------------------
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

    def _save(self, output_dir=None, state_dict=None):
        # transformers 5 writes a model's files (weights, config) on global rank 0 only
        # (`PreTrainedModel.should_save_on_this_rank`), whatever `is_main_process` says: with `save_on_each_node` the
        # copies of every other node (their checkpoints, their final model) would lack the weights. Each node's
        # saving process writes its own copy, as `save_on_each_node` means.
        model = self.accelerator.unwrap_model(self.model)
        if not (self.args.save_on_each_node and self.args.should_save and ranks.rank() != 0
                and hasattr(model, "should_save_on_this_rank")):
            return super()._save(output_dir, state_dict)
        model.should_save_on_this_rank = lambda is_main_process: is_main_process
        try:
            return super()._save(output_dir, state_dict)
        finally:
            del model.should_save_on_this_rank

    def _save_agreed(self, failure: BaseException | None, staged: str, final: str) -> None:
        """Every process says whether its part of the save went well (this replaces a barrier); one failure is a
        `CheckpointSaveError` on every process, its staged folder removed."""
        text = str(CheckpointSaveError(final, failure)) if failure is not None else None
        agreed = ranks.first_failure(text)
        if agreed:
            if self.args.should_save:
                shutil.rmtree(staged, ignore_errors=True)
            raise CheckpointSaveError(final, failure, text=agreed) from failure

    def _save_checkpoint(self, model, trial):
        run_dir = super()._get_output_dir(trial)
        name = f"{PREFIX}-{self.state.global_step}"
        staging = os.path.join(run_dir, STAGING_DIR)
        staged, final = os.path.join(staging, name), os.path.join(run_dir, name)
        run = self._run_id or uuid.uuid4().hex  # a `_save_checkpoint` called outside `train()`
        failure = None
        if self.args.should_save:
            try:
                shutil.rmtree(staged, ignore_errors=True)
                os.makedirs(staged, exist_ok=True)
                manifest.write_record(staged, run, self.state.global_step)
            except OSError as exc:
                failure = exc
        self._save_agreed(failure, staged, final)
        self._saving_checkpoint = True
        try:
            if self.args.should_save:
                self._write_side_files(staged)
            super()._save_checkpoint(model, trial)
        except _SAVE_ERRORS as exc:
            failure = exc
        finally:
            self._saving_checkpoint = False
        best = self.state.best_model_checkpoint
        if failure is None and best and os.path.dirname(os.path.normpath(best)) == os.path.normpath(staging):
            # transformers names the best checkpoint by the folder it just wrote: the staging one.
            self.state.best_model_checkpoint = os.path.join(run_dir, os.path.basename(os.path.normpath(best)))
            if self.args.should_save:
                try:
                    self.state.save_to_json(os.path.join(staged, TRAINER_STATE))
                except OSError as exc:
                    failure = exc
        self._save_agreed(failure, staged, final)  # every process's shards and RNG state are written
        if self.args.should_save:
            try:
                manifest.write_manifest(staged, run, self.state.global_step)
                publish(staged, final, synced=True)
            except OSError as exc:
                failure = exc
            else:
                with contextlib.suppress(OSError):
                    os.rmdir(staging)  # empty now: no clutter in output_dir between saves
                rotate_checkpoints(run_dir, self.args.save_total_limit, run, (final, self.state.best_model_checkpoint))
        self._save_agreed(failure, staged, final)  # nobody reads `checkpoint-N` (or pushes it) before it exists
        if self._push_pending:
            self._push_pending = False
            super()._push_from_checkpoint(final)


def _not_the_checkpoints() -> tuple[type[BaseException], ...]:
    """Errors while loading that are not the checkpoint's fault, and would fail again on any other checkpoint: an
    input the run cannot use (a configuration, a Hub id offline, a model or embedding source that cannot be loaded:
    EMO's cost embedding is prepared with the loss's own state), memory running out."""
    import torch

    from ..core.errors import ConfigError, HubAccessError
    from ..models.sources import SourceError

    return (CheckpointLoadError, ConfigError, HubAccessError, SourceError, MemoryError,
            *((torch.OutOfMemoryError,) if hasattr(torch, "OutOfMemoryError") else ()))


_NOT_THE_CHECKPOINTS = _not_the_checkpoints()


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def save_errors() -> tuple[type[BaseException], ...]:
    """What a save that cannot write raises: an OSError, torch.save's RuntimeError ("PytorchStreamWriter failed
    writing file" on a full disk), safetensors' own error."""
    errors: tuple[type[BaseException], ...] = (OSError, RuntimeError)
    try:
        from safetensors import SafetensorError

        errors += (SafetensorError,)
    except ImportError:
        pass
    return errors


_SAVE_ERRORS = save_errors()


_ATOMIC_CLASSES: dict[type, type] = {}


def with_atomic_checkpoints(trainer_class: type) -> type:
    """`trainer_class` (TRL's `DPOTrainer`, `GRPOTrainer`...) with `AtomicCheckpoints` mixed in, one class per base."""
    if issubclass(trainer_class, AtomicCheckpoints):
        return trainer_class
    if trainer_class not in _ATOMIC_CLASSES:
        _ATOMIC_CLASSES[trainer_class] = type(trainer_class.__name__, (AtomicCheckpoints, trainer_class),
                                              {"__module__": __name__, "__doc__": trainer_class.__doc__})
    return _ATOMIC_CLASSES[trainer_class]
