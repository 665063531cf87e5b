"""The final configuration of a training run, resolved in one function per command.

`resolve_sft_run` and `resolve_dpo_run` take the parsed command line and return everything the trainer gets: the
arguments as they will be used, the tokenizer, the formatted datasets and the trainer's model-loading arguments.
Every change made to the parsed arguments (`resume_from_checkpoint` resolved, `assistant_only_loss` turned on for
conversations or routed through the completion-only loss, `model_init_kwargs` filled from `ModelConfig`) happens in
those two functions and nowhere else, so `main` reads the final configuration, and `--dry_run` prints it
(`trl_emo.commands.dry_run`). The commands `trl_emo.sft` and `trl_emo.dpo` are thin layers over this module; how a
run ends (`end_run`, `save_outputs`) is `trl_emo.training.finish`'s.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import ConfigError
from ..training.finish import end_run, save_outputs  # noqa: F401 - re-exported
from .command_line import CommandLine

logger = logging.getLogger(__name__)

# Where DPO and GRPO keep an SFT adapter merged into its base model (inside their `output_dir`). The leading `_` keeps
# it out of `push_to_hub` (transformers' upload skips `_*` and `checkpoint-*`); `LEGACY_MERGED_DIR` is its old name.
MERGED_DIR = "_sft-merged"
LEGACY_MERGED_DIR = "sft-merged"


@dataclass
class RunArguments:
    """
    Options of the `trl_emo.sft` and `trl_emo.dpo` commands themselves.

    Args:
        dry_run (`bool`, *optional*, defaults to `False`):
            Print the resolved configuration and formatted training examples, then exit without loading the model.
        dry_run_examples (`int`, *optional*, defaults to `3`):
            Number of training examples `--dry_run` prints.
    """

    dry_run: bool = field(
        default=False,
        metadata={"help": "Print the resolved configuration and formatted examples, then exit (no model is loaded)."},
    )
    dry_run_examples: int = field(default=3, metadata={"help": "Number of examples --dry_run prints."})


def sft_dataclass_types() -> tuple:
    """What a `trl_emo.sft` recipe holds: TRL's `ScriptArguments` and `ModelConfig`, `trl_emo.SFTConfig`,
    `trl_emo.data.DataArguments` and `RunArguments`, in that order."""
    from trl import ModelConfig, ScriptArguments

    from ..training.config import SFTConfig
    from ..data import DataArguments

    return (ScriptArguments, SFTConfig, ModelConfig, DataArguments, RunArguments)


def dpo_dataclass_types() -> tuple:
    """What a `trl_emo.dpo` recipe holds: as `sft_dataclass_types`, with TRL's `DPOConfig` for the training fields."""
    from trl import DPOConfig, ModelConfig, ScriptArguments

    from ..data import DataArguments

    return (ScriptArguments, DPOConfig, ModelConfig, DataArguments, RunArguments)


def resolve_resume(training_args, side_files=(), dry_run: bool = False) -> None:
    """`resume_from_checkpoint` resolved before anything loads, to the checkpoint folder the run resumes from or None
    (`trl_emo.training.checkpoints.start_run`: `true`, `auto`, `false` or a folder; torn or damaged checkpoints skipped
    and named; `true` with no complete checkpoint a one-line `ConfigError`; the same choice on every process).
    `side_files`: what the loss keeps in a checkpoint besides transformers' files. `output_dir` is checked
    (`check_output_dir`) and, unless `dry_run`, taken for this run (its lock) before anything is written there, and
    what a kill left in its staging folder settled."""
    from ..training.checkpoints import start_run
    from .training_command import check_output_dir

    check_output_dir(training_args.output_dir)
    training_args.resume_from_checkpoint = start_run(training_args, training_args.resume_from_checkpoint, side_files,
                                                     lock=not dry_run)


def _require(value, message: str) -> None:
    if value is None:
        raise ConfigError(message)


# Counts that must be at least 1 (transformers and PEFT check none of them before the first step, and fail then with a
# traceback: a sampler's ValueError, a ZeroDivisionError), by the arguments' section.
POSITIVE_FIELDS = {
    "training": ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps"),
    "model": ("lora_r",),
}


def check_chat_template_path(value: str | None) -> None:
    """A local `chat_template_path` that does not exist is a one-line error (else it is read as a Hub id, and the
    tokenizer loader fails with a message about repo ids)."""
    from ..core.hub import locate

    if value and locate(value)[0] == "missing":
        raise ConfigError(f"chat_template_path: {value} not found (a .jinja file, a tokenizer folder, or a Hub id).")


def check_counts(training_args, model_args) -> None:
    """The `POSITIVE_FIELDS` of a run are at least 1 (`lora_r` only with `use_peft`): a one-line `ConfigError`."""
    checked = [(training_args, name) for name in POSITIVE_FIELDS["training"]]
    if getattr(model_args, "use_peft", False):
        checked += [(model_args, name) for name in POSITIVE_FIELDS["model"]]
    for args, name in checked:
        value = getattr(args, name, None)
        if value is not None and value < 1:
            raise ConfigError(f"{name} must be at least 1, got {value}.")


# -- models ------------------------------------------------------------------------------------------------------------


def kbit_device_map():
    """Each process loads its quantized copy on its own GPU (a k-bit model cannot be moved afterwards)."""
    import torch
    from accelerate import PartialState

    if torch.cuda.is_available():
        return {"": PartialState().local_process_index}
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return {"": f"xpu:{PartialState().local_process_index}"}
    return None


def model_init_kwargs(model_args, training_args) -> tuple[dict, Any]:
    """The `from_pretrained` keyword arguments TRL's trainers load the model with (TRL's scripts build the same from
    `ModelConfig`; `training_args.model_init_kwargs` wins), and the quantization config."""
    from trl import get_quantization_config

    kwargs = dict(
        revision=model_args.model_revision,
        trust_remote_code=training_args.trust_remote_code,
        attn_implementation=model_args.attn_implementation,
        dtype=model_args.dtype,
    )
    quantization_config = get_quantization_config(model_args)
    if quantization_config is not None:
        kwargs["device_map"] = kbit_device_map()
    kwargs.update(training_args.model_init_kwargs or {})
    return {k: v for k, v in kwargs.items() if v is not None}, quantization_config


def trainer_model_kwargs(model_args, quantization_config) -> dict:
    """The trainer's `quantization_config` and `peft_config` (TRL's `get_peft_config`)."""
    from trl import get_peft_config

    return {"quantization_config": quantization_config, "peft_config": get_peft_config(model_args)}


def model_settings(model_args, training_args) -> dict:
    """`training_args.model_init_kwargs` filled from `ModelConfig` and the trainer's quantization/PEFT settings
    (`model_init_kwargs`, `trainer_model_kwargs`); what they reject (PEFT not installed, a LoRA setting PEFT refuses) is
    a one-line `ConfigError`. DPO and GRPO call it before an adapter merge."""
    try:
        training_args.model_init_kwargs, quantization_config = model_init_kwargs(model_args, training_args)
        return trainer_model_kwargs(model_args, quantization_config)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def load_training_tokenizer(model_args, training_args):
    """The model's tokenizer, with the chat template of `chat_template_path` already in place (TRL applies it again
    inside the trainer; the data formatting and masking checks need to see it first), and a pad token (EOS, as TRL
    pads when there is none, so that the dry run and the trainer agree)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(
        model_args.model_name_or_path, revision=model_args.model_revision, trust_remote_code=training_args.trust_remote_code
    )
    template_path = training_args.chat_template_path
    if template_path is not None and os.path.isfile(template_path) and template_path.endswith((".jinja", ".j2")):
        with open(template_path, encoding="utf-8") as handle:
            tokenizer.chat_template = handle.read()
    elif template_path is not None:
        # TRL clones the template (and its special tokens) from that tokenizer inside SFTTrainer, replacing the
        # model's own.
        source = AutoTokenizer.from_pretrained(template_path, trust_remote_code=training_args.trust_remote_code)
        tokenizer.chat_template = source.chat_template
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


# -- SFT ---------------------------------------------------------------------------------------------------------------


@dataclass
class SFTRun:
    """The final configuration of a `trl_emo.sft` run: what `--dry_run` prints and the trainer is given.

    Attributes:
        script_args, training_args, model_args, data_args, run_args: the parsed arguments, as they will be used.
        tokenizer: the tokenizer the data was formatted with (`processing_class`).
        train_dataset, eval_dataset: formatted for TRL (`eval_dataset` is None when evaluation is off).
        info: what the dataset loader found (`trl_emo.data.DatasetInfo`).
        trainer_kwargs: the trainer's `quantization_config` and `peft_config`.
        notes: lines worth telling the user (printed by `--dry_run`, logged before training).
        hub_sources: the Hub ids the run loads, with their fields (`trl_emo.core.hub`), already checked.
    """

    script_args: Any
    training_args: Any
    model_args: Any
    data_args: Any
    run_args: RunArguments
    tokenizer: Any
    train_dataset: Any
    eval_dataset: Any
    info: Any
    trainer_kwargs: dict
    notes: list = field(default_factory=list)
    hub_sources: list = field(default_factory=list)


def resolve_sft_run(args: CommandLine) -> SFTRun:
    """Resolve a parsed `trl_emo.sft` command line into the run's final configuration.

    In order: required fields checked; `resume_from_checkpoint` resolved; an empty `chat_template_path` unset; every
    Hub id of the run checked (`trl_emo.core.hub`); the tokenizer loaded (with that template); the datasets loaded
    and formatted; `assistant_only_loss` turned on for `messages` data unless the user set it, and, when the chat
    template has no `{% generation %}` markers, the conversations routed through TRL's completion-only loss
    (`assistant_only_loss` off again, same loss); packing advice for plain-text corpora logged; the eval split
    checked; `model_init_kwargs` filled from `ModelConfig`. Raises `ConfigError`/`DataError`, or `HubAccessError` for
    a Hub id the run cannot load, in one line.
    """
    from ..data import load_sft_datasets
    from ..core.hub import check_sources, hub_errors
    from .preflight import check_loss_paths, local_model, sft_sources

    script_args, training_args, model_args, data_args, run_args = args.values
    notes = list(args.notes)
    _require(model_args.model_name_or_path, "model_name_or_path is required (in the recipe or as --model_name_or_path).")
    _require(
        script_args.dataset_name,
        "dataset_name is required (a Hub id or a local file/folder; in the recipe or as --dataset_name).",
    )
    model_args.model_name_or_path = local_model("model_name_or_path", model_args.model_name_or_path)
    check_loss_paths(training_args)
    check_counts(training_args, model_args)
    check_chat_template_path(training_args.chat_template_path)
    resolve_resume(training_args, training_args.checkpoint_side_files(head_trains=_head_trains(model_args)),
                   dry_run=run_args.dry_run)
    training_args.chat_template_path = training_args.chat_template_path or None  # `--chat_template_path ""` unsets it

    # Every Hub id the run will load, checked before the first of them is (a dry run included).
    hub_sources = sft_sources(script_args, training_args, model_args)
    check_sources(hub_sources)
    with hub_errors(hub_sources):
        tokenizer = load_training_tokenizer(model_args, training_args)
        train_dataset, eval_dataset, info = load_sft_datasets(script_args, data_args, tokenizer)

    if info.assistant_only_loss and not training_args.assistant_only_loss and "assistant_only_loss" not in args.explicit:
        logger.warning(
            "The dataset is in the `messages` format: setting assistant_only_loss=True (loss on assistant turns "
            "only; pass --assistant_only_loss false to train on every token)."
        )
        training_args.assistant_only_loss = True
    if training_args.assistant_only_loss and info.output_format in ("prompt_completion", "text"):
        raise ConfigError(
            f"assistant_only_loss=True needs conversations, but the dataset was formatted as {info.output_format} "
            "(no chat template); pass --assistant_only_loss false (prompt/completion data is masked anyway)."
        )
    if training_args.assistant_only_loss:
        from ..training.trl_compat import template_masks_assistant_turns
        from ..data.chat_masking import route_conversations

        if info.output_format == "messages":
            template_source = training_args.chat_template_path or model_args.model_name_or_path
            train_dataset, eval_dataset, routed = route_conversations(train_dataset, eval_dataset, tokenizer, template_source)
        else:  # conversational prompt/completion: TRL's completion-only loss already masks the prompt
            routed = not template_masks_assistant_turns(tokenizer)
        if routed and training_args.completion_only_loss is False:
            raise ConfigError(
                "The chat template has no {% generation %} markers, so the assistant-only loss goes through TRL's "
                "completion-only loss, which completion_only_loss=false turns off; drop one of the two settings."
            )
        if routed:
            # The same loss through TRL's completion-only masking, which needs no template markers.
            training_args.assistant_only_loss = False
            info.output_format = "conversational_prompt_completion"
            notes.append(
                "the chat template has no {% generation %} markers: each conversation (one final assistant turn) "
                "trains as conversational prompt/completion, the prompt masked by TRL's completion-only loss"
            )
    info.assistant_only_loss = training_args.assistant_only_loss
    if info.schema == "plain_text":
        from ..data.plain_text import packing_warnings

        for warning in packing_warnings(training_args):
            logger.warning(warning)
    if training_args.eval_strategy != "no" and eval_dataset is None:
        raise ConfigError(
            f"eval_strategy={training_args.eval_strategy!s} but the dataset has no {script_args.dataset_test_split!r} "
            "split; set dataset_test_split to an existing split or eval_strategy to 'no'."
        )
    if training_args.eval_strategy == "no":
        eval_dataset = None

    return SFTRun(
        script_args, training_args, model_args, data_args, run_args, tokenizer, train_dataset, eval_dataset, info,
        model_settings(model_args, training_args), notes, hub_sources,
    )


# -- DPO ---------------------------------------------------------------------------------------------------------------


@dataclass
class DPORun:
    """The final configuration of a `trl_emo.dpo` run (see `SFTRun`); `policy` is the model DPO starts from: the SFT
    model itself, or its adapter merged into the base (`<output_dir>/_sft-merged`; not merged by a dry run)."""

    script_args: Any
    training_args: Any
    model_args: Any
    data_args: Any
    run_args: RunArguments
    policy: str
    tokenizer: Any
    train_dataset: Any
    eval_dataset: Any
    trainer_kwargs: dict
    notes: list = field(default_factory=list)
    hub_sources: list = field(default_factory=list)


def dpo_starting_model(model_name_or_path: str, output_dir: str, dtype, trust_remote_code: bool) -> str:
    """The folder (or Hub id) DPO and GRPO start from: the SFT model itself, or its LoRA/QLoRA adapter merged into the
    base once under `<output_dir>/_sft-merged` (`trl_emo.models.sources.merge_adapter_to`), so that the DPO reference
    is the SFT model, not the base."""
    from ..models import sources

    if not sources.is_adapter(model_name_or_path):
        return model_name_or_path
    from accelerate import PartialState

    target = os.path.join(output_dir, MERGED_DIR)
    state = PartialState()
    # One process merges; the others wait, then read the same folder.
    with state.main_process_first():
        if state.is_main_process:
            legacy = os.path.join(output_dir, LEGACY_MERGED_DIR)
            if os.path.isdir(legacy) and not os.path.exists(target):
                os.replace(legacy, target)  # an output folder of an earlier version: its merge is reused, renamed
                logger.warning("renamed %s to %s (kept out of push_to_hub)", legacy, target)
            sources.merge_adapter_to(model_name_or_path, target, dtype, trust_remote_code)
    return target


def _head_trains(model_args) -> bool:
    """Whether the output embedding trains: full fine-tuning, or LoRA with the head among `lora_modules_to_save`."""
    if not model_args.use_peft:
        return True
    return any("lm_head" in str(name) for name in (model_args.lora_modules_to_save or []))


def check_sft_output(model_args, training_args, script_args, dataset_example: str, dry_run: bool = False) -> None:
    """What a run after SFT (DPO, GRPO) needs before anything loads: a starting model that exists (a folder written by
    `trl_emo.sft`, made absolute, or a Hub id) and a dataset; `output_dir` usable; `resume_from_checkpoint`
    resolved."""
    from .preflight import local_model

    _require(
        model_args.model_name_or_path,
        "model_name_or_path is required: the folder written by trl_emo.sft (model or adapter).",
    )
    _require(script_args.dataset_name, f"dataset_name is required ({dataset_example}).")
    model_args.model_name_or_path = local_model("model_name_or_path", model_args.model_name_or_path)
    check_counts(training_args, model_args)
    resolve_resume(training_args, dry_run=dry_run)


def evaluation_split(training_args, script_args, eval_dataset):
    """The evaluation dataset a DPO or GRPO run uses: required when `eval_strategy` is set (a one-line `ConfigError`
    naming the missing split), dropped when it is not."""
    if training_args.eval_strategy == "no":
        return None
    if eval_dataset is None:
        raise ConfigError(f"eval_strategy is set but the dataset has no {script_args.dataset_test_split!r} split.")
    return eval_dataset


def sft_tokenizer(model_args, training_args):
    """The SFT folder's tokenizer (model or adapter: it holds the chat template), a pad token added as TRL adds one."""
    from ..models import sources

    tokenizer = sources.load_tokenizer(model_args.model_name_or_path, training_args.trust_remote_code)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def starting_policy(model_args, training_args, dry_run: bool) -> str:
    """The model a run after SFT starts from: the SFT model itself, or its adapter merged into the base once under
    `<output_dir>/_sft-merged` (`dpo_starting_model`; an absolute path, which a new adapter saved over it names as its
    base, so that evaluation finds it from any directory; nothing merged in a dry run). Called once everything else
    of the run is checked: a merge takes minutes and the memory of the whole model."""
    policy = model_args.model_name_or_path
    if dry_run:
        return policy
    return dpo_starting_model(policy, os.path.abspath(training_args.output_dir), model_args.dtype,
                              training_args.trust_remote_code)


def check_dpo_loss_type(training_args) -> None:
    """DPO's `loss_type` values are known to TRL (it checks them only at the first step, with a traceback). The valid
    names are read from `DPOConfig.loss_type`'s help, which lists them; where it lists none, nothing is checked."""
    import dataclasses
    import difflib
    import re

    from trl import DPOConfig

    help_text = {f.name: f for f in dataclasses.fields(DPOConfig)}["loss_type"].metadata.get("help", "")
    known = re.findall(r"`'(\w+)'`", help_text)
    given = training_args.loss_type if isinstance(training_args.loss_type, (list, tuple)) else [training_args.loss_type]
    for name in given:
        if known and name not in known:
            close = difflib.get_close_matches(str(name), known, n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"loss_type: unknown DPO loss {name!r}{hint}; TRL's DPO losses: {', '.join(known)}.")


def resolve_dpo_run(args: CommandLine) -> DPORun:
    """Resolve a parsed `trl_emo.dpo` command line into the run's final configuration.

    In order: required fields checked; the starting model located; `output_dir` and `resume_from_checkpoint` checked;
    every Hub id of the run checked (`trl_emo.core.hub`); the SFT folder's tokenizer loaded (a pad token added as TRL
    would); the preference data loaded and formatted; the eval split checked; `model_init_kwargs` and the PEFT and
    quantization settings built (`model_settings`); then, everything else known good, an adapter merged (except in a
    dry run).
    """
    from ..core.hub import check_sources, hub_errors
    from ..data import load_dpo_datasets
    from .preflight import dpo_sources

    script_args, training_args, model_args, data_args, run_args = args.values
    check_sft_output(model_args, training_args, script_args, "e.g. HuggingFaceH4/ultrafeedback_binarized",
                     dry_run=run_args.dry_run)
    check_dpo_loss_type(training_args)
    # Every Hub id the run will load (the model or its adapter's base, the dataset), checked before merging.
    hub_sources = dpo_sources(script_args, model_args)
    check_sources(hub_sources)
    with hub_errors(hub_sources):
        tokenizer = sft_tokenizer(model_args, training_args)
        train_dataset, eval_dataset = load_dpo_datasets(script_args, data_args, tokenizer)
        eval_dataset = evaluation_split(training_args, script_args, eval_dataset)
        trainer_kwargs = model_settings(model_args, training_args)
        policy = starting_policy(model_args, training_args, run_args.dry_run)
    return DPORun(
        script_args, training_args, model_args, data_args, run_args, policy, tokenizer, train_dataset, eval_dataset,
        trainer_kwargs, list(args.notes), hub_sources,
    )
