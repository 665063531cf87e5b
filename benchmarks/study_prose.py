"""The studies' hand-written reports, held to their results: figures rendered into prose from named values, and a
check that every number a report's prose quotes is one its results give.

**Rendered prose** (`render`): a report's template writes each result as a field, `[[name]]` or `[[name|spec]]` (a
Python format spec: `[[gem.rlT/pass@1.rl|.1f]]`), filled from a study's named figures; a negative number is written
with a minus sign (−). What is left in the template besides the fields are words and the few numbers that are not
results (`literal_numbers` finds them; the study's test lists them, each with its reason).

**Checked prose** (`unmatched`): for a report written by hand, every number in its prose must be found, rounded as
written, among the numbers its results hold (`pool`: the leaves of its JSON, every number of its generated tables),
unless the test's allow-list names it. A check of presence, not of meaning: a figure quoted under the wrong name
passes when the right name's value happens to equal it, so the reports whose figures were found wrong are rendered.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Iterable, Mapping

FIELD = re.compile(r"\[\[([^\]|]+?)(?:\|([^\]]*))?\]\]")
MINUS = "−"


def render(template: str, figures: Mapping[str, object]) -> str:
    """The template with every field replaced by its figure (an unknown name, or a missing figure, is an error
    naming the field). A field may subtract one figure from another (`[[a - b|.1f]]`) and end in `*100` (a share
    written in %)."""
    def value(expression: str) -> object:
        scale = 1.0
        if expression.endswith("*100"):
            expression, scale = expression[:-4].strip(), 100.0
        names = [name.strip() for name in expression.split(" - ")]
        values = []
        for name in names:
            if name not in figures:
                raise KeyError(f"[[{expression}]]: no figure {name!r}")
            if figures[name] is None:
                raise ValueError(f"[[{expression}]]: the results hold no value for {name!r}")
            values.append(figures[name])
        if len(values) == 1 and scale == 1.0:
            return values[0]
        return (values[0] - sum(values[1:])) * scale

    def one(match: re.Match) -> str:
        result = value(match.group(1).strip())
        spec = match.group(2)
        text = format(result, spec) if spec else str(result)
        return MINUS + text[1:] if isinstance(result, (int, float)) and text.startswith("-") else text
    return FIELD.sub(one, template)


def reflow(text: str, width: int = 118) -> str:
    """Prose paragraphs and list items re-wrapped to `width` columns (a rendered field is longer or shorter than its
    name); headings, tables, code blocks and HTML comments are left as they are."""
    import textwrap

    out: list[str] = []
    block: list[str] = []
    fenced = comment = False

    def flush():
        if not block:
            return
        first = block[0]
        indent = re.match(r"^(\s*(?:[-*] |\d+\. )?)", first).group(1)
        words = " ".join(line.strip() for line in block)[len(indent.strip()):].strip()
        out.extend(textwrap.wrap(words, width, initial_indent=indent, subsequent_indent=" " * len(indent),
                                 break_long_words=False, break_on_hyphens=False))
        block.clear()

    for line in text.split("\n"):
        stripped = line.strip()
        if stripped.startswith("```"):
            flush()
            fenced = not fenced
            out.append(line)
            continue
        if fenced or comment or not stripped or stripped.startswith(("|", "#", "<!--", "!", "[[")):
            flush()
            comment = (comment or stripped.startswith("<!--")) and "-->" not in stripped
            out.append(line)
            continue
        if re.match(r"^\s*(?:[-*] |\d+\. )", line):
            flush()
        block.append(line)
    flush()
    return "\n".join(out)


# A number as prose writes it: optional sign (−, -, +), digits with thousands commas, decimals. Not inside a word
# (SmolLM2, 135M, Q4_1, 2e-6), a version (3.11.7) or a date (2026-11-27, handled by `_strip`).
NUMBER = re.compile(r"(?<![\w.\-−+/])([−+-]?)(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d+))?(?![\w.]\d|\w)")


def _strip(text: str) -> str:
    """Text without what holds no result: fenced code, inline code, link targets, HTML comments, dates, times, and the
    regions a report marks `<!-- prose-check: off (why) -->` … `<!-- prose-check: on -->` (figures of runs whose
    results were not kept, the reason written there)."""
    text = re.sub(r"<!-- prose-check: off.*?<!-- prose-check: on -->", " ", text, flags=re.S)
    text = re.sub(r"```.*?```", " ", text, flags=re.S)
    text = re.sub(r"`[^`]*`", " ", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    text = re.sub(r"<!--.*?-->", " ", text, flags=re.S)
    text = re.sub(r"\b\d{4}-\d{2}-\d{2}\b", " ", text)
    # References, not results: issue 46, Section 6, Table 2, Fig. 3-4, App. E, eq. 16, §5.
    text = re.sub(r"(?:\b(?:[Ii]ssues?|Sections?|Tables?|Fig\.|Figures?|App\.|Appendix|eq\.)\s+|§\s?)[\dA-Z][\d.–-]*",
                  " ", text)
    text = re.sub(r"\b\d{1,2}:\d{2}(?:-\d{1,2}:\d{2})?\b", " ", text)
    # A range (0.5-2, 56-96) is two numbers; a dash after a letter is part of a name (Llama-3.2-3B).
    return re.sub(r"(?<=\d)[-–](?=\d)", " – ", text)


def numbers(text: str) -> list[tuple[str, float, int]]:
    """(as written, value, decimals) of every number in `text`'s prose (`_strip`ped)."""
    out = []
    for match in NUMBER.finditer(_strip(text)):
        sign, whole, decimals = match.groups()
        value = float(whole.replace(",", "") + ("." + decimals if decimals else ""))
        out.append((match.group(0), -value if sign in ("-", MINUS) else value, len(decimals or "")))
    return out


def literal_numbers(template: str) -> list[str]:
    """The numbers a template writes itself (outside its fields), as written."""
    return [written for written, _, _ in numbers(FIELD.sub(" ", template))]


def pool(*sources: object) -> list[float]:
    """Every number of `sources`: JSON-like values (their leaves, recursively) and texts (every number in them, as
    `numbers` reads it)."""
    out: list[float] = []

    def walk(value):
        if isinstance(value, bool) or value is None:
            return
        if isinstance(value, (int, float)):
            if math.isfinite(value):
                out.append(float(value))
        elif isinstance(value, str):
            out.extend(v for _, v, _ in numbers(value))
        elif isinstance(value, Mapping):
            for item in value.values():
                walk(item)
        elif isinstance(value, Iterable):
            for item in value:
                walk(item)
    for source in sources:
        walk(source)
    return out


def unmatched(text: str, candidates: list[float], allowed: Iterable[str] = ()) -> list[str]:
    """The numbers of `text` that are neither one of `candidates` rounded as written (either way of a tie, either
    sign: prose writes a difference's size as often as its sign) nor in `allowed` (as written, sign aside)."""
    allowed = {a.replace(MINUS, "-").lstrip("+-") for a in allowed}
    sizes = sorted(abs(c) for c in candidates)
    missing = []
    for written, value, decimals in numbers(text):
        if written.replace(MINUS, "-").lstrip("+-") in allowed:
            continue
        tolerance = 0.5 * 10 ** -decimals + 1e-9
        i = bisect.bisect_left(sizes, abs(value) - tolerance)
        if not (i < len(sizes) and sizes[i] <= abs(value) + tolerance):
            missing.append(written)
    return missing
