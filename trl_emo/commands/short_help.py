"""The short `--help` of the training commands (`trl-emo sft|dpo|grpo --help`): the options people change, at once.

The full parser lists every field of TRL's `SFTConfig`, `ModelConfig` and `ScriptArguments` and of ours (~1,000 lines)
and needs TRL, transformers and torch imported to build (6-10 s); `--help-all` prints it. The short help imports none
of them: it is written here, and the loss types it lists are read from the registry's own registration lines
(`add_loss(<module>.LOSS)` in `trl_emo/losses/__init__.py`, each module's `LOSS = LossSpec(name=..., description=...)`)
without importing the losses, plus the loss plugins installed through the `trl_emo.losses` entry points, by name.
`tests/test_commands.py` checks that the list equals `trl_emo.list_losses()` and that every option named here is an
option of the full parser.
"""

from __future__ import annotations

import ast
from pathlib import Path

LOSSES_PACKAGE = Path(__file__).resolve().parent.parent / "losses"
HELP_FLAGS = ("-h", "--help")
HELP_ALL = "--help-all"

# command -> (usage line, what it does, the options people change most: (option, what it does))
COMMON = [
    ("--model_name_or_path PATH_OR_ID", "the model (or SFT output) to start from: a Hub id, a local folder, an adapter"),
    ("--dataset_name PATH_OR_ID", "the data: a Hub id or a local json/jsonl/parquet/csv file or folder"),
    ("--output_dir DIR", "where checkpoints and the final model go"),
    ("--max_steps N", "stop after N optimizer steps (overrides num_train_epochs; -1: the epochs decide)"),
    ("--learning_rate LR", "the peak learning rate"),
    ("--per_device_train_batch_size N", "rows per device per micro-batch"),
    ("--gradient_accumulation_steps N", "micro-batches per optimizer step"),
    ("--bf16 true|false", "bf16 mixed precision (false on a CPU; the recipe's dtype follows unless --dtype is given)"),
    ("--use_peft true|false", "train a LoRA adapter (--lora_r, --lora_target_modules; --load_in_4bit for QLoRA)"),
    ("--resume_from_checkpoint auto", "resume from the newest complete checkpoint, or start (every relaunch)"),
]
COMMANDS = {
    "sft": ("supervised fine-tuning with any loss, through trl_emo.SFTTrainer (TRL's SFTTrainer)",
            [("--loss_type LOSS", None), *COMMON[:4], ("--num_train_epochs N", "passes over the data"), *COMMON[4:6],
             ("--max_length N", "tokens per row (longer rows are cut)"), *COMMON[6:]]),
    "dpo": ("DPO (TRL's DPOTrainer) on top of an SFT output of trl_emo.sft (a full model or a LoRA adapter, merged "
            "first)",
            [*COMMON[:4], ("--beta B", "DPO's KL strength (TRL's beta)"), *COMMON[4:6],
             ("--max_length N", "tokens per prompt + answer"), *COMMON[6:]]),
    "grpo": ("GRPO (TRL's GRPOTrainer) with verifiable rewards on top of an SFT output of trl_emo.sft",
             [*COMMON[:4],
              ("--reward_funcs NAME ...", "gsm8k_answer, math_answer, format, or package.module:function of yours"),
              ("--num_generations N", "completions per prompt (a group)"),
              ("--max_completion_length N", "tokens per completion"), *COMMON[4:]]),
}


def registered_losses() -> list[tuple[str, str]]:
    """(name, description) of every loss `trl_emo.losses` registers, read from its source without importing it
    (which would import torch), and of the installed loss plugins (name only: they register when imported)."""
    found = []
    tree = ast.parse((LOSSES_PACKAGE / "__init__.py").read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "add_loss" and node.args
                and isinstance(node.args[0], ast.Attribute) and isinstance(node.args[0].value, ast.Name)):
            found.append(_spec(node.args[0].value.id))
    from importlib.metadata import entry_points

    found += [(entry.name, "(a plugin)") for entry in entry_points(group="trl_emo.losses")]
    return sorted(found)


def _spec(module: str) -> tuple[str, str]:
    """`name` and `description` of `LOSS = LossSpec(...)` in `trl_emo/losses/<module>.py`."""
    tree = ast.parse((LOSSES_PACKAGE / f"{module}.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if (isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "LOSS" for t in node.targets)
                and isinstance(node.value, ast.Call)):
            values = {kw.arg: kw.value for kw in node.value.keywords}
            name = ast.literal_eval(values["name"])
            try:
                description = ast.literal_eval(values["description"]) if "description" in values else ""
            except ValueError:  # not a literal: the name alone
                description = ""
            return name, description
    raise LookupError(f"trl_emo/losses/{module}.py has no `LOSS = LossSpec(...)`")


def short_help(command: str, prog: str) -> str:
    """The short help of `command` (`sft`, `dpo`, `grpo`) under the program name `prog`."""
    from .recipes import recipes_dir

    what, options = COMMANDS[command]
    lines = [f"usage: {prog} --recipe NAME|FILE.yaml [--option value ...] [--dry_run]", "",
             what[0].upper() + what[1:] + ".", ""]
    lines += _entry("--recipe NAME|FILE.yaml", "a packaged recipe by name (`trl-emo recipes` lists them, `trl-emo "
                    f"recipes copy NAME` writes one out to edit; they live in {recipes_dir()}) or a YAML file of "
                    "your own; every flag below overrides it")
    lines += _entry("--dry_run", "print the resolved configuration and three examples, load no model")
    lines += ["", "The options changed most:"]
    for option, text in options:
        if option.startswith("--loss_type"):
            lines += _entry(option, "one of (`trl-emo losses` says more):")
            for name, description in registered_losses():
                lines += _entry(name, description, indent=6, width=12)
            continue
        lines += _entry(option, text)
    lines += ["", f"{HELP_ALL} lists every option (TRL's and transformers' training arguments, the model and data "
              "fields);", "bad values are one line with the fix, exit status 2."]
    return "\n".join(lines)


def _entry(name: str, text: str, indent: int = 2, width: int = 34) -> list[str]:
    """`name` in a column, `text` wrapped beside it (at 120 characters)."""
    import textwrap

    head = " " * indent + name.ljust(width - indent + 2)
    return textwrap.wrap(text, 120, initial_indent=head if len(head) <= width + 2 else head + " ",
                         subsequent_indent=" " * len(head)) or [head]


def option_names(command: str) -> list[str]:
    """The option names the short help of `command` shows (for the test that they all exist)."""
    return ["--recipe", "--dry_run", *(option.split()[0] for option, _ in COMMANDS[command][1])]
