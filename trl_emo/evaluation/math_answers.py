"""Final answers of math solutions and their equivalence (Hugging Face `math-verify`).

Extraction is ours (it is a few lines and decides what a "final answer" is): the content of the
last `\\boxed{...}` (nested braces), else the last non-empty line without its "The answer is:"
lead-in. Equivalence is `math-verify`'s: it parses both sides to sympy (LaTeX, fractions, sets,
intervals, percentages, equations) and compares them, which exact string matching gets wrong
(`\\frac{1}{2}` vs `0.5`, `\\dfrac` vs `\\frac`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from .errors import EvaluationError

MATH_VERIFY_MISSING = (
    "task 'math' needs math-verify: pip install 'trl-emo[math]' (or `pip install math-verify[antlr4_13_2]==0.9.0`)"
)
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_MATH_LIKE = re.compile(r"[0-9\\$=]")
_LEAD_IN = re.compile(r"^(?:the\s+)?(?:final\s+)?answer(?:\s+is)?\s*[:：]?\s*", re.IGNORECASE)


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` / `\\fbox{...}` in `text`, braces balanced; None if there is none."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    for start in reversed(starts):
        depth = 1
        for i in range(start, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    content = text[start:i].strip()
                    if content:
                        return content
                    break
    return None


def final_line(text: str) -> str | None:
    """The last non-empty line, without a leading "The answer is:" and a trailing period.

    None when the text is empty, or when the line has no answer lead-in and nothing math-like (a digit,
    `\\`, `$`, `=`): a closing "Hope this helps!" is not an answer that could vote.
    """
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return None
    line = _LEAD_IN.sub("", lines[-1]).strip()
    if line == lines[-1] and not _MATH_LIKE.search(line):
        return None
    if line.endswith(".") and not line.endswith(".."):
        line = line[:-1].rstrip()
    return line or None


def extract_math_answer(text: str) -> str | None:
    """The final answer of a solution: the last `\\boxed{}`, else the final line."""
    return last_boxed(text) or final_line(text)


def math_gold(text: str) -> str | None:
    """A gold answer from an `answer` cell (MATH-500) or a worked `solution` (its last `\\boxed{}`)."""
    text = str(text).strip()
    if not text:
        return None
    return last_boxed(text) or text


def import_math_verify():
    try:
        import math_verify
    except ImportError as exc:
        raise EvaluationError(MATH_VERIFY_MISSING) from exc
    return math_verify


class Equivalence:
    """`math-verify` equivalence of answer strings, with parses and verdicts memoized.

    The answer is parsed as inline LaTeX (`$...$`): a bare `\\frac{1}{2}`, `0.5` or `x = 2` all parse.
    """

    def __init__(self):
        self._mv = import_math_verify()
        self._parsed: dict[str, list] = {}
        self._verdicts: dict[tuple[str, str], bool] = {}

    def parse(self, answer: str) -> list:
        if answer not in self._parsed:
            body = answer.strip().strip("$").strip()
            parsed = self._mv.parse(f"${body}$") if body else []
            if not parsed:
                parsed = self._mv.parse(answer)
            self._parsed[answer] = parsed
        return self._parsed[answer]

    def __call__(self, gold: str | None, answer: str | None) -> bool:
        """Whether `answer` is equivalent to `gold` (False when either is missing or does not parse)."""
        if gold is None or answer is None:
            return False
        if gold.strip() == answer.strip():
            return True
        key = (gold, answer)
        if key not in self._verdicts:
            parsed_gold, parsed_answer = self.parse(gold), self.parse(answer)
            self._verdicts[key] = bool(parsed_gold and parsed_answer and self._mv.verify(parsed_gold, parsed_answer))
        return self._verdicts[key]


def cluster_answers(answers: Sequence[str | None], equivalent) -> list[int | None]:
    """A cluster id per answer (None for a missing answer): equivalent answers share an id, numbered by first
    appearance, so majority voting counts `\\frac{1}{2}` and `0.5` as one answer."""
    representatives: list[str] = []
    labels: list[int | None] = []
    for answer in answers:
        if answer is None:
            labels.append(None)
            continue
        label = next(
            (i for i, rep in enumerate(representatives) if rep == answer or equivalent(rep, answer)), None
        )
        if label is None:
            label = len(representatives)
            representatives.append(answer)
        labels.append(label)
    return labels
