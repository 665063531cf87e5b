"""Dataset adapters: Hub or local data of the papers' schemas -> TRL's SFT and DPO formats.

Modules: `schemas` (the schema declarations, from which detection and validation derive), `prompts` (the prompt
formats, the Alpaca prompt), `adapters` (row -> TRL format, by the schema's kind and field map), `loading` (Hub id /
local file / folder -> `datasets.Dataset`), `arguments` (`DataArguments`), `prepare` (`load_sft_datasets`,
`load_dpo_datasets`), `verifiable` (prompt sets with reference answers for GRPO), `info` (`DatasetInfo`), `bundled`
(the shipped sample), `make_samples` (its generator).
"""

from .adapters import OUTPUT_FORMATS, format_example, format_preference_example, output_format
from .arguments import DataArguments
from .bundled import ALPACA_SAMPLE_FILE, alpaca_sample_path, gsm8k_sample_path, ultrafeedback_sample_path
from .info import DatasetInfo
from .loading import SUPPORTED_EXTENSIONS, DataSource, load_split, resolve_source
from .prepare import load_dpo_datasets, load_sft_datasets, resolve_prompt_format
from .prompts import (
    ALPACA_PROMPT_NO_INPUT,
    ALPACA_PROMPT_WITH_INPUT,
    PROMPT_FORMATS,
    alpaca_prompt,
    check_prompt_format,
    conversation_to_alpaca,
)
from .schemas import (
    SCHEMA_NAMES,
    SCHEMAS,
    Column,
    DataError,
    DataPathError,
    Schema,
    detect_schema,
    register_schema,
    schema_names,
    unregister_schema,
    validate_columns,
)

__all__ = [
    "ALPACA_PROMPT_NO_INPUT",
    "ALPACA_PROMPT_WITH_INPUT",
    "ALPACA_SAMPLE_FILE",
    "Column",
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
    "gsm8k_sample_path",
    "ultrafeedback_sample_path",
    "check_prompt_format",
    "conversation_to_alpaca",
    "detect_schema",
    "format_example",
    "format_preference_example",
    "load_dpo_datasets",
    "load_sft_datasets",
    "load_split",
    "output_format",
    "register_schema",
    "resolve_prompt_format",
    "resolve_source",
    "schema_names",
    "unregister_schema",
    "validate_columns",
]
