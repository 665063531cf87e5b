"""`python -m trl_emo.sft --recipe FILE.yaml [--field value ...]`: supervised fine-tuning with any loss.

The same command runs under `accelerate launch` (one process, DDP, DeepSpeed, FSDP2; see
`recipes/accelerate/`). The recipe is a YAML mapping of fields of TRL's `ScriptArguments` and
`ModelConfig`, of `trl_emo.SFTConfig` and of `trl_emo.data.DataArguments`; command-line flags
override it. `--dry_run` prints the resolved configuration and three formatted training examples
(the masked part marked) and exits without loading the model.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from dataclasses import dataclass, field

from .cli_utils import ConfigError

logger = logging.getLogger("trl_emo.sft")

MASK_OPEN, MASK_CLOSE = "«", "»"
HELP = """Supervised fine-tuning with any loss (loss_type: nll, dft, gem, emo, tailr, mixce, ce_entropy; see
`trl-emo losses`), through trl_emo.SFTTrainer. Runs under `accelerate launch -m trl_emo.sft` too.
--dry_run prints the resolved configuration and formatted training examples (the part without loss in « »)
and exits without loading the model; it needs no GPU."""


@dataclass
class RunArguments:
    """
    Options of the `trl_emo.sft` command itself.

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


def dataclass_types():
    from trl import ModelConfig, ScriptArguments

    from .config import SFTConfig
    from .data import DataArguments

    return (ScriptArguments, SFTConfig, ModelConfig, DataArguments, RunArguments)


def parse_args(argv=None):
    """The command line as a `CommandLine` whose `values` are (script, training, model, data, run) arguments."""
    from .cli_utils import parse_command_line

    command_line = parse_command_line(dataclass_types(), argv, prog="trl_emo.sft (trl-emo sft)", description=HELP)
    script_args, training_args, model_args, data_args, run_args = command_line.values
    if model_args.model_name_or_path is None:
        raise ConfigError("model_name_or_path is required (in the recipe or as --model_name_or_path).")
    if script_args.dataset_name is None:
        raise ConfigError("dataset_name is required (a Hub id or a local file/folder; in the recipe or as --dataset_name).")
    training_args.resume_from_checkpoint = resolve_resume(training_args.resume_from_checkpoint)
    return command_line


def resolve_resume(value):
    """`true`/`latest` -> True (the last checkpoint in output_dir); a path must exist; `false`/empty -> None."""
    if value is None or isinstance(value, bool):
        return value or None
    text = str(value).strip()
    if text.lower() in ("", "false", "no", "none", "null"):
        return None
    if text.lower() in ("true", "yes", "latest", "last"):
        return True
    if not os.path.isdir(text):
        raise ConfigError(f"resume_from_checkpoint: checkpoint folder not found: {text}")
    return text


# -- configuration printing ----------------------------------------------------------------


def format_configuration(script_args, training_args, model_args, data_args) -> str:
    from .cli_utils import dump_sections, non_default_fields

    loss_fields = ["loss_type", "loss_implementation"]
    if training_args.loss_type not in ("nll", "dft"):
        from .losses import get_loss

        spec = get_loss(training_args.loss_type)
        loss_fields += list(spec.config_fields.values())
        if spec.uses_cost_embedding:
            loss_fields.append("emo_cost_embedding")
    return dump_sections(
        {
            "loss": {name: getattr(training_args, name) for name in loss_fields},
            "script": dataclasses.asdict(script_args),
            "data": dataclasses.asdict(data_args),
            "model": non_default_fields(model_args),
            "training (non-default fields)": {
                k: v for k, v in non_default_fields(training_args).items() if k not in loss_fields and not k.startswith("_")
            },
        }
    )


def render_masked(tokenizer, input_ids, labels) -> str:
    """The example's text with every span that gets no loss wrapped in « »."""
    pieces, current, masked = [], [], None
    for token, label in zip(input_ids, labels):
        is_masked = label == -100
        if masked is not None and is_masked != masked:
            pieces.append((masked, current))
            current = []
        masked = is_masked
        current.append(token)
    if current:
        pieces.append((masked, current))
    text = ""
    for is_masked, ids in pieces:
        chunk = tokenizer.decode(ids, skip_special_tokens=False)
        text += f"{MASK_OPEN}{chunk}{MASK_CLOSE}" if is_masked else chunk
    return text


def prepare_examples(train_dataset, tokenizer, training_args, n: int):
    """Tokenize and label `n` rows exactly as TRL's SFTTrainer does, without building the trainer or the model."""
    from types import SimpleNamespace

    from trl import SFTTrainer as TRLSFTTrainer
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers
    from trl.data_utils import is_conversational

    rows = train_dataset.select(range(min(n, len(train_dataset))))
    sample = rows[0]
    chat_template = None
    if training_args.assistant_only_loss and not has_generation_markers(tokenizer.chat_template):
        chat_template = get_training_chat_template(tokenizer)
    completion_only = training_args.completion_only_loss
    if completion_only is None:
        completion_only = "prompt" in sample and "completion" in sample
    if training_args.assistant_only_loss and not is_conversational(sample):
        raise ConfigError("assistant_only_loss=True needs conversational data, but the formatted dataset is not.")
    # TRL's own preparation, so what is printed is exactly what trains.
    stand_in = SimpleNamespace(_tokenizer=tokenizer, completion_only_loss=completion_only, chat_template=chat_template)
    # Packed like the trainer packs them, so a plain-text dry run shows the blocks that train.
    prepared = TRLSFTTrainer._prepare_dataset(
        stand_in, rows, tokenizer, training_args, training_args.packing, None, "dry-run"
    )
    return prepared.select(range(min(n, len(prepared))))


def dry_run(train_dataset, tokenizer, script_args, training_args, model_args, data_args, info, n: int, out=None, notes=()):
    out = out or sys.stdout
    print("# trl_emo.sft --dry_run: resolved configuration", file=out)
    for note in notes:
        print(f"# note: {note}", file=out)
    print(format_configuration(script_args, training_args, model_args, data_args), file=out)
    print(f"# {info.summary()}", file=out)
    prepared = prepare_examples(train_dataset, tokenizer, training_args, n)
    print(f"# {len(prepared)} formatted training example(s); text inside {MASK_OPEN}...{MASK_CLOSE} is masked (no loss)", file=out)
    for i, row in enumerate(prepared):
        n_trained = sum(label != -100 for label in row["labels"])
        print(f"\n--- example {i} ({len(row['input_ids'])} tokens, {n_trained} trained) ---", file=out)
        print(render_masked(tokenizer, row["input_ids"], row["labels"]), file=out)
    return prepared


# -- training -------------------------------------------------------------------------------


def load_tokenizer(model_args, training_args):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(
        model_args.model_name_or_path, revision=model_args.model_revision, trust_remote_code=training_args.trust_remote_code
    )
    template_path = training_args.chat_template_path or None
    training_args.chat_template_path = template_path
    if template_path is not None and os.path.isfile(template_path) and template_path.endswith((".jinja", ".j2")):
        # TRL applies it again inside SFTTrainer; the data formatting needs to see it already.
        with open(template_path, encoding="utf-8") as handle:
            tokenizer.chat_template = handle.read()
    elif template_path is not None:
        # TRL clones the template (and its special tokens) from that tokenizer inside SFTTrainer,
        # replacing the model's own; the data formatting and masking checks need to see it already.
        source = AutoTokenizer.from_pretrained(template_path, trust_remote_code=training_args.trust_remote_code)
        tokenizer.chat_template = source.chat_template
    if tokenizer.pad_token is None:
        # TRL pads with EOS in that case too; set here so the dry run and the trainer agree.
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def kbit_device_map():
    """Each process loads its quantized copy on its own GPU (a k-bit model cannot be moved afterwards)."""
    import torch
    from accelerate import PartialState

    if torch.cuda.is_available():
        return {"": PartialState().local_process_index}
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return {"": f"xpu:{PartialState().local_process_index}"}
    return None


def model_loading_kwargs(model_args, training_args) -> dict:
    """Set `training_args.model_init_kwargs` from `model_args`; return the trainer's quantization/PEFT arguments."""
    from trl import get_peft_config

    init_kwargs, quantization_config = model_init_kwargs(model_args, training_args)
    training_args.model_init_kwargs = init_kwargs
    return {"quantization_config": quantization_config, "peft_config": get_peft_config(model_args)}


def model_init_kwargs(model_args, training_args):
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


def save_outputs(trainer, output_dir: str) -> None:
    """Save the model (or adapter), tokenizer and generation config where DPO and evaluation will read them."""
    trainer.save_model(output_dir)
    if trainer.accelerator.is_main_process:
        model = trainer.accelerator.unwrap_model(trainer.model)
        # An adapter folder gets the generation config too, so the end-of-turn EOS survives merging.
        model.generation_config.save_pretrained(output_dir)


def main(argv=None) -> int:
    from .noise import quiet_optional_packages

    quiet_optional_packages()
    from .data import DataError

    try:
        command_line = parse_args(argv)
        script_args, training_args, model_args, data_args, run_args = command_line.values
        notes = list(command_line.notes)
        tokenizer = load_tokenizer(model_args, training_args)
        from .data import load_sft_datasets

        train_dataset, eval_dataset, info = load_sft_datasets(script_args, data_args, tokenizer)
        if info.assistant_only_loss and not training_args.assistant_only_loss and "assistant_only_loss" not in command_line.explicit:
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
            from .data.chat_masking import route_conversations, template_masks_assistant_turns

            if info.output_format == "messages":
                template_source = training_args.chat_template_path or model_args.model_name_or_path
                train_dataset, eval_dataset, routed = route_conversations(
                    train_dataset, eval_dataset, tokenizer, template_source
                )
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
            from .data.plain_text import packing_warnings

            for warning in packing_warnings(training_args):
                logger.warning(warning)
        if training_args.eval_strategy != "no" and eval_dataset is None:
            raise ConfigError(
                f"eval_strategy={training_args.eval_strategy!s} but the dataset has no {script_args.dataset_test_split!r} "
                "split; set dataset_test_split to an existing split or eval_strategy to 'no'."
            )
        if run_args.dry_run:
            dry_run(train_dataset, tokenizer, script_args, training_args, model_args, data_args, info,
                    run_args.dry_run_examples, notes=notes)
            return 0
    except (ConfigError, DataError, FileNotFoundError) as exc:
        print(f"trl_emo.sft: error: {exc}", file=sys.stderr)
        return 2
    for note in notes:
        logger.warning(note)
    from .noise import release_for

    release_for(model_args, training_args)

    from .trainer import SFTTrainer

    trainer = SFTTrainer(
        model=model_args.model_name_or_path,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset if training_args.eval_strategy != "no" else None,
        processing_class=tokenizer,
        **model_loading_kwargs(model_args, training_args),
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    save_outputs(trainer, training_args.output_dir)
    trainer.accelerator.print(f"trl_emo.sft: model saved to {training_args.output_dir} (loss_type={training_args.loss_type}).")
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name)
    if hasattr(trainer, "end"):
        trainer.end()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
