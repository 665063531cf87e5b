"""`python -m trl_emo.dpo --recipe dpo_ultrafeedback --model_name_or_path <SFT output>`.

DPO with TRL's own `DPOTrainer` on top of an SFT run of `trl_emo.sft`, whether that run saved a
full model or a LoRA/QLoRA adapter. TRL's `DPOTrainer(model="<adapter folder>")` fails, and
training the SFT adapter further would make the *base* model the DPO reference. So an adapter is
first merged into its base model (saved once under `<output_dir>/sft-merged`), and DPO starts from
that merged SFT model: with `use_peft` the new adapter's disabled state is the SFT model, the
correct reference; without it TRL copies the SFT model as reference.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys

from .cli_utils import ConfigError

logger = logging.getLogger("trl_emo.dpo")

MERGED_DIR = "sft-merged"


def is_adapter_folder(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "adapter_config.json"))


def _fingerprint(adapter_dir: str) -> str:
    digest = hashlib.sha256()
    for name in ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin"):
        path = os.path.join(adapter_dir, name)
        if os.path.isfile(path):
            digest.update(name.encode())
            digest.update(str(os.path.getsize(path)).encode())
            digest.update(str(os.path.getmtime(path)).encode())
    return digest.hexdigest()


def merge_adapter(adapter_dir: str, output_dir: str, dtype: str | None = None, trust_remote_code: bool = False) -> str:
    """Merge a LoRA/QLoRA adapter into its base model and save the result (tokenizer and generation config too).

    The base is loaded unquantized (a 4-bit base cannot absorb the update exactly); quantize again
    for DPO with `load_in_4bit`. The merge is reused when the adapter has not changed.
    """
    import torch
    from peft import PeftConfig, PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    target = os.path.join(output_dir, MERGED_DIR)
    stamp = os.path.join(target, "trl_emo_merged_from.json")
    fingerprint = _fingerprint(adapter_dir)
    if os.path.isfile(stamp):
        with open(stamp) as handle:
            if json.load(handle).get("fingerprint") == fingerprint:
                logger.info("Reusing the merged SFT model in %s", target)
                return target

    peft_config = PeftConfig.from_pretrained(adapter_dir)
    base_path = peft_config.base_model_name_or_path
    if not base_path:
        raise ConfigError(f"The adapter in {adapter_dir} does not name its base model (base_model_name_or_path).")
    torch_dtype = getattr(torch, dtype) if dtype not in (None, "auto") else "auto"
    base = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch_dtype, trust_remote_code=trust_remote_code)
    tokenizer = AutoTokenizer.from_pretrained(adapter_dir, trust_remote_code=trust_remote_code)
    if len(tokenizer) > base.get_input_embeddings().weight.shape[0]:
        # The SFT run added tokens (a cloned chat template): the adapter was trained on the resized model.
        base.resize_token_embeddings(len(tokenizer))
    merged = PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()
    if os.path.isfile(os.path.join(adapter_dir, "generation_config.json")):
        merged.generation_config = GenerationConfig.from_pretrained(adapter_dir)
    merged.save_pretrained(target)
    tokenizer.save_pretrained(target)
    with open(stamp, "w") as handle:
        json.dump({"adapter": os.path.abspath(adapter_dir), "base": base_path, "fingerprint": fingerprint}, handle)
    logger.info("Merged adapter %s into %s -> %s", adapter_dir, base_path, target)
    return target


def resolve_policy(model_name_or_path: str, output_dir: str, dtype: str | None, trust_remote_code: bool) -> str:
    """The folder (or Hub id) DPO starts from: the SFT model itself, or its adapter merged into the base."""
    if os.path.isdir(model_name_or_path) and is_adapter_folder(model_name_or_path):
        from accelerate import PartialState

        state = PartialState()
        # One process merges; the others wait, then read the same folder.
        with state.main_process_first():
            if state.is_main_process:
                return merge_adapter(model_name_or_path, output_dir, dtype, trust_remote_code)
        return os.path.join(output_dir, MERGED_DIR)
    if os.path.sep in model_name_or_path and not os.path.exists(model_name_or_path):
        raise ConfigError(f"model_name_or_path not found: {model_name_or_path}")
    return model_name_or_path


def dataclass_types():
    from trl import DPOConfig, ModelConfig, ScriptArguments

    from .data import DataArguments
    from .sft import RunArguments

    return (ScriptArguments, DPOConfig, ModelConfig, DataArguments, RunArguments)


def _render(tokenizer, messages_or_text, prompt=None) -> str:
    if isinstance(messages_or_text, str):
        return messages_or_text
    if prompt is None:
        return tokenizer.apply_chat_template(messages_or_text, tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template(prompt + messages_or_text, tokenize=False)
    head = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    return full[len(head):] if full.startswith(head) else full


def dry_run(train_dataset, tokenizer, script_args, training_args, model_args, data_args, n: int, out=None, notes=()) -> None:
    """Print the resolved configuration and `n` preference pairs as the model will read them."""
    import dataclasses

    from .cli_utils import dump_sections, non_default_fields

    sections = {
        "script": dataclasses.asdict(script_args),
        "data": dataclasses.asdict(data_args),
        "model": non_default_fields(model_args),
        "dpo (non-default fields)": non_default_fields(training_args),
    }
    out = out or sys.stdout
    print("# trl_emo.dpo --dry_run: resolved configuration", file=out)
    for note in notes:
        print(f"# note: {note}", file=out)
    print(dump_sections(sections), file=out)
    for i, row in enumerate(train_dataset.select(range(min(n, len(train_dataset))))):
        print(f"--- pair {i} ---", file=out)
        print(f"[prompt]\n{_render(tokenizer, row['prompt'])}", file=out)
        print(f"[chosen]\n{_render(tokenizer, row['chosen'], row['prompt'] if not isinstance(row['prompt'], str) else None)}", file=out)
        print(f"[rejected]\n{_render(tokenizer, row['rejected'], row['prompt'] if not isinstance(row['prompt'], str) else None)}", file=out)


def main(argv=None) -> int:
    from .noise import quiet_optional_packages

    quiet_optional_packages()
    from .cli_utils import parse_command_line
    from .data import DataError, load_dpo_datasets
    from .sft import model_loading_kwargs, resolve_resume

    try:
        command_line = parse_command_line(
            dataclass_types(),
            argv,
            prog="trl_emo.dpo (trl-emo dpo)",
            description="DPO with TRL's DPOTrainer on top of an SFT output of trl_emo.sft (a full model or a LoRA/QLoRA "
            "adapter, merged first).\n--dry_run prints the resolved configuration and preference pairs, without a model.",
        )
        script_args, training_args, model_args, data_args, run_args = command_line.values
        if model_args.model_name_or_path is None:
            raise ConfigError("model_name_or_path is required: the folder written by trl_emo.sft (model or adapter).")
        if script_args.dataset_name is None:
            raise ConfigError("dataset_name is required (e.g. HuggingFaceH4/ultrafeedback_binarized).")
        training_args.resume_from_checkpoint = resolve_resume(training_args.resume_from_checkpoint)
        from transformers import AutoTokenizer

        # The SFT folder holds the tokenizer whether it is a model or an adapter; a dry run merges nothing.
        source = model_args.model_name_or_path
        if run_args.dry_run:
            policy = source
        else:
            policy = resolve_policy(source, training_args.output_dir, model_args.dtype, training_args.trust_remote_code)
        tokenizer = AutoTokenizer.from_pretrained(policy, trust_remote_code=training_args.trust_remote_code)
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        train_dataset, eval_dataset = load_dpo_datasets(script_args, data_args, tokenizer)
        if training_args.eval_strategy != "no" and eval_dataset is None:
            raise ConfigError(f"eval_strategy is set but the dataset has no {script_args.dataset_test_split!r} split.")
        if run_args.dry_run:
            dry_run(train_dataset, tokenizer, script_args, training_args, model_args, data_args, run_args.dry_run_examples,
                    notes=command_line.notes)
            return 0
    except (ConfigError, DataError, FileNotFoundError) as exc:
        print(f"trl_emo.dpo: error: {exc}", file=sys.stderr)
        return 2
    from .noise import release_for

    release_for(model_args, training_args)

    from trl import DPOTrainer

    trainer = DPOTrainer(
        model=policy,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset if training_args.eval_strategy != "no" else None,
        processing_class=tokenizer,
        **model_loading_kwargs(model_args, training_args),
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)
    trainer.accelerator.print(f"trl_emo.dpo: model saved to {training_args.output_dir} (started from {policy}).")
    if hasattr(trainer, "end"):
        trainer.end()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
