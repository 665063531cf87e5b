"""`trl_emo.SFTTrainer`: TRL's `SFTTrainer`, training with the loss `args.loss_type` selects.

`nll` and `dft` are left to TRL exactly as it computes them. Any other registered loss is computed
by `trl_emo`, fused by default (from hidden states, never the full logits) or from the logits
(`loss_implementation="logits"`), and logged beside cross-entropy, entropy and token accuracy, averaged the way
the Trainer averages the `loss` it logs (see `_MetricSums`), so that `objective` equals `loss`.

Two things TRL 1.16 does not take are taken here, for every loss: per-token loss weights in the data (a message's
`weight`, a tokenized row's `loss_weights`: `trl_emo.data.token_weights`), and a LoRA adapter on the output layer
(`trl_emo.training.lora_head`). With weights, `nll` and `dft` stay TRL's fused head's, each token's term weighted; with
an adapter on the head, which TRL's fused head would leave out, they are computed by trl_emo's `nll` and `dft`.
"""

from __future__ import annotations

import dataclasses
import logging

import torch
from transformers import TrainerCallback
from trl import SFTTrainer as _TRLSFTTrainer

from . import trl_compat as compat
from .atomic_checkpoints import AtomicCheckpoints
from .config import SFTConfig
from . import lora_head
from ..data.token_weights import WEIGHTS_COLUMN, carries_weights
from ..models.generation_eos import add_end_of_turn_to_generation_config
from ..losses.registry import TRL_LOSS_TYPES
from .objective import Objective, output_vocab_size

logger = logging.getLogger(__name__)


class NonFiniteLossError(FloatingPointError):
    """The loss became NaN or infinite: raised instead of training a NaN model."""


def _as_trl_emo_config(args, model) -> SFTConfig:
    if args is None:
        name = model if isinstance(model, str) else getattr(model.config, "_name_or_path", "model")
        return SFTConfig(f"{str(name).rstrip('/').split('/')[-1]}-SFT")
    if isinstance(args, SFTConfig):
        return args
    # A plain `trl.SFTConfig` or `TrainingArguments`: same fields, our defaults for the rest.
    # (`to_dict()` would mask every `*_token` field, `eos_token` included.)
    known = {f.name for f in dataclasses.fields(SFTConfig) if f.init}
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(args) if f.init and f.name in known}
    return SFTConfig(**values)


class SFTTrainer(AtomicCheckpoints, _TRLSFTTrainer):
    """TRL's [`trl.SFTTrainer`] with EMO, GEM and the baselines as `loss_type` values.

    Use it exactly like TRL's trainer, with [`trl_emo.SFTConfig`]:

    ```python
    from trl_emo import SFTConfig, SFTTrainer

    trainer = SFTTrainer(model="Qwen/Qwen2.5-0.5B", args=SFTConfig(loss_type="gem"), train_dataset=dataset)
    trainer.train()
    ```
    """

    _tag_names = ["trl", "sft", "trl-emo"]

    def __init__(self, model, args=None, *positional, **kwargs):
        args = _as_trl_emo_config(args, model)
        self._objective = None
        self._reference = None  # ASFT's reference model (trl_emo.training.reference.ReferenceModel)
        self._lagged = None  # PSFT's old policy, CurioSFT's teacher (trl_emo.training.lagged_policy.LaggedPolicy)
        self._gem_schedule = None  # GEM's adaptive beta (trl_emo.training.gem_schedule.GemBetaSchedule)
        self._sed_calibration = None  # SED's threshold to calibrate: (top_k, ratio, examples), until it is known
        self._train_sums = _MetricSums()  # this optimizer step's metric sums, logged at its end
        self._eval_sums = _MetricSums()  # this evaluation's, logged at its end
        self._weighted_data = False  # a dataset carries per-token weights (set by `_prepare_dataset`)
        self._trl_weights = False  # TRL's own `nll`/`dft` from TRL's fused head, each token's term weighted
        if args.loss_type not in TRL_LOSS_TYPES:
            self._check_own_loss_options(args, kwargs.get("compute_loss_func"), f"loss_type={args.loss_type!r}")
            objective = self._make_objective(args)
            with compat.trl_builds_own_loss_trainer(args), compat.trl_accepts_adapter_on_head():
                super().__init__(model, args, *positional, **kwargs)
            self._objective = objective
        else:
            with compat.trl_accepts_adapter_on_head():
                super().__init__(model, args, *positional, **kwargs)
            if lora_head.adapts(self._base_model()):
                # TRL's fused head would leave the adapter out (TRL refuses it): trl_emo's own `nll`/`dft` take it.
                self._check_own_loss_options(args, self.compute_loss_func, "a LoRA adapter on lm_head")
                self._objective = self._make_objective(args)
            elif self._weighted_data:
                self._check_own_loss_options(args, self.compute_loss_func, "per-token loss weights")
                self._trl_weights = True
        if self._objective is not None:
            if args.loss_implementation == "fused":
                from .lagged_policy import role_name

                lagged = self._objective.spec.lagged_reference is not None
                lora_head.check(self._base_model(), role_name(args.loss_type) if lagged else None)
            self._check_vocabulary(self._base_model())
            self._set_up_reference_and_schedule(args)
        if self._objective is not None or self._trl_weights:
            self.add_callback(_OptimizerStepCallback(self))
        if self._weighted_data:
            self._collate_weights()
        # Patched for TRL's own losses too: the wrapper also makes `copy.deepcopy(model)` run the
        # copy's weights, which TRL's patch alone does not (its plain calls reach the original).
        compat.add_objective_head(
            self._base_model(),
            self._objective.fused if self._objective is not None else None,
            reference=self._reference.hidden_states if self._reference is not None else None,
            reads_label_rows=self._objective is not None and self._objective.reads_label_rows,
            reads_sequences=self._objective is not None and self._objective.reads_sequences,
        )
        add_end_of_turn_to_generation_config(self.model, self._text_tokenizer())
        self._built = True

    # -- set-up ---------------------------------------------------------------------------
    @staticmethod
    def _check_own_loss_options(args, compute_loss_func, what: str) -> None:
        """Options that need TRL's own loss computation, refused where trl_emo computes the loss."""
        if compute_loss_func is not None:
            raise ValueError(
                f"`compute_loss_func` cannot be combined with {what}: the loss is computed by trl_emo. Register your "
                "loss with `trl_emo.register_loss` instead."
            )
        if args.label_smoothing_factor > 0:
            raise ValueError(f"label_smoothing_factor is not supported with {what}.")

    @staticmethod
    def _make_objective(args) -> Objective:
        return Objective(
            args.loss_type,
            args.loss_hyperparameters(),
            cost_source=args.emo_cost_embedding,
            chunk_size=args.fused_chunk_size,
            trust_remote_code=args.trust_remote_code,
            chunk_memory=None if args.fused_chunk_memory_mb is None else int(args.fused_chunk_memory_mb * 2**20),
            backend=args.fused_backend,
            fp32_head_grad=args.fused_fp32_head_grad,
        )

    # -- per-token weights in the data --------------------------------------------------------
    def _prepare_dataset(self, dataset, processing_class, args, packing, formatting_func, dataset_name):
        """TRL's preparation, or, for a dataset with per-token weights, TRL's with the weights laid on the tokens and
        carried through truncation and packing (`compat.prepare_weighted_dataset`)."""
        if getattr(self, "_is_vision_dataset", False) or not carries_weights(dataset):
            return super()._prepare_dataset(dataset, processing_class, args, packing, formatting_func, dataset_name)
        if getattr(self, "_built", False) and not self._weighted_data:
            # `evaluate(eval_dataset=...)` after a trainer built without weights: its collator and loss take none.
            raise ValueError(
                f"The {dataset_name} dataset has per-token loss weights but the trainer was built on data without them: "
                "pass it as eval_dataset when building the trainer."
            )
        self._weighted_data = True
        return compat.prepare_weighted_dataset(
            self, dataset, processing_class, args, packing, formatting_func, dataset_name
        )

    def _set_signature_columns_if_needed(self):
        super()._set_signature_columns_if_needed()
        if self._weighted_data and WEIGHTS_COLUMN not in self._signature_columns:
            self._signature_columns = [*self._signature_columns, WEIGHTS_COLUMN]

    def _collate_weights(self) -> None:
        collator = compat.weighted_collator(self.data_collator)
        if collator is not None:
            self.data_collator = collator
        else:
            logger.warning(
                "The dataset has per-token loss weights, which TRL's DataCollatorForLanguageModeling would pad beside "
                "the labels; the data_collator given (%s) must return them itself, as `%s` aligned with `labels`, or "
                "training is unweighted.", type(self.data_collator).__name__, WEIGHTS_COLUMN,
            )

    def _get_num_items_in_batch(self, batch_samples, device):
        # With per-token weights, the step's normalizer is the sum of the weights of its target tokens.
        if batch_samples and WEIGHTS_COLUMN in batch_samples[0]:
            return compat.count_weighted_items(self, batch_samples, device)
        return super()._get_num_items_in_batch(batch_samples, device)

    def _base_model(self):
        return self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model

    def _text_tokenizer(self):
        # A processor (vision-language models) holds its tokenizer; a tokenizer is its own.
        return getattr(self.processing_class, "tokenizer", self.processing_class)

    def _check_vocabulary(self, model) -> None:
        vocab = output_vocab_size(model)
        tokenizer = self._text_tokenizer()
        if len(tokenizer) > vocab:
            raise ValueError(
                f"Vocabulary mismatch: the tokenizer has {len(tokenizer)} tokens but the model's output embedding "
                f"has {vocab} rows, so some labels could not be scored. Resize the model first: "
                "`model.resize_token_embeddings(len(tokenizer))`."
            )
        if self._objective.spec.validate_vocab is not None:
            self._objective.spec.validate_vocab(self._objective.hparams, vocab)

    def _set_up_reference_and_schedule(self, args) -> None:
        lagged = self._objective.spec.lagged_reference
        if lagged is not None:
            from .lagged_policy import LaggedPolicy

            # Built now, before any step: the starting weights; it serves as the loss's reference.
            self._lagged = self._reference = LaggedPolicy.build(self, *lagged(self._objective.hparams),
                                                                loss=args.loss_type)
        elif self._objective.wants_reference:
            from .reference import ReferenceModel

            # Built now, before any step: "the starting weights" are these.
            field = self._objective.spec.reference_field
            self._reference = ReferenceModel.build(
                self, getattr(args, field) if field else None, field=field or "reference", loss=args.loss_type
            )
        if self._objective.spec.name == "sed" and self._objective.hparams.get("threshold") is None:
            self._sed_calibration = (args.sed_threshold_top_k, args.sed_threshold_ratio, args.sed_threshold_samples)
        if args.gem_target_entropy is not None:
            from .gem_schedule import GemBetaSchedule, check_target_entropy

            check_target_entropy(args.gem_target_entropy, output_vocab_size(self._base_model()))
            self._gem_schedule = GemBetaSchedule(args.gem_beta, args.gem_target_entropy, args.gem_beta_min, args.gem_beta_step)

    def _restore_side_files(self, checkpoint: str | None) -> None:
        # Called by `AtomicCheckpoints.train` with the checkpoint it resolved (`true`/`auto`/a folder; None: from
        # scratch). A folder named explicitly may lack a side file (`auto` skips such checkpoints): each loss says what
        # it does instead.
        from . import gem_schedule, objective

        if self._gem_schedule is not None and checkpoint:
            if self._gem_schedule.load(checkpoint):
                self._objective.hparams["beta"] = self._gem_schedule.beta
            else:
                logger.warning("Checkpoint %s has no %s: GEM's adaptive beta starts again from gem_beta=%s.", checkpoint,
                               gem_schedule.STATE_FILE, self._gem_schedule.beta)
        if self._sed_calibration is not None and checkpoint:
            from . import sed_threshold

            saved = sed_threshold.load(checkpoint)
            if saved is not None:
                self._objective.hparams["threshold"] = saved
            else:
                logger.warning(
                    "Checkpoint %s has no %s: SED's threshold is calibrated again, on the resumed (trained) weights.",
                    checkpoint,
                    sed_threshold.STATE_FILE,
                )
        if self._lagged is not None and checkpoint and not self._lagged.load(checkpoint):
            from .lagged_policy import STATE_FILE

            logger.warning("Checkpoint %s has no %s: %s's %s is re-taken from the resumed weights.", checkpoint,
                           STATE_FILE, self.args.loss_type.upper(), self._lagged.role)
        if self._objective is not None and self._objective.needs_cost:
            restored = bool(checkpoint) and self._objective.load_cost(checkpoint, self._base_model())
            head_trains = self._base_model().get_output_embeddings().weight.requires_grad
            if checkpoint and not restored and self._objective.cost_source == "frozen" and head_trains:
                logger.warning(
                    "Checkpoint %s has no %s: the frozen EMO cost embedding is re-taken from the resumed weights.",
                    checkpoint,
                    objective.COST_EMBEDDING_FILE,
                )
            self._objective.prepare_cost(self._base_model())

    def _checkpoint_side_files(self) -> list[str]:
        return self.args.checkpoint_side_files(self._base_model().get_output_embeddings().weight.requires_grad)

    def _write_side_files(self, folder: str) -> None:
        # Inside the staged save (`AtomicCheckpoints`), so a published checkpoint always has them.
        if self._objective is not None and self._objective.snapshot_must_be_saved(self._base_model()):
            self._objective.save_cost(folder)
        if self._gem_schedule is not None:
            self._gem_schedule.save(folder)
        if self._sed_calibration is not None:
            from . import sed_threshold

            sed_threshold.save(folder, self._objective.hparams["threshold"])
        if self._lagged is not None:
            self._lagged.save(folder)

    # -- the loss -------------------------------------------------------------------------
    def _raise_non_finite(self, mode: str) -> None:
        step = self.state.global_step + (1 if mode == "train" else 0)
        where = f"training step {step}" if mode == "train" else f"evaluation after step {step}"
        raise NonFiniteLossError(
            f"The {self.args.loss_type!r} loss is NaN or infinite at {where} (epoch {self.state.epoch or 0:.2f}): the "
            "model produced NaN/inf logits. Training stopped before this step's update; the last checkpoint in "
            f"{self.args.output_dir!r} is intact. Usual causes: a learning rate too high, fp16 overflow (prefer bf16), "
            "or corrupted weights."
        )

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        mode = "train" if self.model.training else "eval"
        weights = inputs.pop(WEIGHTS_COLUMN, None)
        if weights is not None and inputs.get("shift_labels") is not None:
            # Context and sequence parallelism shard the labels after the collator; the weights would not follow.
            raise ValueError("Per-token loss weights are not supported with pre-shifted labels (context or sequence "
                             "parallelism): train without them, or without that parallelism.")
        if self._objective is None and not self._trl_weights:
            if weights is not None:
                raise ValueError(
                    "This batch has per-token loss weights but the trainer was built on data without them: pass the "
                    "weighted dataset when building the trainer (train_dataset or eval_dataset)."
                )
            # TRL's own losses: exactly TRL's behaviour, a NaN included.
            return super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)

        logits_inputs = compat.loss_inputs(self, inputs)
        if self._objective is None:
            # TRL's `nll`/`dft` with per-token weights (an unweighted batch weighs 1 everywhere).
            if weights is None:
                weights = torch.ones_like(inputs["labels"], dtype=torch.float32)
            loss, result = compat.trl_loss_with_weights(self, model, inputs, weights, num_items_in_batch)
            if self.args.stop_on_non_finite_loss and not torch.isfinite(loss.detach()).all():
                self._raise_non_finite(mode)
            self._add_token_metrics(mode, result, inputs, num_items_in_batch)
            if return_outputs:
                return loss, compat.outputs_for_metrics(model, logits_inputs)
            return loss
        # Normally done when `train()` starts; here too for an `evaluate()` before any training.
        self._objective.prepare_cost(self._base_model())
        if self._sed_calibration is not None and self._objective.hparams.get("threshold") is None:
            self._calibrate_sed_threshold(model, inputs)
        if self.args.loss_implementation == "fused":
            outputs = model(**inputs, trl_emo_loss=True, num_items_in_batch=num_items_in_batch, trl_emo_weights=weights)
            loss, result, aux_loss = outputs.loss, outputs.result, outputs.aux_loss
        else:
            model_outputs = model(**logits_inputs)
            reference_logits = None
            if self._reference is not None:
                reference_logits = self._reference.logits(self._base_model(), logits_inputs)
            result = self._objective.from_logits(
                model_outputs.logits,
                inputs["labels"],
                self._base_model(),
                num_items_in_batch=num_items_in_batch,
                shift_labels=inputs.get("shift_labels"),
                reference_logits=reference_logits,
                position_ids=inputs.get("position_ids"),
                weights=weights,
            )
            loss, aux_loss = result.loss, getattr(model_outputs, "aux_loss", None)

        if self.args.stop_on_non_finite_loss and not torch.isfinite(loss.detach()).all():
            self._raise_non_finite(mode)
        loss = compat.finish_loss(self, loss, aux_loss, num_items_in_batch, mode)
        self._add_token_metrics(mode, result, inputs, num_items_in_batch)
        if return_outputs:
            return loss, compat.outputs_for_metrics(model, logits_inputs)
        return loss

    def _add_token_metrics(self, mode, outputs, inputs, num_items_in_batch) -> None:
        """Add this batch's objective, cross-entropy, entropy, top-1 accuracy and the loss's own metrics to the sums
        logged at the end of the optimizer step (training) or of the evaluation, each weighted as the Trainer weights
        this batch in its `loss` / `eval_loss`; and count TRL's `num_tokens`."""
        names = ("objective", "cross_entropy", "entropy", "mean_token_accuracy", *(outputs.metrics or {}))
        rows = outputs.target_rows  # None: every row is a target position (see `FusedLossOutput`)
        if outputs.weights is not None:
            # With per-token weights every statistic is a weighted mean, as the loss is (label-only rows weigh 0).
            rows = outputs.weights

        def token_sum(values):
            # Statistics of the target positions only; the objective's rows all count (they sum to the loss).
            return (values.sum() if rows is None else (values * rows.to(values.dtype)).sum()).float()

        count = outputs.token_losses.numel() if rows is None else rows.sum()
        sums = torch.stack(
            [
                outputs.token_losses.sum().float(),
                token_sum(outputs.nll),
                token_sum(outputs.entropy),
                token_sum(outputs.is_top1),
                *(token_sum(outputs.metrics[name]) for name in names[4:]),
            ]
        )
        weighted = sums * compat.loss_weight(self, num_items_in_batch, count, mode, sums.device)
        if mode == "train":
            # GEM's schedule wants the step's plain token mean of the entropy, whatever the loss's weighting:
            # the raw token count and entropy sum travel with the weighted sums, in the same collective.
            raw = torch.stack([torch.as_tensor(count, device=sums.device, dtype=torch.float32), sums[2]])
            self._train_sums.add(names, torch.cat([weighted, raw]))
        else:
            rows = compat.gather_eval_batch(self, weighted, inputs)
            self._eval_sums.add(names, rows.sum(0), rows.shape[0])
        compat.count_train_tokens(self, inputs, mode)

    def _end_optimizer_step(self) -> None:
        """Log the step's metrics (one value per step, which TRL's `log` averages over the steps of the logging window,
        as the Trainer averages `loss`) and move GEM's beta."""
        step = self._train_sums.pop()
        if step is not None:
            names, local, _ = step
            # One collective per optimizer step for every metric; averaged over processes like `tr_loss`.
            gathered = compat.gather_step(self, local)
            values = gathered[:, : len(names)].mean(0).tolist()
            count, entropy_sum = gathered[:, len(names) :].sum(0).tolist()
            for name, value in zip(names, values):
                compat.log_metric(self, "train", name, value)
            if self._gem_schedule is not None:
                # Summed over every process, so every process moves beta the same way.
                self._gem_schedule.observe(entropy_sum=entropy_sum, count=count)
        if self._gem_schedule is not None:
            self._update_gem_beta()
        if self._lagged is not None:
            # Before the checkpoint of this step is saved (the Trainer saves after `on_step_end`).
            self._lagged.after_step(self.state.global_step)
        if self._sed_calibration is not None and self._objective.hparams.get("threshold") is not None:
            compat.set_metric(self, "train", "sed_threshold", self._objective.hparams["threshold"])

    def evaluation_loop(self, *args, **kwargs):
        if self._objective is None and not self._trl_weights:
            return super().evaluation_loop(*args, **kwargs)
        self._eval_sums.pop()  # what an interrupted evaluation left
        output = super().evaluation_loop(*args, **kwargs)
        done = self._eval_sums.pop()
        if done is not None:
            # One value per evaluation (set, not appended): the mean of the Trainer's per-example rows, so
            # `eval_objective` is `eval_loss` (see `compat.gather_eval_batch`).
            names, sums, rows = done
            for name, value in zip(names, (sums / max(rows, 1)).tolist()):
                compat.set_metric(self, "eval", name, value)
        return output

    def _calibrate_sed_threshold(self, model, inputs) -> None:
        """SED's `τ` on the model as it starts, once (see `trl_emo.training.sed_threshold`)."""
        from accelerate.utils import broadcast

        from . import sed_threshold

        top_k, ratio, count = self._sed_calibration
        dataset = self.eval_dataset if self.eval_dataset is not None else self.train_dataset
        examples = sed_threshold.calibration_sequences(dataset, count)
        device = inputs["input_ids"].device
        value = sed_threshold.calibrate(model, self._base_model(), examples, top_k, ratio, device)
        # Every process computed it on the same examples; the main process's value is everyone's.
        value = float(broadcast(torch.tensor([value], device=device, dtype=torch.float64))[0])
        self._objective.hparams["threshold"] = value
        logger.warning(
            "SED threshold calibrated on the starting model: tau = %.6f (top-%d mass reached by %g of the positions of "
            "%d examples).", value, top_k, ratio, len(examples),
        )

    def _update_gem_beta(self) -> None:
        beta = self._gem_schedule.update()
        self._objective.hparams["beta"] = beta
        message = self._gem_schedule.saturation_message()
        if message is not None:
            logger.warning(message)
        compat.set_metric(self, "train", "gem_beta", beta)


class _MetricSums:
    """Weighted metric sums, kept on the device until they are logged: no host synchronisation per micro-batch.

    The Trainer logs as `loss` the mean, over the optimizer steps of the logging window, of each step's loss: the
    per-micro-batch losses of the step (already normalized by the step's token count, `num_items_in_batch`) summed and
    averaged over processes. A micro-batch's metrics are weighted here as its loss is weighted there
    (`compat.loss_weight`), so each step's values are token means over the whole step and every process (with the
    default `average_tokens_across_devices`), logged once per step (`_end_optimizer_step`) for TRL's `log` to average
    over the window. In evaluation, the Trainer's `eval_loss` is the mean over examples of their batch's token mean
    (`compat.gather_eval_batch`); the metrics are logged the same way, once per evaluation.
    """

    def __init__(self):
        self.names: tuple[str, ...] | None = None
        self.total = None
        self.rows = 0

    def add(self, names: tuple[str, ...], values, rows: int = 0) -> None:
        if self.total is None:
            self.names, self.total = names, values
        else:
            if names != self.names:
                raise RuntimeError(f"The loss returned metrics {names} after {self.names} in the same step.")
            self.total = self.total + values
        self.rows += rows

    def pop(self):
        """`(names, summed values, rows)`, or None when nothing was added; then start afresh."""
        if self.total is None:
            return None
        done = (self.names, self.total, self.rows)
        self.names, self.total, self.rows = None, None, 0
        return done


class _OptimizerStepCallback(TrainerCallback):
    """At the end of every optimizer step: log the step's metrics, move GEM's beta toward the target entropy
    (`gem_target_entropy`) when it is set, and refresh PSFT's old policy / CurioSFT's teacher on their schedule."""

    def __init__(self, trainer: SFTTrainer):
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        self.trainer._train_sums.pop()  # what an interrupted `train()` left
        if self.trainer._lagged is not None:
            self.trainer._lagged.begin_training()

    def on_step_end(self, args, state, control, **kwargs):
        self.trainer._end_optimizer_step()
