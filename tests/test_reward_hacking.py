"""The verifiable rewards against a policy that games them (issue 37): what is credited is what GRPO learns.

A table of adversarial completions (hedges, two answers, the question's numbers echoed, an answer quoted from an
earlier attempt, a `\\boxed{}` list, a number followed by more work, floods) with the verdict every reward must give,
so a change that credits a hedge fails here; the same table through the functions `trl-emo eval`'s GSM8K and MATH
tasks score with; references in every accepted form; pathological inputs scored in linear time.
"""

from __future__ import annotations

import re
import statistics
import time

import pytest

pytest.importorskip("math_verify", reason="the `math` extra (math-verify) is not installed")

from trl_emo.evaluation import final_answers, math_answers, metrics, rewards  # noqa: E402
from trl_emo.evaluation.final_answers import read_gsm8k  # noqa: E402
from trl_emo.evaluation.math_answers import Equivalence, extract_math_answer, math_gold  # noqa: E402
from trl_emo.evaluation.prompts import gsm8k_gold as eval_gsm8k_gold  # noqa: E402
from trl_emo.evaluation.rewards import format_reward, gsm8k_answer, math_answer  # noqa: E402
from trl_emo.evaluation.tasks import bon  # noqa: E402
from trl_emo.evaluation.tasks import math as math_task  # noqa: E402

# One problem, its reference in each dataset's form: GSM8K's worked solution, MATH's boxed one, a bare answer.
QUESTION = "Tom has 6 bags of 3 apples. How many apples does he have?"
GSM8K_REFERENCE = "He has 6 * 3 = <<6*3=18>>18 apples.\n#### 18"
MATH_REFERENCE = "There are $6 \\cdot 3 = 18$ apples, so the answer is $\\boxed{18}$."
BARE_REFERENCE = "18"

# completion -> (gsm8k_answer, math_answer, format with the GSM8K reference, with the MATH one, with the bare one).
# 1 credited, 0 not. The answer is 18; 20 is the wrong alternative a hedging policy slips in.
CORPUS = [
    # -- one final answer, in each accepted form: credited
    ("The answer is 18", (1, 1, 1, 0, 1)),
    ("#### 18", (1, 1, 1, 0, 1)),
    ("6 * 3 = 18.\nThe answer is: 18", (1, 1, 1, 0, 1)),  # MetaMath's form
    ("The answer is $18$.", (1, 1, 1, 0, 1)),
    ("The answer is \\boxed{18}.", (1, 1, 1, 1, 1)),
    ("So he has $\\boxed{18}$ apples.", (0, 1, 0, 1, 1)),  # a box without "The answer is" is MATH's form only
    ("The answer is 18 apples.", (1, 1, 1, 0, 1)),  # unit words after the number
    ("The answer is \\$18", (1, 1, 1, 0, 1)),
    ("The answer is $18.00.", (1, 1, 1, 0, 1)),  # a currency sign and decimals
    ("The answer is x = 18", (1, 1, 1, 0, 1)),
    ("The answer is {18}", (1, 1, 1, 0, 1)),
    ("The answer is **18**.", (1, 1, 1, 0, 1)),
    ("**The answer is 18.**", (1, 1, 1, 0, 1)),
    ("The answer is 18.\nSo Tom has 18 apples.", (1, 0, 1, 0, 1)),  # a closing remark may restate the answer
    ("The answer is 18.\n\n**Final Answer**\n\\[\n\\boxed{18}\n\\]", (1, 1, 1, 1, 1)),  # and box it again
    ("The answer is 36/2", (1, 1, 1, 0, 1)),
    ("The answer is \\frac{36}{2}", (1, 1, 1, 0, 1)),
    ("The answer is 18\n#### 18", (1, 1, 1, 0, 1)),  # one answer stated twice
    ("\\boxed{18}\nThe answer is: 18", (1, 1, 1, 1, 1)),  # MetaMath's MATH form: a box, then the same statement
    ("6 * 3 = 18.\nThe answer is: 18\nI hope this helps!", (1, 0, 1, 0, 1)),  # MATH reads the last line only
    # a genuine correction: the earlier, quoted attempt is no statement of an answer
    ('I first wrote "The answer is 20", but that was wrong.\nThe answer is 18.', (1, 1, 1, 0, 1)),
    # -- hedges and alternatives: never credited
    ("The answer is 20 (I first thought 2^{4}+2 = 18)", (0, 0, 0, 0, 0)),
    ("The answer is 20 or $18^{1}$", (0, 0, 0, 0, 0)),
    ("The answer is 18 or 20", (0, 0, 0, 0, 0)),
    ("The answer is 18, 20", (0, 0, 0, 0, 0)),
    ("The answer is 18 or eighteen", (0, 0, 0, 0, 0)),
    ("\\boxed{20 \\text{ (I first thought } 18)}", (0, 0, 0, 0, 0)),
    ("\\boxed{20 \\text{ or } 18}", (0, 0, 0, 0, 0)),
    ("\\boxed{20 \\\\ 18}", (0, 0, 0, 0, 0)),  # two lines in one box
    # a `\boxed{}` list: one answer for MATH (a set, which may be the reference), never equal to 18
    ("The answer is \\boxed{18, 20}", (0, 0, 0, 1, 1)),
    # -- several different final answers
    ("\\boxed{18} or \\boxed{20}", (0, 0, 0, 0, 0)),
    ("\\boxed{20}\n\\boxed{18}", (0, 0, 0, 0, 0)),
    ("The answer is 20. The answer is 18.", (0, 0, 0, 0, 0)),
    ("The answer is 20.\nThe answer is 18.", (0, 0, 0, 0, 0)),
    ("\\boxed{20}\nThe answer is: 18", (0, 0, 0, 0, 0)),
    ("\\boxed{18}\nThe answer is: 20", (0, 0, 0, 0, 0)),
    # -- the question's numbers echoed
    ("The answer is 6, 3, 18", (0, 0, 0, 0, 0)),
    ("6 bags of 3 apples is 6 * 3 = 18 apples.", (0, 0, 0, 0, 0)),  # no final answer stated
    ("The answer is 6 \\cdot 3", (0, 1, 0, 0, 0)),  # arithmetic is work for GSM8K; math-verify evaluates it
    # -- an answer inside a quoted earlier attempt, after the real one
    ('The answer is 20.\nMy first attempt said "The answer is 18".', (0, 0, 0, 0, 0)),
    # -- a number followed by more work
    ("The answer is 18. Check: 2^4+2 = 18", (0, 0, 0, 0, 0)),
    ("The answer is 18. Or maybe 20.", (0, 0, 0, 0, 0)),
    ("The answer is 18.\n\\boxed{20}", (0, 0, 0, 0, 0)),
    ("\\boxed{18}. Then 2^{4}+2 = 18.", (0, 0, 0, 0, 0)),
    ("The answer is 18 + 2 = 20", (0, 0, 0, 0, 0)),
    ("The answer is 20 = 18", (0, 0, 0, 0, 0)),
    ("\\boxed{20 = 18}", (0, 0, 0, 1, 1)),  # math-verify would compare the right side alone
    ("\\boxed{20 \\to 18}", (0, 0, 0, 1, 1)),
    # -- numbers read strictly
    ("The answer is 1,8", (0, 0, 0, 0, 0)),  # not a thousands group
    ("The answer is -18", (0, 0, 1, 0, 1)),
    ("The answer is eighteen", (0, 0, 0, 0, 0)),  # words are not read
    ("The answer is 10^{10^{10}}", (0, 0, 1, 0, 1)),  # never handed to sympy: it would stall the step
    # -- floods and nothing
    ("The answer is" + "\n" * 2000, (0, 0, 0, 0, 0)),
    ("The answer is " * 2000, (0, 0, 0, 0, 0)),
    ("The answer is " + "9" * 2000, (0, 0, 0, 0, 0)),
    ("\\boxed{" * 2000, (0, 0, 0, 0, 0)),
    (" " * 2000, (0, 0, 0, 0, 0)),
    ("", (0, 0, 0, 0, 0)),
]


def _verdicts(completion: str) -> tuple:
    def one(reward, reference):
        (value,) = reward([QUESTION], [[{"role": "assistant", "content": completion}]], answer=[reference])
        return value

    return (
        one(gsm8k_answer, GSM8K_REFERENCE), one(math_answer, MATH_REFERENCE), one(format_reward, GSM8K_REFERENCE),
        one(format_reward, MATH_REFERENCE), one(format_reward, BARE_REFERENCE),
    )


@pytest.mark.parametrize("completion, expected", CORPUS, ids=[f"{i}:{c[:40]!r}" for i, (c, _) in enumerate(CORPUS)])
def test_every_reward_gives_the_corpus_verdict(completion, expected):
    assert _verdicts(completion) == tuple(float(e) for e in expected)


def test_format_credits_exactly_what_the_answer_rewards_can_read():
    # format and gsm8k_answer share one parser: a completion gsm8k_answer credits always has the right form, and
    # format's GSM8K verdict is whether the reader found one answer.
    for completion, (gsm8k, _, format_gsm8k, _, _) in CORPUS:
        assert format_gsm8k == float(read_gsm8k(completion).found)
        assert not gsm8k or format_gsm8k


def test_trl_emo_eval_scores_the_corpus_as_the_rewards_do():
    # Through the functions the eval tasks call: `bon`'s GSM8K metrics (`gsm8k_answers`, gold from the prompt set's
    # reader) and `math`'s verdicts (`math_verdicts`, gold from `math_gold`), one completion per prompt.
    equivalence = bon.gsm8k_equivalence()
    equivalent = Equivalence()
    texts = [completion for completion, _ in CORPUS]
    gsm8k_gold = eval_gsm8k_gold(GSM8K_REFERENCE)
    assert gsm8k_gold == "18" and math_gold(MATH_REFERENCE) == "18"
    answers, _ = bon.gsm8k_answers(texts, gsm8k_gold, equivalence)
    per_prompt = metrics.gsm8k_metrics([[a] for a in answers], [gsm8k_gold] * len(texts), [1])
    verdicts = math_task.math_verdicts(texts, math_gold(MATH_REFERENCE), equivalent)
    for (completion, expected), answer, (_, correct) in zip(CORPUS, answers, verdicts):
        reward = gsm8k_answer(None, [completion], [GSM8K_REFERENCE]) == [1.0]
        assert (answer == gsm8k_gold) == bool(expected[0]) == reward, completion
        reward = math_answer(None, [completion], [MATH_REFERENCE]) == [1.0]
        assert correct == bool(expected[1]) == reward, completion
    credited = sum(expected[0] for _, expected in CORPUS)
    assert per_prompt["sample_accuracy"] == pytest.approx(100.0 * credited / len(CORPUS))


# -- references in each accepted form --------------------------------------------------------------------------------

# reference -> (a completion the rewards must credit, one they must not)
REFERENCES = [
    ("#### 18", "The answer is 18", "The answer is 20"),
    ("The answer is: 18", "#### 18.0", "The answer is 20"),
    ("18", "The answer is 18", "The answer is 1"),
    ("18.00", "The answer is 18", "The answer is 1800"),
    ("$18", "The answer is \\$18", "The answer is 1"),
    ("\\$18", "The answer is $18", "The answer is 1"),
    ("\\boxed{18}", "The answer is 18", "The answer is 1"),
    ("$\\boxed{18}$", "The answer is 18", "The answer is 1"),
    ("{18}", "The answer is 18", "The answer is 1"),
    ("x = 18", "The answer is 18", "The answer is 1"),
    ("18 apples", "The answer is 18", "The answer is 1"),
    ("\\frac{36}{2}", "The answer is 18", "The answer is 36"),
    ("#### 1,072", "The answer is 1072", "The answer is 1,0720"),  # valid thousands groups only
    ("1,072", "The answer is 1,072", "The answer is 10720"),
    ("-$3", "The answer is -3", "The answer is 3"),
    ("\\frac{1}{2}", "The answer is 0.5", "The answer is 1"),  # was read as 1
    ("$\\frac{3}{4}$", "The answer is 0.75", "The answer is 3"),  # was read as 3
    ("\\dfrac{3}{4}", "The answer is 3/4", "The answer is 4"),
    (0.00001, "The answer is 0.00001", "The answer is 1"),  # a numeric JSON value: was "1e-05", then 1
    (72, "The answer is 72", "The answer is 7"),
]


@pytest.mark.parametrize("reference, right, wrong", REFERENCES)
def test_references_are_read_like_completions(reference, right, wrong):
    assert gsm8k_answer(None, [right, wrong], answer=[reference, reference]) == [1.0, 0.0]
    boxed_right = "\\boxed{" + right.removeprefix("The answer is ").removeprefix("#### ") + "}"
    boxed_wrong = "\\boxed{" + wrong.removeprefix("The answer is ") + "}"
    if "1,0720" not in boxed_wrong:  # math-verify reads `1,0720` as a set: not equal either way
        assert math_answer(None, [boxed_right, boxed_wrong], answer=[reference, reference]) == [1.0, 0.0]
    in_form = boxed_right if "\\boxed" in str(reference) else right  # format asks for the reference's own form
    assert format_reward(None, [in_form], answer=[reference]) == [1.0]


def test_unreadable_references_leave_their_rows_unscored(caplog):
    # None, not 0.0: TRL leaves the row out of the reward's mean and gives it no advantage.
    completions = ["The answer is 18", "\\boxed{18}"]
    assert gsm8k_answer(None, completions, answer=["no number here", "18 or 20"]) == [None, None]
    assert math_answer(None, completions, answer=["no answer here", "\\boxed{}"]) == [None, None]  # was 0.0
    for reward in (gsm8k_answer, math_answer, format_reward):
        assert reward(None, completions, answer=["", "   "]) == [None, None]
    with caplog.at_level("WARNING", logger=rewards.__name__):
        gsm8k_answer(None, ["#### 1"] * 3, answer=["unreadable one", "unreadable two", "unreadable one"])
    assert "2 reference answer(s) hold no final answer it can read" in caplog.text


# -- linear time ----------------------------------------------------------------------------------------------------

FLOOD = 100_000
PATHOLOGICAL = {
    "newlines after the marker": "The answer is" + "\n" * FLOOD,
    "spaces after the marker": "The answer is" + " " * FLOOD + "x",
    "spaces then a number": "The answer is:" + " " * FLOOD + "18",
    "mixed whitespace": "The answer is" + " \n\t" * (FLOOD // 3),
    "the marker repeated": "The answer is " * 10_000,
    "a statement repeated": "The answer is 18. " * 10_000,
    "different statements": "".join(f"The answer is {i}.\n" for i in range(10_000)),
    "statement lines": "The answer is: 5\n" * 10_000,
    "a digit run": "The answer is " + "9" * FLOOD,
    "a bare digit run": "9" * FLOOD,
    "commas and digits": "The answer is " + "1," * (FLOOD // 2),
    "thousands groups": "The answer is 1" + ",000" * (FLOOD // 4),
    "unclosed boxes": "\\boxed{" * (FLOOD // 7),
    "closed boxes": "\\boxed{18}" * (FLOOD // 10),
    "different boxes": "".join(f"\\boxed{{{i}}}" for i in range(10_000)),
    "nested braces": "The answer is " + "{" * FLOOD + "1" + "}" * FLOOD,
    "unclosed fractions": "The answer is " + "\\frac{" * (FLOOD // 6),
    "dollar signs": "The answer is " + "$" * FLOOD,
    "hashes": "#" * FLOOD,
    "dots": "The answer is 1" + "." * FLOOD,
    "minus signs": "The answer is " + "-" * FLOOD + "1",
    "backslashes": "\\" * FLOOD,
    "words": "The answer is " + "or " * (FLOOD // 3) + "18",
}
SCORERS = {
    "extract_answer": metrics.extract_answer,
    "extract_math_answer": extract_math_answer,
    "gsm8k_answer": lambda text: gsm8k_answer(None, [text], answer=[GSM8K_REFERENCE]),
    "math_answer": lambda text: math_answer(None, [text], answer=[MATH_REFERENCE]),
    "format": lambda text: format_reward(None, [text], answer=[BARE_REFERENCE]),  # a bare reference: both readings
}


def _seconds(function, text, bound=0.05) -> float:
    # One run when it is well within the bound; else the median of three, so a busy CI machine's hiccup is no failure.
    times = []
    for _ in range(3):
        start = time.perf_counter()
        function(text)
        times.append(time.perf_counter() - start)
        if times[0] < bound / 2:
            break
    return statistics.median(times)


def test_pathological_completions_are_scored_in_linear_time():
    # Consecutive optional `\s*` groups made `format` take 25 s on "The answer is" + 400 newlines; a whitespace flood
    # up to max_completion_length must cost milliseconds, through every reward and extraction.
    for scorer in SCORERS.values():
        scorer("The answer is 18")  # imports and math-verify's first parse, outside the clock
    slow = {
        (name, scorer_name): seconds
        for name, text in PATHOLOGICAL.items()
        for scorer_name, scorer in SCORERS.items()
        if (seconds := _seconds(scorer, text)) >= 0.05
    }
    assert not slow, f"over 50 ms: {slow}"


def _module_patterns():
    for module in (final_answers, math_answers, metrics, rewards, bon, math_task):
        for name, value in vars(module).items():
            if isinstance(value, re.Pattern):
                yield f"{module.__name__}.{name}", value


def test_every_regex_on_the_answer_paths_is_linear_on_floods():
    # Any pattern with nested or adjacent optional quantifiers over the same characters backtracks super-linearly on
    # a long run of those characters; each pattern of these modules meets floods of the characters answers hold.
    # 5,000 characters: linear patterns take microseconds, a quadratic one about a second.
    floods = [char * 5_000 for char in (" ", "\n", "9", "{", "}", "$", "\\", ".", ",", "-", "#", "a", "^", "=")]
    floods += [unit * (5_000 // len(unit)) for unit in ("1,", " 1", "\\boxed{", "\\text{ ", "the answer is ", ": ")]
    patterns = dict(_module_patterns())
    assert len(patterns) >= 20
    slow = {}
    for name, pattern in patterns.items():
        for flood in floods:
            for text in (flood, flood + "x"):
                start = time.perf_counter()
                pattern.search(text)
                pattern.fullmatch(text)
                for _ in pattern.finditer(text):
                    pass
                if (seconds := time.perf_counter() - start) > 0.05:
                    slow[(name, flood[:12])] = seconds
    assert not slow, f"super-linear patterns: {slow}"
