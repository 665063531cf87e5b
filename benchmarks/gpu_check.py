"""Everything a first GPU should measure, in one command that stays within one 10-minute call.

    python benchmarks/gpu_check.py                      # report in $OUT (or ./gpu_check_out)
    python benchmarks/gpu_check.py --budget 300 --stages kernels loss
    python benchmarks/gpu_check.py --list               # the stages and their time caps

Stages, in order (each within its cap and the whole within `--budget` seconds; a stage or variant that
would not finish is stopped and reported as such, never losing what came before):

  kernels   every registered loss's Triton row kernel on this GPU against the PyTorch path; a kernel
            that does not build (and falls back to PyTorch) is named with its error
  rowconf   the row kernels alone at 1,280 x 128,256 bf16, at the launch configuration the table picks
            for this GPU and at the alternatives, against the bandwidth the static report predicts
  loss      benchmarks/loss_bench.py at 16,384 x 128,256 x 4,096 bf16 with accuracy: TRL's nll, Liger,
            Cut Cross-Entropy, torch's linear_cross_entropy and trl_emo's losses, each in its own process
  step      benchmarks/step_bench.py: the Llama-3.2-1B shape, full bf16 training
  qlora     every loss under QLoRA (4-bit nf4, double quantization, LoRA r=16 on every linear layer, bf16
            compute, gradient checkpointing), the Llama-3.2-1B and Llama-3-8B shapes, one process and one
            quantized model per shape: step time against TRL's nll and peak memory; `use_liger_kernel: true`
            with gem (TRL keeps Liger's layer kernels, not its loss), its first loss against gem's without
            Liger; and a table of the consumer cards (8, 12, 16, 24 GiB) each configuration fits
  tests     python -m pytest -m gpu

The report (`gpu_check_<date>.md` and `.json`) is rewritten after every variant, with the machine,
the versions and every figure; an anchor that is not installed is a row saying so. It installs
nothing: on a lent machine carry the wheels on PYTHONPATH (../shared/docs/gpu.md).

Exit status 0 once the report is written, whatever it says (a failed test, a fallback, a stage out of
time are rows of the report: one call of a lent GPU must always bring its report back); 2 for a bad
command line or no CUDA GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import io
import json
import os
import platform
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
LOSS_SIZE = "16384x128256x4096"
# The baseline and the target first, so that a short budget still yields the ratios that matter.
LOSS_VARIANTS = ["trl_nll", "liger_nll", "gem", "emo", "sed", "eksft", "gem_ls", "nll", "eksft_authors", "cce_nll",
                 "torch_lce", "emo_live", "psft", "curio_sft", "prob", "iw_sft", "gift", "slm"]
STEP_VARIANTS = ["nll", "gem", "sed", "eksft", "emo", "gem_ls", "psft", "curio_sft", "prob", "iw_sft", "gift", "slm"]
# QLoRA: batch, timed steps, warm-up steps per shape (sequences of SEQ tokens); the baseline and the targets first
# (PSFT's old policy and CurioSFT's teacher are an adapter's copy under QLoRA), then every other registered loss, then
# gem with Liger's layer kernels (last: Liger patches the model in place).
QLORA_SHAPES = {"llama-3.2-1b": (4, 3, 1), "llama-3-8b": (2, 2, 1)}
QLORA_SHARE = {"llama-3.2-1b": 0.35}  # of the stage's time left; the last shape takes the rest
QLORA_FIRST = ("nll", "gem", "emo", "psft", "curio_sft")
LIGER_VARIANT = "gem_liger"
# A configuration fits a card when its peak reserved memory plus the device memory outside PyTorch's allocator (the
# CUDA context, library handles) stays within 95 % of the card's memory (the rest for the driver and a display).
CARDS_GIB = (8, 12, 16, 24)
CARD_USABLE = 0.95
# Liger's layer kernels (RMSNorm, SwiGLU, RoPE) compute in bf16 in another order: the first loss, before any update,
# agrees with gem's to this relative difference or the report says it does not.
LIGER_TOLERANCE = 1e-2
ROW_KERNELS = ["nll", "gem_logsigmoid", "emo"]
ROW_CANDIDATES = [(2048, 4), (4096, 8), (8192, 16), (16384, 16)]
ROW_SHAPE = (1280, 128_256)  # one default chunk of a 128k vocabulary in bf16
KERNEL_SHAPE = (512, 256, 32_000)  # tokens, hidden, vocabulary of the per-loss kernel check
# step_bench shape, batch, timed steps, warm-up steps (sequences of SEQ tokens).
STEP_SHAPES = {"step": ("llama-3.2-1b", 4, 6, 2)}
SEQ = 2048
DEVICE = "cuda"  # the workers' device (a CPU smoke run of the workers sets "cpu")
# Memory bandwidth (GB/s) of GPUs by name, for the row pass's share of it.
BANDWIDTH = {"H200": 4800, "H100 80GB HBM3": 3350, "H100 PCIe": 2000, "A100-SXM4-80GB": 2039, "A100-SXM4-40GB": 1555,
             "A100 80GB PCIe": 1935, "RTX 4090": 1008, "RTX 3090": 936, "A10": 600, "L4": 300, "L40S": 864}
# A variant is not started with less time than this left (it could not even import torch).
MIN_START_S = 5.0
PACKAGES = ("torch", "triton", "transformers", "trl", "peft", "accelerate", "bitsandbytes", "liger-kernel",
            "cut-cross-entropy", "datasets", "trl-emo")


@dataclass
class Stage:
    name: str
    cap: float  # seconds at most
    what: str


# Caps sum to more than the default budget on purpose: a stage that finishes early leaves its time to
# the next ones, and the budget stops the run wherever it is.
STAGES = [
    Stage("kernels", 45, "row kernels on this GPU against the PyTorch path"),
    Stage("rowconf", 45, "row kernels alone at each launch configuration"),
    Stage("loss", 200, f"loss benchmark {LOSS_SIZE} bf16, each variant in its own process"),
    Stage("step", 240, "trainer step, Llama-3.2-1B shape, full bf16"),
    Stage("qlora", 420, "trainer step under QLoRA, every loss, Llama-3.2-1B (4 x 2,048) and Llama-3-8B (2 x 2,048)"),
    Stage("tests", 150, "python -m pytest -m gpu"),
]


# -- running under a deadline ----------------------------------------------------------------------


@dataclass
class Outcome:
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool


def run_limited(cmd: list[str], timeout: float, env: dict | None = None, cwd: Path = ROOT) -> Outcome:
    """Run `cmd`; past `timeout` seconds kill it and everything it started (its process group)."""
    start = time.monotonic()
    if timeout <= 0:
        return Outcome(None, "", "", 0.0, True)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        timed_out = True
    return Outcome(None if timed_out else proc.returncode, out or "", err or "", time.monotonic() - start, timed_out)


@dataclass
class Budget:
    total: float
    start: float = field(default_factory=time.monotonic)

    def left(self) -> float:
        return self.total - (time.monotonic() - self.start)


def last_json(text: str) -> dict | None:
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                return None
    return None


def all_json(text: str) -> list[dict]:
    """Every JSON object printed on a line of its own (a worker that reports as it goes)."""
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:400] if lines else ""


# -- the report ------------------------------------------------------------------------------------


def versions() -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def machine() -> dict:
    info = {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count()}
    try:
        import torch

        info["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            info.update(gpu=props.name, capability=f"{props.major}.{props.minor}", sms=props.multi_processor_count,
                        memory_gib=round(props.total_memory / 2**30, 1), gpus=torch.cuda.device_count())
    except Exception as exc:  # the report says what it could not read
        info["torch_error"] = f"{type(exc).__name__}: {exc}"
    return info


def _fmt(value, digits=3) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def render(report: dict) -> str:
    """The Markdown report: machine, versions, then one table per stage, each row a variant or its fate."""
    m = report["machine"]
    lines = [f"# GPU check, {report['date']}", "",
             f"Command: `{report['command']}`  ",
             f"Machine: {m.get('gpu', 'no CUDA GPU')} (compute capability {m.get('capability', '-')}, "
             f"{m.get('sms', '-')} SMs, {m.get('memory_gib', '-')} GiB), CUDA {m.get('cuda', '-')}, "
             f"{m.get('cpus')} CPUs, Python {m.get('python')}  ",
             "Versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()) + "  ",
             f"Budget: {report['budget_s']:.0f} s; used {report.get('elapsed_s', 0):.0f} s"
             + ("" if report.get("finished") else " (still running or stopped: the stages below are what came back)"),
             ""]
    fallbacks = {k: v for stage in report["stages"].values() for row in stage.get("rows", [])
                 for k, v in (row.get("fallbacks") or {}).items()}
    if fallbacks:
        lines += ["**Row kernels that fell back to PyTorch:**", ""]
        lines += [f"- `{name}`: {error}" for name, error in sorted(fallbacks.items())]
        lines.append("")
    for name, stage in report["stages"].items():
        lines += [f"## {name}: {stage['what']}", "", f"Status: {stage['status']} ({stage.get('seconds', 0):.0f} s)", ""]
        rows = stage.get("rows", [])
        if rows:
            keys = [k for k in stage.get("columns", []) if any(k in r for r in rows)]
            lines.append("| " + " | ".join(["variant", *keys, "note"]) + " |")
            lines.append("|" + "---|" * (len(keys) + 2))
            for r in rows:
                note = r.get("note", "")
                lines.append("| " + " | ".join([str(r.get("variant", "")), *(_fmt(r.get(k)) for k in keys), note]) + " |")
            lines.append("")
        if stage.get("text"):
            lines += ["```", stage["text"].rstrip(), "```", ""]
    return "\n".join(lines)


class Report:
    """The report on disk, rewritten whole (JSON and Markdown) after every change."""

    def __init__(self, out_dir: Path, command: str, budget: float, info: dict | None = None, env: dict | None = None):
        out_dir.mkdir(parents=True, exist_ok=True)
        stamp = date.today().isoformat()
        self.json_path = out_dir / f"gpu_check_{stamp}.json"
        self.md_path = out_dir / f"gpu_check_{stamp}.md"
        self.start = time.monotonic()
        self.data = {"date": stamp, "command": command, "budget_s": budget, "machine": info or machine(),
                     "versions": env or versions(), "stages": {}, "finished": False}

    def stage(self, stage: Stage, status: str = "running", columns: list[str] | None = None) -> dict:
        entry = {"what": stage.what, "status": status, "rows": [], "columns": columns or [], "seconds": 0.0}
        self.data["stages"][stage.name] = entry
        self.save()
        return entry

    def save(self) -> None:
        self.data["elapsed_s"] = time.monotonic() - self.start
        tmp = self.json_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        tmp.replace(self.json_path)
        self.md_path.write_text(render(self.data))


# -- the stages ----------------------------------------------------------------------------------


def _env() -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    env.pop("TRITON_INTERPRET", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def _variant_row(variant: str, outcome: Outcome, result: dict | None) -> dict:
    """One variant's row: its figures, or why there are none (not installed, failed, out of time)."""
    if outcome.timed_out:
        return {"variant": variant, "note": f"stopped after {outcome.seconds:.0f} s (time cap)"}
    if result is None:
        return {"variant": variant, "note": f"failed (exit {outcome.returncode}): {last_line(outcome.stderr or outcome.stdout)}"}
    row = {"variant": variant, **result}
    if "unavailable" in result:
        row["note"] = f"not installed: {result['unavailable']}"
    elif "error" in result:
        row["note"] = f"failed: {result['error']}"
    elif result.get("fallbacks"):
        row["note"] = "fell back to PyTorch: " + "; ".join(f"{k}: {v}" for k, v in result["fallbacks"].items())
    return row


def _run_variants(report: Report, stage: Stage, budget: Budget, variants: list[str], command, columns: list[str]) -> None:
    entry = report.stage(stage, columns=columns)
    start = time.monotonic()
    for i, variant in enumerate(variants):
        left = min(stage.cap - (time.monotonic() - start), budget.left())
        if left < MIN_START_S:
            for rest in variants[i:]:
                entry["rows"].append({"variant": rest, "note": "not run: out of time"})
            entry["status"] = "out of time"
            break
        outcome = run_limited(command(variant), left, env=_env())
        entry["rows"].append(_variant_row(variant, outcome, last_json(outcome.stdout)))
        entry["seconds"] = time.monotonic() - start
        report.save()
    else:
        entry["status"] = "done"
    entry["seconds"] = time.monotonic() - start
    report.save()


def _self(*args: str) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), *args]


def stage_kernels(report: Report, stage: Stage, budget: Budget) -> None:
    columns = ["loss_rel_error", "grad_rel_error", "backend", "seconds"]
    _run_variants(report, stage, budget, ["all"], lambda _: _self("--_kernels"), columns)
    # The one worker reports every loss: spread its rows out.
    entry = report.data["stages"][stage.name]
    rows = entry["rows"]
    if rows and isinstance(rows[0].get("losses"), list):
        entry["rows"] = [_variant_row(r["variant"], Outcome(0, "", "", 0, False), r) for r in rows[0]["losses"]]
        report.save()


def stage_rowconf(report: Report, stage: Stage, budget: Budget) -> None:
    columns = ["block", "warps", "table", "ms", "gb_per_s", "of_peak"]
    _run_variants(report, stage, budget, ROW_KERNELS, lambda k: _self("--_rowconf", k), columns)
    entry = report.data["stages"][stage.name]
    spread = []
    for row in entry["rows"]:
        if isinstance(row.get("configs"), list):
            spread += [{"variant": row["variant"], **c} for c in row["configs"]]
        else:
            spread.append(row)
    entry["rows"] = spread
    report.save()


ONLY: list[str] | None = None  # --variants


def _only(variants: list[str]) -> list[str]:
    return [v for v in variants if ONLY is None or v in ONLY]


def stage_loss(report: Report, stage: Stage, budget: Budget) -> None:
    columns = ["seconds", "peak_extra_bytes", "loss_rel_error", "grad_hidden_rel_error", "grad_head_rel_error"]

    def command(variant):
        return _self("--_loss", variant)

    _run_variants(report, stage, budget, _only(LOSS_VARIANTS), command, columns)


def stage_step(report: Report, stage: Stage, budget: Budget) -> None:
    columns = ["step_seconds", "peak_bytes", "last_loss"]
    variants = _only(STEP_VARIANTS)

    def command(variant):
        return _self("--_step", variant)

    _run_variants(report, stage, budget, variants, command, columns)


def qlora_variants(only: list[str] | None = None) -> list[str]:
    """TRL's nll, gem and emo, every other registered loss, then gem with Liger's layer kernels (`--variants` keeps
    some)."""
    from trl_emo.losses import list_losses

    names = [*QLORA_FIRST, *(n for n in list_losses() if n not in QLORA_FIRST), LIGER_VARIANT]
    return [n for n in names if only is None or n in only]


def _gib(value) -> float | None:
    return None if value is None else value / 2**30


def qlora_summary(rows: list[dict]) -> list[dict]:
    """Per shape: each step against TRL's nll's, the memory a card needs, and Liger's first loss against gem's."""
    for row in rows:
        if row.get("peak_bytes") is not None:
            row["peak_gib"] = _gib(row["peak_bytes"])
        if row.get("peak_reserved_bytes") is not None:
            row["needed_gib"] = _gib(row["peak_reserved_bytes"] + row.get("outside_allocator_bytes", 0))
        if row.get("state_bytes") is not None:  # a reference's, an old policy's or a teacher's weights
            row["state_mib"] = row["state_bytes"] / 2**20
    for shape in {row.get("shape") for row in rows}:
        same = {row["variant"]: row for row in rows if row.get("shape") == shape and "step_seconds" in row}
        base = same.get("nll")
        for row in same.values():
            if base:
                row["vs_nll"] = row["step_seconds"] / base["step_seconds"]
        liger, gem = same.get(LIGER_VARIANT), same.get("gem")
        if liger and gem and liger.get("first_loss") is not None and gem.get("first_loss") is not None:
            difference = abs(liger["first_loss"] - gem["first_loss"]) / max(abs(gem["first_loss"]), 1e-12)
            liger["loss_vs_gem"] = difference
            verdict = (f"first loss equals gem's without Liger within {LIGER_TOLERANCE:g}" if difference <= LIGER_TOLERANCE
                       else f"first loss DIFFERS from gem's without Liger by {difference:.3g} (> {LIGER_TOLERANCE:g})")
            liger["note"] = "; ".join(filter(None, [liger.get("note"), verdict, liger.get("liger_layers")]))
    return rows


def qlora_fit(rows: list[dict]) -> dict:
    """The `qlora_fit` report entry: which card each measured configuration fits."""
    columns = ["needed_gib", *(f"{c} GiB" for c in CARDS_GIB)]
    fit_rows = []
    for row in rows:
        if row.get("needed_gib") is None:
            continue
        needed = row["needed_gib"]
        fit_rows.append({"variant": f"{row['shape']} {row['variant']}", "needed_gib": needed,
                         **{f"{c} GiB": "yes" if needed <= CARD_USABLE * c else "no" for c in CARDS_GIB}})
    return {"what": f"the consumer cards each QLoRA configuration fits: peak reserved memory plus the memory outside "
                    f"PyTorch's allocator, against {CARD_USABLE:.0%} of each card",
            "status": "done" if fit_rows else "nothing measured", "rows": fit_rows, "columns": columns, "seconds": 0.0}


def stage_qlora(report: Report, stage: Stage, budget: Budget) -> None:
    """One worker process per shape, each training every variant on one quantized model and printing a row per
    variant as it goes (what came back before a time cap is kept)."""
    columns = ["shape", "step_seconds", "vs_nll", "peak_gib", "needed_gib", "state_mib", "first_loss", "last_loss",
               "loss_vs_gem"]
    entry = report.stage(stage, columns=columns)
    start = time.monotonic()
    shapes = list(QLORA_SHAPES)
    stopped = False
    for i, shape in enumerate(shapes):
        left = min(stage.cap - (time.monotonic() - start), budget.left())
        share = left * QLORA_SHARE.get(shape, 1.0) if i < len(shapes) - 1 else left
        if share < MIN_START_S:
            entry["rows"].append({"variant": "all", "shape": shape, "note": "not run: out of time"})
            stopped = True
            continue
        # The worker stops starting variants with a margin before the cap, so that it ends on its own.
        cmd = _self("--_qlora", "--_shape", shape, "--_seconds", f"{max(share - 10, 1):.0f}",
                    *(["--variants", *ONLY] if ONLY else []))
        outcome = run_limited(cmd, share, env=_env())
        results = all_json(outcome.stdout)
        for result in results:
            row = _variant_row(result.get("variant", "?"), Outcome(0, "", "", 0, False), result)
            entry["rows"].append({"shape": shape, **row})
        if outcome.timed_out or not results or outcome.returncode:
            row = _variant_row("worker", outcome, None if outcome.timed_out or not results else {})
            entry["rows"].append({"shape": shape, **row})
            stopped = stopped or outcome.timed_out
        qlora_summary(entry["rows"])
        entry["seconds"] = time.monotonic() - start
        report.save()
    entry["status"] = "out of time" if stopped else "done"
    report.data["stages"]["qlora_fit"] = qlora_fit(entry["rows"])
    report.save()


def stage_tests(report: Report, stage: Stage, budget: Budget) -> None:
    entry = report.stage(stage, columns=[])
    left = min(stage.cap, budget.left())
    junit = Path(report.json_path.parent) / "gpu_tests.xml"
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "-rfE", f"--junitxml={junit}", "tests"]
    outcome = run_limited(cmd, left, env=_env())
    summary = last_line(outcome.stdout)
    if outcome.timed_out:
        entry["status"] = f"stopped after {outcome.seconds:.0f} s (time cap); progress: {summary}"
    else:
        entry["status"] = f"exit {outcome.returncode}: {summary}"
    failures = [line for line in outcome.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    entry["text"] = "\n".join(failures[-40:]) if failures else ""
    entry["seconds"] = outcome.seconds
    report.save()


RUNNERS = {
    "kernels": stage_kernels,
    "rowconf": stage_rowconf,
    "loss": stage_loss,
    "step": stage_step,
    "qlora": stage_qlora,
    "tests": stage_tests,
}


# -- workers (one process each) ------------------------------------------------------------------


def _fallbacks() -> dict:
    from trl_emo.losses import fused

    return {name: error.splitlines()[0][:300] for name, error in fused._BROKEN_ROW_KERNELS.items()}


def _load(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def worker_kernels() -> dict:
    """Every registered row kernel on a small CUDA problem against the PyTorch path (bf16)."""
    import torch

    from trl_emo.losses import CostEmbedding, fused_linear_loss, get_loss, list_losses
    from trl_emo.losses.asft import ReferenceHead
    from trl_emo.losses.fused import resolve_backend
    from trl_emo.training.config import loss_defaults

    n, hidden, vocab = KERNEL_SHAPE
    g = torch.Generator(device=DEVICE).manual_seed(0)
    h = torch.randn(n, hidden, device=DEVICE, generator=g).to(torch.bfloat16)
    w = (0.05 * torch.randn(vocab, hidden, device=DEVICE, generator=g)).to(torch.bfloat16)
    y = torch.randint(0, vocab, (n,), device=DEVICE, generator=g)
    rows = []
    for name in list_losses(include_trl=False):
        spec = get_loss(name)
        if spec.row_kernel is None:
            continue
        try:
            hp = loss_defaults(name)
        except KeyError:
            hp = {}
        if spec.uses_cost_embedding:
            hp["cost_embedding"] = CostEmbedding(w)
        if name == "sed":
            hp["threshold"] = 0.9  # the trainer calibrates it on the starting model; the kernel takes a number
        if spec.wants_reference(hp):
            # Not the policy's own head: a reference equal to the policy makes every KL zero up to rounding, and
            # EKSFT's top-KL selection then ranks rounding noise (a different selection per backend).
            w_ref = (w.float() + 0.02 * torch.randn(w.shape, device=DEVICE, generator=g)).to(w.dtype)
            hp["reference"] = ReferenceHead(h, w_ref)
        start = time.perf_counter()
        try:
            out = {}
            for backend in ("auto", "torch"):
                hh, ww = h.clone().requires_grad_(True), w.clone().requires_grad_(True)
                res = fused_linear_loss(hh, ww, y, spec, hp, backend=backend)
                out[backend] = (res.loss.detach().float(), *torch.autograd.grad(res.loss, (hh, ww)))
            loss_err = float((out["auto"][0] - out["torch"][0]).abs() / out["torch"][0].abs().clamp_min(1e-12))
            grad_err = max(float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))
                           for a, b in zip(out["auto"][1:], out["torch"][1:]))
            fell = _fallbacks()
            backend = "torch (fallback)" if name in fell else resolve_backend("auto", spec, h.device, h.dtype)
            rows.append({"variant": name, "loss_rel_error": loss_err, "grad_rel_error": grad_err, "backend": backend,
                         "seconds": time.perf_counter() - start, "fallbacks": {name: fell[name]} if name in fell else {}})
        except Exception as exc:  # one loss failing must not hide the others
            rows.append({"variant": name, "error": f"{type(exc).__name__}: {exc}"[:400]})
    return {"losses": rows}


def worker_rowconf(kernel: str) -> dict:
    """One row kernel alone on a default chunk, at each candidate configuration; GB/s of the row pass."""
    import torch

    from trl_emo.losses import CostEmbedding, _triton, get_loss

    loss, hp = {"nll": ("nll", {}), "gem_logsigmoid": ("gem", {"beta": 0.7, "h": "logsigmoid"}),
                "emo": ("emo", {"weighting": "mle", "demd": "reference", "ratio_cap": None})}[kernel]
    spec = get_loss(loss)
    rows, vocab = ROW_SHAPE
    g = torch.Generator(device=DEVICE).manual_seed(0)
    z = (3 * torch.randn(rows, vocab, device=DEVICE, generator=g)).to(torch.bfloat16)
    targets = torch.randint(0, vocab, (rows,), device=DEVICE, generator=g)
    stats = torch.empty(5, rows, device=DEVICE)
    scratch = torch.empty(rows // 4, vocab, device=DEVICE, dtype=torch.bfloat16) if spec.scratch_rows else None
    if spec.uses_cost_embedding:
        hp = {**hp, "cost_embedding": CostEmbedding(torch.randn(vocab, 64, device=DEVICE, generator=g))}
    launch = _triton.RowLaunch(z, targets, z[torch.arange(rows, device=DEVICE), targets].float(), None, stats,
                               torch.full((1,), 1 / rows, device=DEVICE), 1.0, None, True, scratch=scratch)
    capability = launch.capability or 80  # None only in a CPU smoke run (interpreter)
    table = _triton.launch_config(kernel, capability)
    # Read twice, gradient written once (3 x 2 bytes per logit); EMO's timed call also writes its cost
    # products and reads them twice (3 x 2 more).
    bytes_moved = rows * vocab * 2 * (6 if loss == "emo" else 3)
    name = torch.cuda.get_device_name(0) if DEVICE == "cuda" else "cpu"
    peak = next((gbs for key, gbs in BANDWIDTH.items() if key in name), None)

    def sync():
        if DEVICE == "cuda":
            torch.cuda.synchronize()
    saved = dict(_triton.LAUNCH_CONFIGS[kernel])
    out = []
    try:
        for block, warps in dict.fromkeys([table, *ROW_CANDIDATES]):
            _triton.LAUNCH_CONFIGS[kernel] = {capability: (block, warps)}
            try:
                spec.row_kernel(launch, **hp)  # compile and warm up
                sync()
                start = time.perf_counter()
                for _ in range(10):
                    spec.row_kernel(launch, **hp)
                sync()
                ms = (time.perf_counter() - start) * 100  # per call, in ms
                gbs = bytes_moved / ms / 1e6
                out.append({"block": block, "warps": warps, "table": (block, warps) == table, "ms": ms, "gb_per_s": gbs,
                            "of_peak": gbs / peak if peak else None})
            except Exception as exc:  # a configuration that does not build is a row, not the end
                out.append({"block": block, "warps": warps, "table": (block, warps) == table,
                            "note": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"})
    finally:
        _triton.LAUNCH_CONFIGS[kernel] = saved
    return {"variant": kernel, "configs": out, "capability": capability}


def worker_loss(variant: str) -> dict:
    """loss_bench.py's worker for one variant at the H100 shape, plus the kernels that fell back."""
    loss_bench = _load("loss_bench")
    tokens, vocab, hidden = loss_bench.parse_size(LOSS_SIZE)
    options = {"backend": "auto", "fp32_weight_grad": False}
    result = loss_bench.worker(variant, tokens, vocab, hidden, "bfloat16", DEVICE, 8, None, options, True)
    result["fallbacks"] = _fallbacks()
    return result


def worker_qlora(shape: str, seconds: float, only: list[str] | None = None) -> None:
    """Every QLoRA variant on one model of `shape` (`step_bench.quantized_model`, PEFT's LoRA r=16 on every linear
    layer), the adapter restored before each; one JSON line per variant as soon as it is done. A variant is not
    started when less than 1.3 times the longest one so far is left of `seconds`."""
    import gc
    import importlib.util

    start = time.monotonic()

    def emit(row):
        print(json.dumps({"shape": shape, **row}, default=str), flush=True)

    step_bench = _load("step_bench")
    variants = qlora_variants(only)
    batch, steps, warmup = QLORA_SHAPES[shape]
    try:
        import torch
        from peft import get_peft_model

        base = step_bench.quantized_model(shape, DEVICE)
        quantized = sum(type(m).__module__.startswith("bitsandbytes") for m in base.modules())
        model = get_peft_model(base, step_bench.lora_config())
    except Exception as exc:  # the report says why no variant ran
        for variant in variants:
            emit({"variant": variant, "error": f"building the model: {type(exc).__name__}: {str(exc)[:300]}"})
        return
    initial = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    longest = 0.0
    for variant in variants:
        if seconds - (time.monotonic() - start) < max(1.3 * longest, MIN_START_S):
            emit({"variant": variant, "note": "not run: out of time"})
            continue
        liger = variant == LIGER_VARIANT
        if liger and importlib.util.find_spec("liger_kernel") is None:
            emit({"variant": variant, "unavailable": "liger_kernel is not installed"})
            continue
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name in initial:
                    param.copy_(initial[name])
        began = time.monotonic()
        try:
            row = step_bench.train_variant(model, "gem" if liger else variant, shape, batch, SEQ, steps, warmup, DEVICE,
                                           liger=liger, qlora=True)
            row.update(variant=variant, quantized_layers=quantized)
            if liger:
                row["liger_layers"] = _liger_layers(model)
        except Exception as exc:
            row = {"variant": variant, "error": f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:300]}"}
        row["fallbacks"] = _fallbacks()
        emit(row)
        longest = max(longest, time.monotonic() - began)
        gc.collect()
        if DEVICE == "cuda":
            torch.cuda.empty_cache()


def _liger_layers(model) -> str:
    """Which of the model's layers Liger replaced (its norms' and MLPs' forward come from `liger_kernel`)."""
    patched = sorted({type(m).__name__ for m in model.modules()
                      if "liger" in (getattr(getattr(m, "forward", None), "__module__", "") or "")})
    return "Liger layers: " + (", ".join(patched) if patched else "none found")


def worker_step(variant: str) -> dict:
    """step_bench.py's worker for one variant (the 1B shape, full bf16), plus the kernels that fell back."""
    step_bench = _load("step_bench")
    shape, batch, steps, warmup = STEP_SHAPES["step"]
    argv = ["--_worker", variant, "--shape", shape, "--batch", str(batch), "--seq", str(SEQ), "--steps", str(steps),
            "--warmup", str(warmup), "--device", DEVICE]
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        step_bench.main(argv)
    result = last_json(buffer.getvalue()) or {"error": "the step worker printed no result"}
    result["fallbacks"] = _fallbacks()
    return result


# -- command line --------------------------------------------------------------------------------


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 2)[2])
    parser.add_argument("--out", default=None, help="report folder (default: $OUT, else ./gpu_check_out)")
    parser.add_argument("--budget", type=float, default=540.0, help="seconds for everything (default 540: one 10-minute call, with room to copy the report)")
    parser.add_argument("--stages", nargs="+", default=[s.name for s in STAGES], metavar="STAGE",
                        help=f"stages to run, in this order: {', '.join(s.name for s in STAGES)}")
    parser.add_argument("--list", action="store_true", help="print the stages and their time caps, and stop")
    parser.add_argument("--variants", nargs="+", default=None, metavar="VARIANT",
                        help="only these variants in the loss and step stages (a second, shorter call: e.g. the "
                        "baseline and the variants a first call left out)")
    parser.add_argument("--_kernels", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--_rowconf", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--_loss", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--_step", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--_qlora", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--_shape", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--_seconds", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    unknown = [s for s in args.stages if s not in RUNNERS]
    if unknown:
        parser.error(f"unknown stage {unknown[0]!r}; choose from {', '.join(RUNNERS)}")
    if not 10 <= args.budget <= 3600:
        parser.error(f"--budget must be between 10 and 3600 seconds, got {args.budget:g}")
    return args


def main(argv=None) -> int:
    global ONLY
    args = parse_args(argv)
    ONLY = args.variants
    if args._qlora and args._shape:
        worker_qlora(args._shape, args._seconds or 300.0, ONLY)
        return 0
    worker = next(((k, v) for k, v in (("kernels", args._kernels), ("rowconf", args._rowconf), ("loss", args._loss),
                                       ("step", args._step)) if v), None)
    if worker:
        kind, value = worker
        result = {"kernels": worker_kernels, "rowconf": lambda: worker_rowconf(value), "loss": lambda: worker_loss(value),
                  "step": lambda: worker_step(value)}[kind]()
        print(json.dumps(result, default=str))
        return 0
    if args.list:
        for stage in STAGES:
            print(f"{stage.name:8s} up to {stage.cap:4.0f} s  {stage.what}")
        return 0
    info = machine()
    if "gpu" not in info:
        print(f"gpu_check: no CUDA GPU here ({info.get('torch_error', 'torch.cuda.is_available() is False')}); "
              "the CPU-side checks are `pytest tests/test_gpu_check.py`.", file=sys.stderr)
        return 2
    out_dir = Path(args.out or os.environ.get("OUT") or "gpu_check_out")
    budget = Budget(args.budget)
    report = Report(out_dir, "python benchmarks/gpu_check.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                    args.budget, info)
    print(f"gpu_check: writing {report.md_path} as it goes", file=sys.stderr, flush=True)
    by_name = {s.name: s for s in STAGES}
    for name in args.stages:
        stage = by_name[name]
        if budget.left() < 10:
            report.stage(stage, status="not run: out of time")
            continue
        print(f"gpu_check: {name} ({budget.left():.0f} s left)", file=sys.stderr, flush=True)
        RUNNERS[name](report, stage, budget)
    report.data["finished"] = True
    report.save()
    print(report.md_path.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
