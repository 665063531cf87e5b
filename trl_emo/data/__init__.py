"""Dataset adapters: Hub or local data of the papers' schemas -> TRL's SFT and DPO formats.

Modules: `schemas` (the schema registry, detection, validation), `prompts` (the Alpaca prompt), `adapters` (row ->
TRL format), `loading` (Hub id / local file / folder -> `datasets.Dataset`), `arguments` (`DataArguments`),
`prepare` (`load_sft_datasets`, `load_dpo_datasets`), `bundled` (the shipped sample), `make_samples` (its generator).
"""

from .adapters import OUTPUT_FORMATS, PROMPT_FORMATS, format_example, format_preference_example, output_format
from .arguments import DataArguments
from .bundled import ALPACA_SAMPLE_FILE, alpaca_sample_path
from .loading import SUPPORTED_EXTENSIONS, DataSource, load_split, resolve_source
from .prepare import DatasetInfo, load_dpo_datasets, load_sft_datasets, resolve_prompt_format
from .prompts import ALPACA_PROMPT_NO_INPUT, ALPACA_PROMPT_WITH_INPUT, alpaca_prompt, conversation_to_alpaca
from .schemas import SCHEMA_NAMES, SCHEMAS, DataError, DataPathError, Schema, detect_schema, validate_columns

__all__ = [
    "ALPACA_PROMPT_NO_INPUT",
    "ALPACA_PROMPT_WITH_INPUT",
    "ALPACA_SAMPLE_FILE",
    "OUTPUT_FORMATS",
    "PROMPT_FORMATS",
    "SCHEMAS",
    "SCHEMA_NAMES",
    "SUPPORTED_EXTENSIONS",
    "DataArguments",
    "DataError",
    "DataPathError",
    "DataSource",
    "DatasetInfo",
    "Schema",
    "alpaca_prompt",
    "alpaca_sample_path",
    "conversation_to_alpaca",
    "detect_schema",
    "format_example",
    "format_preference_example",
    "load_dpo_datasets",
    "load_sft_datasets",
    "load_split",
    "output_format",
    "resolve_prompt_format",
    "resolve_source",
    "validate_columns",
]
