"""Generate the bundled samples of `trl-emo demo --chain` deterministically: preferences and verifiable problems.

    python -m trl_emo.data.chain_samples            # rewrites the bundled folders
    python -m trl_emo.data.chain_samples --check    # fails if a bundled file differs from what would be written

- `samples/ultrafeedback_sample/`: rows in the exact schema of `HuggingFaceH4/ultrafeedback_binarized` (`prompt`,
  `prompt_id`, `chosen` and `rejected` conversations, `messages` = `chosen`, `score_chosen`, `score_rejected`) in its
  four splits (`train_sft`, `test_sft`, `train_prefs`, `test_prefs`). The prompts are the single-answer tasks of the
  Alpaca-GPT4 sample (`make_samples`: arithmetic, capitals, sorting, reversal, opposites...) and GSM8K-style word
  problems; the chosen answer is right, the rejected one is the right answer of another prompt of the same kind (a
  fluent, wrong answer, which a reward model must tell by its content, not its form).
- `samples/gsm8k_sample/`: word problems in GSM8K's schema (`question`, `answer` = a worked solution ending in
  `#### <number>`), `train` and `test`, read by `trl_emo.grpo` (the `gsm8k_answer` and `format` rewards) and by
  `trl-emo eval` (greedy, MV@k, pass@k). The same kind of problems is in the UltraFeedback sample's SFT split, so the
  SFT stage teaches the answer format the reward reads.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from pathlib import Path

from . import make_samples as alpaca
from .bundled import GSM8K_SAMPLE_DIR, ULTRAFEEDBACK_SAMPLE_DIR

SEED = 20261128
# Alpaca-sample tasks with one right answer: a wrong answer is another prompt's right one.
SINGLE_ANSWER_TASKS = (alpaca.arithmetic, alpaca.capital, alpaca.sorting, alpaca.reversal, alpaca.opposite,
                       alpaca.uppercase, alpaca.past_tense, alpaca.letter_count)
NAMES = ["Ava", "Ben", "Carla", "Dev", "Elena", "Farid", "Grace", "Hugo", "Ines", "Jamal"]
ITEMS = ["apples", "stickers", "marbles", "pencils", "cookies", "shells", "cards", "beads"]
SIZES = {"ultrafeedback": {"train_sft": 240, "test_sft": 24, "train_prefs": 240, "test_prefs": 24},
         "gsm8k": {"train": 160, "test": 32}}


def word_problem(rng: random.Random) -> tuple[str, str, int]:
    """(question, worked solution ending in `#### n`, n): one or two small steps, whole numbers."""
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b = rng.randint(2, 20), rng.randint(2, 9)
    kind = rng.randrange(3)
    if kind == 0:
        question, answer = f"{name} has {a} {item} and finds {b} more. How many {item} does {name} have now?", a + b
        steps = f"{name} has {a} + {b} = {answer} {item}."
    elif kind == 1:
        a = a + b
        question, answer = f"{name} had {a} {item} and gave {b} away. How many {item} are left?", a - b
        steps = f"{a} - {b} = {answer} {item} are left."
    else:
        question = f"{name} buys {b} bags with {a} {item} in each. How many {item} does {name} buy?"
        answer = a * b
        steps = f"{b} bags of {a} {item} make {b} * {a} = {answer} {item}."
    return question, f"{steps}\n#### {answer}", answer


def _pairs(rng: random.Random, count: int) -> list[tuple[str, str, str]]:
    """(prompt, right answer, wrong answer) triples: a third word problems (the wrong one off by a few), the rest
    Alpaca-sample tasks (the wrong one another prompt's answer of the same task)."""
    out, seen = [], set()
    while len(out) < count:
        if len(out) % 3 == 0:
            question, solution, answer = word_problem(rng)
            wrong_number = answer + rng.choice([-3, -2, -1, 1, 2, 3])
            wrong = solution.replace(f"= {answer}", f"= {wrong_number}").replace(f"#### {answer}", f"#### {wrong_number}")
            triple = (question, solution, wrong)
        else:
            task = rng.choice(SINGLE_ANSWER_TASKS)
            row, other = task(rng), task(rng)
            prompt = " ".join(filter(None, (row["instruction"], row["input"])))
            if other["output"] == row["output"]:
                continue
            triple = (prompt, row["output"], other["output"])
        if triple[0] not in seen:
            seen.add(triple[0])
            out.append(triple)
    return out


def _conversation(prompt: str, answer: str) -> list[dict]:
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]


def ultrafeedback_rows(rng: random.Random, count: int) -> list[dict]:
    rows = []
    for prompt, right, wrong in _pairs(rng, count):
        chosen = _conversation(prompt, right)
        rows.append({"prompt": prompt, "prompt_id": hashlib.sha256(prompt.encode()).hexdigest(), "chosen": chosen,
                     "rejected": _conversation(prompt, wrong), "messages": chosen,
                     "score_chosen": float(rng.choice([8, 9, 10])), "score_rejected": float(rng.choice([1, 2, 3]))})
    return rows


def gsm8k_rows(rng: random.Random, count: int, exclude: set[str]) -> list[dict]:
    rows = []
    while len(rows) < count:
        question, solution, _ = word_problem(rng)
        if question not in exclude:
            exclude.add(question)
            rows.append({"question": question, "answer": solution})
    return rows


def make_files() -> dict[Path, str]:
    """Every bundled file of the chain and its content."""
    rng = random.Random(SEED)
    files, questions = {}, set()
    for split, size in SIZES["ultrafeedback"].items():
        rows = ultrafeedback_rows(rng, size)
        questions.update(row["prompt"] for row in rows)
        files[ULTRAFEEDBACK_SAMPLE_DIR / f"{split}.jsonl"] = alpaca.render(rows)
    for split, size in SIZES["gsm8k"].items():  # no GRPO or test problem is an SFT or preference prompt
        files[GSM8K_SAMPLE_DIR / f"{split}.jsonl"] = alpaca.render(gsm8k_rows(rng, size, questions))
    return files


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only check that the bundled files are up to date")
    args = parser.parse_args(argv)
    stale = []
    for path, content in make_files().items():
        current = path.read_text(encoding="utf-8") if path.is_file() else None
        if current == content:
            continue
        if args.check:
            stale.append(str(path))
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content, encoding="utf-8")
        print(f"wrote {content.count(chr(10))} rows to {path}")
    if stale:
        print(f"out of date: {', '.join(stale)}; run `python -m trl_emo.data.chain_samples`.", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
