"""Final answers of math solutions and their equivalence (Hugging Face `math-verify`).

Extraction is ours (it decides what a "final answer" is, and it is what a reward credits): the content of the
`\\boxed{...}` (nested braces), else the last non-empty line without its "The answer is:" lead-in, read by the rules
of `final_answers` (one final answer or nothing). A box or line holding a hedge (`20 \\text{ or } 18`,
`20 \\text{ (I first thought } 18)`, two lines joined by `\\\\`), several boxes with different answers, a closing
"The answer is: X" that differs from the box, or work after the box (`\\boxed{20}. Then 2^4+2 = 18`) is no answer.
Equivalence is `math-verify`'s: it parses both single answers to sympy (LaTeX, fractions, sets, intervals,
percentages, equations) and compares them, which exact string matching gets wrong (`\\frac{1}{2}` vs `0.5`, `\\dfrac`
vs `\\frac`). math-verify is only ever handed one extracted answer, never a sentence: on a sentence (or an equation
`20 = 18` against a plain number) it takes the last expression, which would credit a hedge.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple

from .errors import EvaluationError
from .final_answers import (
    MAX_ANSWER_CHARS, boxes, closes_work, cut_statement, final_statement, has_hedge, last_boxed, peel, read_number,
    strip_unit,
)

__all__ = [
    "MATH_VERIFY_MISSING", "Equivalence", "MathAnswer", "cluster_answers", "extract_math_answer", "final_line",
    "import_math_verify", "last_boxed", "math_gold", "one_math_answer", "read_math_answer",
]

MATH_VERIFY_MISSING = (
    "task 'math' needs math-verify: pip install 'trl-emo[math]' (or `pip install math-verify[antlr4_13_2]==0.9.0`)"
)
_MATH_LIKE = re.compile(r"[0-9\\$=]")
# "The answer is:", "Final answer:", "Answer:", GSM8K's "####" at the start of a line (the words only: "is" and ":"
# are read after).
_LEAD_IN = re.compile(r"(?:the[ \t]+)?(?:final[ \t]+)?answer(?![A-Za-z])|####", re.IGNORECASE)
_LEAD_IN_LINE = re.compile(
    r"^[ \t*_]*(?:(?:the[ \t]+)?(?:final[ \t]+)?answer(?![A-Za-z])|####)", re.IGNORECASE | re.MULTILINE
)
_IS = re.compile(r"is(?![A-Za-z])", re.IGNORECASE)
_LINE_BREAK = re.compile(r"\\\\|\\newline(?![A-Za-z])")
_TEXT_GROUP = re.compile(r"\\(?:text|mbox|textrm|textbf|mathrm|operatorname)\s?\{[^{}]*\}")
_COMMAND = re.compile(r"\\[A-Za-z]+")
_PROSE = re.compile(r"[A-Za-z]{3,}")
_DIGIT = re.compile(r"\d")
_SPACING = re.compile(r"\s+|\\left(?![A-Za-z])|\\right(?![A-Za-z])|\\[,!; ]")
# A relation or an arrow: math-verify compares only its right side with a plain answer, so `20 = 18` would be 18.
_RELATION = re.compile(
    r"=|\\(?:approx|to|rightarrow|Rightarrow|longrightarrow|Longrightarrow|implies|iff|mapsto|equiv|mid)(?![A-Za-z])"
)
# Values sympy may need seconds (or math-verify's 5 s timeout) to compute: a power tower, an exponent of 4 digits or
# more, the factorial of a 3-digit number or of an expression, a binomial of powers (on the answer without spaces).
_COSTLY = re.compile(r"\^\{[^{}]*\^|\^\d+\^|\^\{?-?\d{4}|\d{3}!|[)}]!|binom\{[^{}]*\^")
_ASSIGNED = re.compile(r"[A-Za-z](?:_\{?[A-Za-z0-9]+\}?)?\s*=")


def _lead_in(line: str) -> tuple[str, bool] | None:
    """`line` (stripped) without its lead-in ("The answer is:", "Final Answer: The final answer is", "####"), and
    whether the lead-in makes it a statement ("is", ":" or "####"); None without a lead-in."""
    rest, statement, found = line.lstrip("*_ "), False, False  # also in bold: **The answer is 18.**
    for _ in range(2):  # Minerva's "Final Answer: The final answer is $5$."
        match = _LEAD_IN.match(rest)
        if match is None:
            break
        found = True
        statement = statement or match.group() == "####"
        rest = rest[match.end() :].lstrip()
        is_ = _IS.match(rest)
        if is_ is not None:
            rest, statement = rest[is_.end() :], True
        rest = rest.lstrip()
        if rest.startswith((":", "：")):
            rest, statement = rest[1:].lstrip(), True
    return (rest, statement) if found else None


def final_line(text: str) -> str | None:
    """The last non-empty line, without a leading "The answer is:" and a trailing period.

    None when the text is empty, or when the line has no answer lead-in and nothing math-like (a digit,
    `\\`, `$`, `=`): a closing "Hope this helps!" is not an answer that could vote.
    """
    end = len(text.rstrip())
    if end == 0:
        return None
    line = text[text.rfind("\n", 0, end) + 1 : end].strip()
    lead = _lead_in(line)
    if lead is None and not _MATH_LIKE.search(line):
        return None
    if lead is not None:
        line = lead[0]
    if line.endswith(".") and not line.endswith(".."):
        line = line[:-1].rstrip()
    return line or None


def one_math_answer(answer: str | None, prose: bool = True) -> str | None:
    """`answer` when it is ONE answer (without what wraps it: `$`, `\\boxed{}`, a final period), else None: no longer
    than `final_answers.MAX_ANSWER_CHARS`, no box left inside, no line break (`\\\\`) outside an environment, no hedge
    word (`or`, `maybe`, `thought`, ... in `\\text{}` or bare). With `prose=False` (a last line, a bare reference)
    also no bare word of three letters or more besides trailing units: a sentence is not an answer."""
    if answer is None or len(answer) > 2 * MAX_ANSWER_CHARS:  # before peeling: no scan of a flood
        return None
    answer = peel(answer)
    if not answer or len(answer) > MAX_ANSWER_CHARS or "\\boxed" in answer or "\\fbox" in answer:
        return None
    if _LINE_BREAK.search(answer) and "\\begin" not in answer:
        return None
    if has_hedge(answer):
        return None
    if not prose:
        for _ in range(4):  # unit words after a number (`18 apples`), never the words of a sentence
            stripped = strip_unit(answer)
            if stripped == answer or not _DIGIT.search(stripped):
                break
            answer = stripped
        if _PROSE.search(_COMMAND.sub("", _TEXT_GROUP.sub("", answer))):
            return None
    if "$" in answer:  # a currency sign (`-$3`): math-verify would take it for a math delimiter
        return read_number(answer) or answer
    return answer or None


def _key(answer: str) -> str:
    # Two statements of one answer in one completion: the same after spacing and `\dfrac`/`\tfrac` are set aside.
    return _SPACING.sub("", answer).replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")


class MathAnswer(NamedTuple):
    """A solution's final answer (None: none, or not one) and whether it came from a `\\boxed{}`."""

    answer: str | None
    boxed: bool = False


def _statement(line: str) -> tuple[str, int] | None:
    # A line that states an answer ("The answer is ...", "Final answer: ..."): (its answer span, where the span ends
    # in the line); None for any other line.
    line = line.rstrip()
    stripped = line.lstrip()
    lead = _lead_in(stripped)
    if lead is None or not lead[1]:
        return None
    span = cut_statement(lead[0])
    return span, len(line) - len(lead[0]) + len(span)


def _line_at(text: str, start: int) -> str:
    end = text.find("\n", start)
    return text[start : len(text) if end < 0 else end]


def read_math_answer(text: str) -> MathAnswer:
    """The final answer of a solution: its `\\boxed{}` (else its last line), when it is the one final answer: no
    other box, and no line stating an answer ("The answer is: X"), gives a different one, and after it the solution
    only closes (`final_answers.closes_work`)."""
    text = str(text)
    found = []
    if "\\boxed" in text or "\\fbox" in text:
        found = [(start, stop, end) for start, stop, end in boxes(text) if text[start:stop].strip()]
    lines = [match.start() for match in _LEAD_IN_LINE.finditer(text)]  # candidate statement lines, by start
    others: list[tuple[str, bool]] = []  # the other statements of an answer, last first; whether prose may be in them
    if found:
        start, stop, end = found[-1]
        answer = one_math_answer(text[start:stop])
        trailer = text[end:]
        after = [pos for pos in lines if pos >= end]
        closing = _statement(_line_at(text, after[-1])) if after else None
        if closing is not None and one_math_answer(closing[0], prose=False) is not None:
            # MetaMath's closing "The answer is: X" after the box: a second statement of the answer, not more work.
            trailer = text[end : after[-1]] + text[after[-1] + closing[1] :]
            others.append((closing[0], False))
        others += [(text[s:e], True) for s, e, _ in reversed(found[:-1])]
        before = [pos for pos in lines if pos < end]
    else:
        end = len(text.rstrip())
        line_start = text.rfind("\n", 0, end) + 1
        line = text[line_start:end].strip()
        lead = _lead_in(line)
        trailer = ""
        if lead is None:
            answer = one_math_answer(line, prose=False) if _MATH_LIKE.search(line) else None
        else:
            span = cut_statement(lead[0])
            trailer = lead[0][len(span) :]
            answer = one_math_answer(span, prose=False)
        before = [pos for pos in lines if pos < line_start]
    if answer is None or not closes_work(trailer, read_number(answer)):
        return MathAnswer(None)
    key = _key(answer)
    seen = {text[start:stop]} if found else set()
    for other, prose in others + [(_line_at(text, pos), None) for pos in reversed(before)]:
        if other in seen:  # equal statements read the same: a flood of them is read once
            continue
        seen.add(other)
        if prose is None:  # a line: its statement, if it is one
            statement = _statement(other)
            if statement is None:
                continue
            other, prose = statement[0], False
        other = one_math_answer(other, prose)
        if other is not None and _key(other) != key:
            return MathAnswer(None)  # two final answers
    return MathAnswer(answer, boxed=bool(found))


def extract_math_answer(text: str) -> str | None:
    """The final answer of a solution: its last `\\boxed{}`, else its final line, when it is the one final answer
    (`read_math_answer`); None otherwise."""
    return read_math_answer(text).answer


def math_gold(text: str) -> str | None:
    """A gold answer from an `answer` cell (MATH-500) or a worked `solution` (its last `\\boxed{}`, else its final
    "The answer is" / `####` statement), read as one answer (`one_math_answer`); None when it holds none."""
    text = str(text).strip()
    if not text:
        return None
    boxed = last_boxed(text)
    if boxed is not None:
        return one_math_answer(boxed)
    statement = final_statement(text)
    if statement is not None:
        return one_math_answer(statement, prose=False)
    return one_math_answer(text, prose=False)


def _relation(answer: str) -> bool:
    answer = answer.strip()
    assigned = _ASSIGNED.match(answer)
    return _RELATION.search(answer, assigned.end() if assigned else 0) is not None


def _costly(answer: str) -> bool:
    return _COSTLY.search(_SPACING.sub("", answer)) is not None


def import_math_verify():
    try:
        import math_verify
    except ImportError as exc:
        raise EvaluationError(MATH_VERIFY_MISSING) from exc
    return math_verify


class Equivalence:
    """`math-verify` equivalence of answer strings, with parses and verdicts memoized.

    The answer is parsed as inline LaTeX (`$...$`): a bare `\\frac{1}{2}`, `0.5` or `x = 2` all parse. Hand it single
    answers (`extract_math_answer`, `math_gold`), never a sentence. A relation or an arrow on one side only (`20 = 18`,
    `20 \\to 18` against `18`; a leading `x =` does not count) is never equivalent: math-verify would compare its
    right side alone. Nor is an answer whose value takes sympy seconds to compute (`10^{10^{10}}`, `1000!`) compared
    with a reference written without such a construct: it cannot equal it, and a reward must not stall on it.
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

    def readable(self, gold: str | None) -> bool:
        """Whether math-verify reads `gold` as math (not only as the string it falls back to)."""
        return gold is not None and any(not isinstance(item, str) for item in self.parse(gold))

    def __call__(self, gold: str | None, answer: str | None) -> bool:
        """Whether `answer` is equivalent to `gold` (False when either is missing or does not parse)."""
        if gold is None or answer is None:
            return False
        if gold.strip() == answer.strip():
            return True
        if _relation(gold) != _relation(answer):
            return False
        if _costly(answer) and not _costly(gold):  # a reward must not stall on `10^{10^{10}}`; it is not the gold
            return False
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
