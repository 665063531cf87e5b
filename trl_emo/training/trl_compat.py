"""Every place where trl_emo's training layer copies, patches or calls a private part of TRL, in one module.

TRL's internals change between releases (`loss_type` gained and deprecated `chunked_nll`; the fused head
is recent), so each piece below names the TRL version and the source (file, function) it mirrors, and
`tests/test_trl_compat.py` compares each one's behaviour with TRL's own: a TRL upgrade that changes one of
them fails a named test there, not a user's run. Where TRL has a public equivalent, trl_emo uses that
instead (the trainer's tokenizer is `processing_class`, not TRL's `_tokenizer`).

Pieces (all mirror TRL 1.16.0):

- `logit_transform`: how the fused head reads logit scaling and soft-capping from the model config
  (`trl/trainer/utils.py`, `add_fused_lm_head`).
- `gather_lm_head`: a TRL helper outside TRL's top-level API, re-exported so that no other module imports it.
- `add_objective_head`, `head_parameters`, `ObjectiveOutput`: the model forward that computes a trl_emo
  loss from the hidden states, modelled on (and wrapped around) TRL's patched forward
  (`trl/trainer/utils.py`, `add_fused_lm_head._fused_forward`).
- `trl_builds_own_loss_trainer`: the `loss_type` swap around `SFTTrainer.__init__`, whose check accepts
  only TRL's own losses (`trl/trainer/sft_trainer.py`, `SFTTrainer.__init__`).
- `loss_inputs`, `finish_loss`, `log_metric`, `set_metric`, `count_train_tokens`, `outputs_for_metrics`: the parts of
  TRL's `compute_loss` that trl_emo's `compute_loss` repeats for its own losses
  (`trl/trainer/sft_trainer.py`, `SFTTrainer.compute_loss`).
- `loss_weight`, `gather_step`, `gather_eval_batch`: how transformers' `Trainer` (5.23, under TRL's `SFTTrainer`)
  weights each batch in the `loss` and `eval_loss` it logs (`Trainer.training_step`, `_maybe_log_save_evaluate`,
  `evaluation_loop`), so that trl_emo's metrics are averaged the same way and `objective` equals `loss`.
- `prepare_sft_examples`: `SFTTrainer._prepare_dataset`, called without a trainer for `--dry_run` and the held-out
  statistics (TRL 1.16 has no public function that prepares a dataset without building a trainer, hence a model)
  (`trl/trainer/sft_trainer.py`).
- Per-token loss weights (`trl_emo.data.token_weights`): `prepare_weighted_dataset` (`SFTTrainer._prepare_dataset`,
  whose truncation and packing keep only `input_ids` and `labels`, with the weights carried through both),
  `weighted_collator` (`DataCollatorForLanguageModeling`, the weights padded beside the labels), `count_weighted_items`
  (transformers' `Trainer._get_num_items_in_batch`, the sum of the weights in place of the count of tokens),
  `trl_loss_with_weights` (the `nll`/`dft` branch of `SFTTrainer.compute_loss`, each token's term weighted).
- `trl_accepts_adapter_on_head`: lifts `SFTTrainer.__init__`'s refusal of a PEFT adapter on `lm_head` (TRL's fused
  head reads `lm_head.weight` and would ignore it; trl_emo's fused path computes the adapter).

The pieces the data layer needs, which sits below this one (`has_generation_markers`,
`template_masks_assistant_turns`: how `SFTTrainer.__init__` picks the training chat template and the completion-only
loss), are `trl_emo.data.trl_compat`'s, re-exported here; `tests/test_trl_compat.py` covers both modules.

The list of TRL's own loss types stays `trl_emo.losses.registry.TRL_LOSS_TYPES` (the losses package imports
nothing from TRL); `tests/test_trl_compat.py` checks it against TRL's.

TRL itself is imported where a piece is used, so importing this module costs transformers' `ModelOutput` only.
"""

from __future__ import annotations

import contextlib
import functools
import types
from dataclasses import dataclass
from typing import Any

from transformers.utils import ModelOutput

# Re-exported: the data layer's pieces of the seam (see the docstring).
from ..data.trl_compat import TRL_VERSION, has_generation_markers, template_masks_assistant_turns  # noqa: F401


# -- helpers outside TRL's top-level API --------------------------------------------------------------------------


def gather_lm_head(*params):
    """TRL's `maybe_gather_lm_head_ctx` (`trl/trainer/utils.py`): gathers the ZeRO-3 partitioned head for a direct
    read; a null context otherwise."""
    from trl.trainer.utils import maybe_gather_lm_head_ctx

    return maybe_gather_lm_head_ctx(*params)


# -- the fused head: logit transform and the patched forward ------------------------------------------------------


def logit_transform(model):
    """The logit scale and soft-cap a model applies after its head, read from the config as TRL's fused head reads
    them (TRL 1.16 `trl/trainer/utils.py`, `add_fused_lm_head`), as a `HeadTransform`."""
    from ..losses.standalone import logit_transform_of

    # The reading lives with the losses, which outside TRL (`FusedLinearLoss.for_model`) read it the same way.
    return logit_transform_of(model.config.get_text_config())


@dataclass
class ObjectiveOutput(ModelOutput):
    """What `model(..., trl_emo_loss=True)` returns: the objective's `FusedLossOutput` (`result`), its `loss`, and the
    MoE router loss.

    A `ModelOutput` rather than the losses package's plain dataclass because DDP and FSDP2 find the tensors of a
    forward's output to hook through torch's pytree, where transformers registers every `ModelOutput`: a plain
    dataclass is one opaque leaf, and its `loss` would miss DDP's and FSDP2's backward hooks. `result.loss` is the
    same tensor as `loss` before those hooks; read `loss`.
    """

    loss: Any = None
    result: Any = None  # `trl_emo.losses.FusedLossOutput`, its per-position tensors over the target positions only
    aux_loss: Any = None


def head_parameters(model):
    """The output embedding's weight and bias, looked up now (PEFT and FSDP replace modules after patching); under
    FSDP2 the full tensors, as TRL's fused forward takes them (TRL 1.16 `add_fused_lm_head._fused_forward`)."""
    from torch.distributed.tensor import DTensor

    head = model.get_output_embeddings()
    weight, bias = head.weight, head.bias
    # Gradients flow back to the shards through `full_tensor`.
    if isinstance(weight, DTensor):
        weight = weight.full_tensor()
        if bias is not None:
            bias = bias.full_tensor()
    return weight, bias


def head_adapter_parameters(head) -> list:
    """The parameters of a LoRA adapter on the head that the fused path reads outside their module's forward (the
    up-projections and their biases), for the ZeRO-3 gather (`gather_lm_head`); none without one."""
    from .lora_head import adapter_read_parameters

    return adapter_read_parameters(head)


def add_objective_head(
    model, objective, reference=None, reads_label_rows: bool = False, reads_sequences: bool = False
) -> None:
    """Patch `model.forward` (already patched by TRL's `add_fused_lm_head`) to compute `objective` when
    `trl_emo_loss=True`.

    Mirrors TRL 1.16's `_fused_forward` (`trl/trainer/utils.py`, `add_fused_lm_head`): the backbone through
    `base_model`, no KV cache, router logits when the config asks for them, the label shift (none for
    `shift_labels`), the hidden states moved to the head's device, the head read at call time (FSDP2 full tensors,
    ZeRO-3 gathered), and Mixtral's load-balancing loss for MoE models. Where TRL projects the valid positions
    through the head into log-probabilities, this calls `objective(hidden [N, H], weight, bias, targets [N],
    num_items_in_batch, transform)`, which returns a `FusedLossOutput`. Without the flag the call is TRL's. Call it on
    the base model (`get_base_model()` under PEFT), like TRL does.

    `reference(model, args, kwargs)`, when given (ASFT, EKSFT, PSFT, CurioSFT), returns a reference model's `(hidden
    [B, T, H'], head weight, head bias, transform)` for the same batch, computed without gradient; its hidden states are
    shifted and masked like the policy's and handed to `objective` as `reference=` (a
    `trl_emo.losses.asft.ReferenceHead`). It may return None (a lagged reference equal to the policy now): then no
    `reference=` is passed.

    When the objective reads label rows (its `reads_label_rows`, EKSFT's authors' formula), the rows are the target
    positions and the positions whose own label is a token (`trl_emo.losses._common.select_positions`), with their
    roles as `roles=`. When it reads sequences (`reads_sequences`, iw-SFT's per-sequence weight), each row's sequence
    (its batch row, or its example in a packed row by the `position_ids` TRL's padding-free collator passes) goes as
    `sequences=`. `trl_emo_weights` (per-token loss weights aligned with the labels, `[B, T]`) reach the objective
    as each row's weight (`weights=`), and a LoRA adapter on the head as its low-rank term (`adapter=`, a
    `trl_emo.losses.fused.HeadAdapter` computed from the rows by `trl_emo.training.lora_head`). `trl_emo_probe=fn`
    instead returns `fn(hidden [B, T, H], weight, bias, transform)` after the
    backbone, the head gathered as for the loss (SED's threshold calibration: every rank runs it).
    """
    from ..losses._common import select_positions

    # Everything below is looked up on `self` at call time, never through a closure over this instance:
    # `copy.deepcopy(model)` rebinds the method to the copy, which must then run its own weights. (TRL's patch calls
    # the original instance's forward for plain calls, so plain calls go to the class's forward here, and only
    # `fused_lm_head=True` calls to TRL's function.)
    previous = model.forward
    trl_fused_forward = getattr(previous, "__func__", None)
    transform = logit_transform(model)

    @functools.wraps(type(model).forward)
    def forward(self, *args, trl_emo_loss=False, labels=None, shift_labels=None, num_items_in_batch=None,
                trl_emo_probe=None, trl_emo_weights=None, **kwargs):
        probe = trl_emo_probe
        if not trl_emo_loss and probe is None:
            passthrough = {"labels": labels, "shift_labels": shift_labels, "num_items_in_batch": num_items_in_batch}
            passthrough = {k: v for k, v in passthrough.items() if v is not None}
            if kwargs.get("fused_lm_head"):
                fused = previous if trl_fused_forward is None else functools.partial(trl_fused_forward, self)
                return fused(*args, **passthrough, **kwargs)
            kwargs.pop("fused_lm_head", None)
            return type(self).forward(self, *args, **passthrough, **kwargs)
        if objective is None and probe is None:
            raise ValueError("This model was patched without a trl_emo objective (loss_type is TRL's own).")
        label_rows = probe is None and reads_label_rows
        text_config = self.config.get_text_config()
        kwargs["use_cache"] = False
        if getattr(text_config, "output_router_logits", False):
            kwargs.setdefault("output_router_logits", True)
        if probe is not None:
            # Hidden states of every position, for a computation of the caller's (SED's threshold calibration), in the
            # model's own precision: accelerate wraps the forward in the mixed-precision autocast, which would run the
            # backbone and the head's product in bf16 (the fused loss turns it off for its head step too).
            import torch

            weight, bias = head_parameters(self)
            inputs = kwargs.get("input_ids", kwargs.get("inputs_embeds"))
            device_type = (inputs if isinstance(inputs, torch.Tensor) else weight).device.type
            with torch.autocast(device_type, enabled=False):
                hidden = self.base_model(*args, **kwargs).last_hidden_state
                from .lora_head import adapter_read_parameters, merged_head

                head = self.get_output_embeddings()
                with gather_lm_head(weight, bias, *adapter_read_parameters(head, with_down=True)):
                    # A LoRA adapter on the head merged into a copy of it for the probe (once per calibration).
                    weight, bias = merged_head(head, weight, bias)
                    return probe(hidden.to(weight.device), weight, bias, transform)
        backbone_outputs = self.base_model(*args, **kwargs)
        hidden = backbone_outputs.last_hidden_state
        weight, bias = head_parameters(self)
        extra = {}
        # The loss reads the label rows too with EKSFT's authors' formula: the rows are then every position that is
        # a target or has a label, with their roles.
        positions = select_positions(labels, shift_labels, label_rows=label_rows, device=weight.device,
                                     weights=trl_emo_weights)
        if positions.roles is not None:
            extra["roles"] = positions.roles
        if positions.weights is not None:
            extra["weights"] = positions.weights
        if probe is None and reads_sequences:
            if shift_labels is not None:
                from ..losses._common import PER_SEQUENCE_WITH_SHIFT_LABELS

                raise ValueError(PER_SEQUENCE_WITH_SHIFT_LABELS)
            extra["sequences"] = positions.sequences(labels, kwargs.get("position_ids"))
        if reference is not None:
            from ..losses.asft import ReferenceHead

            found = reference(self, args, kwargs)  # None: a lagged reference that equals the policy now
            if found is not None:
                ref_hidden, ref_weight, ref_bias, ref_transform = found
                extra["reference"] = ReferenceHead(
                    positions.take(ref_hidden.to(weight.device)), ref_weight, ref_bias, ref_transform.logit_scale,
                    ref_transform.softcap,
                )
        from .lora_head import head_adapter

        rows = positions.take(hidden.to(weight.device))
        head = self.get_output_embeddings()
        with gather_lm_head(weight, bias, *head_adapter_parameters(head)):
            # Masked positions are dropped before any product with the head. With `device_map`, the backbone can end
            # on another device than the head.
            adapter, adapter_bias = head_adapter(head, rows)
            if adapter is not None:
                extra["adapter"] = adapter
                bias = adapter_bias
            result = objective(rows, weight, bias, positions.targets, num_items_in_batch, transform, **extra)
        aux_loss = None
        if kwargs.get("output_router_logits"):
            from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

            num_experts = getattr(text_config, "num_experts", None) or getattr(text_config, "num_local_experts", None)
            aux_loss = load_balancing_loss_func(
                backbone_outputs.router_logits,
                num_experts,
                text_config.num_experts_per_tok,
                kwargs.get("attention_mask"),
            )
        return ObjectiveOutput(loss=result.loss, result=result, aux_loss=aux_loss)

    model.forward = types.MethodType(forward, model)


# -- SFTTrainer.__init__ and compute_loss --------------------------------------------------------------------------


@contextlib.contextmanager
def trl_builds_own_loss_trainer(args):
    """Run TRL's `SFTTrainer.__init__` for a trl_emo loss: TRL 1.16 (`trl/trainer/sft_trainer.py`,
    `SFTTrainer.__init__`) refuses any `loss_type` but its own and builds everything else the same way, so
    `loss_type` reads "nll" while it runs and gets its value back afterwards."""
    loss_type, args.loss_type = args.loss_type, "nll"
    try:
        yield
    finally:
        args.loss_type = loss_type


def loss_inputs(trainer, inputs: dict) -> dict:
    """Set up `inputs` as TRL 1.16's `SFTTrainer.compute_loss` does (no KV cache, router logits for MoE models) and
    return the inputs of a forward that builds the logits (without the labels)."""
    inputs["use_cache"] = False
    if trainer.aux_loss_enabled:
        inputs["output_router_logits"] = True
    return {k: v for k, v in inputs.items() if k not in ("labels", "shift_labels")}


def finish_loss(trainer, loss, aux_loss, num_items_in_batch, mode: str):
    """The last steps of TRL 1.16's `SFTTrainer.compute_loss` on a computed loss: scaled by the number of processes
    when `num_items_in_batch` counts every rank's tokens (DDP averages gradients), plus the MoE router loss averaged
    over the accumulation steps, logged as `aux_loss`."""
    if trainer.args.average_tokens_across_devices and num_items_in_batch is not None:
        loss = loss * (trainer.accelerator.num_processes // trainer.get_tp_size())
    if trainer.aux_loss_enabled and aux_loss is not None:
        steps = trainer.current_gradient_accumulation_steps if num_items_in_batch is not None else 1
        loss = loss + trainer.router_aux_loss_coef * aux_loss / steps
        log_metric(trainer, mode, "aux_loss", trainer.accelerator.gather_for_metrics(aux_loss.detach()).mean().item())
    return loss


# -- how transformers' Trainer averages the loss it logs (transformers 5.23 `trainer.py`) ------------------------------


def loss_weight(trainer, num_items_in_batch, num_positions: int, mode: str, device):
    """What one unit of a batch's summed per-token loss adds, on this process, to the loss the Trainer logs for it.

    Training (`Trainer.training_step` around our `compute_loss` and `finish_loss`): the sum is divided by
    `num_items_in_batch` (the target tokens of the whole optimizer step, of every process with
    `average_tokens_across_devices`) or, without it, by the batch's own positions; multiplied by the number of
    processes when `num_items_in_batch` counts them all (`finish_loss`); divided by the micro-batches of the step unless
    the loss is already normalized over them (`loss_is_scaled_for_ga`). `_maybe_log_save_evaluate` sums these over the
    micro-batches of a step (`tr_loss`), averages over processes and divides by the steps since the last log.

    Evaluation: TRL's `SFTTrainer.prediction_step` passes no `num_items_in_batch`, so a batch's loss is its own token
    mean. With per-token weights the counts are sums of weights (`count_weighted_items`). Returned as a 0-d float32 tensor on `device` (no host synchronisation)."""
    import torch

    from ..losses._common import normalizer

    tokens = num_positions if num_items_in_batch is None else num_items_in_batch
    weight = 1.0 / normalizer(tokens, device, torch.float32)
    if trainer.args.average_tokens_across_devices and num_items_in_batch is not None:
        weight = weight * (trainer.accelerator.num_processes // trainer.get_tp_size())
    if mode == "train":
        scaled_for_ga = getattr(trainer, "loss_is_scaled_for_ga", None)
        if scaled_for_ga is None:
            scaled_for_ga = (
                trainer.model_accepts_loss_kwargs and num_items_in_batch is not None
            ) or trainer.compute_loss_func is not None
        if not scaled_for_ga:
            steps = getattr(trainer, "current_gradient_accumulation_steps", trainer.args.gradient_accumulation_steps)
            weight = weight / steps
    return weight


def gather_step(trainer, local):
    """`local` (a vector) of every process, one row each, as `_maybe_log_save_evaluate` gathers `tr_loss` before
    averaging it over processes. A plain gather: `gather_for_metrics` would cut the rows to the dataset's remainder at
    the end of the training dataloader (it counts examples, not processes)."""
    return trainer.accelerator.gather(local[None])


def gather_eval_batch(trainer, values, inputs):
    """`values` (a vector of per-batch values) as `Trainer.evaluation_loop` gathers a batch's loss: repeated once per
    example slot of the batch (`losses.repeat(batch_size)`, `batch_size` = `args.eval_batch_size`), gathered from every
    process by `gather_for_metrics`, which drops the padding examples of the last batch. `eval_loss` is the mean of all
    the rows of an evaluation, so the mean of these rows is `eval_loss`'s counterpart."""
    batch_size = trainer.args.eval_batch_size
    if batch_size is None:  # the Trainer then takes the batch's own size
        from transformers.trainer_pt_utils import find_batch_size

        batch_size = find_batch_size(inputs)
    return trainer.accelerator.gather_for_metrics(values[None].repeat(batch_size, 1))


def log_metric(trainer, mode: str, name: str, value: float) -> None:
    """Add one value to TRL's per-step metrics (`SFTTrainer._metrics`, averaged and cleared by `SFTTrainer.log`)."""
    trainer._metrics[mode][name].append(value)


def set_metric(trainer, mode: str, name: str, value: float) -> None:
    """Log the current value of a quantity rather than its average over the logging window, the way TRL 1.16 logs
    `num_tokens` (`SFTTrainer.compute_loss`): the metric's list holds that one value."""
    trainer._metrics[mode][name] = [value]


def count_train_tokens(trainer, inputs: dict, mode: str) -> None:
    """TRL 1.16's `num_tokens` metric (`SFTTrainer.compute_loss`): tokens seen in training, from the attention mask,
    or from `position_ids` in padding-free batches."""
    if mode == "train":
        if "attention_mask" in inputs:
            num_tokens = trainer.accelerator.gather_for_metrics(inputs["attention_mask"].sum()).sum().item()
        else:
            import torch

            local_tokens = torch.tensor(inputs["position_ids"].size(1), device=inputs["position_ids"].device)
            num_tokens = trainer.accelerator.gather_for_metrics(local_tokens).sum().item()
        trainer._total_train_tokens += num_tokens // trainer._tp_size
    set_metric(trainer, mode, "num_tokens", trainer._total_train_tokens)


def outputs_for_metrics(model, logits_inputs: dict):
    """`compute_loss(return_outputs=True)`: one more forward for the logits `compute_metrics` wants (deprecated in
    TRL 1.16 too; its fused head builds no logits either)."""
    import torch

    with torch.no_grad():
        return model(**logits_inputs)


# -- SFT data preparation (--dry_run) ------------------------------------------------------------------------------


def prepare_sft_examples(dataset, tokenizer, training_args, n: int):
    """Tokenize and label the first `n` rows of `dataset` exactly as TRL's `SFTTrainer` does, without building the
    trainer or loading the model.

    Repeats `SFTTrainer.__init__`'s choice of the training chat template (`assistant_only_loss` with a template
    without `{% generation %}` markers) and of the completion-only loss (on for prompt/completion rows unless set),
    then calls `SFTTrainer._prepare_dataset` (`prepare_weighted_dataset` for a dataset with per-token weights) with a
    stand-in for the trainer holding the three attributes it reads (TRL 1.16 `trl/trainer/sft_trainer.py`). With `packing`, the first `n` rows are packed as the trainer packs them
    (a plain-text dry run shows the blocks that train), and the first `n` blocks returned.
    """
    from trl import SFTTrainer as TRLSFTTrainer
    from trl.chat_template_utils import get_training_chat_template
    from trl.data_utils import is_conversational

    rows = dataset.select(range(min(n, len(dataset))))
    sample = rows[0]
    chat_template = None
    if training_args.assistant_only_loss and not has_generation_markers(tokenizer.chat_template):
        chat_template = get_training_chat_template(tokenizer)
    completion_only = training_args.completion_only_loss
    if completion_only is None:
        completion_only = "prompt" in sample and "completion" in sample
    if training_args.assistant_only_loss and not is_conversational(sample):
        from ..core.errors import ConfigError

        raise ConfigError("assistant_only_loss=True needs conversational data, but the formatted dataset is not.")
    stand_in = types.SimpleNamespace(_tokenizer=tokenizer, completion_only_loss=completion_only, chat_template=chat_template)
    # Packed like the trainer packs them, so a plain-text dry run shows the blocks that train; per-token weights laid
    # on the tokens as the trainer lays them (`trl_emo.SFTTrainer._prepare_dataset`).
    from ..data.token_weights import carries_weights

    prepare = prepare_weighted_dataset if carries_weights(rows) else TRLSFTTrainer._prepare_dataset
    prepared = prepare(stand_in, rows, tokenizer, training_args, training_args.packing, None, "dry-run")
    return prepared.select(range(min(n, len(prepared))))


def prompt_token_counts(dataset, tokenizer, training_args, n: int = 256) -> list[int]:
    """How many tokens come before the first trained one in each of the first `n` rows, as TRL tokenizes and labels
    them (`prepare_sft_examples`, without truncation or packing): the prompt a `max_length` must leave room past."""
    import copy

    untruncated = copy.copy(training_args)  # not `dataclasses.replace`: no `__post_init__` (device set-up) again
    untruncated.max_length, untruncated.packing = None, False
    counts = []
    for row in prepare_sft_examples(dataset, tokenizer, untruncated, n):
        labels = row["labels"]
        counts.append(next((i for i, label in enumerate(labels) if label != -100), len(labels)))
    return counts


# -- a PEFT adapter on the output layer ----------------------------------------------------------------------------


class _NoTunerLayer:
    """Never an instance: stands in for PEFT's `BaseTunerLayer` in TRL's check while TRL builds the trainer."""


@contextlib.contextmanager
def trl_accepts_adapter_on_head():
    """Run TRL 1.16's `SFTTrainer.__init__` with a PEFT adapter on `lm_head` (`trl/trainer/sft_trainer.py`, the check
    `isinstance(model.get_output_embeddings(), BaseTunerLayer)`): TRL refuses it because its fused head multiplies
    by `lm_head.weight` and would leave the adapter out; trl_emo's fused path adds the adapter's term
    (`trl_emo.training.lora_head`), and `SFTTrainer` sends TRL's own `nll`/`dft` through it when the head has one."""
    import trl.trainer.sft_trainer as sft_trainer

    original = getattr(sft_trainer, "BaseTunerLayer", None)
    if original is None:  # PEFT not installed: TRL never checks
        yield
        return
    sft_trainer.BaseTunerLayer = _NoTunerLayer
    try:
        yield
    finally:
        sft_trainer.BaseTunerLayer = original


# -- per-token loss weights ------------------------------------------------------------------------------------------


def prepare_weighted_dataset(trainer, dataset, processing_class, args, packing, formatting_func, dataset_name):
    """`SFTTrainer._prepare_dataset` (TRL 1.16) for a dataset with per-token weights (`trl_emo.data.token_weights`).

    TRL tokenizes and labels the rows (its own `_prepare_dataset`, asked neither to truncate nor to pack nor to
    shuffle); the weights are then laid on the tokens (a conversation's per-message `weight`, or a tokenized row's
    `loss_weights`, checked), zero-weight labels masked, and TRL's last steps repeated with the weights carried:
    truncation to `max_length` (`truncation_mode`), the fully masked rows dropped, packing (`pack_dataset` over
    `input_ids`, `labels`, `loss_weights`, shuffled first when `shuffle_dataset`), the final shuffle. A dataset without
    weights never comes here (`SFTTrainer._prepare_dataset`), so TRL prepares it exactly as before."""
    import copy
    import json

    from datasets import Dataset
    from trl import SFTTrainer as TRLSFTTrainer
    from trl import pack_dataset
    from trl.data_utils import _tokenize
    from trl.trainer.utils import global_then_local_main_first

    from ..data import token_weights as tw

    if formatting_func is not None:
        from ..core.errors import ConfigError

        raise ConfigError(
            "Per-token weights (a message `weight` or `loss_weights`) are laid on the tokens the chat template renders; "
            "they cannot be combined with formatting_func: drop one of them."
        )
    plain = copy.copy(args)  # not `dataclasses.replace`: no `__post_init__` (device set-up) again
    plain.max_length, plain.packing, plain.shuffle_dataset = None, False, False
    dataset = TRLSFTTrainer._prepare_dataset(trainer, dataset, processing_class, plain, False, None, dataset_name)

    map_kwargs = {}
    if isinstance(dataset, Dataset):  # `IterableDataset.map` takes neither `num_proc` nor `desc`
        map_kwargs["num_proc"] = args.dataset_num_proc
    chat_template = getattr(trainer, "chat_template", None)

    def lay(example):
        n = len(example["input_ids"])
        if tw.WEIGHTS_COLUMN in example and example[tw.WEIGHTS_COLUMN] is not None:
            weights = tw.check_token_weights(example[tw.WEIGHTS_COLUMN], n)
        else:
            conversation = tw.conversation_of(example)
            if conversation is None:
                weights = [1.0] * n
            else:
                messages, field = conversation
                tools = example.get("tools")
                kwargs = {
                    "chat_template": chat_template,
                    "tools": json.loads(tools) if isinstance(tools, str) else tools,
                    **(example.get("chat_template_kwargs") or {}),
                }

                def tokenize(turns):
                    return list(_tokenize(processing_class, turns, **kwargs)["input_ids"])

                weights = tw.lay_message_weights(messages, example["input_ids"], tokenize, field)
                if len(weights) != n:  # the whole conversation rendered otherwise than TRL's tokenization
                    raise ValueError(f"per-message weights: {len(weights)} weights for {n} tokens")
        return {"labels": tw.apply_to_labels(example["labels"], weights), tw.WEIGHTS_COLUMN: weights}

    with global_then_local_main_first():
        if isinstance(dataset, Dataset):
            map_kwargs["desc"] = f"Laying per-token weights on {dataset_name} dataset"
        dataset = dataset.map(lay, **map_kwargs)
        if args.max_length is not None and not packing:
            if isinstance(dataset, Dataset):
                map_kwargs["desc"] = f"Truncating {dataset_name} dataset"
            dataset = dataset.map(
                tw.truncate, fn_kwargs={"max_length": args.max_length, "mode": args.truncation_mode}, **map_kwargs
            )
        # Rows left without a trained token (truncated, or every weighted token at 0) contribute no loss (TRL drops
        # fully masked rows after truncation; here also without it).
        if isinstance(dataset, Dataset):
            map_kwargs["desc"] = f"Dropping fully masked examples from {dataset_name} dataset"
        dataset = dataset.filter(lambda example: any(label != -100 for label in example["labels"]), **map_kwargs)
        if packing:
            if args.max_length is None:
                raise ValueError("When packing is enabled, `max_length` can't be `None`.")
            if isinstance(dataset, Dataset):
                map_kwargs["desc"] = f"Packing {dataset_name} dataset"
            dataset = dataset.select_columns(["input_ids", "labels", tw.WEIGHTS_COLUMN])
            if args.shuffle_dataset:
                dataset = dataset.shuffle(seed=args.seed)
            dataset = pack_dataset(dataset, args.max_length, args.packing_strategy, map_kwargs)
    if args.shuffle_dataset:
        dataset = dataset.shuffle(seed=args.seed)
    return dataset


def weighted_collator(collator):
    """TRL 1.16's `DataCollatorForLanguageModeling` that also returns `loss_weights`, each example's weights padded
    with 0 beside its labels (right padding, `pad_to_multiple_of`, one flattened row when padding-free), as the
    collator pads the labels (`trl/trainer/sft_trainer.py`, `torch_call`). None for any other collator."""
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    if type(collator) is not DataCollatorForLanguageModeling:
        return None
    import dataclasses

    return _weighted_collator_class()(**{f.name: getattr(collator, f.name) for f in dataclasses.fields(collator)})


@functools.lru_cache(maxsize=None)
def _weighted_collator_class():
    import torch
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling
    from trl.trainer.utils import pad

    from ..data.token_weights import WEIGHTS_COLUMN

    class WeightedCollator(DataCollatorForLanguageModeling):
        """`DataCollatorForLanguageModeling` with `loss_weights` (see `weighted_collator`)."""

        def torch_call(self, examples):
            weights = [
                torch.tensor(e[WEIGHTS_COLUMN] if e.get(WEIGHTS_COLUMN) is not None else [1.0] * len(e["input_ids"]),
                             dtype=torch.float32)
                for e in examples
            ]
            output = super().torch_call([{k: v for k, v in e.items() if k != WEIGHTS_COLUMN} for e in examples])
            if self.padding_free:
                weights = [torch.cat(weights, dim=0)]
            output[WEIGHTS_COLUMN] = pad(weights, padding_value=0.0, padding_side="right",
                                         pad_to_multiple_of=self.pad_to_multiple_of)
            if output[WEIGHTS_COLUMN].shape != output["labels"].shape:
                raise RuntimeError(f"loss_weights {tuple(output[WEIGHTS_COLUMN].shape)} do not match the labels "
                                   f"{tuple(output['labels'].shape)} the collator returned.")
            return output

    return WeightedCollator


def count_weighted_items(trainer, batch_samples, device):
    """transformers 5.23's `Trainer._get_num_items_in_batch` (`trainer.py`) for batches with `loss_weights`: the sum
    of the weights of the target tokens of every micro-batch of the optimizer step, where it counts them; then the
    same gathering over processes (`average_tokens_across_devices`) and the same divisions. With every weight 1 this
    is the count, as a float."""
    import torch

    from ..data.token_weights import WEIGHTS_COLUMN

    counting = len(batch_samples) > 0 and "labels" in batch_samples[0] and (
        trainer.model_accepts_loss_kwargs or trainer.compute_loss_func is not None
    )
    if not counting:
        return None
    shifts = getattr(trainer, "_loss_shifts_labels", True)
    total = None
    for batch in batch_samples:
        labels, weights = batch["labels"], batch[WEIGHTS_COLUMN]
        if shifts:
            labels, weights = labels[..., 1:], weights[..., 1:]
        part = (weights * labels.ne(-100)).sum()
        total = part if total is None else total + part
    num_items_in_batch = total
    if trainer.args.average_tokens_across_devices:
        if trainer.args.world_size > 1:
            num_items_in_batch = trainer.accelerator.gather(num_items_in_batch.to(device)).sum()
    elif trainer.args.n_gpu > 1:
        num_items_in_batch = num_items_in_batch // trainer.args.n_gpu
    num_items_in_batch = num_items_in_batch.to(device)
    if trainer.args.n_gpu > 1 and num_items_in_batch.dim() == 0:
        num_items_in_batch = num_items_in_batch.unsqueeze(0).expand(trainer.args.n_gpu, -1)
    return num_items_in_batch / (trainer.get_tp_size() * trainer.get_cp_size() * trainer.get_sp_size())


def trl_loss_with_weights(trainer, model, inputs: dict, weights, num_items_in_batch):
    """The loss TRL 1.16's `SFTTrainer.compute_loss` computes for `nll` and `dft` (its fused head's per-token
    log-probabilities, `trl/trainer/sft_trainer.py`), each token's term times its weight, divided by
    `num_items_in_batch` (the step's sum of weights, `count_weighted_items`) or by this batch's sum of weights; then
    `finish_loss`. Weight 1 everywhere gives TRL's loss bit for bit. Returns `(loss, FusedLossOutput)` for the
    metrics."""
    import torch

    from ..losses._common import normalizer
    from ..losses.fused import FusedLossOutput

    mode = "train" if trainer.model.training else "eval"
    outputs = model(**inputs, fused_lm_head=True)
    per_token_loss = -outputs.log_probs  # zero on ignored positions
    if trainer.args.loss_type == "dft":
        per_token_loss = per_token_loss * outputs.log_probs.exp().detach()
    shift = "shift_labels" not in inputs
    w = (weights[:, 1:] if shift else weights).to(per_token_loss.device, per_token_loss.dtype)
    mask = outputs.label_mask
    w = torch.where(mask, w, torch.zeros_like(w))
    weighted = per_token_loss * w
    count = w.sum() if num_items_in_batch is None else num_items_in_batch
    loss = weighted.sum() / normalizer(count, weighted.device)
    loss = finish_loss(trainer, loss, outputs.aux_loss if trainer.aux_loss_enabled else None, num_items_in_batch, mode)
    result = FusedLossOutput(
        loss, weighted[mask].detach(), -outputs.log_probs[mask].detach(), outputs.entropy[mask].detach(),
        outputs.is_top1[mask].detach().float(), {}, None, w[mask],
    )
    return loss, result
