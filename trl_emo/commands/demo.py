"""`trl-emo demo`: GEM against cross-entropy, offline, in a few minutes on a laptop CPU.

By default it builds (once, cached) a small Llama-style model and a byte-level BPE tokenizer from the
bundled Alpaca-GPT4-schema sample and trains it from scratch; `--model PATH_OR_ID` fine-tunes a
pretrained model instead (a Hub id, a local folder or a `.gguf` file; LoRA, the packaged
`demo_pretrained` recipe). Each loss trains a copy through `trl_emo.sft` (the same path a real recipe
takes); then, on held-out rows: cross-entropy, the entropy of the next-token distribution, and the
diversity of sampled answers (with `--model`, the untrained model too).
`--quick` is a smoke test of an installation (a few steps, a few samples; the numbers mean nothing).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from ..models.tiny import DEMO_MODEL_SIZE as MODEL_SIZE  # the demo's tiny Llama (the chain's too)

HELD_OUT_EVERY = 10  # every 10th sample row is held out
DEFAULT_RECIPE = "demo"  # the packaged recipe (trl_emo/commands/recipes.py)
PRETRAINED_RECIPE = "demo_pretrained"  # with --model: LoRA on a pretrained model
DEFAULTS = dict(max_steps=None, num_prompts=16, samples_per_prompt=4, max_new_tokens=48)  # max_steps: the recipe's
# `--quick`: enough to see every stage run (train, evaluate, sample) in well under a minute.
QUICK = dict(max_steps=3, num_prompts=2, samples_per_prompt=2, max_new_tokens=8)


def make_parser(subparsers=None, prog: str | None = None):
    """The command's parser; with `subparsers`, registered there as `demo`."""
    kwargs = dict(description=__doc__.split("\n\n")[0])
    if subparsers is not None:
        parser = subparsers.add_parser("demo", help="GEM vs cross-entropy on a tiny model, offline", **kwargs)
    else:
        parser = argparse.ArgumentParser(prog=prog or "trl-emo demo", **kwargs)
    parser.add_argument("--output_dir", default=None, help="Where the data, models and summary go (default "
                        "trl_emo_demo; with --chain, trl_emo_chain).")
    parser.add_argument("--chain", action="store_true", help="The whole chain on the bundled samples: SFT with each "
                        "loss, DPO, a reward model built on the fly, best-of-n under it, GRPO on verifiable problems, "
                        "evaluation; each stage through its command, printed (a few minutes on the tiny model).")
    parser.add_argument("--model", default=None, metavar="PATH_OR_ID",
                        help="Fine-tune this pretrained model instead of a tiny one trained from scratch: a Hub id, a "
                        "local model folder or a .gguf file (e.g. `\"$(python -m trl_emo.real_model)\"`: "
                        "SmolLM2-135M-Instruct, offline). Uses the `demo_pretrained` recipe (LoRA) unless --recipe is given.")
    parser.add_argument("--losses", default="nll,gem", help="Comma-separated loss types to compare (first is the baseline).")
    parser.add_argument("--recipe", default=None, help="Training recipe shared by every run: a packaged recipe's "
                        f"name or a YAML file (default: the packaged `{DEFAULT_RECIPE}`, with --model `{PRETRAINED_RECIPE}`).")
    # `None`: the default below, or `--quick`'s; a value given explicitly always wins.
    parser.add_argument("--max_steps", type=int, default=None, help="Override the recipe's number of steps.")
    parser.add_argument("--num_prompts", type=int, default=None, help=f"Held-out prompts to sample answers for (default {DEFAULTS['num_prompts']}).")
    parser.add_argument("--samples_per_prompt", type=int, default=None,
                        help=f"Sampled answers per prompt, for diversity (default {DEFAULTS['samples_per_prompt']}).")
    parser.add_argument("--max_new_tokens", type=int, default=None, help=f"default {DEFAULTS['max_new_tokens']}")
    parser.add_argument("--quick", action="store_true", help="Smoke test of the installation: "
                        + ", ".join(f"--{k} {v}" for k, v in QUICK.items()) + " (the numbers mean nothing).")
    parser.add_argument("--overwrite", action="store_true", help="Retrain even when a finished run is cached.")
    return parser


def resolve_settings(args) -> argparse.Namespace:
    """The demo's final settings: `--quick`'s values (or the defaults) for what was not given, the loss list split,
    the recipe found (a packaged name or a file; `RecipeNotFound` otherwise)."""
    from .recipes import resolve_recipe

    defaults = QUICK if args.quick else DEFAULTS
    values = {name: getattr(args, name) if getattr(args, name) is not None else defaults[name] for name in DEFAULTS}
    values["losses"] = [name.strip() for name in args.losses.split(",") if name.strip()]
    recipe = args.recipe or (PRETRAINED_RECIPE if args.model else DEFAULT_RECIPE)
    values["recipe"] = resolve_recipe(recipe)
    return argparse.Namespace(**{**vars(args), **values})


def write_data(folder: Path):
    """Split the bundled sample into train/test JSONL files (one folder, one file per split)."""
    from ..data import alpaca_sample_path

    rows = [json.loads(line) for line in open(alpaca_sample_path(), encoding="utf-8")]
    train = [r for i, r in enumerate(rows) if i % HELD_OUT_EVERY]
    test = [r for i, r in enumerate(rows) if not i % HELD_OUT_EVERY]
    folder.mkdir(parents=True, exist_ok=True)
    for name, split in (("train", train), ("test", test)):
        with open(folder / f"{name}.jsonl", "w", encoding="utf-8") as handle:
            for row in split:
                handle.write(json.dumps(row) + "\n")
    return train, test


def train_one(loss_type, model_path, data_dir, run_dir: Path, recipe, max_steps, overwrite) -> float:
    """Fine-tune with `loss_type` through the `trl_emo.sft` command, as a user would run it; reuse a finished run
    with the same settings."""
    from . import sft

    argv = ["--recipe", recipe, "--model_name_or_path", model_path, "--dataset_name", str(data_dir),
            "--loss_type", loss_type, "--output_dir", str(run_dir)]
    if max_steps is not None:
        argv += ["--max_steps", str(max_steps)]
    stamp = run_dir / "demo_run.json"
    settings = {"argv": argv, "recipe": Path(recipe).read_text()}
    if not overwrite and stamp.exists() and json.loads(stamp.read_text()).get("settings") == settings:
        print(f"[demo] {loss_type}: reusing the finished run in {run_dir}")
        return json.loads(stamp.read_text())["seconds"]
    print(f"[demo] {loss_type}: training ...", flush=True)
    start = time.time()
    status = sft.run(argv)
    if status:
        raise SystemExit(status)
    seconds = time.time() - start
    stamp.write_text(json.dumps({"settings": settings, "seconds": seconds}))
    return seconds


def recipe_settings(recipe: str) -> dict:
    """What evaluation must share with training: the recipe's `prompt_format` ("auto" when it sets none) and
    `max_length` (TRL's default 1,024 when it sets none), and whether it trains a LoRA adapter."""
    from .command_line import load_yaml_mapping

    values = load_yaml_mapping(recipe)
    return {"prompt_format": values.get("prompt_format", "auto"), "max_length": values.get("max_length", 1024),
            "use_peft": bool(values.get("use_peft", False))}


def evaluate_one(run_dir, test_rows, num_prompts, samples_per_prompt, max_new_tokens, prompt_format="alpaca",
                 max_length=256, seed=0) -> dict:
    """Held-out cross-entropy and entropy on the trained (answer) tokens, and diversity of sampled answers.

    `run_dir`: a trained run (a full model or a LoRA adapter, merged) or any model folder or Hub id."""
    import torch

    from ..data import alpaca_prompt, resolve_prompt_format
    from ..data.prompts import user_content
    from ..core.optional import SACREBLEU
    from ..evaluation.metrics import ngram_diversity, self_bleu_diversity
    from ..training.heldout import heldout_statistics, prepare_rows
    from ..models.sources import load_causal_lm, load_tokenizer

    tokenizer = load_tokenizer(str(run_dir))
    model = load_causal_lm(str(run_dir), dtype=torch.float32).eval()
    prompt_format = resolve_prompt_format(prompt_format, tokenizer)
    # Formatted, tokenized and masked exactly as `trl_emo.sft` trained on them; one code path for every loss.
    examples = prepare_rows(test_rows, tokenizer, "alpaca", prompt_format, max_length=max_length)
    heldout = heldout_statistics(model, examples, pad_token_id=tokenizer.pad_token_id)

    def prompt_of(row) -> str:
        if prompt_format == "chat_template":
            messages = [{"role": "user", "content": user_content(row["instruction"], row["input"])}]
            return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return alpaca_prompt(row["instruction"], row["input"])

    prompts = [prompt_of(r) for r in test_rows[:num_prompts]]
    tokenizer.padding_side = "left"
    torch.manual_seed(seed)
    groups = []
    for prompt in prompts:
        # The chat template writes its own special tokens; a second BOS would change the prompt.
        batch = tokenizer([prompt] * samples_per_prompt, return_tensors="pt", padding=True,
                          add_special_tokens=prompt_format != "chat_template")
        with torch.no_grad():
            out = model.generate(**batch, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=max_new_tokens,
                                 pad_token_id=tokenizer.pad_token_id)
        groups.append(tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True))
    distinct = sum(ngram_diversity(g) for g in groups) / len(groups)
    # Self-BLEU is sacrebleu's (the `eval` extra): without it the column shows "—" and the table says what to install.
    bleu_values = [v for v in (self_bleu_diversity(g) for g in groups) if v is not None] if SACREBLEU.installed() else []
    return {
        "held_out_cross_entropy": heldout["cross_entropy"],
        "held_out_entropy": heldout["entropy"],
        "ngram_diversity": distinct,
        "self_bleu_diversity": sum(bleu_values) / len(bleu_values) if bleu_values else None,
        "example_prompt": " ".join(filter(None, (test_rows[0]["instruction"], test_rows[0]["input"]))),
        "example_answers": groups[0][:2],
    }


def format_table(results: dict, seconds: dict) -> str:
    names = list(results)
    rows = [
        ("held-out cross-entropy (lower = better fit)", "held_out_cross_entropy", "{:.3f}"),
        ("held-out entropy of p(next token)", "held_out_entropy", "{:.3f}"),
        ("n-gram diversity of samples (x100)", "ngram_diversity", "{:.1f}"),
        ("self-BLEU diversity of samples (x100)", "self_bleu_diversity", "{:.1f}"),
    ]
    width = max(len(label) for label, _, _ in rows) + 2
    lines = [" " * width + "".join(f"{name:>12}" for name in names)]
    for label, key, fmt in rows:
        cells = "".join(f"{(fmt.format(results[n][key]) if results[n][key] is not None else '—'):>12}" for n in names)
        lines.append(f"{label:<{width}}{cells}")
    lines.append(f"{'training time (s)':<{width}}"
                 + "".join(f"{seconds[n]:>12.0f}" if seconds.get(n) is not None else f"{'—':>12}" for n in names))
    if any(results[n]["self_bleu_diversity"] is None for n in names):
        from ..core.optional import SACREBLEU

        if not SACREBLEU.installed():
            lines.append(f"(—: self-BLEU needs sacrebleu: pip install 'trl-emo[{SACREBLEU.extra}]')")
    return "\n".join(lines)


def main(args) -> int:
    """Run the demo from its parsed command line (`make_parser().parse_args(argv)`)."""
    from ..core.hub import offline_unless_hub
    from ..core.logs import setup_command_logging
    from ..core.noise import quiet_optional_packages
    from .recipes import RecipeNotFound

    quiet_optional_packages()
    setup_command_logging(logging.INFO)
    offline_unless_hub(args.model)  # the tiny model, a local folder or .gguf file need no Hub
    if args.model is not None and not args.model.strip():
        print("trl-emo demo: error: --model is empty (did `$(python -m trl_emo.real_model)` fail? It prints what to "
              "install); give a local model folder, a .gguf file or a Hub id, or leave --model out for the tiny model.",
              file=sys.stderr)
        return 2
    if args.chain:
        from .chain import main as chain

        args.output_dir = args.output_dir or "trl_emo_chain"
        return chain(args)
    args.output_dir = args.output_dir or "trl_emo_demo"
    try:
        args = resolve_settings(args)
    except RecipeNotFound as exc:
        print(f"trl-emo demo: error: {exc}", file=sys.stderr)
        return 2
    start = time.time()
    out = Path(args.output_dir)
    data_dir = out / "data"
    train_rows, test_rows = write_data(data_dir)
    print(f"[demo] data: {len(train_rows)} training and {len(test_rows)} held-out rows (Alpaca-GPT4 schema) in {data_dir}")
    if args.model is None:
        from ..models.tiny import save_tiny_causal_lm

        model_path = save_tiny_causal_lm(
            [r["text"] for r in train_rows], vocab_size=1024, chat_template=False, seed=0, **MODEL_SIZE
        )
        print(f"[demo] model: tiny Llama ({MODEL_SIZE['hidden_size']} hidden, {MODEL_SIZE['num_hidden_layers']} layers), cached in {model_path}")
    else:
        from ..models.real_model import RealModelUnavailable, pretrained_model

        try:  # a Hub id that cannot be loaded, a bad .gguf file: one line before any work
            model_path = pretrained_model(args.model)
        except RealModelUnavailable as exc:
            print(f"trl-emo demo: error: {exc}", file=sys.stderr)
            return 2
    recipe = recipe_settings(args.recipe)
    if args.model is not None:
        kind = "LoRA" if recipe["use_peft"] else "full"
        print(f"[demo] model: {args.model} ({kind} fine-tuning with the recipe {Path(args.recipe).stem})")
    evaluation = dict(num_prompts=args.num_prompts, samples_per_prompt=args.samples_per_prompt,
                      max_new_tokens=args.max_new_tokens, prompt_format=recipe["prompt_format"],
                      max_length=recipe["max_length"])
    seconds, results = {}, {}
    if args.model is not None:
        # The pretrained model itself, untrained: what each loss moves away from.
        print("[demo] base model: evaluating ...", flush=True)
        results["base"], seconds["base"] = evaluate_one(model_path, test_rows, **evaluation), None
    for loss in args.losses:
        run_dir = out / loss
        seconds[loss] = train_one(loss, model_path, data_dir, run_dir, args.recipe, args.max_steps, args.overwrite)
        print(f"[demo] {loss}: evaluating ...", flush=True)
        results[loss] = evaluate_one(run_dir, test_rows, **evaluation)

    table = format_table(results, seconds)
    print("\n" + table)
    for loss in results:
        answers = " | ".join(a.strip().replace("\n", " ")[:70] for a in results[loss]["example_answers"])
        print(f"\n{loss} on {results[loss]['example_prompt']!r}: {answers}")
    if args.model is None:
        print(
            "\nWhat to look for: GEM keeps a higher-entropy next-token distribution and more diverse samples than\n"
            "cross-entropy, which is what best-of-n selection feeds on (`trl-emo eval`). This tiny model is trained\n"
            "from scratch on 504 rows, so held-out cross-entropy favours nll here; the GEM paper's lower perplexity\n"
            "comes from cross-entropy overfitting a pretrained model in later epochs (measured on SmolLM2-135M-Instruct\n"
            "in docs/real_model_study.md; `--model` runs this demo on a real model)."
        )
    else:
        print(
            "\nWhat to look for: how far each loss moved the pretrained model (the `base` column) on the held-out\n"
            "answers: cross-entropy fits them by sharpening the next-token distribution, GEM by matching it with an\n"
            "entropy regularizer. One short LoRA run per loss, one seed: the study with seeds and three tasks on\n"
            "SmolLM2-135M-Instruct is docs/real_model_study.md."
        )
    summary = {"model": args.model or "tiny", "losses": args.losses, "results": results, "training_seconds": seconds, "total_seconds": time.time() - start}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    (out / "summary.md").write_text(table + "\n")
    print(f"\n[demo] done in {time.time() - start:.0f} s; summary in {out / 'summary.json'}")
    return 0


def run(argv=None) -> int:
    """Parse `argv` (default: `sys.argv[1:]`), then `main`; the exit status."""
    from .command_line import run_command

    return run_command(make_parser, main, argv, error_prefix="trl-emo demo")


if __name__ == "__main__":
    raise SystemExit(run())
