"""lm-evaluation-harness's IFEval checkers (Google's instruction checkers), called as a library.

Nothing of the checkers is copied: `check(row, response)` feeds one response to lm-eval's
`test_instruction_following_strict` / `_loose` and returns their per-instruction verdicts.
What this module adds is making the import safe offline: lm-eval's `instructions_util` tries to
download NLTK's `punkt_tab` sentence model at import time when it is missing (a network call,
then a misleading "Downloaded" message, then a `LookupError` in the two checkers that count
sentences or words). We look for the data first and, without it, stop before any generation
with one line saying what to install; lm-eval is imported only once the data is there.
"""

from __future__ import annotations

import functools

from .errors import EvaluationError

IFEVAL_MISSING = (
    "task 'ifeval' needs lm-evaluation-harness's IFEval checkers: pip install 'trl-emo[ifeval]' "
    "(that is lm-eval[ifeval]==0.4.13 with langdetect, immutabledict and nltk)"
)
NLTK_DATA_MISSING = (
    "task 'ifeval' needs NLTK's punkt_tab sentence model (IFEval's sentence- and word-count checkers use it): "
    "run `python -m nltk.downloader punkt_tab` once online, or copy an nltk_data folder holding "
    "tokenizers/punkt_tab/english and point NLTK_DATA at it"
)
COLUMNS = ("prompt", "instruction_id_list", "kwargs")


def check_available() -> None:
    """Raise a one-line `EvaluationError` when the checkers or their NLTK data are missing."""
    try:
        from importlib.util import find_spec

        import immutabledict  # noqa: F401
        import langdetect  # noqa: F401
        import nltk

        if find_spec("lm_eval") is None:
            raise ImportError("lm_eval")
    except ImportError as exc:
        raise EvaluationError(IFEVAL_MISSING) from exc
    try:
        nltk.data.find("tokenizers/punkt_tab/english/")
    except LookupError as exc:
        raise EvaluationError(NLTK_DATA_MISSING) from exc


@functools.lru_cache(maxsize=1)
def _checkers():
    check_available()
    import langdetect
    from lm_eval.tasks.ifeval import utils

    # langdetect draws random numbers; a fixed seed makes the language checkers give the same verdict every run.
    langdetect.DetectorFactory.seed = 0
    return utils


def check(row: dict, response: str) -> tuple[list[bool], list[bool]]:
    """Strict and loose verdicts, one per instruction of the IFEval `row`, for `response`."""
    utils = _checkers()
    example = utils.InputExample(
        key=row.get("key", 0),
        instruction_id_list=list(row["instruction_id_list"]),
        prompt=row["prompt"],
        kwargs=[dict(kwargs or {}) for kwargs in row["kwargs"]],
    )
    strict = utils.test_instruction_following_strict(example, response).follow_instruction_list
    loose = utils.test_instruction_following_loose(example, response).follow_instruction_list
    return [bool(v) for v in strict], [bool(v) for v in loose]


def instruction_ids() -> list[str]:
    """Every instruction id the checkers know (for validating a local file)."""
    _checkers()
    from lm_eval.tasks.ifeval import instructions_registry

    return sorted(instructions_registry.INSTRUCTION_DICT)


def accuracies(strict: list[list[bool]], loose: list[list[bool]]) -> dict:
    """GEM's Table 1 (IFEval's four numbers), ×100: prompt-level (all instructions of a prompt followed) and
    instruction-level (every instruction counted alone) accuracy, strict and loose."""
    def prompt_level(verdicts):
        return 100.0 * sum(all(v) for v in verdicts) / len(verdicts)

    def instruction_level(verdicts):
        flat = [x for v in verdicts for x in v]
        return 100.0 * sum(flat) / len(flat)

    out = {
        "prompt_level_strict": prompt_level(strict),
        "instruction_level_strict": instruction_level(strict),
        "prompt_level_loose": prompt_level(loose),
        "instruction_level_loose": instruction_level(loose),
    }
    out["average"] = sum(out.values()) / 4
    return out
