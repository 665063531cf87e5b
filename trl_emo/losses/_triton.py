"""The pieces every Triton row kernel shares, and Triton itself when it is installed.

The GPU path of `fused.py` computes one chunk of logits `[n, V]` with cuBLAS (compute dtype,
float32 accumulation), then launches one program per row of a loss's *row kernel*. A row kernel
reads the row once or twice in blocks of `BLOCK` columns: pass 1 gathers online-softmax
statistics (running max, normalizer, whatever the loss needs), pass 2 writes `∂ℓ/∂y` over the
logits in place, so the same buffer feeds the two gradient products. It also writes the row's
objective, cross-entropy, entropy, top-1 and the loss's own metrics into a float32 `[R, N]`
statistics tensor.

Every loaded value is converted to float32 at once: half-precision arithmetic is both less
accurate on a GPU and wrong under Triton's CPU interpreter (`TRITON_INTERPRET=1`, which the tests
use). Running maxima start at a large finite negative number instead of `-inf`, so the rescaling
`s * (m_old - m_new)` of the first block is `0`, not `nan`.

Kernel signature convention (`RowLaunch.args()` / `RowLaunch.meta()` supply the shared part):
`(Z, z_stride, Y, ZY, BIAS, STATS, stats_stride, GRAD_SCALE, V, logit_scale, softcap, <loss
arguments>, HAS_BIAS, HAS_SOFTCAP, WRITE_GRAD, BLOCK)`. `ZY` holds the target logits `z_y` in
float32, computed by the caller as a float32 dot product: a half-precision `z_y` would carry its
rounding straight into every loss value (`ℓ = lse - z_y` for cross-entropy), while the rounding of
the other logits averages out over the vocabulary.

A launcher passes `**launch.meta("<kernel name>")`: the flags, and the `BLOCK` and `num_warps` that
`LAUNCH_CONFIGS` holds for that kernel on the GPU's compute capability (a third-party kernel adds its
own with `register_launch_config`, or takes `"default"`). `python benchmarks/aot_compile.py`
compiles every registered loss's kernels for sm_80/86/89/90 without a GPU and reports ptxas's
registers and spills (a CI check outside the package).

Without Triton this module still imports: `HAS_TRITON` is False, `triton.jit` leaves functions
undecorated, and the fused path never selects a row kernel.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, replace

import torch

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - exercised on machines without Triton
    HAS_TRITON = False

    class _NoTriton:
        """Just enough of `triton`/`triton.language` for the kernel definitions to be parsed."""

        @staticmethod
        def constexpr(value=None):
            return value

        @staticmethod
        def jit(fn=None, **_kwargs):
            return fn if fn is not None else (lambda f: f)

        @staticmethod
        def next_power_of_2(n: int) -> int:
            return 1 << max(0, int(n) - 1).bit_length()

    triton = tl = _NoTriton()

def interpreting() -> bool:
    """Whether Triton kernels run in its CPU interpreter (slow; tests only)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_usable(device: torch.device, explicit: bool = False) -> bool:
    """Row kernels can run on tensors of `device`: compiled on CUDA; interpreted on the CPU only when
    asked for explicitly (tests), never by default."""
    if not HAS_TRITON:
        return False
    if device.type == "cuda":
        return not interpreting()
    return explicit and device.type == "cpu" and interpreting()


@triton.jit
def tanh(x):
    # libdevice's tanh does not run under the interpreter; this identity does, and is exact enough.
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0


@triton.jit
def load_logits(Z_row, BIAS, offs, mask, logit_scale, softcap, HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr):
    """A block of the row's transformed logits `z` in float32 (a huge negative number past the vocabulary).

    Not `-inf`: then `exp(z - m) * (z - m)` would be `0 * -inf = nan` past the vocabulary; with a
    finite sentinel every masked term is an exact zero.
    """
    y = tl.load(Z_row + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        y += tl.load(BIAS + offs, mask=mask, other=0.0).to(tl.float32)
    z = y * logit_scale
    if HAS_SOFTCAP:
        z = softcap * tanh(z / softcap)
    return tl.where(mask, z, -1.0e30)


@triton.jit
def row_inputs(Z, z_stride, Y, ZY):
    """This program's row: its index, its logits, its target id and its (float32) target logit."""
    row = tl.program_id(0).to(tl.int64)
    return row, Z + row * z_stride, tl.load(Y + row), tl.load(ZY + row)


@triton.jit
def logits_block(Z_row, BIAS, off, V, logit_scale, softcap, HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, BLOCK: tl.constexpr):
    """Columns `off : off + BLOCK` of the row: their indices, validity and transformed logits."""
    offs = off + tl.arange(0, BLOCK)
    mask = offs < V
    return offs, mask, load_logits(Z_row, BIAS, offs, mask, logit_scale, softcap, HAS_BIAS, HAS_SOFTCAP)


@triton.jit
def running_max(m, idx, z, off):
    """The running max after this block, and the first index where it is reached (torch's argmax)."""
    block_max = tl.max(z, 0)
    idx = tl.where(block_max > m, off + tl.argmax(z, 0), idx)
    return tl.maximum(m, block_max), idx


@triton.jit
def softmax_sums(m, m_new, s, t, z):
    """`s = Σ e`, `t = Σ e (z - m)` with `e = exp(z - m)`, moved from the old running max to the new one."""
    alpha = tl.exp(m - m_new)
    e = tl.exp(z - m_new)
    t = alpha * (t + s * (m - m_new)) + tl.sum(e * (z - m_new), 0)
    s = alpha * s + tl.sum(e, 0)
    return s, t, e


@triton.jit
def softmax_pass(Z_row, BIAS, V, logit_scale, softcap, HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, BLOCK: tl.constexpr):
    """Pass 1 of the cross-entropy family: `(lse, entropy, argmax)` of `softmax(z)` in one read.

    The entropy is `log s - Σ e (z - m) / s` with sums taken relative to the running max `m`, so it
    involves no cancellation between two large numbers.
    """
    m = -1.0e30  # not -inf: see the module docstring
    s = 0.0
    t = 0.0
    idx = 0
    for off in range(0, V, BLOCK):
        offs, mask, z = logits_block(Z_row, BIAS, off, V, logit_scale, softcap, HAS_BIAS, HAS_SOFTCAP, BLOCK)
        m_new, idx = running_max(m, idx, z, off)
        s, t, e = softmax_sums(m, m_new, s, t, z)
        m = m_new
    log_s = tl.log(s)
    return m + log_s, log_s - t / s, idx


@triton.jit
def weighted_ce_grad(
    Z_row, BIAS, V, lse, y, w, GRAD_SCALE, logit_scale, softcap,
    HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, BLOCK: tl.constexpr,
):
    """Pass 2 of `ℓ = -sg(w) log p_y` (cross-entropy when `w = 1`): `∂ℓ/∂z = w (p - e_y)`."""
    grad_scale = tl.load(GRAD_SCALE)
    for off in range(0, V, BLOCK):
        offs, mask, z = logits_block(Z_row, BIAS, off, V, logit_scale, softcap, HAS_BIAS, HAS_SOFTCAP, BLOCK)
        g = w * (tl.exp(z - lse) - tl.where(offs == y, 1.0, 0.0))
        store_grad(Z_row, offs, mask, g, z, grad_scale, logit_scale, softcap, HAS_SOFTCAP)


@triton.jit
def store_grad(Z_row, offs, mask, g, z, grad_scale, logit_scale, softcap, HAS_SOFTCAP: tl.constexpr):
    """Write `∂ℓ/∂y = ∂ℓ/∂z · dz/dy · grad_scale` over the raw logits of the block."""
    if HAS_SOFTCAP:
        t = tl.where(mask, z / softcap, 0.0)
        g = g * (logit_scale * (1.0 - t * t))
    else:
        g = g * logit_scale
    tl.store(Z_row + offs, (g * grad_scale).to(Z_row.dtype.element_ty), mask=mask)


@triton.jit
def store_stats(STATS, stats_stride, row, value, nll, entropy, top1):
    tl.store(STATS + row, value)
    tl.store(STATS + stats_stride + row, nll)
    tl.store(STATS + 2 * stats_stride + row, entropy)
    tl.store(STATS + 3 * stats_stride + row, top1)


# -- launching ---------------------------------------------------------------------------------

# The largest block any launch uses (tests lower it to force multi-block rows on small vocabularies).
_MAX_BLOCK = 16384
# The interpreter runs a block as one numpy operation: larger is faster there.
_MAX_BLOCK_INTERPRETED = 65536

# (BLOCK, num_warps) of each row kernel per compute capability (major * 10 + minor). Chosen without a
# GPU by `benchmarks/kernel_resources.py --sweep`, and proven by `tests/test_kernel_compile.py`, which
# compiles every kernel for sm_80/86/89/90 and fails on any ptxas spill. The rule: among BLOCK
# 2,048-16,384 and 4/8/16 warps with 16 to 32 columns per thread (at least two 16-byte loads in flight
# per thread per block, a 128k row in at most 64 blocks per pass; past 32, one block alone takes most of
# a thread's registers), drop those where any variant of the kernel (its switches, bias, soft-cap,
# gradient, bf16/fp16) spills on that target; take the one with the most programs resident per SM in
# the kernel's worst variant (rows in flight hide each program's load latency and block reductions);
# then the larger BLOCK. 2,048 x 4 won for every kernel and target: 40-94 registers, 5-9 programs per
# SM. The previous 16,384 x 16 (8,192 x 16 for GEM-logsigmoid, EMO, ASFT) allowed 1-2 and spilled
# 12-24 bytes per thread on sm_80/86/89 (docs/benchmarks.md, "Row kernels on real GPUs").
# A capability not listed takes the closest lower one listed (later GPUs keep 64K registers per SM);
# only the listed ones are proven spill-free. "default" and "heavy" serve unnamed (third-party) kernels.
LAUNCH_CONFIGS: dict[str, dict[int, tuple[int, int]]] = {
    "default":        {80: (2048, 4), 86: (2048, 4), 89: (2048, 4), 90: (2048, 4)},
    "heavy":          {80: (2048, 4), 86: (2048, 4), 89: (2048, 4), 90: (2048, 4)},
    "nll":            {80: (2048, 4), 86: (2048, 4), 89: (2048, 4), 90: (2048, 4)},
    "gem":            {80: (2048, 4), 86: (2048, 4), 89: (2048, 4), 90: (2048, 4)},
    "gem_logsigmoid": {80: (2048, 4), 86: (2048, 4), 89: (2048, 4), 90: (2048, 4)},
    "emo":            {80: (2048, 4), 86: (2048, 4), 89: (2048, 4), 90: (2048, 4)},
    "tailr":          {80: (2048, 4), 86: (2048, 4), 89: (2048, 4), 90: (2048, 4)},
    "mixce":          {80: (2048, 4), 86: (2048, 4), 89: (2048, 4), 90: (2048, 4)},
    "ce_entropy":     {80: (2048, 4), 86: (2048, 4), 89: (2048, 4), 90: (2048, 4)},
    "eaft":           {80: (2048, 4), 86: (2048, 4), 89: (2048, 4), 90: (2048, 4)},
    "asft":           {80: (2048, 4), 86: (2048, 4), 89: (2048, 4), 90: (2048, 4)},
    "sed":            {80: (2048, 4), 86: (2048, 4), 89: (2048, 4), 90: (2048, 4)},
    "eksft":          {80: (2048, 4), 86: (2048, 4), 89: (2048, 4), 90: (2048, 4)},
    "eksft_statistics": {80: (2048, 4), 86: (2048, 4), 89: (2048, 4), 90: (2048, 4)},
    "prob":           {80: (2048, 4), 86: (2048, 4), 89: (2048, 4), 90: (2048, 4)},
    "prob_statistics": {80: (2048, 4), 86: (2048, 4), 89: (2048, 4), 90: (2048, 4)},
    "iw_sft":         {80: (2048, 4), 86: (2048, 4), 89: (2048, 4), 90: (2048, 4)},
    "iw_sft_statistics": {80: (2048, 4), 86: (2048, 4), 89: (2048, 4), 90: (2048, 4)},
    "gift":           {80: (2048, 4), 86: (2048, 4), 89: (2048, 4), 90: (2048, 4)},
    "slm":            {80: (2048, 4), 86: (2048, 4), 89: (2048, 4), 90: (2048, 4)},
    "slm_statistics": {80: (2048, 4), 86: (2048, 4), 89: (2048, 4), 90: (2048, 4)},
}


def register_launch_config(kernel: str, configs: dict[int, tuple[int, int]]) -> None:
    """Give a (third-party) row kernel its own `(BLOCK, num_warps)` per compute capability.

    Its launcher then asks for it by name, `launch.meta("my_kernel")`; capabilities left out take
    the closest lower one listed, as the built-in kernels do.
    """
    if not isinstance(kernel, str) or not kernel:
        raise ValueError(f"A launch configuration needs a kernel name, got {kernel!r}.")
    checked = {}
    for capability, config in configs.items():
        block, warps = config
        if not (isinstance(capability, int) and capability >= 70):
            raise ValueError(f"Compute capabilities are written major * 10 + minor (e.g. 86), got {capability!r}.")
        for what, value in (("BLOCK", block), ("num_warps", warps)):
            if not (isinstance(value, int) and value > 0 and value & (value - 1) == 0):
                raise ValueError(f"{what} of {kernel!r} for capability {capability} must be a power of two, got {value!r}.")
        checked[capability] = (block, warps)
    if not checked:
        raise ValueError(f"No launch configuration given for {kernel!r}.")
    LAUNCH_CONFIGS[kernel] = checked


def launch_config(kernel: str, capability: int) -> tuple[int, int]:
    """`(BLOCK, num_warps)` of `kernel` (a `LAUNCH_CONFIGS` name; unknown names take `"default"`) on a GPU
    of `capability`: its own entry, else the closest lower capability listed, else the lowest."""
    table = LAUNCH_CONFIGS.get(kernel) or LAUNCH_CONFIGS["default"]
    lower = [c for c in table if c <= capability]
    return table[max(lower) if lower else min(table)]


@functools.lru_cache(maxsize=None)
def _device_capability(index: int) -> int:
    major, minor = torch.cuda.get_device_capability(index)
    return 10 * major + minor


@dataclass
class RowLaunch:
    """One chunk's row-kernel launch: the shared arguments, in the order of the convention above."""

    z: torch.Tensor  # [n, V] raw logits in, ∂ℓ/∂y out (when write_grad)
    targets: torch.Tensor  # [n] int64
    target_logits: torch.Tensor  # [n] float32 z_y, transformed
    bias: torch.Tensor | None
    stats: torch.Tensor  # [R, n] float32 view (columns of this chunk)
    grad_scale: torch.Tensor  # 1-element float32: folded into ∂ℓ/∂y (1/N, or 1 when applied later)
    logit_scale: float
    softcap: float | None
    write_grad: bool
    scratch: torch.Tensor | None = None  # the loss's extra [rows, V] buffer (`LossSpec.scratch_rows`)
    # The compute capability to configure for instead of the tensors' GPU (ahead-of-time compiles).
    target: int | None = None

    @property
    def rows(self) -> int:
        return self.z.shape[0]

    def part(self, start: int, end: int) -> RowLaunch:
        """The same launch for rows `start:end` of the chunk."""
        return replace(
            self,
            z=self.z[start:end],
            targets=self.targets[start:end],
            target_logits=self.target_logits[start:end],
            stats=self.stats[:, start:end],
        )

    @property
    def vocab(self) -> int:
        return self.z.shape[1]

    def args(self) -> tuple:
        return (
            self.z,
            self.z.stride(0),
            self.targets,
            self.target_logits,
            self.bias if self.bias is not None else self.stats,
            self.stats,
            self.stats.stride(0),
            self.grad_scale,
            self.vocab,
            float(self.logit_scale),
            float(self.softcap) if self.softcap is not None else 1.0,
        )

    @property
    def capability(self) -> int | None:
        """The compute capability the kernel is built for: `target` when set, else the logits' GPU's."""
        if self.target is not None:
            return self.target
        if self.z.is_cuda:
            return _device_capability(self.z.device.index if self.z.device.index is not None else torch.cuda.current_device())
        return None

    def meta(self, kernel: str | None = None, heavy: bool = False) -> dict:
        """The constexprs and launch options every row kernel takes, for the row kernel named `kernel`
        (a `LAUNCH_CONFIGS` entry; `heavy` picks `"heavy"` for an unnamed kernel with many live blocks)."""
        meta = {
            "HAS_BIAS": self.bias is not None,
            "HAS_SOFTCAP": self.softcap is not None,
            "WRITE_GRAD": self.write_grad,
        }
        capability = self.capability
        if capability is None and interpreting():
            # The interpreter ignores warps; one large block is one numpy operation.
            meta["BLOCK"] = min(_MAX_BLOCK_INTERPRETED, triton.next_power_of_2(self.vocab))
            return meta
        block, warps = launch_config(kernel or ("heavy" if heavy else "default"), capability or 80)
        meta["BLOCK"] = min(block, _MAX_BLOCK, triton.next_power_of_2(self.vocab))
        # A block cut short by a small vocabulary keeps at least 8 columns per thread (one 16-byte load).
        meta["num_warps"] = max(1, min(warps, meta["BLOCK"] // 256))
        return meta


def top_logits(launch: RowLaunch, k: int) -> torch.Tensor:
    """The `k` largest transformed logits of each row of a chunk, float32 `[n, k]`, taken with `torch.topk` from the
    chunk's raw logits before the row kernel overwrites them with the gradient (EAFT's top-k entropy, SED's top-k
    mass). A bias can reorder the logits, so it is added first, into the loss's extra buffer (`launch.scratch`, a part
    of the chunk at a time); scale and soft-cap are increasing maps, so the top-k of the raw logits are those of z."""
    out = torch.empty(launch.rows, k, device=launch.z.device, dtype=torch.float32)
    step = launch.scratch.shape[0] if launch.bias is not None else launch.rows
    for start in range(0, launch.rows, max(step, 1)):
        end = min(start + step, launch.rows)
        raw = launch.z[start:end]
        if launch.bias is not None:
            biased = torch.add(raw, launch.bias.to(raw.dtype), out=launch.scratch[: end - start])
            # The positions from the sum in the compute dtype; the values again in float32, as the row kernel adds
            # the bias (a bf16 sum of logits near 18 is off by up to 1/16, and the top-k mass by ~2% with it).
            index = biased.topk(k, dim=-1).indices
            top = (raw.gather(1, index).float() + launch.bias.float()[index]) * launch.logit_scale
        else:
            top = raw.topk(k, dim=-1).values.float() * launch.logit_scale
        if launch.softcap is not None:
            top = launch.softcap * torch.tanh(top / launch.softcap)
        out[start:end] = top
    return out
