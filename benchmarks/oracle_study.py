"""Oracle study: do our EMO and GEM behave as the papers say, at a scale a 2-core CPU can run?

A randomly initialized Llama with a sharpened head is the oracle: its next-token distribution is
known exactly, so samples from it are training data whose true distribution we can query. A
smaller student is pre-trained briefly with cross-entropy on oracle text (the common start), then
fine-tuned from that same checkpoint with every loss through `trl_emo.SFTTrainer` (same data,
steps, learning rate and seed), for several seeds. Each student is measured against the oracle:

- precision: oracle perplexity of the student's samples (EMO paper, Table 2's PPL_oracle);
- recall: student perplexity on held-out oracle text;
- exact forward and reverse KL to the oracle and the student's entropy on held-out prefixes;
- distinct-n, n-gram diversity and self-BLEU of several samples per prefix (GEM paper's metrics).

    python benchmarks/oracle_study.py                      # default size (see docs/oracle_study.md)
    python benchmarks/oracle_study.py --quick              # ~20 s: tiny sizes, two seeds
    python benchmarks/oracle_study.py --seeds 0 1 2 3 4 --losses nll emo gem-linear

Writes `results.json`, `results.md` and `oracle_study.png` into `--output_dir`.
See docs/oracle_study.md for the design, the measured results and their reading.
"""

from __future__ import annotations

import argparse
import datetime
import contextlib
import json
import math
import os
import warnings
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

if __package__ in (None, ""):  # run as a script: make `benchmarks.oracle` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.oracle.students import DEFAULT_LOSSES, LOSSES  # noqa: E402
from benchmarks.progress import Progress  # noqa: E402

# Default size: 7.5 min on a 2-core CPU with the nine default students (measured 2026-11-23; docs/oracle_study.md).
DEFAULTS = dict(
    vocab_size=256,
    seq_len=32,
    oracle_hidden_size=128,
    oracle_layers=4,
    oracle_heads=4,
    oracle_entropy=3.0,
    oracle_seed=1234,
    hidden_size=64,
    num_layers=2,
    num_heads=4,
    pretrain_sequences=16000,
    pretrain_epochs=1.0,
    pretrain_lr=3e-3,
    finetune_sequences=4000,
    finetune_epochs=2.0,
    limited_sequences=250,
    limited_epochs=16.0,
    learning_rate=1e-3,
    batch_size=32,
    heldout_sequences=1000,
    num_prompts=32,
    samples_per_prompt=16,
    prefix_len=8,
    nll_temperatures=[0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 1.05, 1.1, 1.15, 1.2, 1.25, 1.3, 1.35, 1.4, 1.45, 1.5],
    seeds=[0, 1, 2],
)

# --quick: every loss, two seeds, tiny sizes (the end-to-end test runs this).
QUICK = dict(
    vocab_size=64,
    seq_len=16,
    oracle_hidden_size=32,
    oracle_layers=2,
    oracle_heads=2,
    oracle_entropy=2.0,
    hidden_size=32,
    num_layers=1,
    num_heads=2,
    pretrain_sequences=512,
    pretrain_epochs=1.0,
    pretrain_lr=1e-2,
    finetune_sequences=256,
    finetune_epochs=1.0,
    limited_sequences=32,
    limited_epochs=4.0,
    learning_rate=3e-3,
    batch_size=32,
    heldout_sequences=128,
    num_prompts=8,
    samples_per_prompt=4,
    prefix_len=4,
    nll_temperatures=[0.8, 1.25],
    seeds=[0, 1],
)

STUDY_DATE = "2026-11-23"

REGIMES = {
    "ample": ("finetune_sequences", "finetune_epochs"),
    "limited": ("limited_sequences", "limited_epochs"),
}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="Tiny sizes and two seeds (about 20 s on 2 cores).")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help=f"Student seeds (default {DEFAULTS['seeds']}).")
    parser.add_argument("--losses", nargs="+", default=list(DEFAULT_LOSSES), choices=sorted(LOSSES),
                        help="Students to fine-tune (the start checkpoint and the oracle are always reported).")
    parser.add_argument("--regimes", nargs="+", default=list(REGIMES), choices=list(REGIMES),
                        help="Fine-tuning data regimes: 'ample' (EMO's oracle experiment: plenty of fresh data, few "
                        "epochs) and 'limited' (GEM's concern: a small set, many epochs).")
    parser.add_argument("--output_dir", default="outputs/oracle_study")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice).")
    parser.add_argument("--from_results", default=None, metavar="RESULTS_JSON",
                        help="Train nothing: re-write results.md and oracle_study.png into --output_dir from a saved "
                        "results.json.")
    parser.add_argument("--verdicts_from", nargs="+", default=None, metavar="RESULTS_MD",
                        help="Train nothing: write verdicts.md into --output_dir from the paired-difference tables of a "
                        "saved results.md (and, second, the reachable-target run's): the committed report keeps only "
                        "its results.md (docs/oracle/).")
    sizes = parser.add_argument_group("sizes (defaults: the default study; --quick replaces unset ones)")
    help_text = {
        "vocab_size": "Vocabulary of oracle and students.",
        "seq_len": "Tokens per sequence after BOS.",
        "oracle_hidden_size": "Oracle hidden size.",
        "oracle_layers": "Oracle layers.",
        "oracle_heads": "Oracle attention heads.",
        "oracle_entropy": "Target mean next-token entropy of the oracle on its own samples (nats).",
        "oracle_seed": "Seed of the oracle's weights and of every data set sampled from it.",
        "hidden_size": "Student hidden size.",
        "num_layers": "Student layers.",
        "num_heads": "Student attention heads.",
        "pretrain_sequences": "Oracle sequences for the common cross-entropy pre-training.",
        "pretrain_epochs": "Epochs of pre-training.",
        "pretrain_lr": "Peak learning rate of pre-training.",
        "finetune_sequences": "'ample' regime: oracle sequences for fine-tuning (fresh ones, the same for every loss).",
        "finetune_epochs": "'ample' regime: epochs of fine-tuning.",
        "limited_sequences": "'limited' regime: fine-tuning sequences (the first ones of the 'ample' set).",
        "limited_epochs": "'limited' regime: epochs of fine-tuning (enough for cross-entropy to overfit).",
        "learning_rate": "Peak learning rate of fine-tuning (the same for every loss).",
        "batch_size": "Sequences per optimizer step.",
        "heldout_sequences": "Held-out oracle sequences (recall, KLs, entropy; prefixes for sampling).",
        "num_prompts": "Held-out prefixes the students sample from.",
        "samples_per_prompt": "Samples per prefix (diversity is measured within these).",
        "prefix_len": "Prefix length, BOS included; samples continue to the full sequence length.",
    }
    parser.add_argument("--nll_temperatures", type=float, nargs="*", default=None,
                        help="Also measure the nll student sampled at these temperatures (its logits divided by T): "
                        f"the precision/recall/entropy trade-off a temperature knob gives for free (default "
                        f"{DEFAULTS['nll_temperatures']}; none: no frontier).")
    adaptive = parser.add_argument_group("GEM with a target entropy (the gem-target student)")
    adaptive.add_argument("--gem_target_entropy", type=float, default=None,
                          help="Target entropy in nats (default: the oracle's own mean next-token entropy over the "
                          "target tokens of the regime's fine-tuning data).")
    adaptive.add_argument("--gem_beta_step", type=float, default=None,
                          help="Its gem_beta_step, log beta per nat per optimizer step (default: the library's).")
    for name, value in DEFAULTS.items():
        if name in ("seeds", "nll_temperatures"):
            continue
        sizes.add_argument(f"--{name}", type=type(value), default=None, help=f"{help_text[name]} Default {value}.")
    args = parser.parse_args(argv)
    base = dict(DEFAULTS, **(QUICK if args.quick else {}))
    for name, value in base.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    if not 1 <= args.prefix_len < args.seq_len + 1:
        parser.error(f"--prefix_len must be in [1, {args.seq_len}]")
    if args.samples_per_prompt < 2:
        parser.error("--samples_per_prompt must be at least 2 (self-BLEU compares samples of one prefix)")
    if args.limited_sequences > args.finetune_sequences:
        parser.error("--limited_sequences cannot exceed --finetune_sequences (the limited set is a prefix of it)")
    if args.num_prompts > args.heldout_sequences:
        parser.error("--num_prompts cannot exceed --heldout_sequences")
    if args.gem_target_entropy is not None and not 0 < args.gem_target_entropy < math.log(args.vocab_size):
        parser.error(f"--gem_target_entropy must be in (0, ln {args.vocab_size}) = (0, {math.log(args.vocab_size):.3f})")
    if args.gem_beta_step is not None and not (args.gem_beta_step > 0 and math.isfinite(args.gem_beta_step)):
        parser.error("--gem_beta_step must be a positive number")
    return args


@contextlib.contextmanager
def _quiet():
    """Silence progress bars, library logs and warnings while the study runs; restore them after
    (the study also runs inside the test process)."""
    import datasets
    import transformers

    tf_logging = transformers.utils.logging
    verbosity, tf_bars, ds_bars = tf_logging.get_verbosity(), tf_logging.is_progress_bar_enabled(), \
        datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    tf_logging.set_verbosity_error()
    tf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning)
            warnings.filterwarnings("ignore", category=UserWarning)
            yield
    finally:
        tf_logging.set_verbosity(verbosity)
        if tf_bars:
            tf_logging.enable_progress_bar()
        if ds_bars:
            datasets.enable_progress_bars()


def _log(message: str) -> None:
    print(message, flush=True)


def _short(metrics: dict) -> str:
    return (
        f"precision PPL_oracle={metrics['precision_ppl']:.2f}  recall PPL={metrics['recall_ppl']:.2f}  "
        f"KL(o|s)={metrics['forward_kl']:.4f}  KL(s|o)={metrics['reverse_kl']:.4f}  H={metrics['entropy']:.3f}  "
        f"ngram-div={metrics['ngram_diversity']:.1f}  self-BLEU={metrics['self_bleu']:.1f}"
    )


def _default(field_name: str):
    """The default of a `trl_emo.SFTConfig` field (the value every student here uses)."""
    import dataclasses

    from trl_emo import SFTConfig

    return {f.name: f.default for f in dataclasses.fields(SFTConfig)}[field_name]


def _gem_beta_path(log_history: list[dict], start: float, target: float) -> dict:
    """The path of an adaptive GEM beta (logged at every step) and of the training entropy it steers."""
    rows = [row for row in log_history if "gem_beta" in row and "train_runtime" not in row]
    betas = [float(row["gem_beta"]) for row in rows]
    entropies = [float(row["entropy"]) for row in rows]
    if not betas:
        raise RuntimeError("the adaptive GEM beta was not logged (is gem_target_entropy set?)")
    tail = entropies[-10:]
    return {
        "target_entropy": target,
        "start": start,
        "end": betas[-1],
        "min": min(start, *betas),
        "max": max(start, *betas),
        # The first step after which beta sits at its upper bound 1 (None: never).
        "first_step_at_1": next((row["step"] for row, beta in zip(rows, betas) if beta >= 1.0), None),
        "train_entropy_first": entropies[0],
        "train_entropy_last10": sum(tail) / len(tail),
        "steps": [int(row["step"]) for row in rows],
        "path": betas,
        "train_entropy": entropies,
    }


def _final_train_log(log_history: list[dict]) -> dict:
    rows = [row for row in log_history if "loss" in row and "train_runtime" not in row]
    last = rows[-1] if rows else {}
    return {key: float(last[key]) for key in ("loss", "cross_entropy", "entropy", "mean_token_accuracy") if key in last}


def run_study(args) -> dict:
    """Run the whole study; return everything `results.json` holds. Checkpoints live in a working
    folder under `--output_dir` that is removed at the end, whatever happens."""
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="work-", dir=output_dir))
    try:
        return _run_study(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run_study(args, work: Path) -> dict:
    import torch
    from safetensors.torch import save_file

    from benchmarks.oracle import lm, report, students
    from benchmarks.oracle.evaluate import evaluate, prompts_from
    from trl_emo.models.tiny import build_tiny_model

    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    timings: dict[str, float] = {}

    # -- oracle and data ------------------------------------------------------------------
    _log(f"[oracle] vocab {args.vocab_size}, hidden {args.oracle_hidden_size}, {args.oracle_layers} layers; "
         f"calibrating the head to {args.oracle_entropy} nats/token")
    tokenizer = lm.make_tokenizer(args.vocab_size)
    oracle, oracle_info = lm.build_oracle(tokenizer, args)

    def draw(n: int, offset: int):  # one generator per split: a split does not depend on the others' sizes
        return lm.sample_sequences(oracle, n, args.seq_len, torch.Generator().manual_seed(args.oracle_seed + offset))

    pretrain = draw(args.pretrain_sequences, 1)
    finetune = draw(args.finetune_sequences, 2)
    heldout = draw(args.heldout_sequences, 3)
    data = {
        "ample": (finetune, args.finetune_epochs),
        "limited": (finetune[: args.limited_sequences], args.limited_epochs),
    }
    prompts = prompts_from(heldout, args.num_prompts, args.prefix_len, args.samples_per_prompt)
    eval_kwargs = dict(heldout=heldout, prompts=prompts, samples_per_prompt=args.samples_per_prompt,
                       new_tokens=args.seq_len + 1 - args.prefix_len)
    oracle_metrics = evaluate(oracle, oracle, seed=args.oracle_seed + 4, train_subset=finetune[: args.heldout_sequences],
                              **eval_kwargs)
    oracle_info["entropy_on_heldout"] = oracle_metrics["entropy"]
    # gem-target's target: the oracle's mean next-token entropy over the target tokens of the regime's
    # fine-tuning data, the very positions where the trainer measures the student's entropy.
    oracle_info["entropy_on_finetune"] = {
        regime: lm.compare_on_text(oracle, oracle, sequences)["oracle_entropy"] for regime, (sequences, _) in data.items()
    }
    oracle_head_path = work / "oracle_head.safetensors"
    save_file({"cost_embedding": oracle.get_output_embeddings().weight.detach().contiguous()}, str(oracle_head_path))
    timings["oracle_and_data"] = time.perf_counter() - started
    _log(f"[oracle] head scale {oracle_info['head_scale']:.2f}; entropy on held-out text "
         f"{oracle_metrics['entropy']:.3f} nats; {args.pretrain_sequences}/{args.finetune_sequences}/"
         f"{args.heldout_sequences} pre-training/fine-tuning/held-out sequences sampled "
         f"({timings['oracle_and_data']:.0f}s)")
    _log(f"[oracle] as its own student: {_short(oracle_metrics)}")

    runs = [{"regime": None, "student": "oracle", "seed": None, "metrics": oracle_metrics}]
    if any(LOSSES[name]["loss_type"] == "gem" for name in args.losses):
        # GEM-linear's fixed point is softmax(z / beta) = data, i.e. the oracle at temperature 1 / beta:
        # where it heads with unlimited data and capacity (GEM-logsigmoid is nearly the same).
        beta = _default("gem_beta")
        tempered = lm.with_temperature(oracle, 1 / beta)
        metrics = evaluate(tempered, oracle, seed=args.oracle_seed + 4, train_subset=finetune[: args.heldout_sequences],
                           **eval_kwargs)
        runs.append({"regime": None, "student": report.tempered_oracle_name(beta), "seed": None, "metrics": metrics})
        _log(f"[oracle] at temperature 1/{beta:g} (GEM's target): {_short(metrics)}")
        del tempered
    training: list[dict] = []
    student_config = lm.model_config(args.hidden_size, args.num_layers, args.num_heads, args.seq_len)
    # The jobs: per seed, the start's pre-training, then one fine-tune (and its measures) per loss and regime.
    jobs = Progress(len(args.seeds) * (1 + len(args.regimes) * len(args.losses)))
    for seed in args.seeds:
        # -- the common start: cross-entropy pre-training on separate oracle text ----------
        t0 = time.perf_counter()
        base = build_tiny_model(tokenizer, seed=seed, **student_config)
        info = students.train(base, tokenizer, pretrain, work / f"seed{seed}-pretrain", seed=seed,
                              batch_size=args.batch_size, learning_rate=args.pretrain_lr,
                              num_epochs=args.pretrain_epochs, loss_fields={"loss_type": "nll"})
        base_dir = work / f"seed{seed}-start"
        base.save_pretrained(base_dir)
        training.append({"regime": None, "student": "start", "seed": seed, "steps": info["steps"],
                         "seconds": info["seconds"], **_final_train_log(info["log_history"])})
        _log(f"[seed {seed}] " + jobs.step("pre-training of the start"))
        sample_seed = 10_000 + seed  # the same sampling seed for every student of this seed
        for regime in args.regimes:
            sequences, epochs = data[regime]
            train_subset = sequences[: args.heldout_sequences]
            # The start is measured against each regime's training data (for the generalization gap).
            metrics = evaluate(base, oracle, seed=sample_seed, train_subset=train_subset, **eval_kwargs)
            runs.append({"regime": regime, "student": "start", "seed": seed, "metrics": metrics})
            _log(f"[seed {seed}] start ({info['steps']} pre-training steps, {time.perf_counter() - t0:.0f}s): "
                 f"{_short(metrics)}")

            # -- one fine-tune per loss, all from the same start ----------------------------
            for name in args.losses:
                t0 = time.perf_counter()
                fields = students.fill(LOSSES[name], oracle_head=oracle_head_path,
                                       oracle_entropy=oracle_info["entropy_on_finetune"][regime])
                if fields.get("gem_target_entropy") is not None:
                    if args.gem_target_entropy is not None:
                        fields["gem_target_entropy"] = args.gem_target_entropy
                    if args.gem_beta_step is not None:
                        fields["gem_beta_step"] = args.gem_beta_step
                student = students.load(base_dir)
                info_ft = students.train(student, tokenizer, sequences, work / f"seed{seed}-{regime}-{name}",
                                         seed=seed, batch_size=args.batch_size, learning_rate=args.learning_rate,
                                         num_epochs=epochs, loss_fields=fields)
                metrics = evaluate(student, oracle, seed=sample_seed, train_subset=train_subset, **eval_kwargs)
                runs.append({"regime": regime, "student": name, "seed": seed, "metrics": metrics})
                record = {"regime": regime, "student": name, "seed": seed, "steps": info_ft["steps"],
                          "seconds": info_ft["seconds"], **_final_train_log(info_ft["log_history"])}
                if fields.get("gem_target_entropy") is not None:
                    record["gem_beta"] = _gem_beta_path(info_ft["log_history"], fields.get("gem_beta", _default("gem_beta")),
                                                        fields["gem_target_entropy"])
                training.append(record)
                _log(f"[seed {seed}] {regime:<7} {name:<15} ({info_ft['steps']} steps, train {info_ft['seconds']:.0f}s, "
                     f"total {time.perf_counter() - t0:.0f}s): {_short(metrics)}")
                if "gem_beta" in record:
                    path = record["gem_beta"]
                    _log(f"[seed {seed}] {regime:<7} {name:<15} beta {path['start']:g} -> {path['end']:.4f} "
                         f"(range {path['min']:.4f}-{path['max']:.4f}); training entropy {path['train_entropy_first']:.3f}"
                         f" -> {path['train_entropy_last10']:.3f} (last 10 steps), target {path['target_entropy']:.3f}")
                if name == "nll":
                    for temperature in args.nll_temperatures:
                        tempered = lm.with_temperature(student, temperature)
                        metrics = evaluate(tempered, oracle, seed=sample_seed, train_subset=train_subset, **eval_kwargs)
                        runs.append({"regime": regime, "student": report.frontier_name(temperature), "seed": seed,
                                     "metrics": metrics})
                        del tempered
                    if args.nll_temperatures:
                        _log(f"[seed {seed}] {regime:<7} nll at temperatures {args.nll_temperatures} measured")
                _log(f"[seed {seed}] " + jobs.step(f"{regime} {name}"))
                del student
            t0 = time.perf_counter()

    runtime = time.perf_counter() - started
    config = {key: getattr(args, key) for key in [*DEFAULTS, "losses", "regimes", "quick", "gem_target_entropy",
                                                  "gem_beta_step"]}
    return {
        "study": "oracle_study",
        "date": STUDY_DATE,
        "run_at": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "python": platform.python_version(),
            "torch": torch.__version__,
        },
        "config": config,
        "oracle": oracle_info,
        "student_architecture": student_config,
        "loss_settings": {name: LOSSES[name] for name in args.losses},
        "runs": runs,
        "training": training,
        **report.analyse(runs, args.regimes, training),
        "timings_seconds": {**timings, "total": runtime},
    }


REGIME_TITLES = {
    "ample": "'ample' regime (EMO's oracle setting: {finetune_sequences} fresh sequences, {finetune_epochs:g} epoch(s))",
    "limited": "'limited' regime (GEM's setting: {limited_sequences} sequences, {limited_epochs:g} epoch(s))",
}


def write_outputs(results: dict, output_dir) -> None:
    from benchmarks.oracle import report

    output_dir = Path(output_dir)
    json_path = output_dir / "results.json"
    if not json_path.exists() or json.loads(json_path.read_text()) != json.loads(json.dumps(results, default=str)):
        with open(json_path, "w") as handle:
            json.dump(results, handle, indent=2, default=str)
    cfg = results["config"]
    lines = [
        f"# Oracle study results ({'quick' if cfg['quick'] else 'default size'})",
        "",
        f"Seeds {cfg['seeds']}; mean ± std over seeds (sample std). Oracle: vocab {cfg['vocab_size']}, "
        f"hidden {cfg['oracle_hidden_size']} × {cfg['oracle_layers']} layers, head scale "
        f"{results['oracle']['head_scale']:.2f}, entropy {results['oracle']['entropy_on_heldout']:.3f} nats/token. "
        f"Students: hidden {cfg['hidden_size']} × {cfg['num_layers']} layers; start = {cfg['pretrain_epochs']:g} epoch(s) "
        f"of cross-entropy on {cfg['pretrain_sequences']} oracle sequences; each loss then fine-tunes it at lr "
        f"{cfg['learning_rate']:g}. Sequences: BOS + {cfg['seq_len']} tokens. Samples: {cfg['samples_per_prompt']} per "
        f"prefix × {cfg['num_prompts']} held-out prefixes of {cfg['prefix_len']} tokens, ancestral at T=1.",
        "",
    ]
    for regime, summary in results["summary"].items():
        lines += [f"## {REGIME_TITLES[regime].format(**cfg)}", "", report.markdown_table(summary), ""]
        curve = report.frontier(summary)
        if len(curve) > 1:
            columns = [c for c in report.TABLE_COLUMNS if c[0] in report.FRONTIER_COLUMNS]
            lines += [
                "The nll student sampled at other temperatures (its logits divided by T; no training): the "
                "trade-off a temperature knob gives for free.",
                "",
                report.markdown_table(summary, columns=columns, students=curve),
                "",
            ]
        differences = results["paired_differences_vs_nll"].get(regime)
        if differences:
            lines += [
                "Paired differences with nll (per seed: same start, data order and sampling seed), mean ± std over "
                "seeds, and on how many seeds the student's value is lower than nll's:",
                "",
                report.markdown_differences(differences),
                "",
            ]
        matched = results["differences_vs_nll_at_equal_entropy"].get(regime)
        if matched:
            lines += [
                "Differences with nll sampled at the temperature that gives the same entropy (per seed, nll's values "
                "interpolated along its temperature curve at the student's entropy), mean ± std over seeds: does the "
                "loss do better than turning nll's temperature knob?",
                "",
                report.markdown_matched(matched),
                "",
            ]
        for student, comparison in results.get("target_entropy", {}).get(regime, {}).items():
            target = ("the oracle's own mean token entropy on the fine-tuning data" if cfg.get("gem_target_entropy") is None
                      else f"a target entropy of {cfg['gem_target_entropy']:g} nats set with --gem_target_entropy")
            lines += [
                f"GEM with a target entropy ({student}: beta adapted after every step toward {target}): how close it "
                "lands to the oracle, beside fixed-beta GEM, nll, "
                "and nll sampled at the entropy it reached and at the oracle's entropy (interpolated along nll's "
                "temperature curve, per seed; T = that temperature). Mean ± std over seeds; a comparator row counts the "
                "seeds where the student's value is lower.",
                "",
                report.markdown_target_entropy(student, comparison),
                "",
            ]
    from benchmarks.oracle.verdicts import CLAIMS, differences_from_results, markdown as verdicts_markdown, verdict_rows

    tables = verdict_rows(differences_from_results(results), CLAIMS)
    if tables:
        lines += ["## Verdicts", "", "Each claim as a paired, two-sided test over the seeds (Student's t of the per-seed "
                  "differences, `benchmarks/oracle/verdicts.py`); better / worse / cannot tell from the 95 % interval.",
                  "", verdicts_markdown(tables)]
    lines.append(f"Runtime: {results['timings_seconds']['total']:.0f} s on {results['machine']['cpu_count']} CPU cores "
                 f"({results['machine']['torch_threads']} torch threads).")
    (output_dir / "results.md").write_text("\n".join(lines) + "\n")
    report.plot(results["summary"], str(output_dir / "oracle_study.png"),
                titles={regime: REGIME_TITLES[regime].format(**cfg) for regime in results["summary"]},
                suptitle=f"Oracle study ({'quick' if cfg['quick'] else 'default size'}; seeds {cfg['seeds']}; "
                f"mean ± std over seeds)")


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.verdicts_from:
        from benchmarks.oracle.verdicts import write_from_markdown

        path = write_from_markdown([Path(p) for p in args.verdicts_from], Path(args.output_dir))
        _log(f"Wrote {path}")
        return {}
    if args.from_results:
        from benchmarks.oracle import report

        results = json.loads(Path(args.from_results).read_text())
        # with this version's analysis
        results.update(report.analyse(results["runs"], results["config"]["regimes"], results.get("training")))
        Path(args.output_dir).mkdir(parents=True, exist_ok=True)
    else:
        with _quiet():
            results = run_study(args)
        command = argv if argv is not None else sys.argv[1:]
        results["command"] = " ".join(["python benchmarks/oracle_study.py", *map(str, command)])
    write_outputs(results, args.output_dir)
    _log("")
    _log((Path(args.output_dir) / "results.md").read_text())
    _log(f"Wrote {args.output_dir}/results.json, results.md, oracle_study.png "
         f"({results['timings_seconds']['total']:.0f} s).")
    return results


if __name__ == "__main__":
    main()
