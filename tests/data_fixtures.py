"""Small look-alike files of the Hub datasets' schemas, for tests and recipe dry runs (no Hub access needed).

    from data_fixtures import write_fixture
    path = write_fixture("ultrafeedback", tmp_path)          # folder with train_sft/test_sft/train_prefs/test_prefs
    path = write_fixture("alpaca", tmp_path, fmt="parquet")  # folder with train.parquet
    path = write_fixture_file("metamath", tmp_path / "mm.json")  # one file (the train split)

Every returned path can be passed as `dataset_name` (script_args) to `trl_emo.data.load_sft_datasets` /
`load_dpo_datasets`. Column names and types follow `../shared/docs/datasets.md` exactly.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from trl_emo.data.prompts import alpaca_prompt

# Schema -> the splits written by default (those of the Hub dataset).
DEFAULT_SPLITS = {
    "alpaca": ("train",),
    "evol_instruct": ("train",),
    "ultrafeedback": ("train_sft", "test_sft", "train_prefs", "test_prefs"),
    "metamath": ("train",),
    "magicoder": ("train",),
    "miromind_m1": ("train",),
    "openr1_math": ("train",),
    "prompt_completion": ("train", "test"),
    "messages": ("train", "test"),
    "text": ("train", "test"),
    "preference": ("train", "test"),
    "plain_text": ("train", "validation", "test"),
}
FIXTURE_SCHEMAS = tuple(DEFAULT_SPLITS)
FORMATS = ("jsonl", "json", "parquet", "csv", "disk")
# Schemas with nested columns, which CSV cannot hold.
_NESTED = {"evol_instruct", "ultrafeedback", "messages", "openr1_math"}

_COLORS = ["red", "blue", "green", "yellow", "black", "white", "orange", "purple"]
_ANIMALS = ["cat", "dog", "owl", "fox", "bear", "frog", "duck", "goat"]


def _instruction(i: int, split: str) -> tuple[str, str, str]:
    """A deterministic (instruction, input, output) triple; every other row has an input."""
    color, animal = _COLORS[i % len(_COLORS)], _ANIMALS[(i * 3) % len(_ANIMALS)]
    tag = "" if split.startswith("train") else f" ({split})"
    if i % 2 == 0:
        return f"Describe a {color} {animal}{tag}.", "", f"The {animal} is {color} and it likes to play."
    return f"Add the numbers{tag}.", f"{i} and {i + 3}", f"{i} + {i + 3} = {2 * i + 3}."


def _conversation(i: int, split: str, answer: str) -> list[dict]:
    instruction, input_, output = _instruction(i, split)
    first = instruction if not input_ else f"{instruction}\n\n{input_}"
    turns = [{"role": "user", "content": first}, {"role": "assistant", "content": answer or output}]
    if i % 4 == 3:  # a few multi-turn rows
        turns += [
            {"role": "user", "content": "Say it again, shorter."},
            {"role": "assistant", "content": f"Short: {answer or output}"},
        ]
    return turns


def wikitext_line(i: int, split: str = "train") -> str:
    """Row `i` of a WikiText-like corpus: an article is a title line, a blank row, a paragraph, a blank row, a
    section heading, a blank row and a paragraph (lines end with "\n", as in `Salesforce/wikitext` raw)."""
    article, line = divmod(i, 7)
    color, animal = _COLORS[article % len(_COLORS)], _ANIMALS[(article * 3) % len(_ANIMALS)]
    words = " ".join(f"{_COLORS[(article + j) % 8]} {_ANIMALS[(article + 2 * j) % 8]} runs ." for j in range(30))
    return [
        f" = The {color} {animal} ({split} {article}) = \n", "", f" The {color} {animal} is an animal . {words}\n", "",
        " = = Habitat = = \n", "", f" It lives near the {color} river with {words}\n",
    ][line]


def fixture_rows(schema: str, n_rows: int = 8, split: str = "train") -> list[dict]:
    """`n_rows` deterministic rows of `schema` (the split name is woven into the text, so splits differ)."""
    rows = []
    for i in range(n_rows):
        instruction, input_, output = _instruction(i, split)
        if schema == "alpaca":
            text = alpaca_prompt(instruction, input_) + output  # the Hub's `text` column; adapters ignore it
            rows.append({"instruction": instruction, "input": input_, "output": output, "text": text})
        elif schema == "evol_instruct":
            rows.append({"data": {"instruction": instruction, "input": input_, "output": output}})
        elif schema == "ultrafeedback":
            chosen = _conversation(i, split, "")
            # Multi-turn pairs share every turn but the last answer, as in real preference data.
            wrong = f"I do not know, maybe {_COLORS[(i + 1) % len(_COLORS)]}."
            rejected = chosen[:-1] + [{"role": "assistant", "content": wrong}]
            prompt = chosen[0]["content"]
            rows.append(
                {
                    "prompt": prompt,
                    "prompt_id": hashlib.sha256(prompt.encode()).hexdigest(),
                    "chosen": chosen,
                    "rejected": rejected,
                    "messages": chosen,
                    "score_chosen": 8.0 + (i % 3) / 2,
                    "score_rejected": 3.0 + (i % 4) / 2,
                }
            )
        elif schema == "metamath":
            a, b = i + 2, 2 * i + 1
            tag = f" ({split})" if split != "train" else ""
            question = f"Tom has {a} apples and buys {b} more{tag}. How many apples does he have?"
            rows.append(
                {
                    "query": question,
                    "response": f"Tom has {a} + {b} = {a + b} apples.\nThe answer is: {a + b}",
                    "type": ["GSM_Rephrased", "MATH_AnsAug", "GSM_SV", "MATH_FOBAR"][i % 4],
                    "original_question": question,
                }
            )
        elif schema == "magicoder":
            name = f"add_{i}"
            rows.append(
                {
                    "problem": f"Write a Python function `{name}(x)` that returns x plus {i}.",
                    "solution": f"```python\ndef {name}(x):\n    return x + {i}\n```",
                    "lang": ["python", "rust", "cpp"][i % 3],
                    "seed": f"def helper_{i}(): pass",
                    "index": i,
                    "raw_index": 1000 + i,
                    "openai_fingerprint": "fp_0123456789",
                }
            )
        elif schema == "miromind_m1":
            a, b = i + 3, 2 * i + 5
            tag = f" ({split})" if split != "train" else ""
            rows.append(
                {
                    "id": f"mm-{split}-{i}",
                    "question": f"A box holds {a} red and {b} blue balls{tag}. How many balls are in the box?",
                    "response": f"<think>\nRed {a}, blue {b}: {a} + {b} = {a + b}.\n</think>\n"
                    f"There are {a} + {b} = {a + b} balls.\n\n\\boxed{{{a + b}}}",
                }
            )
        elif schema == "openr1_math":
            a, b = i + 4, 3 * i + 2
            problem = f"Find x if x - {a} = {b}." + ("" if split == "train" else f" ({split})")
            solution = f"Add {a} to both sides: x = {b} + {a} = {a + b}."
            generation = f"<think>\nx - {a} = {b}, so x = {a + b}.\n</think>\n{solution} The answer is $\\boxed{{{a + b}}}$."
            rows.append(
                {
                    "problem": problem, "solution": solution, "answer": str(a + b), "problem_type": "Algebra",
                    "question_type": "math-word-problem", "source": "olympiads", "uuid": f"u-{split}-{i}",
                    "is_reasoning_complete": [True, True], "generations": [generation, generation],
                    "correctness_math_verify": [True, True], "correctness_llama": None,
                    "finish_reasons": None, "correctness_count": 2,
                    "messages": [{"role": "user", "content": problem}, {"role": "assistant", "content": generation}],
                }
            )
        elif schema == "prompt_completion":
            rows.append({"prompt": f"Q: {instruction} {input_}".rstrip() + "\nA:", "completion": f" {output}"})
        elif schema == "messages":
            rows.append({"messages": _conversation(i, split, "")})
        elif schema == "text":
            rows.append({"text": f"{instruction} {output}"})
        elif schema == "plain_text":
            rows.append({"text": wikitext_line(i, split)})
        elif schema == "preference":
            rows.append({"prompt": f"Q: {instruction}\nA:", "chosen": f" {output}", "rejected": " I do not know."})
        else:
            raise ValueError(f"No fixture for schema {schema!r}; known: {', '.join(FIXTURE_SCHEMAS)}")
    return rows


def write_jsonl(path, rows) -> str:
    """`rows` as JSON Lines at `path`; the path as a string, as the commands take it."""
    Path(path).write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return str(path)


def _write_rows(rows: list[dict], path: Path, fmt: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "jsonl":
        write_jsonl(path, rows)
    elif fmt == "json":  # a JSON list, like the EMO paper's copy of Alpaca-GPT4
        path.write_text(json.dumps(rows, indent=1), encoding="utf-8")
    elif fmt in ("parquet", "csv"):
        from datasets import Dataset

        dataset = Dataset.from_list(rows)
        dataset.to_parquet(str(path)) if fmt == "parquet" else dataset.to_csv(str(path), index=False)
    else:
        raise ValueError(f"Unsupported fixture format {fmt!r}; use one of {', '.join(FORMATS)}")


def write_fixture(
    schema: str, folder: str | Path, n_rows: int = 8, fmt: str = "jsonl", splits: tuple[str, ...] | None = None
) -> str:
    """Write a fixture dataset of `schema` into a new folder `folder/<schema>_<fmt>/` and return that folder's path.

    One file per split (`<split>.<fmt>`, the layout `trl_emo.data.loading` reads), or with `fmt="disk"` a
    `DatasetDict.save_to_disk` folder. `splits` defaults to the Hub dataset's splits (`DEFAULT_SPLITS`).
    """
    if fmt == "csv" and schema in _NESTED:
        raise ValueError(f"CSV cannot hold the nested columns of schema {schema!r}; use jsonl, json, parquet or disk.")
    splits = DEFAULT_SPLITS[schema] if splits is None else tuple(splits)
    root = Path(folder) / f"{schema}_{fmt}"
    if fmt == "disk":
        from datasets import Dataset, DatasetDict

        splits_data = {split: Dataset.from_list(fixture_rows(schema, n_rows, split)) for split in splits}
        DatasetDict(splits_data).save_to_disk(str(root))
        return str(root)
    for split in splits:
        _write_rows(fixture_rows(schema, n_rows, split), root / f"{split}.{fmt}", fmt)
    return str(root)


def write_fixture_file(schema: str, path: str | Path, n_rows: int = 8, split: str = "train") -> str:
    """Write one fixture file (format from the extension: .jsonl, .json, .parquet, .csv) and return its path."""
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower()
    if fmt == "csv" and schema in _NESTED:
        raise ValueError(f"CSV cannot hold the nested columns of schema {schema!r}.")
    _write_rows(fixture_rows(schema, n_rows, split), path, fmt)
    return str(path)


# -- GRPO prompt sets (issue 29): a prompt and its reference answer, never SFT data, so they stay out of
# FIXTURE_SCHEMAS (whose tests detect SFT and DPO schemas); `write_fixture("gsm8k", ...)` writes them all the same.
GRPO_FIXTURE_SCHEMAS = ("gsm8k", "math", "prompt_answer")
DEFAULT_SPLITS.update({"gsm8k": ("train", "test"), "math": ("train", "test"), "prompt_answer": ("train",)})
_SFT_DPO_FIXTURE_ROWS = fixture_rows


def grpo_fixture_rows(schema: str, n_rows: int = 8, split: str = "train") -> list[dict]:
    """`n_rows` rows of a GRPO prompt set with the Hub dataset's columns: GSM8K's worked `answer` ending in `#### n`
    (numbers past 1,000 written with commas, as GSM8K does), MATH's `solution` with a `\\boxed{}` answer (fractions,
    nested braces), or `prompt_answer`'s conversational prompt and bare answer."""
    rows = []
    for i in range(n_rows):
        tag = f" ({split})" if split != "train" else ""
        a, b = 3 * i + 2, 250 * i + 7
        if schema == "gsm8k":
            total = a + b
            rows.append({
                "question": f"Tom has {a} apples and buys {b} more{tag}. How many apples does he have?",
                "answer": f"Tom has {a} + {b} = <<{a}+{b}={total}>>{total} apples.\n#### {total:,}",
            })
        elif schema == "math":
            level, kind = f"Level {i % 5 + 1}", ["Algebra", "Prealgebra", "Number Theory"][i % 3]
            if i % 2 == 0:
                problem, answer = f"What is $\\frac{{{a}}}{{{2 * a}}} + {i}${tag}?", f"\\frac{{{2 * i + 1}}}{{2}}"
            else:
                problem, answer = f"Solve $x^2 = {a * a}$ for $x${tag}.", f"\\{{-{a}, {a}\\}}"
            rows.append({"problem": problem, "level": level, "solution": f"Working it out, $\\boxed{{{answer}}}$.",
                         "type": kind})
        elif schema == "prompt_answer":
            rows.append({"prompt": [{"role": "user", "content": f"What is {a} times 2{tag}?"}], "answer": str(2 * a)})
        else:
            return _SFT_DPO_FIXTURE_ROWS(schema, n_rows, split)
    return rows


fixture_rows = grpo_fixture_rows  # noqa: F811 - `write_fixture` and the tests find every schema's rows by this name
