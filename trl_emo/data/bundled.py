"""Paths of the sample data shipped inside the package (used by the offline demo)."""

from __future__ import annotations

from pathlib import Path

SAMPLES_DIR = Path(__file__).resolve().parent / "samples"
# Synthetic rows in the exact Alpaca-GPT4 schema (instruction, input, output, text); see `make_samples.py`.
ALPACA_SAMPLE_FILE = SAMPLES_DIR / "alpaca_gpt4_sample.jsonl"


def alpaca_sample_path() -> str:
    """Path of the bundled Alpaca-GPT4-schema sample (a JSON-lines file usable as `dataset_name`)."""
    if not ALPACA_SAMPLE_FILE.is_file():
        raise FileNotFoundError(
            f"Bundled sample missing: {ALPACA_SAMPLE_FILE}. Regenerate it with `python -m trl_emo.data.make_samples`."
        )
    return str(ALPACA_SAMPLE_FILE)
