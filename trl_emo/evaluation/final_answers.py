"""A completion's final answer: one statement holding one answer, or nothing.

One reader for the GRPO rewards (`rewards.py`: `gsm8k_answer`, `math_answer`, `format`) and for `trl-emo eval`'s GSM8K
and MATH scoring (`tasks/bon.py`, `math_answers.py`), so a reward and an evaluation always read the same answer. In RL
the reward is the objective: whatever is credited by mistake, the policy learns. So the rules are strict:

- **One final answer or nothing.** The final-answer statement is the words after the completion's last "The answer
  is" (any case) or `####`, up to the end of that line or sentence. It is read only when it holds exactly one answer
  in an accepted form (below), optionally followed by unit words (`18 apples`, `3/4 of a cup`); anything else there
  (`20 (I first thought 2^{4}+2 = 18)`, `20 or $18^{1}$`, `10, 20 or 30`, `18 + 2 = 20`, `\\boxed{18, 20}`) is a
  hedge and no answer. After the statement the completion may only close (`I hope it helps!`): a digit or math
  markup there (`Actually 2^4+2 = 18`) is more work after the answer, and no answer. An earlier statement, or a
  `\\boxed{}` anywhere, that reads a different answer makes two final answers, and no answer.
- **Numbers read exactly** (`Fraction`, canonical strings such as `"1072"`, `"-3"`, `"1/2"`): digits with valid
  thousands groups only (`1,072` is 1072; `1,0720` and `18,20` are no number), an optional sign, decimals, `a/b`,
  `\\frac{a}{b}` / `\\dfrac` / `\\tfrac` / `\\frac12`, a currency sign before the number (`$18`, `\\$18`, `-$3`,
  `$-3`, `€5`), a percent sign after it, the whole answer possibly wrapped in `$...$`, `\\(...\\)`, `\\[...\\]`,
  `\\boxed{}`, `\\fbox{}`, `{}`, `**...**` or given as `x = 18`. A single LaTeX value that is not a plain
  number, a power, root or fraction of numbers (`2^{10}`, `\\sqrt{16}`), is kept as an expression for math-verify
  to compare with the reference; arithmetic (`6 \\cdot 3`, `2^{4}+2`, `1000 + 24`) is work, not an answer.
- **Linear time.** Every regex run over a whole completion is a literal marker or a single-character class with no
  optional quantifier next to another over the same characters; `\\boxed{` is matched by one pass of a brace
  counter; everything else runs on an answer span cut to at most `MAX_ANSWER_CHARS` characters. A completion that
  degenerates into whitespace or repeats "The answer is" thousands of times is scored in milliseconds.

References are read by the same rules (`reference_number`), so `\\frac{1}{2}` is 0.5, `$\\frac{3}{4}$` is 0.75 and a
JSON `0.00001` (written out by `trl_emo.data.adapters.reference_text`, never as `1e-05`) is 1/100000.
"""

from __future__ import annotations

import itertools
import re
from fractions import Fraction
from typing import NamedTuple

__all__ = [
    "HEDGE_WORDS", "MAX_ANSWER_CHARS", "Reading", "boxes", "closes_work", "cut_statement", "final_statement",
    "has_hedge", "last_boxed", "peel", "read_answer", "read_gsm8k", "read_number", "reference_number", "strip_unit",
]

# A final answer is short: a longer span is prose or a flood, never one answer (and never handed to math-verify).
MAX_ANSWER_CHARS = 500

# Words that join or qualify alternatives: an answer holding one is a hedge (`20 or 18`, `\text{(I first thought 18)}`).
HEDGE_WORDS = frozenset(
    "or nor maybe perhaps possibly probably either otherwise alternatively actually wait thought think guess earlier "
    "initially previously originally instead unless but versus vs".split()
)
# After a GSM8K number only unit words may follow; these are never units.
_NOT_UNITS = HEDGE_WORDS | frozenset(
    "and not no then if else so because since which that is was were are be equals equal plus minus times over "
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety hundred thousand million "
    "billion half".split()
)
_MAX_UNIT_WORDS = 4
_MAX_WRAPPERS = 8  # `**$\\boxed{18}$**` is three; deeper nesting is no answer (and each layer costs a scan)

_MARKER = re.compile(r"the answer is|####", re.IGNORECASE)
# The end of a statement: a line break, or a sentence end (. ! ? followed by whitespace or the end).
_STATEMENT_END = re.compile(r"\n|[.!?。](?=\s|$)")
_NON_SPACE = re.compile(r"\S")
_DIGIT = re.compile(r"\d")
# What may follow the final answer: math delimiters (`$`, `\[ \]`, `\( \)`, `\end{...}`; its boxes set aside), then text
# with no math markup and no number but the answer itself ("So Tom has 18 apples." after "The answer is 18").
_CLOSERS = re.compile(r"\\[\[\]()]|\\end\{[A-Za-z*]*\}|\$")
_MARKUP = re.compile(r"[=^\\]")
_TRAILER_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_MAX_RESTATEMENTS = 16  # distinct spellings of the answer a closing remark may hold

_UNSIGNED = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+"
_SIGN = "[-+−]"
_CURRENCY = r"(?:\\\$|[$€£¥₹])"
# A sign, a currency sign between or before (`-$3`, `$-3`, `\$18`), or neither: one alternative per shape, so no
# two optional parts can take the same character.
_PREFIX = rf"(?P<prefix>{_SIGN}?{_CURRENCY}{_SIGN}?|{_SIGN})?"
_NUMBER = re.compile(rf"{_PREFIX}(?P<num>{_UNSIGNED})(?:/(?P<den>{_UNSIGNED}))?(?:\\?%)?")
_SIGNED = rf"{_SIGN}?(?:{_UNSIGNED})"
_FRAC = re.compile(
    rf"{_PREFIX}\\[dt]?frac(?:\{{(?P<a>{_SIGNED})\}}\{{(?P<b>{_SIGNED})\}}|(?P<a1>\d)(?P<b1>\d))(?:\\?%)?"
)
# A space that touches anything but a digit or a comma goes (`- $ 3`, `1 / 2`, `\frac{1} {2}`); one between digits or
# after a comma stays, so `10 20` and `10, 200` are never read as 1020 or 10200.
_LOOSE_SPACE = re.compile(r" (?=[^\d,])|(?<=[^\d,]) ")

# A single LaTeX value that is not a plain number: a power, a root or a fraction of numbers (2^{10}, \sqrt{16}). No
# operator (+, -, *, /, \cdot, \times) after its first character: `6 \cdot 3` or `1000 + 24` is work, not an answer.
_EXPRESSION_COMMANDS = re.compile(r"\\(?:[dt]?frac|sqrt|left|right)(?![A-Za-z])")
_EXPRESSION_CHARS = re.compile(r"[^0-9.\s^(){}\[\]]")
_LATEX_MARK = re.compile(r"[\\^{]")
_DIGITS_APART = re.compile(r"\d\s+\d")

_UNIT_WORD = re.compile(r"[A-Za-z]+(?:[-'/][A-Za-z]+)?")
_TEXT_UNIT = re.compile(r"\\(?:text|mbox|textrm|mathrm)\s?\{([^{}]*)\}$")
_ASSIGNMENT = re.compile(r"[A-Za-z] ?= ?")
_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]+")
_WRAPPERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"), ("**", "**"))
_BRACED = ("\\boxed", "\\fbox", "\\textbf", "\\mathbf", "")
# Brace tokens for `boxes`: a box with no brace inside (one token: the common case), a box opening, a plain group with
# no brace inside (depth-neutral), a single brace. Each alternative's run stops at the next brace, so the scan is
# linear.
_BOXES = re.compile(
    r"\\(?:boxed|fbox)\s*\{(?P<simple>[^{}]*)\}|(?P<box>\\(?:boxed|fbox)\s*\{)|\{[^{}]*\}|(?P<brace>[{}])"
)


class Reading(NamedTuple):
    """What a final-answer statement holds: `number` (canonical, `Fraction`'s string) or `expression` (one
    LaTeX expression math-verify may compare), or neither. `stated` tells a hedge (numbers but no single answer)
    from a statement that holds none."""

    number: str | None = None
    expression: str | None = None
    stated: bool = False

    @property
    def found(self) -> bool:
        return self.number is not None or self.expression is not None


NOTHING = Reading()
HEDGE = Reading(stated=True)


# -- boxes ----------------------------------------------------------------------------------------------------------


def boxes(text: str) -> list[tuple[int, int, int]]:
    """The `\\boxed{...}` / `\\fbox{...}` that close and sit in no other box, in order, as `(content start, content
    end, end)`: one pass of a brace counter (an unclosed `\\boxed{` flood costs its length, not its square)."""
    first = min((i for i in (text.find("\\boxed"), text.find("\\fbox")) if i >= 0), default=-1)
    if first < 0:
        return []
    stack: list[int] = []  # per open brace: its box's content start, or -1 for a plain brace
    open_boxes = 0
    found = []
    for match in _BOXES.finditer(text, first):  # braces before the first box cannot close one
        if match["simple"] is not None:
            if open_boxes == 0:
                found.append((match.start("simple"), match.end("simple"), match.end()))
        elif match["box"] is not None:
            stack.append(match.end())
            open_boxes += 1
        elif match["brace"] == "{":
            stack.append(-1)
        elif match["brace"] == "}" and stack:
            start = stack.pop()
            if start >= 0:
                open_boxes -= 1
                if open_boxes == 0:
                    found.append((start, match.start(), match.end()))
    return found


def last_boxed(text: str) -> str | None:
    """The content of the last non-empty `\\boxed{...}` / `\\fbox{...}` in `text`, braces balanced; None if none."""
    for start, stop, _ in reversed(boxes(text)):
        content = text[start:stop].strip()
        if content:
            return content
    return None


# -- spans ----------------------------------------------------------------------------------------------------------


def _unwrap_braced(text: str) -> str | None:
    # `\boxed{x}`, `{x}`...: only when the brace that opens after the command closes at the very end.
    for command in _BRACED:
        if not text.startswith(command + "{") or not text.endswith("}"):
            continue
        depth = 0
        for i in range(len(command), len(text)):
            char = text[i]
            if char == "{":
                depth += 1
            elif char == "}":
                depth -= 1
                if depth == 0:
                    return text[len(command) + 1 : -1] if i == len(text) - 1 else None
        return None
    return None


def peel(text: str) -> str:
    """`text` without what wraps a whole answer: surrounding space, a final `.`/`!`/`?`, `$...$`, `$$...$$`,
    `\\(...\\)`, `\\[...\\]`, `**...**`, `\\boxed{}`, `\\fbox{}`, `\\textbf{}`, `{}` (each as often as it wraps)."""
    text = text.strip()
    for _ in range(_MAX_WRAPPERS):
        before = text
        text = text.rstrip(".!?。").strip()
        if text.endswith("*") and not text.startswith("*"):  # the end of a bold sentence: **The answer is 18.**
            text = text.rstrip("*").strip()
        for opening, closing in _WRAPPERS:
            inner = text[len(opening) : -len(closing)]
            if (len(text) >= len(opening) + len(closing) and text.startswith(opening) and text.endswith(closing)
                    and opening not in inner):
                text = inner.strip()
                break
        else:
            inner = _unwrap_braced(text)
            if inner is not None:
                text = inner.strip()
        if text == before:
            return text
    return text


def has_hedge(text: str) -> bool:
    """Whether `text` holds a hedge word (`HEDGE_WORDS`), bare or in `\\text{}` (LaTeX commands are not words)."""
    return any(word.lower() in HEDGE_WORDS for word in _WORD.findall(text))


def cut_statement(text: str) -> str:
    """`text` up to its first line or sentence end (included): the statement an answer lead-in starts."""
    end = _STATEMENT_END.search(text)
    return text if end is None else text[: end.end()]


def strip_unit(text: str) -> str:
    """`text` without one trailing unit: a `\\text{...}` of unit words, or a word that is no hedge or number word."""
    match = _TEXT_UNIT.search(text)
    if match is not None:
        words = match.group(1).split()
        if all(_UNIT_WORD.fullmatch(w) and w.lower() not in _NOT_UNITS for w in words):
            return text[: match.start()].rstrip()
        return text
    head, space, word = text.rpartition(" ")
    if space and _UNIT_WORD.fullmatch(word) and word.lower() not in _NOT_UNITS:
        return head.rstrip()
    return text


def _fraction(text: str) -> Fraction:
    return Fraction(text.replace(",", "").replace("−", "-"))


def _negative(prefix: str | None) -> bool:
    return prefix is not None and (prefix.count("-") + prefix.count("−")) % 2 == 1


def _number(core: str) -> str | None:
    core = _LOOSE_SPACE.sub("", core)
    try:
        match = _NUMBER.fullmatch(core)
        if match is not None:
            value = _fraction(match["num"])
            if match["den"] is not None:
                value /= _fraction(match["den"])
        else:
            match = _FRAC.fullmatch(core)
            if match is None:
                return None
            value = _fraction(match["a"] or match["a1"]) / _fraction(match["b"] or match["b1"])
    except (ZeroDivisionError, ValueError):
        return None
    return str(-value if _negative(match["prefix"]) else value)


def _expression(core: str) -> bool:
    if not _LATEX_MARK.search(core) or _DIGITS_APART.search(core):
        return False
    if _EXPRESSION_CHARS.search(_EXPRESSION_COMMANDS.sub("", core.lstrip("-−"))):
        return False
    depth = 0
    for char in core:
        depth += (char in "({[") - (char in ")}]")
        if depth < 0:
            return False
    return depth == 0


def read_answer(span: str) -> Reading:
    """One answer span (what follows "The answer is", or a bare reference) read as ONE answer: a number (canonical),
    a single LaTeX expression, `HEDGE` when it holds a digit but no single answer, `NOTHING` when it holds none."""
    text = span.strip()
    if text.startswith((":", "：")):
        text = text[1:]
    if not _DIGIT.search(text):
        return NOTHING
    if len(text) > MAX_ANSWER_CHARS:
        return HEDGE
    text = " ".join(text.split())
    units = 0
    assigned = False
    while True:  # every pass removes something, so at most a few passes over a short span
        before = text
        text = peel(text)
        if units < _MAX_UNIT_WORDS:
            stripped = strip_unit(text)
            if stripped != text:
                units += 1
                text = stripped
                continue
        if not assigned:
            match = _ASSIGNMENT.match(text)
            if match is not None:
                assigned = True
                text = text[match.end() :]
                continue
        if text == before:
            break
    number = _number(text)
    if number is not None:
        return Reading(number=number, stated=True)
    if _expression(text):
        return Reading(expression=text, stated=True)
    return HEDGE


def read_number(span: str) -> str | None:
    """The number `span` holds as its one answer (`"1,072"` → `"1072"`, `"$\\frac{3}{4}$"` → `"3/4"`), else None."""
    return read_answer(span).number


# -- statements -----------------------------------------------------------------------------------------------------


def closes_work(text: str, answer: str | None = None) -> bool:
    """Whether `text`, what follows a final answer, only closes the completion: without its boxes (compared as
    statements of their own) and math delimiters (`$`, `\\[`, `\\]`, `\\(`, `\\)`, `\\end{...}`), no math markup
    (`=`, `^`, `\\`) and no number but `answer` (canonical) restated: "So Tom has 18 apples." closes an 18, "Check:
    3 * 6 = 18" or "Or maybe 20." does not."""
    if "\\boxed" in text or "\\fbox" in text:
        spans = [(text.rfind("\\", 0, start), end) for start, _, end in boxes(text)]
        starts = [0] + [end for _, end in spans]
        stops = [start for start, _ in spans] + [len(text)]
        text = "".join(text[a:b] for a, b in zip(starts, stops))
    text = _CLOSERS.sub("", text)
    if _MARKUP.search(text):
        return False
    seen = set()
    for match in _TRAILER_NUMBER.finditer(text):
        number = match.group().rstrip(",")
        if number in seen:
            continue
        seen.add(number)
        if answer is None or len(seen) > _MAX_RESTATEMENTS or read_number(number) != answer:
            return False
    return True


def _split_statement(piece: str) -> tuple[str, str]:
    # What follows one marker, up to the next: (the answer span, the rest). The answer may start on the next line
    # ("The answer is:\n18"); it ends at the first line or sentence end.
    first = _NON_SPACE.search(piece)
    if first is not None and piece[first.start()] in ":：":
        first = _NON_SPACE.search(piece, first.end())
    if first is None:
        return "", ""
    end = _STATEMENT_END.search(piece, first.start())
    return (piece[first.start() :], "") if end is None else (piece[first.start() : end.end()], piece[end.end() :])


def final_statement(text: str) -> str | None:
    """The answer span of the last "The answer is" / `####` statement of `text`; None without one."""
    parts = _MARKER.split(text)
    return _split_statement(parts[-1])[0] if len(parts) > 1 else None


def read_gsm8k(text: str) -> Reading:
    """The final answer of a GSM8K-style completion: the last "The answer is" / `####` statement read as one answer
    (`read_answer`), provided nothing but closing words follows it and no earlier statement reads another answer.
    `NOTHING` when there is no statement; a `Reading` that is not `found` for a hedge."""
    # Split at the markers (one pass in C): what follows each marker up to the next. A statement never runs past the
    # next marker, and equal pieces read the same, so a flood of repeated statements is read once.
    parts = _MARKER.split(text)
    if len(parts) == 1:
        return NOTHING
    span, rest = _split_statement(parts[-1])
    final = read_answer(span)
    if not final.found:
        return final
    if not closes_work(rest, final.number):
        return HEDGE
    # Every other statement of an answer: the earlier "The answer is" / `####` ones and the boxes (`\\boxed{18}` then
    # "The answer is 20" is two final answers).
    others = reversed(parts[1:-1])
    if "\\boxed" in text or "\\fbox" in text:
        others = itertools.chain(others, (text[start:stop] for start, stop, _ in boxes(text)))
    seen = {parts[-1]}
    for other in others:
        if other in seen:
            continue
        seen.add(other)
        earlier = read_answer(_split_statement(other)[0])
        if earlier.found and (earlier.number, earlier.expression) != (final.number, final.expression):
            return HEDGE  # two final answers
    return final


def reference_number(reference: str) -> str | None:
    """The canonical number of a reference, read like a completion: its final "The answer is" / `####` statement
    (GSM8K's `#### 1,072`), else its last `\\boxed{}`, else the whole reference as one answer (`72`, `\\frac{1}{2}`,
    `$\\frac{3}{4}$`, `0.00001`, `$18`); None when none of them holds exactly one number."""
    reference = str(reference)
    if final_statement(reference) is not None:
        return read_gsm8k(reference).number
    boxed = last_boxed(reference)
    if boxed is not None:
        return read_number(boxed)
    return read_number(reference)
