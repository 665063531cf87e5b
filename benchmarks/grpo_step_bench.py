"""Where a GRPO step's time goes on a CPU: plain `generate` against one `GRPOTrainer` step, phase by phase.

    python benchmarks/grpo_step_bench.py                       # SmolLM2-135M-Instruct, 16 x 64 tokens, every variant
    python benchmarks/grpo_step_bench.py --quick               # two variants, one timed step each (a few minutes)
    python benchmarks/grpo_step_bench.py --variants default tuned --steps 4
    python benchmarks/grpo_step_bench.py --variants default --set beta=0.04   # any GRPOConfig field, on every variant

The workload is the one the GRPO study would run: SmolLM2-135M-Instruct (`trl_emo.real_model`, offline), 2 GSM8K-style
prompts x 8 generations = 16 completions per step, T = 1, at most 64 new tokens, the `gsm8k_answer` reward, TRL
1.16's `GRPOTrainer` as `trl_emo.grpo` builds it (float32 on the CPU). Every completion is made exactly 64 tokens long
(`min_new_tokens`, so that sampling luck does not change the work between variants; `--natural_length` lets them stop
at their end of turn). `plain_generate` is `model.generate` of the same 16 x 64 from the same prompts, chat template
and sampling settings, outside any trainer.

A step is timed from the trainer's `on_step_begin` to `on_step_end`, and split into phases by timing the trainer's own
methods: generation (`_generate_single_turn`: unwrapping, TRL's generation config, `generate`), reward
(`_calculate_rewards`), old/ref log-probs (`_get_per_token_logps_and_entropies` without gradient: the old policy's pass
when a generation serves several updates, the reference model's when `beta != 0`), loss forward (`compute_loss`, the
fused head's log-probs and entropy over the full vocabulary included), backward (`accelerator.backward`, recomputation
under gradient checkpointing included) and optimizer (`on_pre_optimizer_step` to `on_optimizer_step`); "other" is the
rest of the step (data loading, padding, logging, gradient clipping, the scheduler). Each variant runs in its own
process, `--warmup` untimed steps first (the first step allocates the optimizer's state); the means of the timed
steps are reported (an even number of them: with `num_iterations: 2` every other step generates). The machine's load
and any other busy process are sampled every 5 s while a variant runs: the numbers are only comparable between
variants that ran on an otherwise idle machine.

Writes `outputs/grpo_step_bench.json` (or `--json`) and prints a Markdown table (`docs/benchmarks.md`, "GRPO step time
(CPU)").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

NUM_PROMPTS, NUM_GENERATIONS, MAX_NEW_TOKENS = 2, 8, 64
PHASES = ("generation", "reward", "old_ref_logps", "loss_forward", "backward", "optimizer", "other")

# GRPOConfig fields of each variant, over `grpo_step`'s base: TRL's defaults for this workload on a CPU. Keys with a
# leading underscore are not GRPOConfig fields: `_peft` (LoRA r=16 on all linear layers), `_threads` (torch's
# intra-op threads), `_malloc` (glibc keeps freed memory for the next step: `trl_emo.commands.cpu_memory`, what
# `trl_emo.grpo` does on a CPU), `_matmul_bf16` (oneDNN's fp32 matmuls with bf16 inputs, AMX).
VARIANTS: dict[str, dict] = {
    "plain_generate": {},  # not a trainer: model.generate of the same 16 x 64
    "fused_head": {},  # not a trainer: the log-prob/entropy head over the full vocabulary, alone (forward + backward)
    "default": {},  # TRL 1.16's GRPO defaults: gradient checkpointing on, beta 0, one update per generation
    "no_checkpointing": {"gradient_checkpointing": False},
    "beta_0.04": {"beta": 0.04},  # a KL term: a reference model and its forward pass every step
    "num_iterations_2": {"num_iterations": 2},  # two updates per generation: an old-policy pass, half the generations
    "threads_1": {"_threads": 1},
    "lora": {"_peft": True},  # the QLoRA recipes' adapter (unquantized: no 4-bit kernels on a CPU)
    "bf16_autocast": {"bf16": True},  # TRL's own default off the CPU; AMX bf16 matmuls on this CPU
    "matmul_bf16": {"_matmul_bf16": True},
    "malloc": {"_malloc": True},  # what `trl_emo.grpo` does on a CPU by itself
    "tuned": {"_malloc": True, "gradient_checkpointing": False},  # ... plus `--activation_checkpointing false`
    "tuned_bf16": {"_malloc": True, "gradient_checkpointing": False, "bf16": True},
}
# What a plain run measures (`matmul_bf16` only on request: slower here).
DEFAULT_VARIANTS = tuple(name for name in VARIANTS if name != "matmul_bf16")
QUICK_VARIANTS = ("plain_generate", "default", "tuned")


def _questions(n: int) -> list[dict]:
    return [
        {"question": f"A farmer has {3 * i + 4} cows and buys {2 * i + 5} more. Then {i + 1} cows are sold. How many "
                     "cows does the farmer have now?", "answer": f"#### {(3 * i + 4) + (2 * i + 5) - (i + 1)}"}
        for i in range(n)
    ]


def _model_path(value: str | None) -> str:
    if value:
        return value
    from trl_emo.models.real_model import smollm2_instruct

    return smollm2_instruct(progress=False)


def _load(exclude: set[int] = frozenset()) -> dict:
    """The 1-minute load average and the processes, other than this benchmark's, using 20% of a core or more."""
    load = os.getloadavg()
    others = []
    try:
        out = subprocess.run(["ps", "-eo", "pid,ppid,pcpu,args", "--sort=-pcpu"], capture_output=True, text=True).stdout
        mine = {os.getpid(), os.getppid(), *exclude}
        for line in out.splitlines()[1:8]:
            pid, ppid, cpu, args = line.split(None, 3)
            if float(cpu) >= 20 and int(pid) not in mine and int(ppid) not in mine and args.split()[0] != "ps":
                others.append(f"{float(cpu):.0f}% {args[:100]}")
    except (OSError, ValueError):
        pass
    return {"loadavg_1min": round(load[0], 2), "busy_processes": others}


def plain_generate(args) -> dict:
    """`model.generate` of NUM_PROMPTS x NUM_GENERATIONS completions, as TRL samples them (left padding, T=1)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = _model_path(args.model)
    settings = VARIANTS["plain_generate"]
    if settings.get("_matmul_bf16"):
        torch.backends.mkldnn.matmul.fp32_precision = "bf16"
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    times = []
    for step in range(args.warmup + args.steps):
        rows = _questions(NUM_PROMPTS * (step + 1))[-NUM_PROMPTS:]
        prompts = [tokenizer.apply_chat_template([{"role": "user", "content": r["question"]}], tokenize=True,
                                                 add_generation_prompt=True, return_dict=True)["input_ids"]
                   for r in rows for _ in range(NUM_GENERATIONS)]
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        kwargs = {} if args.natural_length else {"min_new_tokens": MAX_NEW_TOKENS}
        torch.manual_seed(step)
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0,
                                 top_p=1.0, max_new_tokens=MAX_NEW_TOKENS, pad_token_id=tokenizer.pad_token_id,
                                 **kwargs)
        times.append(time.perf_counter() - start)
    return {"generation": statistics.mean(times[args.warmup:]), "step": statistics.mean(times[args.warmup:]),
            "new_tokens": int(out.shape[1] - ids.shape[1]), "all_steps": times,
            "peak_rss_gib": round(_peak_rss_gib(), 2)}


def grpo_step(args, variant: str) -> dict:
    """One `GRPOTrainer` run of `--warmup + --steps` steps, each split into PHASES."""
    import functools

    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from trl_emo.evaluation.rewards import gsm8k_answer

    path = _model_path(args.model)
    settings = {**VARIANTS[variant], **dict(_parse_set(args.set))}
    peft = settings.pop("_peft", False)
    if settings.pop("_malloc", False):
        from trl_emo.commands.cpu_memory import keep_freed_memory

        assert keep_freed_memory(), "glibc's mallopt is not available here"
    threads = settings.pop("_threads", None)
    if threads:
        torch.set_num_threads(threads)
    if settings.pop("_matmul_bf16", False):
        torch.backends.mkldnn.matmul.fp32_precision = "bf16"
    tokenizer = AutoTokenizer.from_pretrained(path)
    total = args.warmup + args.steps
    rows = [{"prompt": [{"role": "user", "content": r["question"]}], "answer": r["answer"]}
            for r in _questions(NUM_PROMPTS * total * 2)]
    config = dict(
        output_dir=tempfile.mkdtemp(prefix="grpo_step_bench_"), use_cpu=True, bf16=False, seed=0,
        per_device_train_batch_size=NUM_PROMPTS * NUM_GENERATIONS, num_generations=NUM_GENERATIONS,
        max_completion_length=MAX_NEW_TOKENS, temperature=1.0, max_steps=total, logging_steps=1, report_to="none",
        save_strategy="no", disable_tqdm=True, shuffle_dataset=False,
        model_init_kwargs={"dtype": "float32"},
        generation_kwargs=None if args.natural_length else {"min_new_tokens": MAX_NEW_TOKENS},
    )
    config.update(settings)
    peft_config = None
    if peft:
        from peft import LoraConfig

        peft_config = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear",
                                 task_type="CAUSAL_LM")
        config.setdefault("learning_rate", 1e-5)
    trainer = GRPOTrainer(model=path, reward_funcs=[gsm8k_answer], args=GRPOConfig(**config),
                          train_dataset=Dataset.from_list(rows), processing_class=tokenizer, peft_config=peft_config)
    phases: dict[str, float] = {}
    steps: list[dict] = []

    def timed(name_of, function):
        @functools.wraps(function)
        def wrapper(*a, **k):
            name = name_of() if callable(name_of) else name_of
            start = time.perf_counter()
            try:
                return function(*a, **k)
            finally:
                phases[name] = phases.get(name, 0.0) + time.perf_counter() - start
        return wrapper

    trainer._generate_single_turn = timed("generation", trainer._generate_single_turn)
    trainer._calculate_rewards = timed("reward", trainer._calculate_rewards)
    # Without gradient: the old policy's or the reference model's pass; with it: the loss forward (timed as a whole).
    trainer._get_per_token_logps_and_entropies = timed(
        lambda: "old_ref_logps" if not torch.is_grad_enabled() else "_logps_in_loss",
        trainer._get_per_token_logps_and_entropies,
    )
    trainer.compute_loss = timed("loss_forward", trainer.compute_loss)
    trainer.accelerator.backward = timed("backward", trainer.accelerator.backward)

    class Phases(TrainerCallback):
        def on_step_begin(self, *_, **__):
            phases.clear()
            phases["_start"] = time.perf_counter()

        def on_pre_optimizer_step(self, *_, **__):
            phases["_optimizer"] = time.perf_counter()

        def on_optimizer_step(self, *_, **__):
            phases["optimizer"] = time.perf_counter() - phases.pop("_optimizer")

        def on_step_end(self, *_, **__):
            step = time.perf_counter() - phases.pop("_start")
            row = {name: phases.get(name, 0.0) for name in PHASES if name != "other"}
            row["other"] = step - sum(row.values())
            row["step"] = step
            steps.append(row)

    trainer.add_callback(Phases())
    trainer.train()
    timed_steps = steps[args.warmup:]
    result = {name: statistics.mean(s[name] for s in timed_steps) for name in (*PHASES, "step")}
    logs = [row for row in trainer.state.log_history if "completions/mean_length" in row]
    result["mean_completion_length"] = statistics.mean(row["completions/mean_length"] for row in logs)
    result["all_steps"] = steps
    result["threads"] = torch.get_num_threads()
    result["peak_rss_gib"] = round(_peak_rss_gib(), 2)
    return result


def _peak_rss_gib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def fused_head(args) -> dict:
    """TRL's fused log-prob head at the step's shape, alone: forward + backward of `ChunkedLogProbFunction` over
    every position of the 16 sequences (what TRL scores on a CPU, prompt included), with and without the entropy
    TRL always asks for, and over the completion positions only (what it scores where Triton runs)."""
    import torch
    from transformers import AutoConfig, AutoTokenizer
    from trl.kernels import ChunkedLogProbFunction

    path = _model_path(args.model)
    config, tokenizer = AutoConfig.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    prompt = max(len(tokenizer.apply_chat_template([{"role": "user", "content": r["question"]}], tokenize=True,
                                                   add_generation_prompt=True, return_dict=True)["input_ids"])
                 for r in _questions(NUM_PROMPTS))
    rows = NUM_PROMPTS * NUM_GENERATIONS
    weight = torch.randn(config.vocab_size, config.hidden_size, requires_grad=True) * 0.02
    weight = weight.detach().requires_grad_(True)
    result = {"positions_all": rows * (prompt + MAX_NEW_TOKENS - 1), "positions_completion": rows * MAX_NEW_TOKENS}
    cases = (("all_with_entropy", result["positions_all"], ("log_probs", "entropy")),
             ("all_log_probs_only", result["positions_all"], ("log_probs",)),
             ("completion_with_entropy", result["positions_completion"], ("log_probs", "entropy")))
    for name, positions, outputs in cases:
        times = []
        for _ in range(args.warmup + args.steps):
            hidden = torch.randn(positions, config.hidden_size, requires_grad=True)
            targets = torch.randint(0, config.vocab_size, (positions,))
            start = time.perf_counter()
            logps, *_ = ChunkedLogProbFunction.apply(hidden, weight, None, targets, 1.0, 32768, None, 1.0, outputs)
            logps.sum().backward()
            times.append(time.perf_counter() - start)
            weight.grad = None
        result[name] = statistics.mean(times[args.warmup:])
    return result


def _parse_set(values):
    for item in values or []:
        key, _, value = item.partition("=")
        try:
            yield key, json.loads(value)
        except json.JSONDecodeError:
            yield key, value


def worker(args, variant: str) -> dict:
    if variant == "plain_generate":
        return plain_generate(args)
    if variant == "fused_head":
        return fused_head(args)
    return grpo_step(args, variant)


def run_isolated(variant: str, args) -> dict:
    """One variant in a fresh process (its own allocator, threads and model), the machine's load around it."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, os.path.abspath(__file__), "--_worker", variant, "--steps", str(args.steps), "--warmup",
           str(args.warmup), *(["--model", args.model] if args.model else []),
           *(["--natural_length"] if args.natural_length else []), *(["--set", *args.set] if args.set else [])]
    before = _load()
    start = time.perf_counter()
    # Every 5 s while it runs: the load, and any other process busy on the machine (this benchmark uses both cores).
    peak, seen = before["loadavg_1min"], set(before["busy_processes"])
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=env)
        while child.poll() is None:
            time.sleep(5)
            now = _load(exclude={child.pid})
            peak = max(peak, now["loadavg_1min"])
            seen.update(now["busy_processes"])
        out.seek(0), err.seek(0)
        stdout, stderr = out.read(), err.read()
    wall = time.perf_counter() - start
    after = _load()
    load = {"load_before": before, "load_after": after, "peak_loadavg_1min": peak, "other_busy_processes": sorted(seen)}
    if child.returncode != 0:
        lines = stderr.strip().splitlines()
        return {"variant": variant, "error": lines[-1] if lines else "failed", **load}
    row = json.loads(stdout.strip().splitlines()[-1])
    return {"variant": variant, **row, "wall_seconds": round(wall, 1), **load}


def format_table(rows: list[dict]) -> str:
    """Means in seconds; `x gen` is the step over the generation inside it, `x plain` over plain generate."""
    plain = next((r for r in rows if r["variant"] == "plain_generate" and "step" in r), None)
    head = ("| variant | step (s) | x its generation | x plain generate | " + " | ".join(PHASES)
            + " | peak RSS (GiB) | peak load, others busy |")
    lines = [head, "|---|" + "---:|" * (4 + len(PHASES)) + "---|"]
    for r in rows:
        load = f"{r.get('peak_loadavg_1min', r['load_after']['loadavg_1min']):.1f}, " + (
            "yes" if r.get("other_busy_processes") else "no")
        if "error" in r:
            lines.append(f"| {r['variant']} | failed: {r['error'][:80]} |" + " |" * (3 + len(PHASES)) + f" {load} |")
            continue
        if r["variant"] == "fused_head":
            continue
        if r["variant"] == "plain_generate":
            cells = [f"{r['generation']:.2f}"] + [""] * (len(PHASES) - 1)
            lines.append(f"| plain generate (16 x {r['new_tokens']}) | {r['step']:.2f} | 1.00 | 1.00 | "
                         + " | ".join(cells) + f" | {r.get('peak_rss_gib', '')} | {load} |")
            continue
        versus = f"{r['step'] / plain['step']:.2f}" if plain else "—"
        cells = [f"{r[name]:.2f}" for name in PHASES]
        lines.append(f"| {r['variant']} | {r['step']:.2f} | {r['step'] / r['generation']:.2f} | {versus} | "
                     + " | ".join(cells) + f" | {r.get('peak_rss_gib', '')} | {load} |")
    head = next((r for r in rows if r["variant"] == "fused_head" and "all_with_entropy" in r), None)
    if head:
        lines += ["", "| fused log-prob head alone (forward + backward) | positions | seconds |", "|---|---:|---:|",
                  f"| every position, log-probs and entropy (TRL on a CPU) | {head['positions_all']} | "
                  f"{head['all_with_entropy']:.2f} |",
                  f"| every position, log-probs only | {head['positions_all']} | {head['all_log_probs_only']:.2f} |",
                  f"| completion positions only, log-probs and entropy (TRL with Triton) | "
                  f"{head['positions_completion']} | {head['completion_with_entropy']:.2f} |"]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", nargs="+", default=None, choices=sorted(VARIANTS),
                        help=f"default: {', '.join(DEFAULT_VARIANTS)}; --quick: {', '.join(QUICK_VARIANTS)}")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per variant (mean); default 2, --quick 1")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    parser.add_argument("--quick", action="store_true", help="three variants, one timed step each")
    parser.add_argument("--model", default=None, help="a model folder (default: SmolLM2-135M-Instruct, offline)")
    parser.add_argument("--natural_length", action="store_true", help="let completions stop at their end of turn")
    parser.add_argument("--set", nargs="*", default=None, metavar="FIELD=VALUE",
                        help="GRPOConfig fields for every variant (JSON values)")
    parser.add_argument("--json", default="outputs/grpo_step_bench.json", help="where to write the results")
    parser.add_argument("--_worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.steps = args.steps or (1 if args.quick else 2)
    if args._worker:
        print(json.dumps(worker(args, args._worker)))
        return 0
    variants = args.variants or list(QUICK_VARIANTS if args.quick else DEFAULT_VARIANTS)
    rows = []
    for variant in variants:
        rows.append(run_isolated(variant, args))
        row = rows[-1]
        done = f"step {row['step']:.2f} s" if "step" in row else "done"
        busy = "; other jobs running" if row.get("other_busy_processes") else ""
        print(f"{variant}: " + ("failed: " + row["error"] if "error" in row else
                                f"{done} (peak load {row['peak_loadavg_1min']}{busy})"), flush=True)
    table = format_table(rows)
    print(table)
    import torch

    report = {
        "date": date.today().isoformat(),
        "machine": {"cpu": _cpu_name(), "cores": os.cpu_count(), "platform": platform.platform(),
                    "torch": torch.__version__, "threads": torch.get_num_threads()},
        "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
        "workload": {"prompts": NUM_PROMPTS, "generations": NUM_GENERATIONS, "max_new_tokens": MAX_NEW_TOKENS,
                     "fixed_length": not args.natural_length, "steps": args.steps, "warmup": args.warmup,
                     "set": args.set},
        "results": rows,
        "table": table,
    }
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1))
    print(f"wrote {path}")
    return 0


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    raise SystemExit(main())
