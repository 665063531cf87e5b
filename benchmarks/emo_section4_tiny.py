"""EMO's Section 4 pipeline end to end on tiny models (CPU, ~2 minutes): the shape of its tables, not its numbers.

    python benchmarks/emo_section4_tiny.py [--output_dir outputs/section4-tiny]

1. A WikiText-like corpus (articles of title, paragraphs and section headings; train/validation/test).
2. A tiny Llama (as the tests build them) continually fine-tuned on it with `nll` and with `emo`
   (`dataset_schema: plain_text`, TRL's wrapped packing, 64-token blocks), through `trl_emo.sft`.
3. `trl-emo eval --task continuation` (MAUVE with a tiny GPT-2 featurizer built from a config,
   perplexity, distinct-n, rep-n) and `--task icl` (SST-2- and MMLU-shaped local fixtures) on the
   pre-trained model and both fine-tunes; the two summary.md files are printed.

Everything is offline and random-initialised: the numbers say nothing about EMO. The real-scale
commands are in docs/evaluation.md ("EMO's language-modelling setting").
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

COLORS = ["red", "blue", "green", "amber", "violet", "black", "white", "grey"]
ANIMALS = ["cat", "owl", "fox", "yak", "eel", "bee", "crow", "hare"]
PLACES = ["river", "forest", "hill", "lake", "field", "marsh"]
VERBS = ["runs", "sleeps", "hunts", "sings", "waits", "climbs"]


def paragraph(rng: random.Random, color: str, animal: str) -> str:
    sentences = []
    for _ in range(rng.randint(6, 10)):
        sentences.append(
            f"The {color} {animal} {rng.choice(VERBS)} near the {rng.choice(PLACES)} with a "
            f"{rng.choice(COLORS)} {rng.choice(ANIMALS)} ."
        )
    return " " + " ".join(sentences) + " \n"


def corpus_rows(rng: random.Random, articles: int, split: str) -> list[dict]:
    rows = []
    for number in range(articles):
        color, animal = rng.choice(COLORS), rng.choice(ANIMALS)
        rows += [{"text": f" = The {color} {animal} ({split} {number}) = \n"}, {"text": ""},
                 {"text": paragraph(rng, color, animal)}, {"text": ""}, {"text": " = = Habitat = = \n"}, {"text": ""},
                 {"text": paragraph(rng, color, animal)}, {"text": ""}]
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output_dir", default="outputs/section4-tiny")
    parser.add_argument("--max_steps", type=int, default=40)
    args = parser.parse_args(argv)
    root = Path(args.output_dir)
    rng = random.Random(0)

    from transformers import GPT2Config, GPT2Model

    from trl_emo.commands import sft
    from trl_emo.commands.evaluate import run as evaluate
    from trl_emo.models.tiny import save_tiny_causal_lm, train_tokenizer

    corpus = root / "wikitext-tiny"
    splits = {"train": 60, "validation": 6, "test": 12}
    for split, articles in splits.items():
        write_jsonl(corpus / f"{split}.jsonl", corpus_rows(rng, articles, split))
    texts = [json.loads(line)["text"] for line in (corpus / "train.jsonl").read_text().splitlines()]
    texts = [t for t in texts if t.strip()]
    tiny = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)
    base = save_tiny_causal_lm(texts, output_dir=root / "pretrained", vocab_size=400, chat_template=False, **tiny)

    policies = {"pretrained": base}
    for loss in ("nll", "emo"):
        out = root / f"{loss}-wikitext-tiny"
        status = sft.run([
            "--model_name_or_path", base, "--dataset_name", str(corpus), "--dataset_schema", "plain_text",
            "--text_documents", "wikitext", "--dataset_test_split", "validation", "--packing", "true",
            "--packing_strategy", "wrapped", "--max_length", "64", "--loss_type", loss, "--learning_rate", "3e-3",
            "--max_steps", str(args.max_steps), "--per_device_train_batch_size", "16", "--use_cpu", "true",
            "--bf16", "false", "--save_strategy", "no", "--report_to", "none", "--logging_steps", "10",
            "--seed", "0", "--output_dir", str(out), "--disable_tqdm", "true",
        ])
        if status != 0:
            return status
        policies[loss] = str(out)

    tokenizer = train_tokenizer(texts, vocab_size=300, chat_template=False)
    config = GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=2, n_positions=256,
                        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    GPT2Model(config).save_pretrained(root / "featurizer")
    tokenizer.save_pretrained(root / "featurizer")

    common = ["--policies", *(f"{name}={path}" for name, path in policies.items()), "--progress", "false",
              "--device", "cpu"]
    status = evaluate([
        "--task", "continuation", "--prompts", str(corpus / "test.jsonl"), "--continuation_corpus", "wikitext-103",
        "--continuation_prefix_words", "10", "--max_new_tokens", "24", "--n", "5", "--continuation_block_size", "64",
        "--mauve_featurizer", str(root / "featurizer"), "--output_dir", str(root / "eval-continuation"), *common,
    ])
    if status != 0:
        return status

    icl = root / "icl-data"
    good = ["a great and moving film", "wonderful acting, I loved it", "a delight", "brilliant and funny", "a joy"]
    bad = ["a dull and boring mess", "terrible acting, I hated it", "a waste of time", "awful and tedious", "a bore"]
    write_jsonl(icl / "sst2" / "train.jsonl", [{"text": t, "label": 0} for t in good] + [{"text": t, "label": 1} for t in bad])
    write_jsonl(icl / "sst2" / "test.jsonl", [{"text": f"{a} and {b}", "label": y}
                                               for y, words in enumerate((good, bad)) for a, b in zip(words, words[1:])])
    questions = [{"question": f"What colour is the {c} {a}?", "subject": "animals",
                  "choices": [c, COLORS[(i + 1) % 8], COLORS[(i + 2) % 8], COLORS[(i + 3) % 8]], "answer": 0}
                 for i, (c, a) in enumerate(zip(COLORS, ANIMALS))]
    write_jsonl(icl / "mmlu" / "dev.jsonl", questions[:5])
    write_jsonl(icl / "mmlu" / "test.jsonl", questions[5:])
    status = evaluate([
        "--task", "icl", "--prompts", str(icl), "--icl_benchmarks", "sst2", "mmlu", "--icl_num_demonstrations", "4",
        "--output_dir", str(root / "eval-icl"), *common,
    ])
    return status


if __name__ == "__main__":
    raise SystemExit(main())
