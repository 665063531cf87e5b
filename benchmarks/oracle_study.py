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
    python benchmarks/oracle_study.py --quick              # a minute or so, tiny sizes
    python benchmarks/oracle_study.py --seeds 0 1 2 3 4 --losses nll emo gem-linear

Writes `results.json`, `results.md` and `oracle_study.png` into `--output_dir`.
See docs/oracle_study.md for the design, the measured results and their reading.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
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

# Default size: measured at ~X min on a 2-core CPU (docs/oracle_study.md).
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
    pretrain_sequences=8000,
    pretrain_epochs=1.0,
    pretrain_lr=3e-3,
    finetune_sequences=2000,
    finetune_epochs=2.0,
    learning_rate=1e-3,
    batch_size=32,
    heldout_sequences=1000,
    num_prompts=32,
    samples_per_prompt=16,
    prefix_len=8,
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
    learning_rate=3e-3,
    batch_size=32,
    heldout_sequences=128,
    num_prompts=8,
    samples_per_prompt=4,
    prefix_len=4,
    seeds=[0, 1],
)

STUDY_DATE = "2026-11-22"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="Tiny sizes and two seeds (about a minute).")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help=f"Student seeds (default {DEFAULTS['seeds']}).")
    parser.add_argument("--losses", nargs="+", default=list(DEFAULT_LOSSES), choices=sorted(LOSSES),
                        help="Students to fine-tune (the start checkpoint and the oracle are always reported).")
    parser.add_argument("--output_dir", default="outputs/oracle_study")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice).")
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
        "finetune_sequences": "Oracle sequences for fine-tuning (fresh ones, the same for every loss).",
        "finetune_epochs": "Epochs of fine-tuning.",
        "learning_rate": "Peak learning rate of fine-tuning (the same for every loss).",
        "batch_size": "Sequences per optimizer step.",
        "heldout_sequences": "Held-out oracle sequences (recall, KLs, entropy; prefixes for sampling).",
        "num_prompts": "Held-out prefixes the students sample from.",
        "samples_per_prompt": "Samples per prefix (diversity is measured within these).",
        "prefix_len": "Prefix length, BOS included; samples continue to the full sequence length.",
    }
    for name, value in DEFAULTS.items():
        if name == "seeds":
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
    if args.num_prompts > args.heldout_sequences:
        parser.error("--num_prompts cannot exceed --heldout_sequences")
    return args


def _quiet():
    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)


def _log(message: str) -> None:
    print(message, flush=True)


def _short(metrics: dict) -> str:
    return (
        f"precision PPL_oracle={metrics['precision_ppl']:.2f}  recall PPL={metrics['recall_ppl']:.2f}  "
        f"KL(o|s)={metrics['forward_kl']:.4f}  KL(s|o)={metrics['reverse_kl']:.4f}  H={metrics['entropy']:.3f}  "
        f"ngram-div={metrics['ngram_diversity']:.1f}  self-BLEU={metrics['self_bleu']:.1f}"
    )


def _final_train_log(log_history: list[dict]) -> dict:
    rows = [row for row in log_history if "loss" in row and "train_runtime" not in row]
    last = rows[-1] if rows else {}
    return {key: float(last[key]) for key in ("loss", "cross_entropy", "entropy", "mean_token_accuracy") if key in last}


def run_study(args) -> dict:
    import torch

    from benchmarks.oracle import lm, report, students
    from benchmarks.oracle.evaluate import evaluate, prompts_from
    from trl_emo.tiny import build_tiny_model

    _quiet()
    if args.threads:
        torch.set_num_threads(args.threads)
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="work-", dir=output_dir))
    started = time.perf_counter()
    timings: dict[str, float] = {}

    # -- oracle and data ------------------------------------------------------------------
    _log(f"[oracle] vocab {args.vocab_size}, hidden {args.oracle_hidden_size}, {args.oracle_layers} layers; "
         f"calibrating the head to {args.oracle_entropy} nats/token")
    tokenizer = lm.make_tokenizer(args.vocab_size)
    oracle, oracle_info = lm.build_oracle(tokenizer, args)
    generator = torch.Generator().manual_seed(args.oracle_seed + 1)
    pretrain = lm.sample_sequences(oracle, args.pretrain_sequences, args.seq_len, generator)
    finetune = lm.sample_sequences(oracle, args.finetune_sequences, args.seq_len, generator)
    heldout = lm.sample_sequences(oracle, args.heldout_sequences, args.seq_len, generator)
    train_subset = finetune[: args.heldout_sequences]
    prompts = prompts_from(heldout, args.num_prompts, args.prefix_len, args.samples_per_prompt)
    new_tokens = args.seq_len + 1 - args.prefix_len
    eval_kwargs = dict(heldout=heldout, train_subset=train_subset, prompts=prompts,
                       samples_per_prompt=args.samples_per_prompt, new_tokens=new_tokens)
    oracle_metrics = evaluate(oracle, oracle, seed=args.oracle_seed + 2, **eval_kwargs)
    oracle_info["entropy_on_heldout"] = oracle_metrics["entropy"]
    oracle_head_path = work / "oracle_head.safetensors"
    from safetensors.torch import save_file

    save_file({"cost_embedding": oracle.get_output_embeddings().weight.detach().contiguous()}, str(oracle_head_path))
    timings["oracle_and_data"] = time.perf_counter() - started
    _log(f"[oracle] head scale {oracle_info['head_scale']:.2f}; entropy on held-out text "
         f"{oracle_metrics['entropy']:.3f} nats; {args.pretrain_sequences}/{args.finetune_sequences}/"
         f"{args.heldout_sequences} pre-training/fine-tuning/held-out sequences sampled "
         f"({timings['oracle_and_data']:.0f}s)")
    _log(f"[oracle] as its own student: {_short(oracle_metrics)}")

    runs = [{"student": "oracle", "seed": None, "metrics": oracle_metrics}]
    training: list[dict] = []
    student_config = lm.model_config(args.hidden_size, args.num_layers, args.num_heads, args.seq_len)
    common = dict(batch_size=args.batch_size)
    for seed in args.seeds:
        # -- the common start: cross-entropy pre-training on separate oracle text ----------
        t0 = time.perf_counter()
        base = build_tiny_model(tokenizer, seed=seed, **student_config)
        info = students.train(base, tokenizer, pretrain, work / f"seed{seed}-pretrain", seed=seed,
                              learning_rate=args.pretrain_lr, num_epochs=args.pretrain_epochs,
                              loss_fields={"loss_type": "nll"}, **common)
        base_dir = work / f"seed{seed}-start"
        base.save_pretrained(base_dir)
        sample_seed = 10_000 + seed  # the same sampling seed for every student of this seed
        metrics = evaluate(base, oracle, seed=sample_seed, **eval_kwargs)
        runs.append({"student": "start", "seed": seed, "metrics": metrics})
        training.append({"student": "start", "seed": seed, "steps": info["steps"], "seconds": info["seconds"],
                         **_final_train_log(info["log_history"])})
        _log(f"[seed {seed}] start ({info['steps']} pre-training steps, {time.perf_counter() - t0:.0f}s): {_short(metrics)}")

        # -- one fine-tune per loss, all from the same start --------------------------------
        for name in args.losses:
            t0 = time.perf_counter()
            fields = {k: (v.format(oracle_head=oracle_head_path) if isinstance(v, str) else v)
                      for k, v in LOSSES[name].items()}
            student = students.load(base_dir)
            info = students.train(student, tokenizer, finetune, work / f"seed{seed}-{name}", seed=seed,
                                  learning_rate=args.learning_rate, num_epochs=args.finetune_epochs,
                                  loss_fields=fields, **common)
            metrics = evaluate(student, oracle, seed=sample_seed, **eval_kwargs)
            runs.append({"student": name, "seed": seed, "metrics": metrics})
            training.append({"student": name, "seed": seed, "steps": info["steps"], "seconds": info["seconds"],
                             **_final_train_log(info["log_history"])})
            _log(f"[seed {seed}] {name:<15} ({info['steps']} steps, train {info['seconds']:.0f}s, "
                 f"total {time.perf_counter() - t0:.0f}s): {_short(metrics)}")
            del student

    shutil.rmtree(work, ignore_errors=True)
    summary = report.summarize(runs)
    differences = report.paired_differences(runs) if "nll" in args.losses else {}
    runtime = time.perf_counter() - started
    config = {key: getattr(args, key) for key in [*DEFAULTS, "losses", "quick"]}
    results = {
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
        "summary": summary,
        "paired_differences_vs_nll": differences,
        "timings_seconds": {**timings, "total": runtime},
    }
    return results


def write_outputs(results: dict, output_dir) -> None:
    from benchmarks.oracle import report

    output_dir = Path(output_dir)
    with open(output_dir / "results.json", "w") as handle:
        json.dump(results, handle, indent=2, default=str)
    cfg = results["config"]
    lines = [
        f"# Oracle study results ({'quick' if cfg['quick'] else 'default size'})",
        "",
        f"Seeds {cfg['seeds']}; mean ± std over seeds (sample std). Oracle: vocab {cfg['vocab_size']}, "
        f"hidden {cfg['oracle_hidden_size']} × {cfg['oracle_layers']} layers, head scale "
        f"{results['oracle']['head_scale']:.2f}, entropy {results['oracle']['entropy_on_heldout']:.3f} nats/token. "
        f"Students: hidden {cfg['hidden_size']} × {cfg['num_layers']} layers; start = {cfg['pretrain_epochs']} epoch(s) "
        f"of cross-entropy on {cfg['pretrain_sequences']} oracle sequences; each loss then fine-tunes it for "
        f"{cfg['finetune_epochs']} epoch(s) on {cfg['finetune_sequences']} other sequences at lr {cfg['learning_rate']}. "
        f"Sequences: BOS + {cfg['seq_len']} tokens. Samples: {cfg['samples_per_prompt']} per prefix × "
        f"{cfg['num_prompts']} held-out prefixes of {cfg['prefix_len']} tokens, ancestral at T=1.",
        "",
        report.markdown_table(results["summary"]),
        "",
    ]
    if results["paired_differences_vs_nll"]:
        lines += [
            "Paired differences with nll (per seed: same start, data order and sampling seed), mean ± std over seeds, "
            "and on how many seeds the student's value is lower than nll's:",
            "",
            report.markdown_differences(results["paired_differences_vs_nll"]),
            "",
        ]
    lines.append(f"Runtime: {results['timings_seconds']['total']:.0f} s on {results['machine']['cpu_count']} CPU cores "
                 f"({results['machine']['torch_threads']} torch threads).")
    (output_dir / "results.md").write_text("\n".join(lines) + "\n")
    report.plot(results["summary"], str(output_dir / "oracle_study.png"),
                title=f"Oracle study ({'quick' if cfg['quick'] else 'default'}; seeds {cfg['seeds']}; mean ± std)")


def main(argv=None) -> dict:
    args = parse_args(argv)
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
