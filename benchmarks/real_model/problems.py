"""Arithmetic word problems with short worked solutions in GSM8K's format, and creative-writing titles.

Each problem is drawn from one of a few templates (two or three arithmetic steps, whole-number answers) with random
names, objects and numbers. Its solution is one of two or three phrasings of the same steps, picked at random, and
ends with GSM8K's `#### answer` line, so the project's GSM8K scoring (`trl_emo.evaluation.metrics.extract_answer`)
reads it. Several phrasings per template give the data some of the spread of real answers: one problem has more
than one good solution, which is the situation in which GEM's paper expects cross-entropy to narrow the model.

Rows carry both schemas the study needs: `query`/`response` (MetaMathQA's, for `trl_emo.sft`) and
`question`/`answer` (GSM8K's, for the evaluation's gold answers).
"""

from __future__ import annotations

import random

NAMES = ["Ava", "Ben", "Carla", "Dev", "Elena", "Farid", "Grace", "Hugo", "Ines", "Jamal", "Kira", "Liam", "Mei",
         "Noah", "Olga", "Pedro", "Quinn", "Rosa", "Sami", "Tara"]
ITEMS = ["apples", "stickers", "marbles", "pencils", "cookies", "stamps", "shells", "cards", "beads", "books"]
CONTAINERS = ["bags", "boxes", "packs", "jars", "baskets"]


def _pick(rng: random.Random, values):
    return values[rng.randrange(len(values))]


def _buy_packs(rng):
    name, item, box = _pick(rng, NAMES), _pick(rng, ITEMS), _pick(rng, CONTAINERS)
    a, b, c = rng.randint(5, 60), rng.randint(2, 9), rng.randint(3, 12)
    bc, ans = b * c, a + b * c
    question = f"{name} has {a} {item}. {name} buys {b} {box} with {c} {item} in each. How many {item} does {name} have now?"
    steps = [
        f"The {b} {box} hold {b} * {c} = {bc} {item}.\n{name} now has {a} + {bc} = {ans} {item}.",
        f"{name} buys {b} * {c} = {bc} {item}.\nSo {name} has {a} + {bc} = {ans} {item} in total.",
        f"Each of the {b} {box} has {c} {item}, so that is {bc} {item}.\nAdding the {a} {item} {name} had gives {ans}.",
    ]
    return question, steps, ans


def _give_away(rng):
    name, item = _pick(rng, NAMES), _pick(rng, ITEMS)
    b, c = rng.randint(2, 8), rng.randint(2, 9)
    a = b * c + rng.randint(1, 40)
    bc, ans = b * c, a - b * c
    question = f"{name} had {a} {item} and gave {b} {item} to each of {c} friends. How many {item} are left?"
    steps = [
        f"{name} gave away {b} * {c} = {bc} {item}.\n{a} - {bc} = {ans} {item} are left.",
        f"The friends got {c} * {b} = {bc} {item} in all.\nSo {name} keeps {a} - {bc} = {ans} {item}.",
    ]
    return question, steps, ans


def _change(rng):
    name = _pick(rng, NAMES)
    thing = _pick(rng, ["notebooks", "pens", "sandwiches", "tickets", "plants"])
    p, n = rng.randint(2, 15), rng.randint(2, 8)
    m = (p * n // 10 + 1 + rng.randint(0, 3)) * 10
    cost, ans = p * n, m - p * n
    question = f"{thing.capitalize()} cost ${p} each. {name} buys {n} {thing} and pays with ${m}. How much change does {name} get?"
    steps = [
        f"The {thing} cost {n} * {p} = ${cost}.\nThe change is {m} - {cost} = ${ans}.",
        f"{name} spends {p} * {n} = {cost} dollars.\n{name} gets back {m} - {cost} = {ans} dollars.",
    ]
    return question, steps, ans


def _free_seats(rng):
    a, b = rng.randint(3, 15), rng.randint(4, 12)
    c = rng.randint(1, a * b - 1)
    total, ans = a * b, a * b - c
    place = _pick(rng, ["hall", "theater", "classroom", "bus depot", "garden"])
    question = f"A {place} has {a} rows of {b} chairs. {c} chairs are taken. How many chairs are free?"
    steps = [
        f"There are {a} * {b} = {total} chairs.\n{total} - {c} = {ans} chairs are free.",
        f"The {place} has {total} chairs, because {a} * {b} = {total}.\nSo {total} - {c} = {ans} are free.",
    ]
    return question, steps, ans


def _savings(rng):
    name = _pick(rng, NAMES)
    a, b = rng.randint(3, 25), rng.randint(2, 12)
    c = rng.randint(1, a * b - 1)
    saved, ans = a * b, a * b - c
    question = f"{name} saves ${a} every week for {b} weeks, then spends ${c} on a gift. How much money is left?"
    steps = [
        f"{name} saves {a} * {b} = ${saved}.\nAfter the gift, {saved} - {c} = ${ans} is left.",
        f"In {b} weeks {name} puts away {b} * {a} = {saved} dollars.\nThen {saved} - {c} = {ans} dollars remain.",
    ]
    return question, steps, ans


def _trip(rng):
    vehicle = _pick(rng, ["train", "bus", "car", "ferry", "truck"])
    a, b, c = rng.randint(20, 90), rng.randint(2, 6), rng.randint(5, 60)
    first, ans = a * b, a * b + c
    question = f"A {vehicle} travels {a} km per hour for {b} hours, then {c} km more. How many km does it travel in all?"
    steps = [
        f"In {b} hours it travels {a} * {b} = {first} km.\nIn all it travels {first} + {c} = {ans} km.",
        f"First part: {b} * {a} = {first} km.\nTotal: {first} + {c} = {ans} km.",
    ]
    return question, steps, ans


def _share(rng):
    name, item, box = _pick(rng, NAMES), _pick(rng, ITEMS), _pick(rng, CONTAINERS)
    b, per, c = rng.randint(2, 9), rng.randint(2, 12), rng.randint(1, 9)
    a, ans = b * per, per + c
    question = f"{name} shares {a} {item} equally among {b} {box}, then adds {c} more {item} to each. How many {item} are in each of the {box}?"
    steps = [
        f"Each of the {box} first gets {a} / {b} = {per} {item}.\nWith {c} more, each has {per} + {c} = {ans} {item}.",
        f"{a} / {b} = {per} {item} per {box[:-1] if box.endswith('s') else box}.\nThen {per} + {c} = {ans} {item}.",
    ]
    return question, steps, ans


def _age(rng):
    name, other = rng.sample(NAMES, 2)
    a, b, c = rng.randint(4, 20), rng.randint(2, 4), rng.randint(1, 15)
    older, ans = a * b, a * b + c
    question = f"{name} is {a} years old. {other} is {b} times as old as {name}. How old will {other} be in {c} years?"
    steps = [
        f"{other} is {a} * {b} = {older} years old.\nIn {c} years {other} will be {older} + {c} = {ans}.",
        f"Now {other} is {b} * {a} = {older}.\nAfter {c} years: {older} + {c} = {ans} years old.",
    ]
    return question, steps, ans


TEMPLATES = (_buy_packs, _give_away, _change, _free_seats, _savings, _trip, _share, _age)


def make_problem(rng: random.Random) -> dict:
    """One problem: `query`/`response` (MetaMathQA schema) and `question`/`answer` (GSM8K schema)."""
    question, steps, answer = _pick(rng, TEMPLATES)(rng)
    solution = f"{_pick(rng, steps)}\n#### {answer}"
    return {"query": question, "response": solution, "question": question, "answer": solution}


def make_splits(sizes: dict[str, int], seed: int = 0) -> dict[str, list[dict]]:
    """Disjoint splits (no question in two splits), each from its own generator so a split's content does not depend
    on the other splits' sizes."""
    seen: set[str] = set()
    splits = {}
    for offset, (name, size) in enumerate(sizes.items()):
        rng = random.Random(f"{seed}:{name}:{offset}")
        rows = []
        while len(rows) < size:
            row = make_problem(rng)
            if row["question"] not in seen:
                seen.add(row["question"])
                rows.append(row)
        splits[name] = rows
    return splits


# Creative-writing titles (GEM Table 2 uses poem titles from `merve/poetry` and story titles from ROCStories; these
# are our own, so that the study runs offline).
POEM_TITLES = [
    "The Lighthouse Keeper", "Autumn Rain", "A Letter to the Sea", "Morning in the City", "The Old Oak",
    "Winter Stars", "The Forgotten Garden", "Crossing the River", "Salt and Thunder", "The Quiet Hour",
    "Paper Boats", "Lanterns", "The Baker's Dawn", "Northern Wind", "Small Victories", "The Last Train Home",
]
STORY_TITLES = [
    "The Lost Key", "A Day at the Fair", "The Broken Bicycle", "Grandma's Recipe", "The New Neighbor",
    "Snow Day", "The Missing Cat", "First Day of School", "The Surprise Party", "A Walk in the Woods",
    "The Borrowed Umbrella", "The Science Fair", "Late for the Bus", "The Birthday Cake", "Camping Trip",
    "The Old Photograph",
]
