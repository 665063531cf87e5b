"""What `--dry_run` prints: the final configuration of a run (`trl_emo.commands.run_config`) and a few training examples as the
model will read them, without loading the model."""

from __future__ import annotations

import collections
import dataclasses
import sys

from .command_line import dump_sections, non_default_fields

MASK_OPEN, MASK_CLOSE = "«", "»"


def format_sft_configuration(run) -> str:
    """The loss fields first (the selected loss's hyper-parameters only), then every section of the recipe: script and
    data arguments in full, model and training arguments where they differ from the defaults."""
    from ..losses import get_loss
    from ..losses.registry import TRL_LOSS_TYPES

    training_args = run.training_args
    loss_fields = ["loss_type", "loss_implementation"]
    if training_args.loss_type not in TRL_LOSS_TYPES:
        spec = get_loss(training_args.loss_type)
        loss_fields += list(spec.config_fields.values())
        if spec.uses_cost_embedding:
            loss_fields.append("emo_cost_embedding")
    return dump_sections(
        {
            "loss": {name: getattr(training_args, name) for name in loss_fields},
            "script": dataclasses.asdict(run.script_args),
            "data": dataclasses.asdict(run.data_args),
            "model": non_default_fields(run.model_args),
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


def print_sft_dry_run(run, out=None):
    """The configuration of an `SFTRun`, then `run_args.dry_run_examples` training examples tokenized and labelled
    exactly as TRL's trainer will (the part without loss in « »). Returns the prepared examples."""
    from ..training.trl_compat import prepare_sft_examples

    out = out or sys.stdout
    print("# trl_emo.sft --dry_run: resolved configuration", file=out)
    for note in run.notes:
        print(f"# note: {note}", file=out)
    print(format_sft_configuration(run), file=out)
    print(f"# {run.info.summary()}", file=out)
    _check_rows_left(run, out)
    prepared = prepare_sft_examples(run.train_dataset, run.tokenizer, run.training_args, run.run_args.dry_run_examples)
    print(f"# {len(prepared)} formatted training example(s); text inside {MASK_OPEN}...{MASK_CLOSE} is masked (no loss)", file=out)
    for i, row in enumerate(prepared):
        n_trained = sum(label != -100 for label in row["labels"])
        weighed = ""
        if row.get("loss_weights") is not None:
            # Per-token loss weights (a message's `weight`, `loss_weights`): how many trained tokens carry each.
            counts = collections.Counter(w for w, label in zip(row["loss_weights"], row["labels"]) if label != -100)
            weighed = ", weights " + " ".join(f"{w:g}x{n}" for w, n in sorted(counts.items()))
        print(f"\n--- example {i} ({len(row['input_ids'])} tokens, {n_trained} trained{weighed}) ---", file=out)
        print(render_masked(run.tokenizer, row["input_ids"], row["labels"]), file=out)
    return prepared


# The dry run prepares at most this many rows to count those `max_length` leaves nothing to train in.
ROWS_COUNTED = 10_000


def _check_rows_left(run, out) -> None:
    """What the trainer will drop (TRL drops a row whose completion `max_length` cuts away), counted on the first
    `ROWS_COUNTED` rows: every one, the one-line error training would give; some, a line saying how many."""
    from ..core.errors import ConfigError
    from ..training.trl_compat import prepare_sft_examples, prompt_token_counts
    from .training_command import no_rows_left, rows_dropped

    args = run.training_args
    if args.max_length is None or args.packing or not hasattr(run.train_dataset, "__len__"):
        return
    counted = min(len(run.train_dataset), ROWS_COUNTED)
    kept = len(prepare_sft_examples(run.train_dataset, run.tokenizer, args, counted))
    of = "" if counted == len(run.train_dataset) else f" (of the first {counted})"
    if kept == 0 and counted == len(run.train_dataset):
        raise ConfigError(no_rows_left(args.max_length, counted,
                                       prompt_token_counts(run.train_dataset, run.tokenizer, args)))
    if kept < counted:
        print(f"# {rows_dropped(args.max_length, counted - kept, counted)}{of}", file=out)


def _render(tokenizer, messages_or_text, prompt=None) -> str:
    if isinstance(messages_or_text, str):
        return messages_or_text
    if prompt is None:
        return tokenizer.apply_chat_template(messages_or_text, tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template(prompt + messages_or_text, tokenize=False)
    head = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    return full[len(head):] if full.startswith(head) else full


def print_dpo_dry_run(run, out=None) -> None:
    """The configuration of a `DPORun`, then `run_args.dry_run_examples` preference pairs as the model will read
    them."""
    sections = {
        "script": dataclasses.asdict(run.script_args),
        "data": dataclasses.asdict(run.data_args),
        "model": non_default_fields(run.model_args),
        "dpo (non-default fields)": non_default_fields(run.training_args),
    }
    out = out or sys.stdout
    print("# trl_emo.dpo --dry_run: resolved configuration", file=out)
    for note in run.notes:
        print(f"# note: {note}", file=out)
    print(dump_sections(sections), file=out)
    dataset, tokenizer = run.train_dataset, run.tokenizer
    for i, row in enumerate(dataset.select(range(min(run.run_args.dry_run_examples, len(dataset))))):
        prompt = row["prompt"] if not isinstance(row["prompt"], str) else None
        print(f"--- pair {i} ---", file=out)
        print(f"[prompt]\n{_render(tokenizer, row['prompt'])}", file=out)
        print(f"[chosen]\n{_render(tokenizer, row['chosen'], prompt)}", file=out)
        print(f"[rejected]\n{_render(tokenizer, row['rejected'], prompt)}", file=out)


def print_grpo_dry_run(run, out=None) -> None:
    """The configuration of a `GRPORun` (`trl_emo.commands.grpo_run`), then `run_args.dry_run_examples` prompts as
    the policy will read them (its chat template and generation prompt, as TRL renders them) with their reference
    answers and the final answer each built-in answer reward compares the completions with."""
    from ..evaluation.rewards import reference_answers

    training_args = run.training_args
    sections = {
        "script": dataclasses.asdict(run.script_args),
        "data": dataclasses.asdict(run.data_args),
        "model": non_default_fields(run.model_args),
        "rewards": {"reward_funcs": run.grpo_args.reward_funcs, "reward_weights": training_args.reward_weights},
        "grpo command": {"cpu_keep_freed_memory": run.grpo_args.cpu_keep_freed_memory},
        "grpo (non-default fields)": {
            k: v for k, v in non_default_fields(training_args).items()
            if k != "reward_weights" and not k.startswith("_")
        },
    }
    out = out or sys.stdout
    print("# trl_emo.grpo --dry_run: resolved configuration", file=out)
    print(f"# starting model: {run.policy}", file=out)
    for note in run.notes:
        print(f"# note: {note}", file=out)
    print(dump_sections(sections), file=out)
    print(f"# {run.info.summary()}", file=out)
    dataset, tokenizer = run.train_dataset, run.tokenizer
    shown = dataset.select(range(min(run.run_args.dry_run_examples, len(dataset))))
    print(f"# {len(shown)} prompt(s) as the policy reads them, each followed by its reference answer", file=out)
    for i, row in enumerate(shown):
        print(f"\n--- prompt {i} ---", file=out)
        print(_render(tokenizer, row["prompt"]), file=out)
        reference = str(row["answer"])
        print(f"[answer] {reference if len(reference) <= 400 else '...' + reference[-400:]}", file=out)
        for name, final in reference_answers(run.grpo_args.reward_funcs, reference).items():
            print(f"[{name} compares with] {final if final is not None else '(none: not scored)'}", file=out)
