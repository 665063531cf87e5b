"""Generate the bundled sample `samples/alpaca_gpt4_sample.jsonl` deterministically.

    python -m trl_emo.data.make_samples            # rewrites the bundled file
    python -m trl_emo.data.make_samples --check    # fails if the bundled file differs from what would be written

The rows are synthetic, in the exact Alpaca-GPT4 schema (`instruction`, `input` (often ""), `output`, `text` = the
Alpaca prompt + output, as on the Hub). The tasks are templated so that a tiny model learns them in minutes on a CPU:
some have one right answer (arithmetic, sorting, reversal, capitals of an invented set of countries, tense rewriting,
sentiment), others several valid answers (one-sentence stories, examples of a category, rhymes), where the diversity of
the sampled outputs is what EMO/GEM change.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable

from .bundled import ALPACA_SAMPLE_FILE
from .prompts import alpaca_prompt

SEED = 20240601

CAPITALS = {
    "Veloria": "Amberlin",
    "Nordavia": "Frosthaven",
    "Kestria": "Solmere",
    "Drelland": "Ironford",
    "Ostavia": "Pellgrave",
    "Marnesse": "Lumeport",
    "Tirovia": "Caskel",
    "Zennith": "Orrin",
    "Quellmar": "Brightwater",
    "Saldora": "Vintor",
    "Erovia": "Halden",
    "Brisca": "Mirelle",
}
WORDS = [
    "garden", "river", "candle", "pencil", "window", "silver", "basket", "forest", "rocket", "planet",
    "button", "dragon", "mirror", "orange", "pepper", "ladder", "summer", "winter", "castle", "island",
    "cloud", "stone", "bread", "music", "tiger", "lemon", "paper", "chair", "water", "light",
]
OPPOSITES = {
    "hot": "cold", "big": "small", "fast": "slow", "happy": "sad", "early": "late", "light": "dark",
    "open": "closed", "full": "empty", "strong": "weak", "high": "low", "young": "old", "loud": "quiet",
    "wet": "dry", "rich": "poor", "up": "down", "inside": "outside", "hard": "soft", "near": "far",
    "clean": "dirty", "first": "last",
}
SUBJECTS = ["cat", "farmer", "teacher", "child", "robot", "sailor", "baker", "painter"]
VERBS = [  # (present, past)
    ("opens", "opened"), ("paints", "painted"), ("cleans", "cleaned"), ("carries", "carried"),
    ("watches", "watched"), ("fixes", "fixed"), ("finds", "found"), ("builds", "built"),
    ("reads", "read"), ("draws", "drew"),
]
OBJECTS = ["the door", "a boat", "the garden", "a letter", "the old map", "the window", "a small box", "the fence"]
THINGS = ["soup", "movie", "hotel room", "concert", "book", "coffee", "game", "bus ride"]
POSITIVE = ["wonderful", "delicious", "excellent", "lovely", "fantastic", "great"]
NEGATIVE = ["awful", "terrible", "boring", "disappointing", "cold and bland", "far too noisy"]
PHRASES = [
    "good morning", "see you soon", "the sky is blue", "happy birthday", "keep it simple", "time to eat",
    "open the door", "the end", "well done", "read the map", "close the window", "let us go",
]
ANIMALS = ["fox", "rabbit", "turtle", "owl", "mouse", "bear"]
PLACES = ["forest", "city", "desert", "mountains", "village"]
STORY_ACTIONS = [
    "found a shiny stone", "learned to sing", "built a tiny house", "lost its way home", "met a talking tree",
    "planted a magic seed", "followed a falling star", "baked a berry pie",
]
STORY_ENDINGS = [
    "and everyone celebrated", "and it smiled all day", "and it never forgot that day", "and a new friend appeared",
    "and the night turned bright", "and then it went to sleep",
]
CATEGORIES = {
    "fruit": ["an apple", "a banana", "a cherry", "a mango", "a pear", "a plum"],
    "color": ["red", "blue", "green", "yellow", "purple", "orange"],
    "vegetable": ["a carrot", "a potato", "an onion", "a pea", "a leek", "a bean"],
    "musical instrument": ["a piano", "a violin", "a drum", "a flute", "a guitar", "a harp"],
    "tool": ["a hammer", "a saw", "a wrench", "a drill", "a shovel", "a rake"],
}
RHYMES = {
    "cat": ["hat", "bat", "mat", "rat", "sat"],
    "light": ["night", "bright", "kite", "white", "sight"],
    "cake": ["lake", "bake", "make", "take", "wake"],
    "rain": ["train", "plain", "main", "gain", "chain"],
    "moon": ["soon", "spoon", "tune", "noon", "june"],
    "bell": ["shell", "well", "tell", "sell", "spell"],
}


def _row(instruction: str, output: str, input: str = "") -> dict:  # noqa: A002
    return {
        "instruction": instruction,
        "input": input,
        "output": output,
        "text": alpaca_prompt(instruction, input) + output,
    }


def arithmetic(rng: random.Random) -> dict:
    a, b = rng.randint(2, 60), rng.randint(2, 40)
    kind = rng.choice(["plus", "minus", "times"])
    if kind == "plus":
        question = rng.choice(["What is {a} plus {b}?", "Compute {a} + {b}.", "Add {a} and {b}."])
        return _row(question.format(a=a, b=b), f"{a} + {b} = {a + b}.")
    if kind == "minus":
        a, b = max(a, b), min(a, b)
        question = rng.choice(["What is {a} minus {b}?", "Compute {a} - {b}.", "Subtract {b} from {a}."])
        return _row(question.format(a=a, b=b), f"{a} - {b} = {a - b}.")
    a, b = rng.randint(2, 12), rng.randint(2, 12)
    question = rng.choice(["What is {a} times {b}?", "Compute {a} x {b}.", "Multiply {a} by {b}."])
    return _row(question.format(a=a, b=b), f"{a} x {b} = {a * b}.")


def arithmetic_with_input(rng: random.Random) -> dict:
    a, b = rng.randint(2, 90), rng.randint(2, 90)
    return _row("Add the two numbers.", f"{a} + {b} = {a + b}.", f"{a} and {b}")


def capital(rng: random.Random) -> dict:
    country = rng.choice(list(CAPITALS))
    question = rng.choice(
        ["What is the capital of {c}?", "Name the capital city of {c}.", "Which city is the capital of {c}?"]
    )
    return _row(question.format(c=country), f"The capital of {country} is {CAPITALS[country]}.")


def sorting(rng: random.Random) -> dict:
    if rng.random() < 0.6:
        numbers = rng.sample(range(1, 100), rng.randint(3, 6))
        descending = rng.random() < 0.3
        order = "descending" if descending else "ascending"
        return _row(
            f"Sort the following numbers in {order} order.",
            ", ".join(str(n) for n in sorted(numbers, reverse=descending)),
            ", ".join(str(n) for n in numbers),
        )
    words = rng.sample(WORDS, rng.randint(3, 5))
    return _row("Sort these words alphabetically.", ", ".join(sorted(words)), ", ".join(words))


def reversal(rng: random.Random) -> dict:
    word = rng.choice(WORDS)
    question = rng.choice(['Reverse the letters of the word "{w}".', 'Spell "{w}" backwards.'])
    return _row(question.format(w=word), word[::-1])


def letter_count(rng: random.Random) -> dict:
    word = rng.choice(WORDS)
    return _row(f'How many letters are in the word "{word}"?', f'The word "{word}" has {len(word)} letters.')


def past_tense(rng: random.Random) -> dict:
    subject, (present, past), obj = rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(OBJECTS)
    return _row(
        "Rewrite the sentence in the past tense.", f"The {subject} {past} {obj}.", f"The {subject} {present} {obj}."
    )


def sentiment(rng: random.Random) -> dict:
    positive = rng.random() < 0.5
    adjective = rng.choice(POSITIVE if positive else NEGATIVE)
    review = f"The {rng.choice(THINGS)} was {adjective}."
    return _row(
        "Classify the sentiment of the following review as positive or negative.",
        "Positive" if positive else "Negative",
        review,
    )


def uppercase(rng: random.Random) -> dict:
    phrase = rng.choice(PHRASES)
    return _row("Convert the text to uppercase.", phrase.upper(), phrase)


def opposite(rng: random.Random) -> dict:
    word = rng.choice(list(OPPOSITES))
    return _row(f'What is the opposite of "{word}"?', f'The opposite of "{word}" is "{OPPOSITES[word]}".')


def story(rng: random.Random) -> dict:
    animal, place = rng.choice(ANIMALS), rng.choice(PLACES)
    output = f"Once upon a time, a {animal} in the {place} {rng.choice(STORY_ACTIONS)}, {rng.choice(STORY_ENDINGS)}."
    return _row(f"Write a one-sentence story about a {animal} in the {place}.", output)


def category_example(rng: random.Random) -> dict:
    category = rng.choice(list(CATEGORIES))
    example = rng.choice(CATEGORIES[category])
    return _row(f"Give an example of a {category}.", f"An example of a {category} is {example}.")


def rhyme(rng: random.Random) -> dict:
    word = rng.choice(list(RHYMES))
    return _row(f'Name a word that rhymes with "{word}".', f'"{rng.choice(RHYMES[word])}" rhymes with "{word}".')


# (task, number of rows). About 29% of the rows have a non-empty input.
TASKS: list[tuple[Callable[[random.Random], dict], int]] = [
    (arithmetic, 80),
    (arithmetic_with_input, 20),
    (capital, 50),
    (sorting, 40),
    (reversal, 40),
    (letter_count, 30),
    (past_tense, 40),
    (sentiment, 40),
    (uppercase, 20),
    (opposite, 40),
    (story, 70),
    (category_example, 50),
    (rhyme, 40),
]


def make_rows(seed: int = SEED) -> list[dict]:
    """The sample rows, in a fixed order. Tasks with one right answer get distinct (instruction, input) pairs where
    the template allows; open-ended tasks repeat instructions with different outputs on purpose."""
    rng = random.Random(seed)
    rows, seen = [], set()
    for task, count in TASKS:
        made, attempts = 0, 0
        while made < count:
            row = task(rng)
            attempts += 1
            key = (row["instruction"], row["input"], row["output"])
            # Exact duplicates add nothing; give up on uniqueness for small template spaces.
            if key in seen and attempts < count * 20:
                continue
            seen.add(key)
            rows.append(row)
            made += 1
    rng.shuffle(rows)
    return rows


def render(rows: list[dict]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", default=str(ALPACA_SAMPLE_FILE), help="file to write (default: the bundled one)")
    parser.add_argument("--check", action="store_true", help="only check that the file is up to date")
    args = parser.parse_args(argv)
    content = render(make_rows())
    if args.check:
        try:
            with open(args.output, encoding="utf-8") as handle:
                current = handle.read()
        except FileNotFoundError:
            current = None
        if current != content:
            print(f"{args.output} is out of date; run `python -m trl_emo.data.make_samples`.", file=sys.stderr)
            return 1
        print(f"{args.output} is up to date.")
        return 0
    import os

    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w", encoding="utf-8") as handle:
        handle.write(content)
    print(f"Wrote {content.count(chr(10))} rows to {args.output} ({len(content.encode())} bytes).")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
