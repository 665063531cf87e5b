"""The dataset schemas the adapters understand: one entry per schema, plus detection and validation.

Each entry records the Hub id, the default splits, the columns the adapter reads (with their types) and a one-line
description that error messages quote, so that a user who points a recipe at the wrong file learns which columns were
expected and which were found.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# Column kinds. "messages" is a list of {"role", "content"} dicts; "struct" is a dict whose fields are listed in
# `Column.fields`; "any" is only checked for presence.
STRING = "string"
MESSAGES = "messages"
STRUCT = "struct"
ANY = "any"


class DataError(ValueError):
    """A dataset that cannot be used as given (wrong columns, missing split, empty, unsupported file...)."""


class DataPathError(DataError, FileNotFoundError):
    """A local dataset path that does not exist (also a `FileNotFoundError`)."""


@dataclass(frozen=True)
class Column:
    name: str
    kind: str = STRING
    required: bool = True
    # For STRUCT columns: the nested fields, as (name, required) pairs.
    fields: tuple[tuple[str, bool], ...] = ()

    def describe(self) -> str:
        if self.kind == STRUCT:
            inner = ", ".join(name if required else f"{name} (optional)" for name, required in self.fields)
            kind = f"struct {{{inner}}}"
        else:
            kind = self.kind
        return f"{self.name} ({kind})" if self.required else f"{self.name} ({kind}, optional)"


@dataclass(frozen=True)
class Schema:
    name: str
    description: str
    columns: tuple[Column, ...]
    hub_id: str | None = None
    train_split: str = "train"
    test_split: str | None = None
    # Other splits of the Hub dataset that are not for SFT (e.g. UltraFeedback's preference splits).
    other_splits: tuple[str, ...] = ()
    # All columns of the Hub dataset, including the ones the adapter ignores (for the documentation and fixtures).
    hub_columns: tuple[str, ...] = ()
    # Whether the schema holds preference pairs (DPO) rather than SFT examples.
    preference: bool = False
    sft: bool = True

    @property
    def required_columns(self) -> list[str]:
        return [column.name for column in self.columns if column.required]

    def expected(self) -> str:
        """The columns this schema expects, for error messages."""
        return ", ".join(column.describe() for column in self.columns)

    def summary(self) -> str:
        source = f" [{self.hub_id}]" if self.hub_id else ""
        return f"'{self.name}'{source}: {self.description}; columns: {self.expected()}"


_INSTRUCTION_FIELDS = (("instruction", True), ("input", False), ("output", True))

SCHEMAS: dict[str, Schema] = {
    schema.name: schema
    for schema in [
        Schema(
            name="alpaca",
            description="Alpaca-GPT4 instruction data (instruction, optional input, output)",
            hub_id="vicgalle/alpaca-gpt4",
            columns=(Column("instruction"), Column("input", required=False), Column("output")),
            hub_columns=("instruction", "input", "output", "text"),
        ),
        Schema(
            name="evol_instruct",
            description="Recycled Evol-Instruct: one struct column `data` holding {instruction, input, output}",
            hub_id="umd-zhou-lab/recycled_wiz70_v1",
            columns=(Column("data", kind=STRUCT, fields=_INSTRUCTION_FIELDS),),
            hub_columns=("data",),
        ),
        Schema(
            name="ultrafeedback",
            description="UltraFeedback binarized: SFT on the chosen conversation `messages`, DPO on chosen/rejected",
            hub_id="HuggingFaceH4/ultrafeedback_binarized",
            columns=(Column("messages", kind=MESSAGES),),
            train_split="train_sft",
            test_split="test_sft",
            other_splits=("train_prefs", "test_prefs", "train_gen", "test_gen"),
            hub_columns=("prompt", "prompt_id", "chosen", "rejected", "messages", "score_chosen", "score_rejected"),
            preference=True,
        ),
        Schema(
            name="metamath",
            description="MetaMathQA: `query` is the prompt, `response` the completion (ends with 'The answer is: X')",
            hub_id="meta-math/MetaMathQA",
            columns=(Column("query"), Column("response")),
            hub_columns=("query", "response", "type", "original_question"),
        ),
        Schema(
            name="magicoder",
            description="Magicoder-OSS-Instruct: `problem` is the prompt, `solution` the completion",
            hub_id="ise-uiuc/Magicoder-OSS-Instruct-75K",
            columns=(Column("problem"), Column("solution")),
            hub_columns=("problem", "solution", "lang", "seed", "index", "raw_index", "openai_fingerprint"),
        ),
        Schema(
            name="prompt_completion",
            description="TRL prompt/completion data (strings or conversations), passed through",
            columns=(Column("prompt", kind=ANY), Column("completion", kind=ANY)),
            hub_columns=("prompt", "completion"),
        ),
        Schema(
            name="messages",
            description="TRL conversational data: `messages`, a list of {role, content} turns",
            columns=(Column("messages", kind=MESSAGES),),
            hub_columns=("messages",),
        ),
        Schema(
            name="text",
            description="plain language-modeling text in a `text` column (every token is trained)",
            columns=(Column("text"),),
            hub_columns=("text",),
        ),
        Schema(
            name="plain_text",
            description="a plain-text corpus (WikiText, PTB, AG News, ...): rows become documents, every token "
            "trained; see trl_emo.data.plain_text (`text_column`, `text_documents`, packing)",
            columns=(Column("text"),),
            hub_columns=("text",),
        ),
        Schema(
            name="preference",
            description="TRL preference data: `chosen`/`rejected` (strings or conversations), optional `prompt`",
            columns=(
                Column("prompt", kind=ANY, required=False),
                Column("chosen", kind=ANY),
                Column("rejected", kind=ANY),
            ),
            hub_columns=("prompt", "chosen", "rejected"),
            preference=True,
            sft=False,
        ),
    ]
}

SCHEMA_NAMES: tuple[str, ...] = ("auto", *SCHEMAS)
# The schemas `load_dpo_datasets` accepts.
PREFERENCE_SCHEMAS: tuple[str, ...] = tuple(name for name, schema in SCHEMAS.items() if schema.preference)


def get_schema(name: str) -> Schema:
    try:
        return SCHEMAS[name]
    except KeyError:
        raise DataError(f"Unknown dataset schema {name!r}; valid values: {', '.join(SCHEMA_NAMES)}.") from None


def schemas_overview(names=None) -> str:
    """One line per schema (name, Hub id, expected columns), for error messages."""
    names = list(SCHEMAS) if names is None else names
    return "\n".join(f"  - {SCHEMAS[name].summary()}" for name in names)


def feature_kind(feature) -> str:
    """Reduce a `datasets` feature to the column kinds used here ("string", "messages", "struct", or a type name)."""
    from datasets import LargeList, List, Sequence, Value

    if isinstance(feature, Value):
        return STRING if feature.dtype in ("string", "large_string") else feature.dtype
    if isinstance(feature, dict):
        return STRUCT
    if isinstance(feature, (List, LargeList, Sequence)):
        inner = feature.feature
        if isinstance(inner, dict) and "role" in inner and "content" in inner:
            return MESSAGES
        return "list"
    return type(feature).__name__


def detect_schema(features: Mapping, *, preference: bool = False) -> str:
    """Guess the schema from the column names (and the type of `data`).

    The order matters: UltraFeedback has `prompt` and `messages`, Alpaca-GPT4 has `text`, so the specific schemas are
    tried before the generic ones. With `preference=True`, only preference schemas are considered.
    """
    columns = set(features)
    if preference:
        if {"chosen", "rejected"} <= columns:
            # Keep the UltraFeedback name when its columns are all there: its conversion is the same, but the name
            # says where the data came from.
            return "ultrafeedback" if "messages" in columns else "preference"
        candidates = PREFERENCE_SCHEMAS
    else:
        if "data" in columns and feature_kind(features["data"]) == STRUCT:
            return "evol_instruct"
        if "messages" in columns and ({"chosen", "prompt_id"} & columns):
            return "ultrafeedback"
        if {"query", "response"} <= columns:
            return "metamath"
        if {"problem", "solution"} <= columns:
            return "magicoder"
        if {"instruction", "output"} <= columns:
            return "alpaca"
        if "messages" in columns:
            return "messages"
        if {"prompt", "completion"} <= columns:
            return "prompt_completion"
        if "text" in columns:
            return "text"
        if {"chosen", "rejected"} <= columns:
            raise DataError(
                f"The dataset has preference columns (chosen, rejected) but no SFT columns; found columns: "
                f"{', '.join(sorted(columns))}. Use it for DPO (trl_emo.dpo), or set dataset_schema explicitly."
            )
        candidates = [name for name, schema in SCHEMAS.items() if schema.sft]
    raise DataError(
        f"Could not detect the dataset schema from its columns: {', '.join(sorted(columns)) or '(none)'}.\n"
        f"Known schemas and the columns they need:\n{schemas_overview(candidates)}\n"
        "Rename the columns, or set `dataset_schema` explicitly."
    )


def validate_columns(features: Mapping, schema_name: str) -> None:
    """Raise `DataError` naming the first missing or mistyped column, the schema and the columns it expects."""
    schema = get_schema(schema_name)
    found = ", ".join(f"{name} ({feature_kind(feature)})" for name, feature in features.items()) or "(none)"

    def fail(problem: str):
        raise DataError(
            f"{problem} Schema {schema.summary()}.\nColumns found: {found}.\n"
            "Fix the data, or set `dataset_schema` to the schema the data follows."
        )

    for column in schema.columns:
        if column.name not in features:
            if column.required:
                fail(f"Missing column {column.name!r} for dataset schema {schema.name!r}.")
            continue
        kind = feature_kind(features[column.name])
        # A column whose values are all empty (an all-"" `input` read from CSV) has type null: fine if optional.
        if column.kind == ANY or (kind == "null" and not column.required):
            continue
        if kind != column.kind:
            fail(f"Column {column.name!r} must be {column.kind} for dataset schema {schema.name!r}, found {kind}.")
        if column.kind == STRUCT:
            inner = features[column.name]
            for name, required in column.fields:
                if name not in inner and required:
                    fail(
                        f"Missing field {column.name}.{name!r} (column {column.name!r} is a struct with fields "
                        f"{', '.join(inner) or '(none)'}) for dataset schema {schema.name!r}."
                    )
