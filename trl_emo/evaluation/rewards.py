"""Verifiable rewards for GRPO (`trl_emo.grpo`), from the answer checks the evaluation already trusts.

Each reward has TRL's reward-function signature, `reward(prompts, completions, answer, **kwargs) -> list`, one value
per completion: TRL 1.16's `GRPOTrainer` calls it with the prompts, the completions (strings, or for conversational
prompts a list holding one assistant message, `[{"role": "assistant", "content": "..."}]`) and every dataset column by
name, here `answer`, the reference of `trl_emo.data.verifiable`'s rows (GSM8K's worked solution ending in `#### 72`,
MATH's solution with its `\\boxed{}`, or a bare answer). In RL the reward is the objective, so a completion is
credited only when it states ONE final answer, equal to the reference; the reading is `final_answers`' (GSM8K) and
`math_answers`' (MATH), the very functions `trl-emo eval` scores with, so a reward and an evaluation never disagree:

- `gsm8k_answer`: 1.0 when the completion's last "The answer is" / `####` statement holds exactly one number equal to
  the reference's (thousands groups checked: `1,072` yes, `1,0720` no; sign, decimals, `a/b`, `\\frac{a}{b}`,
  `\\boxed{}`, `$...$`, a currency sign before and unit words after, `x = 18`), nothing but closing words follows
  it and no earlier statement or `\\boxed{}` gives another number; a single power or root (`2^{10}`, `\\sqrt{16}`) is
  compared by math-verify (`tasks.bon.gsm8k_answers`). A hedge (`20 (I first thought 2^{4}+2 = 18)`, `20 or $18^{1}$`, `\\boxed{18, 20}`),
  two final answers or more work after the answer score 0.0.
- `math_answer`: 1.0 when the completion's `\\boxed{}` (else its last line, without "The answer is:") is one answer
  (no hedge word, no second different box or closing statement, no work after it) that math-verify finds
  equivalent to the reference's last `\\boxed{}` (else its final statement, else the reference itself); 0.0
  otherwise. math-verify only ever sees the two extracted answers, never a sentence it could pick a part of.
- `format`: 1.0 when the completion states its final answer in the reference's own form AND the answer reward can
  read that answer: exactly the completions for which `final_answers.read_gsm8k` finds an answer for a GSM8K-style
  reference (`####` or "The answer is"), for which `math_answers.read_math_answer` finds a boxed one for a
  `\\boxed{}` reference, either for a bare one. Right or wrong does not matter, so give it a small weight next to an
  answer reward; it reads with the answer rewards' parser, so a completion whose answer they cannot read (a hedge,
  two final answers, work after the answer) gets 0.0 here too.

`tests/test_reward_hacking.py` holds a corpus of gaming attempts with every reward's verdict, checked against
`trl-emo eval`'s scoring too; README.md ("GRPO after SFT") compares these rules with TRL's `accuracy_reward`,
lm-evaluation-harness's GSM8K filters and math-verify.

A reference with no readable final answer gives `None` for each of its completions: TRL's convention for "not
scored" (the row is left out of the reward's mean and its advantage is 0), instead of a 0.0 that would read as wrong;
an empty reference gives None from every reward, `format` included, and a warning counts the unreadable ones.

`resolve_reward_funcs(names)` turns a recipe's `reward_funcs` into the callables: a name above, or a function of
yours by import path (`my_pkg.rewards:score`, or TRL's dotted `my_pkg.rewards.score`).
"""

from __future__ import annotations

import difflib
import importlib
import logging
import os
import sys
from collections.abc import Callable, Sequence

from ..core.errors import ConfigError
from ..data.adapters import reference_text
from .final_answers import final_statement, read_gsm8k, reference_number
from .math_answers import Equivalence, math_gold, read_math_answer

logger = logging.getLogger(__name__)

__all__ = [
    "REWARDS", "completion_text", "format_reward", "gsm8k_answer", "math_answer", "reference_answers",
    "resolve_reward_funcs",
]

def completion_text(completion) -> str:
    """The text of one completion as TRL passes it: a string, or a list of messages (the assistant's contents
    joined; a content given as typed parts keeps its text parts); anything else is ""."""
    if completion is None:
        return ""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        completion = [completion]
    if not isinstance(completion, list):
        return ""
    texts = []
    for message in completion:
        if not isinstance(message, dict) or message.get("role", "assistant") != "assistant":
            continue
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
        if isinstance(content, str):
            texts.append(content)
    return "\n".join(texts)


def _references(answer, count: int, name: str) -> list[str]:
    if answer is None:
        raise ConfigError(
            f"reward {name!r} needs the dataset's reference answers (an `answer` column, as trl_emo.grpo's prompt sets "
            "give), and got none."
        )
    if isinstance(answer, str) or not isinstance(answer, Sequence):
        answer = [answer] * count
    if len(answer) != count:
        raise ValueError(f"reward {name!r}: {count} completions but {len(answer)} reference answers.")
    return [reference_text(a) for a in answer]  # a number as plain decimals: 0.00001, never 1e-05


# The unreadable references already named in a warning, per reward: each is named once, not at every step.
_WARNED: set[tuple[str, str]] = set()


def _warn_unscored(name: str, references: list[str]) -> None:
    new = [r for r in dict.fromkeys(references) if r.strip() and (name, r) not in _WARNED]
    if new:
        _WARNED.update((name, r) for r in new)
        logger.warning(
            "reward %r: %d reference answer(s) hold no final answer it can read (first: %r); their completions are "
            "not scored (None).", name, len(new), new[0][:120],
        )


def gsm8k_gold(reference: str) -> str | None:
    """The canonical number of a GSM8K-style reference, read as a completion is (`final_answers.reference_number`):
    after its last "The answer is" or `####` (the dataset's own form), else its last `\\boxed{}`, else the whole
    reference as one number (`72`, `1,234`, `\\frac{1}{2}`, `$\\frac{3}{4}$`, `0.00001`); None when it holds none."""
    return reference_number(reference)


def _equivalence() -> Equivalence | None:
    from .tasks.bon import gsm8k_equivalence

    return gsm8k_equivalence()


def gsm8k_answer(prompts=None, completions=None, answer=None, **kwargs) -> list[float | None]:
    """1.0 for a completion whose one final GSM8K answer is the reference's, 0.0 otherwise (no answer, a wrong one, a
    hedge, two final answers, an empty completion); None when the reference itself has no number. The verdict of
    `trl-emo eval`'s GSM8K metrics (`tasks.bon.gsm8k_answers`)."""
    from .tasks.bon import gsm8k_answers

    completions = list(completions or [])
    references = _references(answer, len(completions), "gsm8k_answer")
    equivalence = _equivalence()
    rewards, unscored = [], []
    for completion, reference in zip(completions, references):
        gold = gsm8k_gold(reference)
        if gold is None:
            rewards.append(None)
            unscored.append(reference)
            continue
        (found,), _ = gsm8k_answers([completion_text(completion)], gold, equivalence)
        rewards.append(1.0 if found is not None and found == gold else 0.0)
    _warn_unscored("gsm8k_answer", unscored)
    return rewards


def math_answer(prompts=None, completions=None, answer=None, **kwargs) -> list[float | None]:
    """1.0 for a completion whose one final answer (its `\\boxed{}`, else its last line) math-verify finds equivalent
    to the reference's (its last `\\boxed{}`, else its final statement, else the reference itself), 0.0 otherwise;
    None when the reference is empty or holds no answer math-verify can read. The verdict of `trl-emo eval`'s MATH
    task (`tasks.math.math_verdicts`)."""
    from .tasks.math import math_verdicts

    completions = list(completions or [])
    references = _references(answer, len(completions), "math_answer")
    equivalent = Equivalence()  # one per call: the parses of a group's shared reference are memoized, then dropped
    rewards, unscored = [], []
    for completion, reference in zip(completions, references):
        gold = math_gold(reference)
        if gold is None or not equivalent.readable(gold):
            rewards.append(None)
            unscored.append(reference)
            continue
        ((_, correct),) = math_verdicts([completion_text(completion)], gold, equivalent)
        rewards.append(1.0 if correct else 0.0)
    _warn_unscored("math_answer", unscored)
    return rewards


def format_reward(prompts=None, completions=None, answer=None, **kwargs) -> list[float | None]:
    """1.0 for a completion whose final answer is in the reference's own form and readable by the answer reward
    (one "The answer is" / `####` answer, `final_answers.read_gsm8k`, for a GSM8K-style reference; one boxed answer,
    `math_answers.read_math_answer`, for a `\\boxed{}` one; either for a bare reference), 0.0 otherwise (no such
    statement, a hedge, two final answers, work after the answer); None for an empty reference (the row is not
    scored). Right or wrong does not matter here."""
    completions = list(completions or [])
    references = _references(answer, len(completions), "format")
    rewards = []
    for completion, reference in zip(completions, references):
        if not reference.strip():
            rewards.append(None)
            continue
        text = completion_text(completion)
        if "\\boxed" in reference or "\\fbox" in reference:
            ok = read_math_answer(text).boxed
        elif final_statement(reference) is not None:
            ok = read_gsm8k(text).found
        else:
            ok = read_gsm8k(text).found or read_math_answer(text).boxed
        rewards.append(1.0 if ok else 0.0)
    return rewards


def reference_answers(reward_names: Sequence[str], reference: str) -> dict[str, str | None]:
    """What each built-in answer reward among `reward_names` reads as the final answer of `reference` (None: it
    reads none, so those completions are not scored): what `--dry_run` shows next to each prompt."""
    readers = {"gsm8k_answer": gsm8k_gold, "math_answer": math_gold}
    return {name: readers[name](str(reference)) for name in reward_names if name in readers}


# TRL logs each reward under its function's name (`rewards/<name>/mean`): the name the recipe uses.
format_reward.__name__ = "format"

# The rewards a recipe names in `reward_funcs`.
REWARDS: dict[str, Callable] = {
    "gsm8k_answer": gsm8k_answer,
    "math_answer": math_answer,
    "format": format_reward,
}


def import_reward(path: str) -> Callable:
    """A reward function of yours: `package.module:function` (or TRL's `package.module.function`), imported with the
    current directory on the path, as TRL's `grpo` script does. Raises `ConfigError` in one line."""
    module_name, sep, attribute = path.partition(":")
    if not sep:
        module_name, _, attribute = path.rpartition(".")
    if not module_name or not attribute:
        raise ConfigError(f"reward_funcs: {path!r} is not an import path (write `package.module:function`).")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any failure to import is the user's path or module: one line
        raise ConfigError(f"reward_funcs: cannot import {module_name!r} for {path!r} ({type(exc).__name__}: {exc}).")
    function = getattr(module, attribute, None)
    if function is None:
        raise ConfigError(f"reward_funcs: module {module_name!r} has no {attribute!r} (from {path!r}).")
    if not callable(function):
        raise ConfigError(f"reward_funcs: {path!r} is a {type(function).__name__}, not a function.")
    return function


def _check_math_verify() -> None:
    # At resolve time, not at the first scored group: without math-verify, math_answer would stop the run mid-training.
    from .errors import EvaluationError
    from .math_answers import import_math_verify

    try:
        import_math_verify()
    except EvaluationError:
        raise ConfigError("reward_funcs: math_answer needs math-verify: pip install 'trl-emo[math]' (or `pip install "
                          "math-verify[antlr4_13_2]==0.9.0`).") from None


def resolve_reward_funcs(names: Sequence[str]) -> list[Callable]:
    """The reward functions a recipe names, in order: built-in names (`REWARDS`) or import paths. An unknown name is a
    one-line `ConfigError` listing the built-in ones (with the closest, for a typo)."""
    if isinstance(names, str):
        names = [names]
    functions = []
    for name in names:
        name = str(name).strip()
        if name in REWARDS:
            if name == "math_answer":
                _check_math_verify()
            functions.append(REWARDS[name])
        elif ":" in name or "." in name:
            functions.append(import_reward(name))
        else:
            close = difflib.get_close_matches(name, list(REWARDS), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(
                f"reward_funcs: unknown reward {name!r}{hint}; built-in rewards: {', '.join(REWARDS)}, or a function "
                "of yours as `package.module:function`."
            )
    if not functions:
        raise ConfigError(f"reward_funcs is empty: name at least one reward ({', '.join(REWARDS)}).")
    return functions
