"""The dataset schemas the adapters understand: each one a single declaration, from which detection, validation and
the row adapters derive.

A declaration gives the columns (names, types, which are required), the `kind` of row (which adapter converts it)
and the `fields` map from the kind's fields to the columns (`"data.instruction"` reads a struct's field), plus the Hub
id, default splits and a one-line description that error messages quote, so that a user who points a recipe at the
wrong file learns which columns were expected and which were found. Adding an instruction-style dataset is one
`Schema(...)` entry in `SCHEMAS` (or `register_schema(...)` from user code) and a fixture in `tests/data_fixtures.py`.
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

# Kinds of row, and the fields an adapter reads from each (`Schema.fields` maps them to columns).
INSTRUCTION = "instruction"  # one instruction (optional input) and one response -> prompt/completion
CONVERSATION = "conversation"  # a list of turns -> messages (chat template) or Alpaca prompt/completion
PROMPT_COMPLETION = "prompt_completion"  # TRL prompt/completion rows, passed through
TEXT = "text"  # plain language-modeling text, passed through
PREFERENCE = "preference"  # chosen/rejected pairs, for DPO only
VERIFIABLE = "verifiable"  # a prompt and its reference answer, for GRPO with verifiable rewards only (trl_emo.grpo)
KIND_FIELDS: dict[str, tuple[str, ...]] = {
    INSTRUCTION: ("instruction", "input", "output"),
    CONVERSATION: ("messages",),
    PROMPT_COMPLETION: ("prompt", "completion"),
    TEXT: ("text",),
    PREFERENCE: ("prompt", "chosen", "rejected"),
    VERIFIABLE: ("prompt", "answer"),
}
# Fields an adapter can do without (an instruction without input; a preference pair whose prompt is in its turns).
OPTIONAL_FIELDS = {(INSTRUCTION, "input"), (PREFERENCE, "prompt")}


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
    """One dataset schema.

    Attributes:
        name: the `dataset_schema` value.
        description: one line, quoted by error messages.
        columns: the columns the adapter reads, with their types (`validate_columns` checks them).
        kind: `INSTRUCTION`, `CONVERSATION`, `PROMPT_COMPLETION`, `TEXT` or `PREFERENCE`: which adapter converts a row.
        fields: the kind's fields (`KIND_FIELDS`) -> the column holding each (`"column"` or `"struct.field"`); a field
            left out is read from the column of its own name when there is one (an optional field may have none).
        markers: for detection, columns of which at least one must also be present (UltraFeedback's `messages` are
            told from generic conversations by its `chosen`/`prompt_id` columns).
        hub_id, train_split, test_split, other_splits: where the data lives on the Hub and its splits (`other_splits`:
            those not for SFT, e.g. UltraFeedback's preference splits).
        hub_columns: every column of the Hub dataset, read or not (documentation and test fixtures).
        preference: the data also holds preference pairs (chosen/rejected) for DPO.
    """

    name: str
    description: str
    columns: tuple[Column, ...]
    kind: str
    fields: Mapping[str, str] = field(default_factory=dict)
    markers: tuple[str, ...] = ()
    hub_id: str | None = None
    train_split: str = "train"
    test_split: str | None = None
    other_splits: tuple[str, ...] = ()
    hub_columns: tuple[str, ...] = ()
    preference: bool = False

    @property
    def sft(self) -> bool:
        """Whether the rows are SFT examples (every kind but `PREFERENCE` and `VERIFIABLE`)."""
        return self.kind not in (PREFERENCE, VERIFIABLE)

    @property
    def verifiable(self) -> bool:
        """Whether the rows are prompts with a reference answer, for GRPO (`VERIFIABLE`)."""
        return self.kind == VERIFIABLE

    @property
    def required_columns(self) -> list[str]:
        return [column.name for column in self.columns if column.required]

    def column_of(self, name: str) -> str | None:
        """The column (or `struct.field`) holding the kind's field `name`, or None when the schema has none."""
        if name in self.fields:
            return self.fields[name]
        return name if any(column.name == name for column in self.columns) else None

    def is_required(self, path: str) -> bool:
        """Whether the column or struct field `path` must be present in every row."""
        top, _, inner = path.partition(".")
        for column in self.columns:
            if column.name == top:
                if not inner:
                    return column.required
                return column.required and dict(column.fields).get(inner, False)
        return False

    def expected(self) -> str:
        """The columns this schema expects, for error messages."""
        return ", ".join(column.describe() for column in self.columns)

    def summary(self) -> str:
        source = f" [{self.hub_id}]" if self.hub_id else ""
        return f"'{self.name}'{source}: {self.description}; columns: {self.expected()}"

    def check(self) -> None:
        """Raise `ValueError` when the declaration is inconsistent (unknown kind, a field on an undeclared column...)."""
        if self.kind not in KIND_FIELDS:
            raise ValueError(f"Schema {self.name!r}: unknown kind {self.kind!r}; valid kinds: {', '.join(KIND_FIELDS)}.")
        unknown = sorted(set(self.fields) - set(KIND_FIELDS[self.kind]))
        if unknown:
            raise ValueError(
                f"Schema {self.name!r}: {', '.join(unknown)} not fields of kind {self.kind!r} "
                f"({', '.join(KIND_FIELDS[self.kind])})."
            )
        declared = {column.name: column for column in self.columns}
        for name in KIND_FIELDS[self.kind]:
            path = self.column_of(name)
            if path is None:
                if (self.kind, name) not in OPTIONAL_FIELDS:
                    raise ValueError(f"Schema {self.name!r}: no column for the {self.kind} field {name!r}.")
                continue
            top, _, inner = path.partition(".")
            if top not in declared or (inner and inner not in dict(declared[top].fields)):
                raise ValueError(f"Schema {self.name!r}: field {name!r} reads {path!r}, which is not a declared column.")


_INSTRUCTION_FIELDS = (("instruction", True), ("input", False), ("output", True))

BUILTIN_SCHEMAS: tuple[Schema, ...] = (
    Schema(
        name="alpaca",
        description="Alpaca-GPT4 instruction data (instruction, optional input, output)",
        kind=INSTRUCTION,
        hub_id="vicgalle/alpaca-gpt4",
        columns=(Column("instruction"), Column("input", required=False), Column("output")),
        hub_columns=("instruction", "input", "output", "text"),
    ),
    Schema(
        name="evol_instruct",
        description="Recycled Evol-Instruct: one struct column `data` holding {instruction, input, output}",
        kind=INSTRUCTION,
        fields={"instruction": "data.instruction", "input": "data.input", "output": "data.output"},
        hub_id="umd-zhou-lab/recycled_wiz70_v1",
        columns=(Column("data", kind=STRUCT, fields=_INSTRUCTION_FIELDS),),
        hub_columns=("data",),
    ),
    Schema(
        name="ultrafeedback",
        description="UltraFeedback binarized: SFT on the chosen conversation `messages`, DPO on chosen/rejected",
        kind=CONVERSATION,
        markers=("chosen", "prompt_id"),
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
        kind=INSTRUCTION,
        fields={"instruction": "query", "output": "response"},
        hub_id="meta-math/MetaMathQA",
        columns=(Column("query"), Column("response")),
        hub_columns=("query", "response", "type", "original_question"),
    ),
    Schema(
        name="magicoder",
        description="Magicoder-OSS-Instruct: `problem` is the prompt, `solution` the completion",
        kind=INSTRUCTION,
        fields={"instruction": "problem", "output": "solution"},
        hub_id="ise-uiuc/Magicoder-OSS-Instruct-75K",
        columns=(Column("problem"), Column("solution")),
        hub_columns=("problem", "solution", "lang", "seed", "index", "raw_index", "openai_fingerprint"),
    ),
    Schema(
        name="miromind_m1",
        description="MiroMind-M1-SFT-719K (SED-SFT's data): `question` is the prompt, `response` the reasoning and "
        "answer (\\boxed{})",
        kind=INSTRUCTION,
        fields={"instruction": "question", "output": "response"},
        hub_id="miromind-ai/MiroMind-M1-SFT-719K",
        columns=(Column("question"), Column("response")),
        hub_columns=("id", "question", "response"),
    ),
    Schema(
        name="openr1_math",
        description="OpenR1-Math-220k (EKSFT's data): SFT on the `messages` conversation (a problem and DeepSeek-R1's "
        "solution)",
        kind=CONVERSATION,
        markers=("problem", "generations"),
        hub_id="open-r1/OpenR1-Math-220k",
        columns=(Column("messages", kind=MESSAGES),),
        hub_columns=(
            "problem", "solution", "answer", "problem_type", "question_type", "source", "uuid",
            "is_reasoning_complete", "generations", "correctness_math_verify", "correctness_llama", "finish_reasons",
            "correctness_count", "messages",
        ),
    ),
    Schema(
        name="prompt_completion",
        description="TRL prompt/completion data (strings or conversations), passed through",
        kind=PROMPT_COMPLETION,
        columns=(Column("prompt", kind=ANY), Column("completion", kind=ANY)),
        hub_columns=("prompt", "completion"),
    ),
    Schema(
        name="messages",
        description="TRL conversational data: `messages`, a list of {role, content} turns",
        kind=CONVERSATION,
        columns=(Column("messages", kind=MESSAGES),),
        hub_columns=("messages",),
    ),
    Schema(
        name="text",
        description="plain language-modeling text in a `text` column (every token is trained)",
        kind=TEXT,
        columns=(Column("text"),),
        hub_columns=("text",),
    ),
    Schema(
        name="plain_text",
        description="a plain-text corpus (WikiText, PTB, AG News, ...): rows become documents, every token "
        "trained; see trl_emo.data.plain_text (`text_column`, `text_documents`, packing)",
        kind=TEXT,  # declared after `text`: `auto` picks `text` for a lone `text` column (same columns, first wins)
        columns=(Column("text"),),
        hub_columns=("text",),
    ),
    Schema(
        name="preference",
        description="TRL preference data: `chosen`/`rejected` (strings or conversations), optional `prompt`",
        kind=PREFERENCE,
        columns=(
            Column("prompt", kind=ANY, required=False),
            Column("chosen", kind=ANY),
            Column("rejected", kind=ANY),
        ),
        hub_columns=("prompt", "chosen", "rejected"),
        preference=True,
    ),
    # GRPO prompt sets (trl_emo.grpo): a prompt and the reference answer its rewards compare with. Never SFT data,
    # so `auto` detects them only for GRPO (`detect_schema(..., verifiable=True)`).
    Schema(
        name="gsm8k",
        description="GSM8K (GRPO): `question` is the prompt, `answer` the worked solution ending in '#### <number>'",
        kind=VERIFIABLE,
        fields={"prompt": "question"},
        hub_id="openai/gsm8k",  # config `main`
        test_split="test",
        columns=(Column("question"), Column("answer")),
        hub_columns=("question", "answer"),
    ),
    Schema(
        name="math",
        description="MATH (GRPO): `problem` is the prompt, `solution` the worked solution with its answer in \\boxed{}",
        kind=VERIFIABLE,
        fields={"prompt": "problem", "answer": "solution"},
        hub_id="DigitalLearningGmbH/MATH-lighteval",  # also EleutherAI/hendrycks_math (one config per subject)
        test_split="test",
        columns=(Column("problem"), Column("solution")),
        hub_columns=("problem", "level", "solution", "type"),
    ),
    Schema(
        name="prompt_answer",
        description="GRPO prompts of your own: `prompt` (a string or a conversation) and its reference `answer`",
        kind=VERIFIABLE,
        columns=(Column("prompt", kind=ANY), Column("answer", kind=ANY)),
        hub_columns=("prompt", "answer"),
    ),
)

SCHEMAS: dict[str, Schema] = {}


def register_schema(schema: Schema, overwrite: bool = False) -> Schema:
    """Add a dataset schema: `dataset_schema: <name>` selects it and `auto` detects it from then on."""
    schema.check()
    if schema.name in SCHEMAS and not overwrite:
        raise ValueError(f"A dataset schema named {schema.name!r} is already registered; pass overwrite=True.")
    SCHEMAS[schema.name] = schema
    return schema


def unregister_schema(name: str) -> None:
    SCHEMAS.pop(name, None)


for _schema in BUILTIN_SCHEMAS:
    register_schema(_schema)

# The built-in schemas (`schema_names()` includes registered ones).
SCHEMA_NAMES: tuple[str, ...] = ("auto", *SCHEMAS)


def schema_names() -> tuple[str, ...]:
    """Valid `dataset_schema` values: "auto" and every registered schema."""
    return ("auto", *SCHEMAS)


def get_schema(name: str) -> Schema:
    try:
        return SCHEMAS[name]
    except KeyError:
        raise DataError(f"Unknown dataset schema {name!r}; valid values: {', '.join(schema_names())}.") from None


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
        if type(inner).__name__ == "Json":
            # Turns whose keys differ (a `weight` on some messages only) load as JSON values: each row is checked as a
            # conversation when it is converted (`adapters.clean_messages`).
            return MESSAGES
        return "list"
    return type(feature).__name__


def _detection_score(schema: Schema, features: Mapping, extra: tuple[str, ...] = ()) -> int | None:
    """How many columns of the data identify `schema` (its required columns, the markers present and `extra`), or None
    when it does not match. A column declared as a struct must be one: that is what tells Evol-Instruct's `data` from a
    plain column of that name (other types are checked by `validate_columns`, whose error names the column)."""
    columns = set(features)
    identifying = set(schema.required_columns) | set(extra)
    if not identifying <= columns:
        return None
    for column in schema.columns:
        if column.kind == STRUCT and column.name in identifying and feature_kind(features[column.name]) != STRUCT:
            return None
    if schema.markers:
        present = set(schema.markers) & columns
        if not present:
            return None
        identifying |= present
    return len(identifying)


def detect_schema(features: Mapping, *, preference: bool = False, verifiable: bool = False) -> str:
    """Guess the schema from the column names (and struct types), from the declarations in `SCHEMAS`.

    The schema whose identifying columns (required columns and markers) cover the most columns of the data wins, so
    specific schemas beat generic ones whatever their order (Alpaca-GPT4 also has `text`, UltraFeedback also has
    `prompt`); a tie goes to the schema declared first. With `preference=True`, only schemas holding preference pairs
    are considered, and the pair columns (those the `preference` kind requires) must be there too. With
    `verifiable=True`, only the GRPO prompt sets (kind `VERIFIABLE`: a prompt and a reference answer) are considered;
    they are never detected as SFT data.
    """
    columns = set(features)
    pair_columns = tuple(SCHEMAS["preference"].required_columns) if "preference" in SCHEMAS else ("chosen", "rejected")
    if preference:
        candidates = [schema for schema in SCHEMAS.values() if schema.preference]
        scores = {schema.name: _detection_score(schema, features, pair_columns) for schema in candidates}
    elif verifiable:
        candidates = [schema for schema in SCHEMAS.values() if schema.verifiable]
        scores = {schema.name: _detection_score(schema, features) for schema in candidates}
    else:
        candidates = [schema for schema in SCHEMAS.values() if schema.sft]
        scores = {schema.name: _detection_score(schema, features) for schema in candidates}
    matches = {name: score for name, score in scores.items() if score is not None}
    if matches:
        return max(matches, key=matches.get)  # the first of equal scores, in declaration order
    if not preference and not verifiable:
        pairs = [s for s in SCHEMAS.values() if s.kind == PREFERENCE and _detection_score(s, features) is not None]
        if pairs:
            raise DataError(
                f"The dataset has preference columns ({', '.join(pairs[0].required_columns)}) but no SFT columns; "
                f"found columns: {', '.join(sorted(columns))}. Use it for DPO (trl_emo.dpo), or set dataset_schema "
                "explicitly."
            )
    grpo = [s.name for s in SCHEMAS.values() if s.verifiable and _detection_score(s, features) is not None]
    hint = ""
    if grpo and not verifiable:
        hint = f"\nThe columns match the GRPO prompt set {grpo[0]!r}: use it with trl_emo.grpo."
    raise DataError(
        f"Could not detect the dataset schema from its columns: {', '.join(sorted(columns)) or '(none)'}.\n"
        f"Known schemas and the columns they need:\n{schemas_overview([schema.name for schema in candidates])}\n"
        f"Rename the columns, or set `dataset_schema` explicitly.{hint}"
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
