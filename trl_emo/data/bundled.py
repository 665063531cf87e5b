"""Paths of the sample data shipped inside the package (used by the offline demo)."""

from __future__ import annotations

from pathlib import Path

SAMPLES_DIR = Path(__file__).resolve().parent / "samples"
# Synthetic rows in the exact Alpaca-GPT4 schema (instruction, input, output, text); see `make_samples.py`.
ALPACA_SAMPLE_FILE = SAMPLES_DIR / "alpaca_gpt4_sample.jsonl"
# The samples of `trl-emo demo --chain` (`chain_samples.py`): a folder each, one JSON-lines file per split, usable as
# `dataset_name` (UltraFeedback's schema and splits: train_sft, test_sft, train_prefs, test_prefs; GSM8K's: train, test).
ULTRAFEEDBACK_SAMPLE_DIR = SAMPLES_DIR / "ultrafeedback_sample"
GSM8K_SAMPLE_DIR = SAMPLES_DIR / "gsm8k_sample"


def alpaca_sample_path() -> str:
    """Path of the bundled Alpaca-GPT4-schema sample (a JSON-lines file usable as `dataset_name`)."""
    if not ALPACA_SAMPLE_FILE.is_file():
        raise FileNotFoundError(
            f"Bundled sample missing: {ALPACA_SAMPLE_FILE}. Regenerate it with `python -m trl_emo.data.make_samples`."
        )
    return str(ALPACA_SAMPLE_FILE)


def _bundled_folder(folder: Path) -> str:
    if not any(folder.glob("*.jsonl")):
        raise FileNotFoundError(
            f"Bundled sample missing: {folder}. Regenerate it with `python -m trl_emo.data.chain_samples`."
        )
    return str(folder)


def ultrafeedback_sample_path() -> str:
    """Folder of the bundled UltraFeedback-schema sample (preference pairs and SFT conversations), a `dataset_name`."""
    return _bundled_folder(ULTRAFEEDBACK_SAMPLE_DIR)


def gsm8k_sample_path() -> str:
    """Folder of the bundled GSM8K-schema word problems (`train`, `test`), a `dataset_name` for GRPO."""
    return _bundled_folder(GSM8K_SAMPLE_DIR)


SAMPLES = {"alpaca": alpaca_sample_path, "ultrafeedback": ultrafeedback_sample_path, "gsm8k": gsm8k_sample_path}


def main(argv=None) -> int:
    """`python -m trl_emo.samples NAME`: print the path of a bundled sample, for `--dataset_name "$(...)"`."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m trl_emo.samples",
                                     description="Print the path of a sample shipped with trl_emo (a dataset_name).")
    parser.add_argument("name", choices=list(SAMPLES), help="alpaca: Alpaca-GPT4 schema (SFT); ultrafeedback: "
                        "UltraFeedback schema (SFT and DPO); gsm8k: GSM8K schema (GRPO, evaluation)")
    args = parser.parse_args(argv)
    try:
        print(SAMPLES[args.name]())
    except FileNotFoundError as exc:
        print(f"python -m trl_emo.samples: error: {exc}", file=sys.stderr)
        return 2
    return 0
