"""Which answer reader scored a study's evaluation: a fingerprint of its rules, kept in every cached evaluation's key.

A study caches its measures (which sample of which problem is right) next to the completions they were read from.
When the reader's rules change (`trl_emo/evaluation/final_answers.py` and the functions that apply it), a cached
verdict would silently keep the old reading; with the fingerprint in the cache's key, a changed reader re-scores the
saved completions (seconds) instead of reusing them, and never regenerates them (hours).

The fingerprint is a hash of the reader's source: the modules that read an answer (`final_answers`, `math_answers`,
`rewards`), the functions that apply them to GSM8K-style completions (`tasks/bon.py`'s `gsm8k_answers` and
`gsm8k_equivalence`, `metrics.extract_answer` and `metrics.pass_at_k_unbiased`) and the installed math-verify (its
equivalence decides some verdicts). Any edit of those sources, comments included, changes it: a re-score too many
costs seconds, one too few a wrong verdict.
"""

from __future__ import annotations

import functools
import hashlib
import inspect


@functools.lru_cache(maxsize=None)
def answer_reader_version() -> str:
    """The fingerprint (16 hex digits) of the answer reader this process would score with."""
    from importlib import metadata

    from trl_emo.evaluation import final_answers, math_answers, metrics, rewards
    from trl_emo.evaluation.tasks import bon

    parts = [inspect.getsource(module) for module in (final_answers, math_answers, rewards)]
    parts += [inspect.getsource(function) for function in (bon.gsm8k_answers, bon.gsm8k_equivalence,
                                                           metrics.extract_answer, metrics.pass_at_k_unbiased)]
    try:
        parts.append("math-verify " + metadata.version("math-verify"))
    except metadata.PackageNotFoundError:
        parts.append("math-verify absent")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
