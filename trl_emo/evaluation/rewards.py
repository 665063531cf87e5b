"""Verifiable rewards for GRPO (`trl_emo.grpo`), from the answer checks the evaluation already trusts.

Each reward has TRL's reward-function signature, `reward(prompts, completions, answer, **kwargs) -> list`, one value
per completion: TRL 1.16's `GRPOTrainer` calls it with the prompts, the completions (strings, or for conversational
prompts a list holding one assistant message, `[{"role": "assistant", "content": "..."}]`) and every dataset column by
name, here `answer`, the reference of `trl_emo.data.verifiable`'s rows (GSM8K's worked solution ending in `#### 72`,
MATH's solution with its `\\boxed{}`, or a bare answer). What counts as the final answer and when two answers are the
same is decided exactly as `trl-emo eval` scores them, so a reward and an evaluation never disagree on a verdict:

- `gsm8k_answer`: 1.0 when the completion's number after its last "The answer is" (else its last `####`) equals the
  reference's (`metrics.extract_answer`: commas dropped, `18`, `18.0` and `36/2` the same), or when math-verify finds
  the stated answer equivalent (`\\frac{1}{2}` for 0.5; the GSM8K metrics' rule, `tasks.bon.gsm8k_answers`); else 0.0.
- `math_answer`: 1.0 when the completion's last `\\boxed{}` (else its last line, without "The answer is:") is
  equivalent to the reference's last `\\boxed{}` (or the reference itself) by math-verify (`math_answers`); else 0.0.
- `format`: 1.0 when the completion ends with a final answer in the form the reference uses (`####` or "The answer
  is" and a number for a GSM8K reference, a non-empty `\\boxed{}` for a MATH one; either for a bare reference), else
  0.0; its value does not depend on being right, so give it a small weight next to an answer reward.

A reference with no readable final answer gives `None` for each of its completions: TRL's convention for "not
scored" (the row is left out of the reward's mean and its advantage is 0), instead of a 0.0 that would read as wrong.

`resolve_reward_funcs(names)` turns a recipe's `reward_funcs` into the callables: a name above, or a function of
yours by import path (`my_pkg.rewards:score`, or TRL's dotted `my_pkg.rewards.score`).
"""

from __future__ import annotations

import difflib
import importlib
import os
import re
import sys
from collections.abc import Callable, Sequence

from ..core.errors import ConfigError
from . import metrics
from .math_answers import Equivalence, extract_math_answer, last_boxed, math_gold

__all__ = [
    "REWARDS", "completion_text", "format_reward", "gsm8k_answer", "math_answer", "reference_answers",
    "resolve_reward_funcs",
]

_GSM8K_FORM = re.compile(r"(?:the answer is|####)\s*:?\s*\$?\s*[-+−]?\s*\.?\d", re.IGNORECASE)


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


def _references(answer, count: int, name: str) -> list:
    if answer is None:
        raise ConfigError(
            f"reward {name!r} needs the dataset's reference answers (an `answer` column, as trl_emo.grpo's prompt sets "
            "give), and got none."
        )
    if isinstance(answer, str) or not isinstance(answer, Sequence):
        answer = [answer] * count
    if len(answer) != count:
        raise ValueError(f"reward {name!r}: {count} completions but {len(answer)} reference answers.")
    return ["" if a is None else str(a) for a in answer]


def gsm8k_gold(reference: str) -> str | None:
    """The canonical number of a GSM8K-style reference: after its last "The answer is" or `####` (the dataset's
    own form), else its first number (a bare `72` or `1,234`); None when it holds none."""
    return metrics.extract_answer(reference) or metrics.parse_number(reference)


def _equivalence() -> Equivalence | None:
    from .tasks.bon import gsm8k_equivalence

    return gsm8k_equivalence()


def gsm8k_answer(prompts=None, completions=None, answer=None, **kwargs) -> list[float | None]:
    """1.0 for a completion whose final GSM8K answer is the reference's, 0.0 otherwise (no answer, a wrong one, an
    empty completion); None when the reference itself has no number. The verdict of `trl-emo eval`'s GSM8K metrics."""
    from .tasks.bon import gsm8k_answers

    completions = list(completions or [])
    references = _references(answer, len(completions), "gsm8k_answer")
    equivalence = _equivalence()
    rewards = []
    for completion, reference in zip(completions, references):
        gold = gsm8k_gold(reference)
        if gold is None:
            rewards.append(None)
            continue
        (found,), _ = gsm8k_answers([completion_text(completion)], gold, equivalence)
        rewards.append(1.0 if found is not None and found == gold else 0.0)
    return rewards


def math_answer(prompts=None, completions=None, answer=None, **kwargs) -> list[float | None]:
    """1.0 for a completion whose final answer (last `\\boxed{}`, else last line) math-verify finds equivalent to the
    reference's (its last `\\boxed{}`, or the reference itself), 0.0 otherwise; None when the reference is empty.
    The verdict of `trl-emo eval`'s MATH task."""
    completions = list(completions or [])
    references = _references(answer, len(completions), "math_answer")
    equivalent = Equivalence()  # one per call: the parses of a group's shared reference are memoized, then dropped
    rewards = []
    for completion, reference in zip(completions, references):
        gold = math_gold(reference)
        if gold is None:
            rewards.append(None)
            continue
        rewards.append(1.0 if equivalent(gold, extract_math_answer(completion_text(completion))) else 0.0)
    return rewards


def format_reward(prompts=None, completions=None, answer=None, **kwargs) -> list[float]:
    """1.0 for a completion that gives its final answer in the reference's own form (`####`/"The answer is" and a
    number for a GSM8K-style reference, a non-empty `\\boxed{}` for a MATH-style one, either for a bare reference),
    0.0 otherwise. Right or wrong does not matter here."""
    completions = list(completions or [])
    references = _references(answer, len(completions), "format")
    rewards = []
    for completion, reference in zip(completions, references):
        text = completion_text(completion)
        boxed = last_boxed(text) is not None
        stated = _GSM8K_FORM.search(text) is not None
        if "\\boxed" in reference or "\\fbox" in reference:
            ok = boxed
        elif "####" in reference or re.search("the answer is", reference, re.IGNORECASE):
            ok = stated
        else:
            ok = boxed or stated
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
