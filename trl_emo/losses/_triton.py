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

Without Triton this module still imports: `HAS_TRITON` is False, `triton.jit` leaves functions
undecorated, and the fused path never selects a row kernel.
"""

from __future__ import annotations

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

# Columns per block: large blocks mean few loop iterations; past ~16k the per-thread register
# use of the heavier kernels (EMO, GEM-logsigmoid keep ~6 live float32 blocks) starts to spill.
_MAX_BLOCK = 16384
# The interpreter runs a block as one numpy operation: larger is faster there.
_MAX_BLOCK_INTERPRETED = 65536


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

    def meta(self, heavy: bool = False) -> dict:
        cap = _MAX_BLOCK_INTERPRETED if interpreting() else (_MAX_BLOCK // 2 if heavy else _MAX_BLOCK)
        block = min(cap, triton.next_power_of_2(self.vocab))
        meta = {
            "HAS_BIAS": self.bias is not None,
            "HAS_SOFTCAP": self.softcap is not None,
            "WRITE_GRAD": self.write_grad,
            "BLOCK": block,
        }
        if not interpreting():
            meta["num_warps"] = 16 if block >= 8192 else 8
        return meta
