"""`DataArguments`: how to read and format the dataset named by TRL's `ScriptArguments`."""

from __future__ import annotations

from dataclasses import dataclass, field

from .prompts import PROMPT_FORMATS, check_prompt_format
from .schemas import SCHEMA_NAMES, schema_names


@dataclass
class DataArguments:
    r"""
    Dataset options of `trl_emo`, parsed next to TRL's `ScriptArguments` (which holds `dataset_name`,
    `dataset_config`, `dataset_train_split` and `dataset_test_split`).

    Args:
        dataset_schema (`str`, *optional*, defaults to `"auto"`):
            Schema of the source data: `"alpaca"` (Alpaca-GPT4), `"evol_instruct"` (Recycled Evol-Instruct, nested
            `data` struct), `"ultrafeedback"` (UltraFeedback binarized), `"metamath"` (MetaMathQA), `"magicoder"`
            (Magicoder-OSS-Instruct), the generic TRL formats `"prompt_completion"`, `"messages"` and `"text"`, or
            `"preference"` (DPO only). `"auto"` detects it from the column names.
        prompt_format (`str`, *optional*, defaults to `"auto"`):
            How instructions are presented to the model: `"chat_template"` (the tokenizer's chat template, one user
            turn and one assistant turn), `"alpaca"` (the Alpaca prompt, for base models), or `"auto"` (the chat
            template when the tokenizer has one, else Alpaca).
        system_prompt (`str` or `None`, *optional*, defaults to `None`):
            System turn prepended to every conversation formatted with the chat template (not used with the Alpaca
            prompt, whose preamble plays that part; not added to conversations that already start with one).
        max_train_samples (`int` or `None`, *optional*, defaults to `None`):
            Keep only the first N training rows (no shuffling here: the trainer shuffles).
        max_eval_samples (`int` or `None`, *optional*, defaults to `None`):
            Keep only the first N evaluation rows.
        text_column (`str` or `None`, *optional*, defaults to `None`):
            `plain_text` only: the column holding the text; `None` takes the known corpus's (`sentence` for PTB),
            else `text`, else the only column.
        text_documents (`str`, *optional*, defaults to `"auto"`):
            `plain_text` only: what a document is. `"rows"` (each non-blank row), `"wikitext"` (rows are lines; a
            ` = Title = ` line starts an article) or `"auto"` (`wikitext` for WikiText, else `rows`). Each document
            gets one EOS before TRL packs the documents into blocks.
    """

    dataset_schema: str = field(
        default="auto",
        # No argparse `choices`: `__post_init__` checks the value (recipe or flag) against every registered schema.
        metadata={"help": f"Schema of the source data ({', '.join(SCHEMA_NAMES[1:])}, or a registered one), or 'auto' "
                  "to detect it from the column names."},
    )
    prompt_format: str = field(
        default="auto",
        metadata={
            "help": "'chat_template', 'alpaca' (the Alpaca prompt for base models), or 'auto': the chat template when "
            f"the tokenizer has one, else Alpaca (one of {', '.join(PROMPT_FORMATS)})."
        },
    )
    system_prompt: str | None = field(
        default=None,
        metadata={"help": "Optional system turn prepended to conversations formatted with the chat template."},
    )
    max_train_samples: int | None = field(
        default=None, metadata={"help": "Keep only the first N training rows (for quick runs)."}
    )
    max_eval_samples: int | None = field(
        default=None, metadata={"help": "Keep only the first N evaluation rows."}
    )
    text_column: str | None = field(
        default=None, metadata={"help": "plain_text: the text column (default: the corpus's, else `text`)."}
    )
    text_documents: str = field(
        default="auto",
        metadata={"help": "plain_text: 'rows', 'wikitext' (lines joined into articles) or 'auto'.",
                  "choices": ["auto", "rows", "wikitext"]},
    )

    def __post_init__(self):
        if self.dataset_schema not in schema_names():
            raise ValueError(
                f"Invalid dataset_schema {self.dataset_schema!r}; valid values: {', '.join(schema_names())}."
            )
        self.prompt_format = check_prompt_format(self.prompt_format)
        if self.text_documents not in ("auto", "rows", "wikitext"):
            raise ValueError(f"Invalid text_documents {self.text_documents!r}; valid values: auto, rows, wikitext.")
        for name in ("max_train_samples", "max_eval_samples"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"{name} must be a positive integer or None, got {value!r}.")
