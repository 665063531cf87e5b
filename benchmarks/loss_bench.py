"""Forward+backward time and peak memory of the LM-head losses, each measured in its own process.

    python benchmarks/loss_bench.py --sizes 4096x32000x512 16384x32000x256 --device cpu
    python benchmarks/loss_bench.py --sizes 16384x128256x4096 --device cuda --dtype bfloat16 --accuracy
    python benchmarks/loss_bench.py --sizes 4096x32000x512 --threads 1 --clock cpu   # on a shared CPU machine

Variants (`--variants`):
  trl_nll         TRL 1.16's fused head kernel (`ChunkedLogProbFunction`), as its SFTTrainer calls it
                  (log-probs + entropy + top-1, `-sum(log_probs) / N`): the baseline of every ratio.
  liger_nll       Liger's `LigerFusedLinearCrossEntropyLoss` (needs `pip install liger-kernel`; GPU).
  cce_nll         Cut Cross-Entropy's `linear_cross_entropy` (needs `pip install cut-cross-entropy`; GPU).
  torch_lce       torch's own chunked `F.linear_cross_entropy(..., options=LinearCrossEntropyOptions())`
                  (torch >= 2.13).
  trl_nll_logits  plain logits + `torch.nn.functional.cross_entropy` (what TRL avoids).
  <loss>          trl_emo's fused path (`fused_linear_loss`, `--backend`): nll, gem, gem_ls
                  (h=logsigmoid), emo, emo_live (cost = the live head), tailr, mixce, ce_entropy,
                  eaft (top-20 entropy), eaft_full (full entropy), asft (the reference model's hidden
                  states and head are inputs like the policy's: its own memory is reported apart,
                  as `reference_model_bytes`; the loss's peak counts its reference-logits buffer),
                  sed (threshold 0.9: the trainer calibrates it), eksft (the paper's formula; its reference as
                  ASFT's), eksft_authors (the authors' formula on the target rows), psft (an old policy as
                  ASFT's reference), curio_sft (a teacher as ASFT's reference, top-512 temperature search), prob (q = 10),
                  prob_top (q = 1 and a threshold: its first pass), iw_sft, gift, slm (their reference as ASFT's;
                  iw_sft's tokens one sequence, which costs what many do).
                  Hyper-parameters are SFTConfig's defaults.
  logits_<loss>   trl_emo's logits path: full float32 logits, then the reference per-token function.
  <loss>_weighted the same fused loss with per-token loss weights (uniform in [0, 2]): their cost.
  <loss>_frozen_head, <loss>_lora_head
                  the fused loss with the head frozen (LoRA, QLoRA: no head gradient), and with a LoRA
                  adapter (r=16, alpha 32) on that frozen head: `a = s·A h` through autograd, `a B^T` added to
                  each chunk's logits, the gradients of `a` and `B` (`HeadAdapter`): the adapter's cost.
  trl_gem_tempered GEM-linear through TRL's kernel at temperature beta (same gradient, see losses.md),
                  plus a no-grad pass at temperature 1 for the logged cross-entropy and entropy.

Memory is the peak *extra* memory of one forward+backward over the inputs (hidden, head, targets
and EMO's cost table already allocated), the returned gradients included: peak RSS minus RSS
before the call on CPU, `max_memory_allocated` minus allocated before the call on CUDA. Time is
the median of `--repeats` calls after that first one. Every variant runs in a fresh process, so
no allocator state leaks. A variant whose package is missing is reported as such, not failed.

`--accuracy` adds, per variant, the relative error of the loss and of the two gradients (Frobenius
norm) against the same formula in float64 on the same (rounded) inputs, computed chunk by chunk.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import date

VARIANTS = [
    "trl_nll", "liger_nll", "cce_nll", "torch_lce", "trl_nll_logits", "nll", "gem", "gem_ls", "emo", "emo_live",
    "tailr", "mixce", "ce_entropy", "eaft", "eaft_full", "asft", "sed", "eksft", "eksft_authors", "psft", "curio_sft",
    "trl_gem_tempered",
    "logits_gem", "logits_emo", "prob", "prob_top", "iw_sft", "gift", "slm",
]
# Anchors that compute cross-entropy (their float64 reference is nll), and what each needs.
NLL_ANCHORS = {"trl_nll", "liger_nll", "cce_nll", "torch_lce", "trl_nll_logits"}
OPTIONAL = {"liger_nll": "liger_kernel", "cce_nll": "cut_cross_entropy"}
# variant -> (loss_type, settings other than SFTConfig's defaults)
LOSS_VARIANTS = {
    "nll": ("nll", {}),
    "gem": ("gem", {}),
    "gem_ls": ("gem", {"h": "logsigmoid"}),
    "emo": ("emo", {}),
    "emo_live": ("emo", {}),
    "tailr": ("tailr", {}),
    "mixce": ("mixce", {}),
    "ce_entropy": ("ce_entropy", {}),
    "eaft": ("eaft", {}),
    "eaft_full": ("eaft", {"entropy": "full"}),
    "asft": ("asft", {}),
    # SED's threshold is calibrated by the trainer; a fixed one costs the same.
    "sed": ("sed", {"threshold": 0.9}),
    "eksft": ("eksft", {}),
    "eksft_authors": ("eksft", {"formula": "authors"}),
    # The old policy's / the teacher's hidden states and head as the reference (PSFT: an old policy other than the
    # current model, as on 7 of every 8 steps; CurioSFT: its teacher, the top 512 logits of each row searched).
    "psft": ("psft", {}),
    "curio_sft": ("curio_sft", {}),
    "prob": ("prob", {}),
    # A threshold (here "OnlyTopP-1e-5": about half the tokens of a random model) adds a first pass over the chunks.
    "prob_top": ("prob", {"q": 1.0, "only": "top", "threshold": 1e-5}),
    "iw_sft": ("iw_sft", {}),
    "gift": ("gift", {}),
    "slm": ("slm", {}),
}


def loss_args(variant: str) -> tuple[str, dict]:
    from trl_emo.training.config import loss_defaults

    name, overrides = LOSS_VARIANTS[variant]
    return name, {**loss_defaults(name), **overrides}


def _rss_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_rss_bytes() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class Unavailable(RuntimeError):
    """The variant's package (or torch feature) is not installed here."""


# Suffixes of a trl_emo variant: per-token weights, a frozen head, a LoRA adapter on the frozen head.
SUFFIXES = ("_weighted", "_frozen_head", "_lora_head")
LORA_RANK, LORA_ALPHA = 16, 32


def split_variant(variant: str) -> tuple[str, str]:
    """`(base variant, suffix)`: `gem_lora_head` -> `("gem", "_lora_head")`; a plain variant has suffix `""`."""
    for suffix in SUFFIXES:
        if variant.endswith(suffix) and variant[: -len(suffix)] in LOSS_VARIANTS:
            return variant[: -len(suffix)], suffix
    return variant, ""


def build_step(variant, hidden, weight, targets, cost, options=None, reference=None, weights=None, adapter=None):
    """A closure running one forward+backward of `variant` (`weights`: per-token weights; `adapter`: a LoRA
    adapter's `(A, B)` on the head)."""
    import importlib.util

    import torch

    from trl_emo.losses import CostEmbedding, fused_linear_loss, get_loss
    from trl_emo.losses.fused import HeadAdapter

    options = options or {}
    variant = split_variant(variant)[0]
    n = hidden.shape[0]
    if variant in OPTIONAL and importlib.util.find_spec(OPTIONAL[variant]) is None:
        raise Unavailable(f"{OPTIONAL[variant]} is not installed")
    if variant == "liger_nll":
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

        loss_fn = LigerFusedLinearCrossEntropyLoss()

        def step():
            loss = loss_fn(weight, hidden, targets)
            loss.backward()
            return loss

        return step
    if variant == "cce_nll":
        from cut_cross_entropy import linear_cross_entropy

        def step():
            loss = linear_cross_entropy(hidden, weight, targets)
            loss.backward()
            return loss

        return step
    if variant == "torch_lce":
        if not hasattr(torch.nn, "LinearCrossEntropyOptions"):
            raise Unavailable(f"torch {torch.__version__} has no chunked linear_cross_entropy")
        lce_options = torch.nn.LinearCrossEntropyOptions()

        def step():
            loss = torch.nn.functional.linear_cross_entropy(hidden, weight, targets, options=lce_options)
            loss.backward()
            return loss

        return step
    if variant in ("trl_nll", "trl_gem_tempered"):
        from trl.kernels.chunked_logprob import ChunkedLogProbFunction
        from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE

        outputs = ("log_probs", "entropy", "is_top1")
        temperature = 0.7 if variant == "trl_gem_tempered" else 1.0

        def step():
            logp, *_ = ChunkedLogProbFunction.apply(
                hidden, weight, None, targets, temperature, _CHUNKED_LOGPROB_CHUNK_SIZE, None, 1.0, outputs
            )
            loss = -logp.sum() / n * temperature
            loss.backward()
            if variant == "trl_gem_tempered":
                with torch.no_grad():  # the cross-entropy and entropy the trainer logs
                    ChunkedLogProbFunction.apply(hidden, weight, None, targets, 1.0, _CHUNKED_LOGPROB_CHUNK_SIZE, None, 1.0, outputs)
            return loss

        return step
    if variant == "trl_nll_logits":
        def step():
            logits = hidden @ weight.t()
            loss = torch.nn.functional.cross_entropy(logits.float(), targets)
            loss.backward()
            return loss

        return step
    if variant.startswith("logits_"):
        name, hparams = loss_args(variant[len("logits_"):])
        spec = get_loss(name)
        if spec.uses_cost_embedding:
            hparams = {**hparams, "cost_embedding": CostEmbedding(cost)}

        def step():
            logits = (hidden @ weight.t()).float()
            loss = spec.per_token(logits, targets, **hparams).sum() / n
            loss.backward()
            return loss

        return step
    name, hparams = loss_args(variant)
    spec = get_loss(name)
    frozen = CostEmbedding(cost) if cost is not None else None

    def step():
        extra = {}
        if spec.uses_cost_embedding:
            extra["cost_embedding"] = CostEmbedding(weight.detach()) if variant == "emo_live" else frozen
        if spec.needs_reference:
            extra["reference"] = reference
        head = None
        if adapter is not None:
            # PEFT's `lora_A` (and the scale) on the rows through autograd; `B` in the chunks.
            head = HeadAdapter((hidden @ adapter[0].t()) * (LORA_ALPHA / LORA_RANK), adapter[1])
        out = fused_linear_loss(hidden, weight, targets, spec, {**hparams, **extra}, weights=weights, adapter=head,
                                **options)
        out.loss.backward()
        return out.loss

    return step


def reference_errors(variant, hidden, weight, targets, cost, loss, reference=None) -> dict:
    """Relative errors of `loss` and of the gradients now in `.grad` against float64, same formula."""
    import torch

    from trl_emo.losses import CostEmbedding, fused_linear_loss, get_loss

    key = "nll" if variant in NLL_ANCHORS else variant.removeprefix("logits_").replace("trl_gem_tempered", "gem")
    name, hparams = loss_args(key)
    if get_loss(name).prepare is not None and get_loss(name).needs_reference:  # a first pass (EKSFT) reads it per chunk
        from trl_emo.losses.asft import ReferenceHead

        hparams = {**hparams, "reference": ReferenceHead(reference.hidden.double(), reference.weight.double())}
    elif get_loss(name).needs_reference:
        hparams = {**hparams, "reference": reference.hidden.double() @ reference.weight.double().t()}
    if get_loss(name).uses_cost_embedding:
        table = weight.detach() if variant == "emo_live" else cost
        hparams = {**hparams, "cost_embedding": CostEmbedding(table.double())}
    h64 = hidden.detach().double().requires_grad_(True)
    w64 = weight.detach().double().requires_grad_(True)
    ref = fused_linear_loss(h64, w64, targets, get_loss(name), hparams, backend="torch")
    gh, gw = torch.autograd.grad(ref.loss, (h64, w64))

    def rel(a, b):
        return float((a.double() - b).norm() / b.norm())

    return {
        "loss_rel_error": abs(float(loss) - float(ref.loss)) / abs(float(ref.loss)),
        "grad_hidden_rel_error": rel(hidden.grad, gh),
        "grad_head_rel_error": rel(weight.grad, gw),
    }


# The timer: wall-clock time, or (`--clock cpu`) the process's CPU time, which other jobs on a shared machine do not
# lengthen (with `--threads 1`).
_clock = time.perf_counter


def worker(variant, tokens, vocab, hidden_size, dtype_name, device, repeats, threads, options, accuracy,
           fastest=False) -> dict:
    import torch

    from trl_emo.losses import get_loss

    if threads:
        torch.set_num_threads(threads)
    dtype = getattr(torch, dtype_name)
    gen = torch.Generator(device="cpu").manual_seed(0)
    hidden = torch.randn(tokens, hidden_size, generator=gen).to(device=device, dtype=dtype).requires_grad_(True)
    weight = (torch.randn(vocab, hidden_size, generator=gen) / hidden_size**0.5).to(device=device, dtype=dtype).requires_grad_(True)
    targets = torch.randint(0, vocab, (tokens,), generator=gen).to(device)
    # EMO's frozen cost table: a snapshot of the head, in the head's dtype (as the trainer keeps it).
    base, suffix = split_variant(variant)
    cost = weight.detach().clone() if base in ("emo", "logits_emo") else None
    reference = None
    weights = adapter = None
    if suffix == "_weighted":
        weights = (2 * torch.rand(tokens, generator=gen)).to(device)
    if suffix in ("_frozen_head", "_lora_head"):
        weight.requires_grad_(False)
    if suffix == "_lora_head":
        lora_a = (torch.randn(LORA_RANK, hidden_size, generator=gen) / hidden_size**0.5).to(device, dtype)
        lora_b = (0.01 * torch.randn(vocab, LORA_RANK, generator=gen)).to(device, dtype)
        adapter = (lora_a.requires_grad_(True), lora_b.requires_grad_(True))
    if base in LOSS_VARIANTS and get_loss(LOSS_VARIANTS[base][0]).needs_reference:
        # The reference model (ASFT, EKSFT, iw-SFT, GIFT, SLM; PSFT's old policy, CurioSFT's teacher, whose
        # `needs_reference` is a function) at the target positions: its hidden states and head (persistent inputs like
        # the policy's, excluded from the loss's peak and reported on their own).
        from trl_emo.losses.asft import ReferenceHead

        ref_hidden = (hidden.detach().float() + 0.1 * torch.randn(hidden.shape, generator=gen).to(device)).to(dtype)
        ref_weight = (weight.detach().float() + 0.01 * torch.randn(weight.shape, generator=gen).to(device)).to(dtype)
        reference = ReferenceHead(ref_hidden, ref_weight)
    try:
        step = build_step(variant, hidden, weight, targets, cost, options, reference, weights, adapter)
    except Unavailable as exc:
        return {"variant": variant, "unavailable": str(exc)}

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    sync()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = _rss_bytes()
    start = _clock()
    loss = step()
    sync()
    first = _clock() - start
    peak = (torch.cuda.max_memory_allocated() if device == "cuda" else _peak_rss_bytes()) - base
    times = []
    for _ in range(repeats):
        hidden.grad = weight.grad = None
        sync()
        start = _clock()
        step()
        sync()
        times.append(_clock() - start)
    result = {
        "variant": variant,
        "loss": float(loss),
        # `--fastest`: the fastest call, on a machine shared with other work (which only ever slows a call down).
        "seconds": (min(times) if fastest else statistics.median(times)) if times else first,
        "first_seconds": first,
        "peak_extra_bytes": int(peak),
    }
    if reference is not None:
        result["reference_model_bytes"] = sum(t.numel() * t.element_size() for t in (reference.hidden, reference.weight))
    if accuracy and not suffix:
        hidden.grad = weight.grad = None
        loss = step()
        result.update(reference_errors(variant, hidden, weight, targets, cost, loss, reference))
    return result


def interleaved(size, args) -> list[dict]:
    """`--interleave`: every variant in this one process, one forward+backward of each in turn, `--rounds` times after a
    first round (at least 3), each variant timed by its fastest call. On a machine shared with other work the variants
    then meet the same interference, call by call, instead of each its own stretch of it; there are no memory figures
    (one process's peak is every variant's)."""
    import torch

    from trl_emo.losses.asft import ReferenceHead

    tokens, vocab, hidden_size = size
    dtype = getattr(torch, args.dtype)
    gen = torch.Generator(device="cpu").manual_seed(0)
    hidden = torch.randn(tokens, hidden_size, generator=gen).to(args.device, dtype).requires_grad_(True)
    weight = (torch.randn(vocab, hidden_size, generator=gen) / hidden_size**0.5).to(args.device, dtype).requires_grad_(True)
    targets = torch.randint(0, vocab, (tokens,), generator=gen).to(args.device)
    reference = ReferenceHead(
        (hidden.detach().float() + 0.1 * torch.randn(hidden.shape, generator=gen).to(args.device)).to(dtype),
        (weight.detach().float() + 0.01 * torch.randn(weight.shape, generator=gen).to(args.device)).to(dtype),
    )
    options = {"backend": args.backend, "fp32_weight_grad": args.fp32_weight_grad}
    if args.chunk_memory_mb is not None:
        options["chunk_memory"] = int(args.chunk_memory_mb * 2**20)
    steps, rows = {}, {}
    for variant in args.variants:
        cost = weight.detach().clone() if variant in ("emo", "logits_emo") else None
        try:
            steps[variant] = build_step(variant, hidden, weight, targets, cost, options, reference)
        except Unavailable as exc:
            rows[variant] = {"variant": variant, "unavailable": str(exc)}
    best = {variant: float("inf") for variant in steps}
    for round_ in range(1 + max(args.rounds, 3)):
        for variant, step in steps.items():
            hidden.grad = weight.grad = None
            if args.device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            step()
            if args.device == "cuda":
                torch.cuda.synchronize()
            if round_:  # the first round compiles and allocates
                best[variant] = min(best[variant], time.perf_counter() - start)
        print(f"  round {round_}: {best}", file=sys.stderr, flush=True)
    return [rows.get(variant) or {"variant": variant, "seconds": best[variant]} for variant in args.variants]


def run_isolated(variant, size, args) -> dict:
    tokens, vocab, hidden = size
    cmd = [sys.executable, __file__, "--_worker", variant, f"{tokens}x{vocab}x{hidden}", "--dtype", args.dtype,
           "--device", args.device, "--repeats", str(args.repeats), "--threads", str(args.threads or 0),
           "--backend", args.backend, "--clock", args.clock]
    if args.chunk_memory_mb is not None:
        cmd += ["--chunk-memory-mb", str(args.chunk_memory_mb)]
    if args.fp32_weight_grad:
        cmd.append("--fp32-weight-grad")
    if args.accuracy:
        cmd.append("--accuracy")
    if args.fastest:
        cmd.append("--fastest")
    result = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if result.returncode != 0:
        return {"variant": variant, "error": result.stderr.strip().splitlines()[-1] if result.stderr else "failed"}
    return json.loads(result.stdout.strip().splitlines()[-1])


def machine_description(device) -> str:
    import torch

    if device == "cuda":
        import importlib.metadata as md

        def version(name):
            try:
                return md.version(name)
            except md.PackageNotFoundError:
                return "absent"

        versions = ", ".join(f"{n} {version(n)}" for n in ("triton", "trl", "transformers", "liger-kernel", "cut-cross-entropy"))
        return f"{torch.cuda.get_device_name(0)}, torch {torch.__version__} (CUDA {torch.version.cuda}), {versions}"
    cores = os.cpu_count()
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as handle:
            names = [line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    return f"{cpu}, {cores} cores, torch {torch.__version__} (CPU)"


def format_table(size, rows) -> str:
    tokens, vocab, hidden = size
    base = next((r for r in rows if r["variant"] == "trl_nll" and "seconds" in r), None)
    liger = next((r for r in rows if r["variant"] == "liger_nll" and "seconds" in r), None)
    accuracy = any("loss_rel_error" in r for r in rows)
    timed = [r for r in rows if "seconds" in r]
    unit = 1e3 if timed and max(r["seconds"] for r in timed) < 10 else 1.0
    unit_name = "ms" if unit == 1e3 else "s"
    header = f"| variant | time ({unit_name}) | time / TRL nll | time / Liger | peak extra memory (GiB) | memory / TRL nll |"
    rule = "|---|---:|---:|---:|---:|---:|"
    if accuracy:
        header += " loss rel. err | ∂h rel. err | ∂W rel. err |"
        rule += "---:|---:|---:|"
    lines = [f"**{tokens:,} tokens x {vocab:,} vocab x {hidden:,} hidden**", "", header, rule]
    blanks = " |" * (rule.count("|") - 3)
    for r in rows:
        if "unavailable" in r:
            lines.append(f"| {r['variant']} | not run: {r['unavailable']} |{blanks}")
            continue
        if "error" in r:
            lines.append(f"| {r['variant']} | failed: {r['error'][:60]} |{blanks}")
            continue

        def ratio(ref, key):
            return f"{r[key] / ref[key]:.2f}" if ref and key in r and key in ref else "—"

        memory = f"{r['peak_extra_bytes'] / 2**30:.2f}" if "peak_extra_bytes" in r else "—"  # none with --interleave
        line = (
            f"| {r['variant']} | {r['seconds'] * unit:.{0 if unit == 1e3 else 2}f} | {ratio(base, 'seconds')} | "
            f"{ratio(liger, 'seconds')} | {memory} | {ratio(base, 'peak_extra_bytes')} |"
        )
        if accuracy:
            line += "".join(f" {r[k]:.1e} |" if k in r else " |" for k in ("loss_rel_error", "grad_hidden_rel_error", "grad_head_rel_error"))
        lines.append(line)
    return "\n".join(lines)


def parse_size(text):
    tokens, vocab, hidden = (int(x.replace(",", "").replace("_", "")) for x in text.lower().split("x"))
    return tokens, vocab, hidden


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["4096x32000x512", "16384x32000x256"], help="TOKENSxVOCABxHIDDEN")
    parser.add_argument("--variants", nargs="+", default=VARIANTS,
                        help=f"{', '.join(VARIANTS)}, or a trl_emo variant with a suffix: {', '.join(SUFFIXES)}")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--repeats", type=int, default=2, help="timed calls after the first (memory) call")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--backend", default="auto", choices=["auto", "triton", "torch"], help="trl_emo's fused kernels")
    parser.add_argument("--chunk-memory-mb", type=float, default=None, help="trl_emo's chunk memory budget")
    parser.add_argument("--fp32-weight-grad", action="store_true", help="float32 head-gradient accumulator")
    parser.add_argument("--accuracy", action="store_true", help="also measure errors against float64")
    parser.add_argument("--clock", default="wall", choices=["wall", "cpu"],
                        help="time as wall-clock time, or as the process's CPU time (a shared CPU machine, with "
                        "--threads 1)")
    parser.add_argument("--rounds", type=int, default=1, help="run the variants this many times in turn and keep each "
                        "one's fastest round (on a machine shared with other work, which only ever slows a run down)")
    parser.add_argument("--fastest", action="store_true", help="time each variant by its fastest call, not the median")
    parser.add_argument("--interleave", action="store_true", help="time every variant in one process, one call of each "
                        "in turn, --rounds times (at least 3): each one's fastest call; no memory figures")
    parser.add_argument("--json", default=None, help="also write the raw results here")
    parser.add_argument("--_worker", nargs=2, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    unknown = [v for v in args.variants if v not in VARIANTS and not split_variant(v)[1]]
    if unknown:
        parser.error(f"unknown variant {unknown[0]!r}: one of {', '.join(VARIANTS)}, or a trl_emo loss with "
                     f"{', '.join(SUFFIXES)}")
    suffixed = [v for v in args.variants if split_variant(v)[1]]
    if args.interleave and suffixed:
        # Weights, a frozen head and an adapter are each variant's own inputs, which one shared process does not build.
        parser.error(f"{suffixed[0]!r} runs in its own process: drop --interleave for the {', '.join(SUFFIXES)} variants")

    if args._worker:
        global _clock
        _clock = time.process_time if args.clock == "cpu" else time.perf_counter
        variant, size = args._worker
        options = {"backend": args.backend, "fp32_weight_grad": args.fp32_weight_grad}
        if args.chunk_memory_mb is not None:
            options["chunk_memory"] = int(args.chunk_memory_mb * 2**20)
        result = worker(variant, *parse_size(size), args.dtype, args.device, args.repeats, args.threads, options,
                        args.accuracy, args.fastest)
        print(json.dumps(result))
        return 0

    command = "python benchmarks/loss_bench.py " + " ".join(a for a in (argv if argv is not None else sys.argv[1:]))
    if args.interleave:
        timing = f"every variant in one process, in turn, {max(args.rounds, 3)} rounds after one: its fastest call"
    else:
        timing = f"{'fastest' if args.fastest else 'median'} of {args.repeats} forward+backward calls after the first"
        timing += f"; each variant's fastest of {args.rounds} rounds" if args.rounds > 1 else ""
    print(f"# Loss benchmark, {date.today().isoformat()}\n\nMachine: {machine_description(args.device)}  \n"
          f"Command: `{command}`  \nDtype: {args.dtype}; trl_emo backend: {args.backend}; {timing} "
          f"({'process CPU' if args.clock == 'cpu' else 'wall-clock'} time).\n", flush=True)
    raw = {}
    for size_text in args.sizes:
        size = parse_size(size_text)
        if args.interleave:
            raw[size_text] = rows = interleaved(size, args)
            print(format_table(size, rows) + "\n", flush=True)
            continue
        rounds = []
        for _ in range(args.rounds):
            rows = []
            for variant in args.variants:
                rows.append(run_isolated(variant, size, args))
                print(f"  {size_text} {variant}: {rows[-1]}", file=sys.stderr, flush=True)
            rounds.append(rows)
        rows = [min(runs, key=lambda r: r.get("seconds", float("inf"))) for runs in zip(*rounds)]
        raw[size_text] = rows
        if args.rounds > 1:
            raw[f"{size_text} rounds"] = rounds
        print(format_table(size, rows) + "\n", flush=True)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"machine": machine_description(args.device), "command": command, "date": date.today().isoformat(),
                       "dtype": args.dtype, "results": raw}, handle, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
