"""The row kernels compiled ahead of time for named NVIDIA GPUs, on a machine without one.

Triton compiles for any `GPUTarget` with the ptxas inside its wheel, so a CPU-only CI machine can
check what a GPU user would build: that every registered row kernel compiles for sm_80 (A100),
sm_86 (RTX 3090, A10), sm_89 (RTX 4090, L4) and sm_90 (H100), and what ptxas allots it (registers
per thread, spill bytes). `tests/test_kernel_compile.py` asserts no failure and no spill;
`benchmarks/kernel_resources.py` reports the numbers.

How the launches are found: every loss's launcher (`LossSpec.row_kernel`) is called on meta tensors
shaped like a real chunk while Triton's kernel launch is recorded instead of run, for the loss's
switch settings (`SWITCHES`), with and without bias, soft-cap and gradient, for bf16 and fp16 logits,
per vocabulary and per target capability (`RowLaunch.target`, so `RowLaunch.meta` picks what it would
pick on that GPU). So a third-party loss is covered as soon as it is registered, launched exactly as
its own code launches it. The arguments are specialized as Triton specializes them at run time:
16-byte alignment of pointers and of integers (chunk buffers are aligned, row strides are vocabulary
multiples of 16), and a token count that is not a multiple of 16, the usual case.

Which settings: the full product of the switches is about 1,600 compiles for four targets, so by
default every pair of switch values that a kernel is built with is covered instead
(`covering_settings`); `full=True` / `--full` compiles the product. Launches that give Triton the
same kernel, signature, specialization, constexprs and warps (different vocabularies at the same
block size) are compiled once. Run as `python benchmarks/aot_compile.py` (a process of its own:
kernels defined under `TRITON_INTERPRET=1`, as the tests define them, cannot be compiled). It is a CI check, not
part of the installed package: it lives beside the benchmark that reports its numbers (`kernel_resources.py`).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import itertools
import json
import math
import os
import re
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field

import torch

from trl_emo.losses import _triton
from trl_emo.losses.registry import get_loss, list_losses

# Which GPUs each target stands for, and the per-SM limits that bound resident programs (CUDA C++
# Programming Guide, "Technical Specifications per Compute Capability"). Shared memory is the most a
# program may be given per SM; every program also takes 1 KiB reserved by the system.
TARGETS = {
    80: dict(name="sm_80", gpus="A100", max_warps=64, max_programs=32, shared=167936, bandwidth_gbs=2039),
    86: dict(name="sm_86", gpus="RTX 3090, A10", max_warps=48, max_programs=16, shared=102400, bandwidth_gbs=936),
    89: dict(name="sm_89", gpus="RTX 4090, L4", max_warps=48, max_programs=24, shared=102400, bandwidth_gbs=1008),
    90: dict(name="sm_90", gpus="H100", max_warps=64, max_programs=32, shared=233472, bandwidth_gbs=3350),
}
# Llama-2/Mistral, Llama-3, Qwen2/2.5.
VOCABS = (32_000, 128_256, 151_936)
DTYPES = (torch.bfloat16, torch.float16)
# The register file: 64K 32-bit registers per SM in four sub-partitions; a warp's registers come in
# units of 256 from one sub-partition (the occupancy calculator's rule).
_REGISTERS_PER_PARTITION = 16384
_REGISTER_UNIT = 256

# Hyper-parameter values that flip a built-in kernel's own constexpr switches, combined with each
# other and with the shared flags (all pairs, or every combination). A loss not listed here (a third-party one) is
# launched at its defaults (`LossSpec.defaults`), or add its switches: `SWITCHES["focal"] = {"mode": ("a", "b")}`.
SWITCHES: dict[str, dict[str, tuple]] = {
    "gem": {"h": ("linear", "logsigmoid")},
    "emo": {"weighting": ("mle", "emo", "none"), "demd": ("reference", "paper"), "ratio_cap": (None, 3.0)},
    "tailr": {"min_weight": (None, 0.2), "formula": ("paper", "authors")},
    "eaft": {"entropy": ("topk", "full")},
    "asft": {"alpha": (0.0, 0.5)},
    # SED's threshold is calibrated by the trainer (its default is None); k sets the width of the top-k block.
    "sed": {"threshold": (0.9,), "top_k": (2, 32)},
    "eksft": {"formula": ("paper", "authors")},
    # A threshold adds the first pass (`target_stats._statistics`, its policy half) and the weighted loss pass.
    "prob": {"only": (None, "top"), "threshold": (0.5,)},
    "gift": {"formula": ("authors", "paper")},
}
# The shared switches every row kernel has (`RowLaunch.meta`), and all their settings.
FLAGS = ("bias", "softcap", "write_grad")
ALL_FLAGS = tuple(itertools.product((False, True), repeat=3))

# Rows of the recorded launches: the row count is the grid, not the code, but the launchers split a
# chunk into parts (EMO: quarters) whose offsets decide the alignment of the per-row pointers, so it
# is a whole number of 64-row granules like a real chunk. The token count sets the statistics' row
# stride (not a multiple of 16, as in most batches).
_ROWS = 64
_TOKENS = 1001
_COST_DIM = 8


@dataclass(frozen=True)
class Build:
    """One distinct compile: everything that decides the code Triton generates."""

    kernel: str  # module.qualname of the @triton.jit function
    capability: int
    num_warps: int
    signature: tuple[tuple[str, str], ...]  # (argument, Triton type or "constexpr")
    divisible: tuple[str, ...]  # arguments specialized as 16-byte aligned / multiples of 16
    constexprs: tuple[tuple[str, object], ...]
    num_stages: int | None = None  # when the launch sets it

    @property
    def block(self) -> int | None:
        return dict(self.constexprs).get("BLOCK")

    @property
    def switches(self) -> dict:
        """The constexprs other than BLOCK (the kernel's own switches and the shared flags)."""
        return {k: v for k, v in self.constexprs if k != "BLOCK"}


@dataclass(frozen=True)
class Setting:
    """One way a loss's launcher is called, apart from the vocabulary and the target."""

    loss: str
    hparams: tuple[tuple[str, object], ...]
    dtype: str  # of the logits
    bias: bool
    softcap: bool
    write_grad: bool
    reference: str = ""  # a reference model's head: "plain" or "softcapped" (ASFT), "" without one

    def describe(self) -> str:
        parts = [f"{k}={v}" for k, v in self.hparams]
        parts += [f"{k}={getattr(self, k)}" for k in FLAGS]
        if self.reference:
            parts.append(f"reference={self.reference}")
        return f"{self.loss}({', '.join(parts)}; {self.dtype})"


@dataclass
class Use:
    """Where a build is used: a setting, and the vocabularies it was launched for."""

    setting: str
    vocabs: list[int] = field(default_factory=list)


@dataclass
class Result:
    kernel: str
    capability: int
    target: str
    block: int | None
    num_warps: int
    dtype: str
    switches: dict
    uses: list[dict]
    ok: bool
    error: str = ""
    registers: int | None = None
    spill_stores: int | None = None
    spill_loads: int | None = None
    stack: int | None = None
    shared: int | None = None
    programs_per_sm: int | None = None
    seconds: float = 0.0
    cpu_seconds: float = 0.0

    @property
    def spills(self) -> int:
        return (self.spill_stores or 0) + (self.spill_loads or 0)

    def describe(self) -> str:
        flags = ", ".join(f"{k}={v}" for k, v in self.switches.items())
        return f"{self.kernel} for {self.target} (BLOCK {self.block}, {self.num_warps} warps, {self.dtype}; {flags})"


# -- occupancy ---------------------------------------------------------------------------------


def programs_per_sm(capability: int, registers: int, num_warps: int, shared: int = 0) -> int:
    """Programs of `num_warps` warps that fit on one SM at once: warps, registers, shared memory, programs."""
    limits = TARGETS[capability]
    per_warp = math.ceil(max(registers, 1) * 32 / _REGISTER_UNIT) * _REGISTER_UNIT
    warps_by_registers = 4 * (_REGISTERS_PER_PARTITION // per_warp)
    bounds = [limits["max_programs"], limits["max_warps"] // num_warps, warps_by_registers // num_warps]
    if shared:
        bounds.append(limits["shared"] // (shared + 1024))
    return max(0, min(bounds))


# -- recording the launches ----------------------------------------------------------------------


def _kernel_name(kernel) -> str:
    fn = getattr(kernel, "fn", kernel)
    return f"{fn.__module__}.{fn.__qualname__}"


@contextlib.contextmanager
def _recorded_launches(records: list):
    """Triton launches inside the block are recorded as `(kernel, args, kwargs)` instead of run."""
    from triton.runtime.jit import KernelInterface

    original = KernelInterface.__getitem__

    def record(self, grid):
        return lambda *args, **kwargs: records.append((self, args, kwargs))

    KernelInterface.__getitem__ = record
    try:
        yield records
    finally:
        KernelInterface.__getitem__ = original


_POINTEE = {
    torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float64: "fp64",
    torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8", torch.bool: "i1",
}


def _arg_type(value) -> tuple[str, bool]:
    """Triton's type for a run-time argument, and whether Triton specializes it as divisible by 16.

    Triton's rules: a tensor is a pointer to its dtype; an int is i32 (i64 past 32 bits) and the
    int 1 becomes a constant; a float is fp32; None is a constant.
    """
    if isinstance(value, torch.Tensor):
        # The recorded tensors live on the meta device; on a GPU every allocation is aligned far beyond
        # 16 bytes, so a pointer's alignment is its offset into the allocation.
        return "*" + _POINTEE[value.dtype], value.storage_offset() * value.element_size() % 16 == 0
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value == 1):
        return "constexpr", False
    if isinstance(value, bool):
        return "u1", False
    if isinstance(value, int):
        return ("i32" if -(2**31) <= value < 2**31 else "i64"), value % 16 == 0
    if isinstance(value, float):
        return "fp32", False
    raise TypeError(f"unsupported kernel argument of type {type(value).__name__}")


def _parameters(kernel) -> list[tuple[str, bool, object]]:
    """`(name, is_constexpr, default)` of a @triton.jit function (compiled or interpreted alike)."""
    import inspect

    fn = getattr(kernel, "fn", None)
    if fn is None or not callable(fn) or getattr(kernel, "arg_names", None) is None:
        raise TypeError(f"{_kernel_name(kernel)} is launched through {type(kernel).__name__}; the compile check "
                        "takes plain @triton.jit row kernels with their launch options given at the launch")
    out = []
    for param in inspect.signature(fn).parameters.values():
        annotation = param.annotation
        text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", repr(annotation))
        default = None if param.default is inspect.Parameter.empty else param.default
        out.append((param.name, "constexpr" in str(text), default))
    return out


def _build_of(kernel, args, kwargs, capability) -> Build:
    params = _parameters(kernel)
    names = [name for name, _, _ in params]
    options = {k: v for k, v in kwargs.items() if k not in names}
    unknown = set(options) - {"num_warps", "num_stages"}
    if unknown:
        raise TypeError(f"{_kernel_name(kernel)}: unsupported launch options {sorted(unknown)}")
    bound = {name: default for name, _, default in params}
    bound.update(zip(names, args))
    bound.update({k: v for k, v in kwargs.items() if k in names})
    signature, divisible, constexprs = [], [], []
    for name, is_constexpr, _ in params:
        value = bound[name]
        kind, div = ("constexpr", False) if is_constexpr else _arg_type(value)
        signature.append((name, kind))
        if kind == "constexpr":
            constexprs.append((name, value))
        elif div:
            divisible.append(name)
    return Build(
        kernel=_kernel_name(kernel),
        capability=capability,
        num_warps=int(options.get("num_warps", 4)),
        signature=tuple(signature),
        divisible=tuple(divisible),
        constexprs=tuple(constexprs),
        num_stages=options.get("num_stages"),
    )


def switch_cases(names: Iterable[str] | None = None) -> list[tuple[str, dict]]:
    """`(loss, hyper-parameters)` for every registered loss with a row kernel and every combination of
    its `SWITCHES` over its defaults (`LossSpec.defaults`, which `SFTConfig`'s fields also take)."""
    out = []
    for name in names or list_losses(include_trl=False):
        if get_loss(name).row_kernel is None:
            continue
        base = dict(get_loss(name).defaults)
        switches = SWITCHES.get(name, {})
        for values in itertools.product(*switches.values()):
            out.append((name, {**base, **dict(zip(switches, values))}))
    return out


def all_settings(
    cases: list[tuple[str, dict]],
    dtypes: Iterable[torch.dtype] = DTYPES,
    flag_sets: Iterable[tuple[bool, bool, bool]] = ALL_FLAGS,
) -> list[Setting]:
    """The full product: every case, logits dtype and setting of the shared flags (and, for a loss that
    reads a reference model, a reference head with and without a soft-cap: a switch of its kernel)."""
    out = []
    for (name, hparams), dtype, flags in itertools.product(cases, tuple(dtypes), tuple(flag_sets)):
        references = ("plain", "softcapped") if get_loss(name).wants_reference(hparams) else ("",)
        for reference in references:
            out.append(Setting(name, tuple(hparams.items()), str(dtype).removeprefix("torch."), *flags, reference=reference))
    return out


class _Recorder:
    """Calls launchers on meta tensors shaped like a real chunk, recording their launches."""

    def __init__(self):
        self.cache: dict = {}
        self.kernels: dict[str, object] = {}

    def _tensor(self, *shape, dtype=torch.float32):
        key = (shape, dtype)
        if key not in self.cache:
            self.cache[key] = torch.empty(*shape, dtype=dtype, device="meta")
        return self.cache[key]

    def _kwargs(self, setting: Setting, vocab: int, dtype: torch.dtype) -> dict:
        from trl_emo.losses.asft import ReferenceHead
        from trl_emo.losses.cost import CostEmbedding

        kwargs = dict(setting.hparams)
        if get_loss(setting.loss).uses_cost_embedding:
            key = ("cost", vocab)
            if key not in self.cache:
                self.cache[key] = CostEmbedding(torch.empty(vocab, _COST_DIM, device="meta"))
            kwargs["cost_embedding"] = self.cache[key]
        if setting.reference:
            kwargs["reference"] = ReferenceHead(
                self._tensor(_ROWS, _COST_DIM, dtype=dtype),
                self._tensor(vocab, _COST_DIM, dtype=dtype),
                softcap=30.0 if setting.reference == "softcapped" else None,
            )
        return kwargs

    def launches(self, setting: Setting, vocab: int, capability: int) -> list[Build]:
        """The builds of one launcher call (its kernels are kept in `kernels`)."""
        spec = get_loss(setting.loss)
        dtype = getattr(torch, setting.dtype)
        scratch_rows = math.ceil(_ROWS * spec.scratch_rows)
        launch = _triton.RowLaunch(
            z=self._tensor(_ROWS, vocab, dtype=dtype),
            targets=self._tensor(_ROWS, dtype=torch.int64),
            target_logits=self._tensor(_ROWS),
            bias=self._tensor(vocab, dtype=dtype) if setting.bias else None,
            # the shared statistics and the loss's metrics (at least 8 rows, what the first pass of EKSFT writes)
            stats=self._tensor(max(8, 4 + len(spec.metrics)), _TOKENS)[:, :_ROWS],
            grad_scale=self._tensor(1),
            logit_scale=1.0,
            softcap=30.0 if setting.softcap else None,
            write_grad=setting.write_grad,
            scratch=self._tensor(scratch_rows, vocab, dtype=dtype) if scratch_rows else None,
            target=capability,
        )
        records: list = []
        kwargs = self._kwargs(setting, vocab, dtype)
        with _recorded_launches(records):
            spec.row_kernel(launch, **kwargs)
            if spec.prepared_rows:
                # A loss with a first pass (`prepare`): the call above launched that pass's kernel; the loss pass's
                # takes the per-row tensors `prepare` would have computed.
                from trl_emo.losses.registry import RowTensors

                weights = RowTensors({name: self._tensor(_ROWS) for name in spec.prepared_rows})
                spec.row_kernel(launch, **kwargs, weights=weights)
        if not records:
            raise RuntimeError("the launcher launched no Triton kernel")
        builds = []
        for kernel, args, kwargs in records:
            build = _build_of(kernel, args, kwargs, capability)
            self.kernels[build.kernel] = kernel
            if build not in builds:
                builds.append(build)
        return builds


def covering_settings(settings: list[Setting], capability: int = 90, vocab: int = VOCABS[1]) -> list[Setting]:
    """A subset of `settings` that still builds, for every kernel, every pair of values of its code
    switches (its constexprs other than BLOCK, and the logits dtype) that the full set builds.

    The full product of the switches is what CI cannot afford (about 1,600 builds for four targets);
    all pairs take a few dozen settings. Each kernel's heaviest and lightest settings (most and fewest
    switches on) are always in. Greedy: repeatedly the setting that builds the most uncovered pairs.
    """
    recorder = _Recorder()
    factors: dict[str, list[tuple[Setting, frozenset]]] = {}
    failing: list[Setting] = []
    for setting in settings:
        try:
            builds = recorder.launches(setting, vocab, capability)
        except Exception:  # kept, so that `record_builds` reports the error
            failing.append(setting)
            continue
        for build in builds:
            values = frozenset({("dtype", setting.dtype), *build.switches.items()})
            factors.setdefault(build.kernel, []).append((setting, values))
    chosen: list[Setting] = []
    for kernel, pool in factors.items():
        wanted = set()
        for _, values in pool:
            wanted.update(itertools.combinations(sorted(values, key=repr), 2))
        weight = [sum(v is True for _, v in values) for _, values in pool]
        picks = [pool[weight.index(max(weight))], pool[weight.index(min(weight))]]
        covered = set()
        for _, values in picks:
            covered.update(itertools.combinations(sorted(values, key=repr), 2))
        while covered < wanted:
            best = max(pool, key=lambda item: len(set(itertools.combinations(sorted(item[1], key=repr), 2)) - covered))
            picks.append(best)
            covered.update(itertools.combinations(sorted(best[1], key=repr), 2))
        for setting, _ in picks:
            if setting not in chosen:
                chosen.append(setting)
    return chosen + failing


def record_builds(
    settings: list[Setting],
    capabilities: Iterable[int] = tuple(TARGETS),
    vocabs: Iterable[int] = VOCABS,
) -> tuple[dict[Build, list[Use]], dict[str, object], list[str]]:
    """Every distinct build the launchers make for `settings`; returns `(builds -> uses, kernels, errors)`."""
    builds: dict[Build, list[Use]] = {}
    errors: list[str] = []
    recorder = _Recorder()
    for setting, vocab, capability in itertools.product(settings, tuple(vocabs), tuple(capabilities)):
        try:
            launched = recorder.launches(setting, vocab, capability)
        except Exception as exc:  # reported, and failed by the test, with the launch that raised
            errors.append(f"{setting.describe()}, vocab {vocab}, {TARGETS[capability]['name']}: {type(exc).__name__}: {exc}")
            continue
        for build in launched:
            uses = builds.setdefault(build, [])
            for use in uses:
                if use.setting == setting.describe():
                    if vocab not in use.vocabs:
                        use.vocabs.append(vocab)
                    break
            else:
                uses.append(Use(setting.describe(), [vocab]))
    return builds, recorder.kernels, errors


# -- compiling -----------------------------------------------------------------------------------

_PTXAS_SPILLS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_REGISTERS = re.compile(r"Used (\d+) registers")

_KERNELS: dict[str, object] = {}  # the worker processes' view of the recorded kernels (inherited at fork)


def _ptxas_report(log: str) -> dict:
    spills = _PTXAS_SPILLS.search(log)
    registers = _PTXAS_REGISTERS.search(log)
    if not (spills and registers):
        raise RuntimeError(f"no resource report in the ptxas output:\n{log[-2000:]}")
    stack, stores, loads = (int(g) for g in spills.groups())
    return {"registers": int(registers.group(1)), "stack": stack, "spill_stores": stores, "spill_loads": loads}


def _cpu_seconds() -> float:
    """CPU time of this process and of its finished children (ptxas)."""
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def compile_build(build: Build, kernel=None) -> dict:
    """Compile `build` with Triton for its target and read ptxas's report of the kernel Triton built."""
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.compiler import compile as triton_compile

    kernel = kernel or _KERNELS[build.kernel]
    target = GPUTarget("cuda", build.capability, 32)
    attrs = {(kernel.arg_names.index(name),): make_backend(target).parse_attr("D") for name in build.divisible}
    source = ASTSource(fn=kernel, signature=dict(build.signature), constexprs=dict(build.constexprs), attrs=attrs)
    start = time.perf_counter()
    cpu_start = _cpu_seconds()
    log = io.StringIO()
    # Triton prints ptxas's `-v` report of its own invocation (its flags, its ptxas for the target)
    # when asked; always compiling makes a warm cache report too.
    with knobs.nvidia.scope(), knobs.compilation.scope(), contextlib.redirect_stdout(log):
        knobs.nvidia.dump_ptxas_log = True
        knobs.compilation.always_compile = True
        options = {"num_warps": build.num_warps}
        if build.num_stages is not None:
            options["num_stages"] = build.num_stages
        compiled = triton_compile(source, target=target, options=options)
    report = _ptxas_report(log.getvalue())
    report["shared"] = int(compiled.metadata.shared)
    report["seconds"] = time.perf_counter() - start
    report["cpu_seconds"] = _cpu_seconds() - cpu_start
    return report


def _compile_job(build: Build) -> dict:
    try:
        return {"ok": True, **compile_build(build)}
    except Exception as exc:  # every failure is a result naming the build, never a crash of the pool
        # Triton's messages start with the location and end with the reason, the source in between.
        lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
        kept = lines if len(lines) <= 3 else [lines[0], "...", *lines[-2:]]
        return {"ok": False, "error": f"{type(exc).__name__}: {' | '.join(kept)[:1500]}"}


def compile_all(builds: dict[Build, list[Use]], kernels: dict[str, object], jobs: int | None = None) -> list[Result]:
    """Compile every build (in `jobs` processes) and return one `Result` each, in a stable order."""
    import multiprocessing

    _KERNELS.update(kernels)
    order = sorted(builds, key=lambda b: (b.kernel, b.capability, str(b.constexprs), str(b.signature)))
    jobs = jobs or os.cpu_count() or 1
    if jobs > 1 and len(order) > 1:
        # fork: the workers inherit the recorded kernels and Triton, imported once.
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork")) as pool:
            reports = list(pool.map(_compile_job, order, chunksize=1))
    else:
        reports = [_compile_job(b) for b in order]
    results = []
    for build, report in zip(order, reports):
        uses = builds[build]
        # The logits' dtype: the first pointer argument (`Z` in the row-kernel convention).
        dtype = next((kind[1:] for _, kind in build.signature if kind.startswith("*")), "")
        result = Result(
            kernel=build.kernel.removeprefix("trl_emo.losses."),
            capability=build.capability,
            target=TARGETS[build.capability]["name"],
            block=build.block,
            num_warps=build.num_warps,
            dtype=dtype,
            switches=build.switches,
            uses=[asdict(u) for u in uses],
            **report,
        )
        if result.ok:
            result.programs_per_sm = programs_per_sm(build.capability, result.registers, build.num_warps, result.shared)
        results.append(result)
    return results


def check(
    settings: list[Setting] | None = None,
    capabilities: Iterable[int] = tuple(TARGETS),
    vocabs: Iterable[int] = VOCABS,
    full: bool = False,
    jobs: int | None = None,
) -> dict:
    """Record and compile the row-kernel launches of `settings` (default: every registered loss's full
    product, narrowed to all pairs unless `full`); a JSON-ready summary with every result."""
    if _triton.interpreting():
        raise RuntimeError("The kernels were defined for Triton's interpreter (TRITON_INTERPRET=1); "
                           "run the compile check in a process without it (python benchmarks/aot_compile.py).")
    import triton

    capabilities, vocabs = tuple(capabilities), tuple(vocabs)
    start = time.perf_counter()
    product = all_settings(switch_cases()) if settings is None else settings
    chosen = product if full else covering_settings(product)
    builds, kernels, errors = record_builds(chosen, capabilities, vocabs)
    recorded = time.perf_counter()
    results = compile_all(builds, kernels, jobs)
    return {
        "triton": triton.__version__,
        "torch": torch.__version__,
        "mode": "full product" if full else "all pairs",
        "targets": {TARGETS[c]["name"]: TARGETS[c]["gpus"] for c in capabilities},
        "vocabs": list(vocabs),
        "launch_configs": {k: {str(c): list(v) for c, v in table.items()} for k, table in _triton.LAUNCH_CONFIGS.items()},
        "settings": len(chosen),
        "settings_in_full_product": len(product),
        "launch_errors": errors,
        "builds": len(builds),
        "record_seconds": round(recorded - start, 2),
        "compile_seconds": round(time.perf_counter() - recorded, 2),
        "compile_cpu_seconds": round(sum(r.cpu_seconds for r in results), 1),
        "results": [asdict(r) for r in results],
    }


def force_launch_config(block: int, warps: int) -> None:
    """Launch every kernel (known or not) with `(block, warps)` on every target: for sweeps."""
    for name in list(_triton.LAUNCH_CONFIGS):
        _triton.LAUNCH_CONFIGS[name] = {c: (block, warps) for c in TARGETS}


def problems(summary: dict) -> list[str]:
    """One line per launch error, failed compile and spilling kernel of a `check` summary."""
    lines = [f"launch failed: {e}" for e in summary["launch_errors"]]
    for r in summary["results"]:
        where = (f"{r['kernel']} for {r['target']} (BLOCK {r['block']}, {r['num_warps']} warps, {r['dtype']}, "
                 f"{r['switches']}; used by {r['uses'][0]['setting']}, vocab {r['uses'][0]['vocabs']})")
        if not r["ok"]:
            lines.append(f"does not compile: {where}: {r['error']}")
        elif r["spill_stores"] or r["spill_loads"]:
            lines.append(f"spills {r['spill_stores']} B stored / {r['spill_loads']} B loaded per thread at "
                         f"{r['registers']} registers: {where}")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", nargs="+", type=int, default=list(TARGETS), choices=list(TARGETS), help="compute capabilities")
    parser.add_argument("--vocabs", nargs="+", type=int, default=list(VOCABS))
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float16"], choices=["bfloat16", "float16"])
    parser.add_argument("--losses", nargs="+", default=None, help="registered losses (default: all with a row kernel)")
    parser.add_argument("--import", dest="imports", nargs="+", default=[], help="modules to import first (they register losses)")
    parser.add_argument("--full", action="store_true", help="every combination of switches, not all pairs (slow)")
    parser.add_argument("--config", default=None, help="BLOCKxWARPS: launch every kernel with this instead of the table")
    parser.add_argument("--jobs", type=int, default=None, help="compile processes (default: one per core)")
    parser.add_argument("--json", default=None, help="also write every build's result here (JSON)")
    args = parser.parse_args(argv)
    for module in args.imports:
        importlib.import_module(module)
    if args.config:
        force_launch_config(*(int(x) for x in args.config.lower().split("x")))
    settings = all_settings(switch_cases(args.losses), [getattr(torch, d) for d in args.dtypes])
    summary = check(settings, args.targets, args.vocabs, args.full, args.jobs)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(summary, handle, indent=1, default=str)
    found = problems(summary)
    print(f"{summary['builds']} builds from {summary['settings']} settings ({summary['mode']}): {len(found)} problems; "
          f"recorded in {summary['record_seconds']} s, compiled in {summary['compile_seconds']} s", file=sys.stderr)
    for line in found:
        print(line, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
