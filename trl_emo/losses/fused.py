"""Every objective from hidden states and the head, chunk by chunk, never the whole logits.

For `N` target positions with hidden states `h [N, H]` and a head `W [V, H]`, the positions are
taken a chunk at a time: the chunk's logits are built, a kernel turns them into the loss and
`∂ℓ/∂z`, and that is immediately folded into `∂h = (∂ℓ/∂z) W` and `∂W += (∂ℓ/∂z)^T h`. Peak extra
memory is the chunk's `[n, V]` buffers, independent of batch size and sequence length. The
gradient is formed during the forward pass (three products per chunk; recomputing the logits in
backward would take four) and scaled by the incoming gradient in backward, so the function
returns a scalar.

Two implementations of the chunk step, chosen by `backend`:

- `"triton"` (the default on CUDA when Triton is installed): the logits product in the compute
  dtype (bf16/fp16 output, float32 accumulation inside cuBLAS), then the loss's Triton row kernel
  reads each row once or twice and writes the statistics and `∂ℓ/∂y` over the logits in place, so
  one `[n, V]` buffer (two for EMO) serves the whole chunk; then the two gradient products. The
  weight gradient accumulates in float32 when the head is float32 (autocast training) and in the
  head's dtype otherwise, one rounding per chunk, like Liger's and TRL's kernels (a float32
  accumulator for a bf16 head would cost twice the head's size; `docs/benchmarks.md` has the
  measured error).
- `"torch"` (the CPU path, the fallback, and losses registered without a row kernel): float32
  logits and the loss's closed-form PyTorch chunk kernel (or autograd on its per-token function),
  float64 kept for gradcheck.

Chunk size: `chunk_size` positions when given, else as many as fit a memory budget for the
chunk's `[n, V]` buffers (`chunk_memory` bytes; defaults below), bounded to keep the products
efficient.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch

from . import _triton
from ._common import autograd_chunk, normalizer
from .precision import accumulate_product_, addmm_float32_, mm_float32
from .registry import ROLES, TOKEN_WEIGHTS, LossSpec, RowTensors, TokenAligned, token_weight_rows

logger = logging.getLogger(__name__)

BACKENDS = ("auto", "triton", "torch")
# Memory for one chunk's [n, V] buffers when none is given. The PyTorch kernels keep about four
# float32 buffers alive (logits, probabilities, gradient, and q or the cost similarities): 4 x 128
# MiB. The Triton path keeps one buffer in the compute dtype (plus a quarter-size one for EMO):
# 320 MiB gives 1,280 rows of a bf16 128k-vocabulary chunk (EMO 1,024), and keeps a
# Llama-3-8B-sized loss within 1.5 GiB, its 0.98 GiB head gradient included. Larger chunks mean
# fewer bf16 roundings of the head gradient (docs/benchmarks.md) and more memory.
DEFAULT_TORCH_CHUNK_MEMORY = 4 * 128 * 2**20
DEFAULT_TRITON_CHUNK_MEMORY = 320 * 2**20
_TORCH_BUFFERS = 4
# Bounds of the chunk size: small chunks starve the matrix units, large ones only cost memory.
_MIN_CHUNK, _MAX_CHUNK = 64, 8192
# The Triton path rounds its chunks to this many rows (whole GEMM tiles).
_ROW_GRANULE = 64

# Losses whose row kernel failed to compile on this machine: they run the PyTorch path instead
# (only under backend="auto"; an explicit backend="triton" raises).
_BROKEN_ROW_KERNELS: dict[str, str] = {}


def auto_chunk_size(vocab_size: int, chunk_memory: int | None = None, bytes_per_row: int | None = None) -> int:
    """Positions per chunk whose `[n, V]` buffers fit `chunk_memory` bytes.

    `bytes_per_row` defaults to the PyTorch path's (four float32 buffers).
    """
    chunk_memory = DEFAULT_TORCH_CHUNK_MEMORY if chunk_memory is None else chunk_memory
    bytes_per_row = bytes_per_row or _TORCH_BUFFERS * 4 * vocab_size
    return int(min(_MAX_CHUNK, max(_MIN_CHUNK, chunk_memory // bytes_per_row)))


@dataclass
class HeadTransform:
    """What the model does to `h W^T + b` before the softmax (read from its config).

    `z = softcap * tanh(scale * y / softcap)` with a soft-cap, `z = scale * y` without one.
    """

    logit_scale: float = 1.0
    softcap: float | None = None

    def apply_(self, y: torch.Tensor) -> torch.Tensor:
        if self.logit_scale != 1.0:
            y.mul_(self.logit_scale)
        if self.softcap is not None:
            y.div_(self.softcap).tanh_().mul_(self.softcap)
        return y

    def chain_(self, grad: torch.Tensor, z: torch.Tensor | None) -> torch.Tensor:
        """`∂ℓ/∂y` from `∂ℓ/∂z` (in place); `z` is the transformed logits (needed with a soft-cap)."""
        if self.softcap is not None:
            # dz/dy = scale * (1 - tanh^2), and tanh = z / softcap
            grad.mul_(1.0 - (z / self.softcap) ** 2)
        if self.logit_scale != 1.0:
            grad.mul_(self.logit_scale)
        return grad


@dataclass
class HeadAdapter:
    """A low-rank term in the head, as a LoRA adapter on the output layer adds: `y = h W^T + b + a B^T`.

    `down` `[N, r]`: each row's adapter activation, already scaled, `a = s · A dropout(h)` (PEFT's
    `lora_B(lora_A(dropout(h))) * scaling` without its last product). The caller computes it with autograd, so that
    `A`, the dropout and the scale get their gradients there; the fused path returns `∂ℓ/∂a`. `up` `[V, r]`: the
    up-projection `B` (PEFT's `lora_B.weight`). Several adapters are one, concatenated along `r`. The chunk's logits
    take one more product (`r` columns against the head's `H`), and the gradient three more, each `r` wide: the
    `[tokens, V]` logits are never formed."""

    down: torch.Tensor
    up: torch.Tensor


def _adapter_logits_(z: torch.Tensor, adapter: HeadAdapter | None, start: int, end: int, float32: bool) -> torch.Tensor:
    """`z += a B^T` for rows `start:end`: in float32 on the PyTorch path (`float32`), in `z`'s dtype otherwise."""
    if adapter is not None:
        a = adapter.down[start:end]
        if float32:
            addmm_float32_(z, a, adapter.up.t())
        else:
            z.addmm_(a.to(z.dtype), adapter.up.to(z.dtype).t())
    return z


# Rows of the statistics tensor returned beside the loss.
STAT_ROWS = ("token_losses", "nll", "entropy", "is_top1")


@dataclass
class _Needs:
    hidden: bool
    weight: bool
    bias: bool
    down: bool = False  # the adapter's `a` and `B` (`HeadAdapter`)
    up: bool = False

    @property
    def any(self) -> bool:
        return self.hidden or self.weight or self.bias or self.down or self.up


@dataclass
class _Plan:
    """Everything about one call except the tensors that autograd tracks."""

    spec: LossSpec
    hparams: dict
    transform: HeadTransform
    backend: str  # "triton" or "torch", resolved
    chunk_size: int | None
    chunk_memory: int | None
    compute_dtype: torch.dtype
    want_grad: bool
    fp32_weight_grad: bool = False
    # Each row's per-token weight when the paths apply it (`LossSpec.token_weights == "scale"`); None: unweighted.
    row_weights: torch.Tensor | None = None
    adapter: HeadAdapter | None = None

    @property
    def metric_names(self) -> tuple[str, ...]:
        # Extra metrics come from a loss's own kernels; autograd on `per_token` yields none.
        has_kernel = self.spec.row_kernel if self.backend == "triton" else self.spec.chunk_kernel
        return self.spec.metrics if has_kernel is not None else ()

    def chunk_hparams(self, start: int, end: int) -> dict:
        """The loss's keyword arguments for positions `start:end` (per-position inputs sliced)."""
        return {k: v.rows(start, end) if isinstance(v, TokenAligned) else v for k, v in self.hparams.items()}

    def chunk_rows(self, vocab: int, n_tokens: int) -> int:
        if self.chunk_size is not None:
            return self.chunk_size
        if self.backend == "torch":
            return auto_chunk_size(vocab, self.chunk_memory)
        per_row = vocab * torch.tensor([], dtype=self.compute_dtype).element_size() * (1 + self.spec.scratch_rows)
        budget = DEFAULT_TRITON_CHUNK_MEMORY if self.chunk_memory is None else self.chunk_memory
        rows = max(_ROW_GRANULE, budget // per_row // _ROW_GRANULE * _ROW_GRANULE)
        rows = min(rows, _MAX_CHUNK)
        # Never allocate more rows than there are positions.
        return int(min(rows, -(-n_tokens // _ROW_GRANULE) * _ROW_GRANULE))


@dataclass
class StatisticsPass:
    """What a loss's `prepare` (`LossSpec.prepare`) gets: this call's positions in chunks and their logits, computed
    as the loss pass will compute them, without gradient (the pass runs under `torch.no_grad`).

    `backend` says which kernels the loss pass runs: on `"torch"`, `logits(start, end)` gives the float32 transformed
    logits of rows `start:end`; on `"triton"`, `raw_logits(start, end, out)` writes the compute-dtype `h W^T` into
    `out` (bias and transform left to the row kernel, as in the loss pass)."""

    hidden: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor | None
    targets: torch.Tensor
    transform: HeadTransform
    backend: str
    compute_dtype: torch.dtype
    chunk_size: int
    adapter: HeadAdapter | None = None  # a LoRA adapter's term in the logits, detached like the rest

    @property
    def n_rows(self) -> int:
        return self.hidden.shape[0]

    @property
    def vocab(self) -> int:
        return self.weight.shape[0]

    def chunks(self):
        """`(start, end)` of every chunk, in order."""
        for start in range(0, self.n_rows, self.chunk_size):
            yield start, min(start + self.chunk_size, self.n_rows)

    def logits(self, start: int, end: int) -> torch.Tensor:
        z = mm_float32(self.hidden[start:end].to(self.compute_dtype), self.weight.to(self.compute_dtype).t())
        _adapter_logits_(z, self.adapter, start, end, float32=True)
        if self.bias is not None:
            z.add_(self.bias.to(z.dtype))
        return self.transform.apply_(z)

    def target_logits(self, start: int, end: int) -> torch.Tensor:
        """The float32 transformed target logits `z_y` of rows `start:end`, as the Triton loss pass computes them
        (`_target_logits`: a float32 dot product, the bias, a LoRA adapter's term)."""
        cd = self.compute_dtype
        h = self.hidden[start:end].to(cd)
        a = up = None
        if self.adapter is not None:
            a, up = self.adapter.down[start:end].to(cd), self.adapter.up.to(cd)
        return _target_logits(h, self.weight.to(cd), self.bias, self.targets[start:end], self.transform, a, up)

    def raw_logits(self, start: int, end: int, out: torch.Tensor) -> torch.Tensor:
        w = self.weight if self.weight.dtype == self.compute_dtype else self.weight.to(self.compute_dtype)
        h = self.hidden[start:end]
        torch.mm(h if h.dtype == self.compute_dtype else h.to(self.compute_dtype), w.t(), out=out[: end - start])
        return _adapter_logits_(out[: end - start], self.adapter, start, end, float32=False)


def _prepare(plan: _Plan, hidden, weight, bias, targets) -> None:
    """Run the loss's `prepare` (if any) over every chunk before the loss pass; it may replace the hyper-parameters."""
    if plan.spec.prepare is None:
        return
    adapter = plan.adapter and HeadAdapter(plan.adapter.down.detach(), plan.adapter.up.detach())
    statistics = StatisticsPass(
        hidden.detach(), weight.detach(), None if bias is None else bias.detach(), targets, plan.transform, plan.backend,
        plan.compute_dtype, plan.chunk_rows(weight.shape[0], hidden.shape[0]), adapter,
    )
    with torch.no_grad():
        plan.hparams = plan.spec.prepare(statistics, plan.hparams)


def _run_torch(plan: _Plan, hidden, weight, bias, targets, scale, needs: _Needs):
    """The PyTorch chunk step: float32 logits, closed-form (or autograd) kernel, float32 accumulation."""
    n_tokens = hidden.shape[0]
    kernel = plan.spec.chunk_kernel or autograd_chunk(plan.spec.per_token)
    acc_dtype = torch.float64 if hidden.dtype == torch.float64 else torch.float32
    stats = torch.empty(len(STAT_ROWS) + len(plan.metric_names), n_tokens, device=hidden.device, dtype=acc_dtype)
    grad_hidden = torch.empty(hidden.shape, device=hidden.device, dtype=acc_dtype) if needs.hidden else None
    grad_weight = torch.zeros(weight.shape, device=weight.device, dtype=acc_dtype) if needs.weight else None
    grad_bias = torch.zeros(bias.shape, device=bias.device, dtype=acc_dtype) if needs.bias else None
    adapter, row_weights = plan.adapter, plan.row_weights
    grad_down = torch.empty(adapter.down.shape, device=hidden.device, dtype=acc_dtype) if needs.down else None
    grad_up = torch.zeros(adapter.up.shape, device=hidden.device, dtype=acc_dtype) if needs.up else None
    compute_dtype = plan.compute_dtype
    late_scale = compute_dtype == torch.float16
    w = weight.to(compute_dtype)
    up = None if adapter is None else adapter.up.to(compute_dtype)
    chunk_size = plan.chunk_rows(weight.shape[0], n_tokens)
    for start in range(0, n_tokens, chunk_size):
        end = min(start + chunk_size, n_tokens)
        h = hidden[start:end].to(compute_dtype)
        z = mm_float32(h, w.t())
        if adapter is not None:
            a = adapter.down[start:end].to(compute_dtype)
            addmm_float32_(z, a, up.t())
        if bias is not None:
            z.add_(bias.to(z.dtype))
        plan.transform.apply_(z)
        result = kernel(z, targets[start:end], needs.any, **plan.chunk_hparams(start, end))
        # A row's weight multiplies its term and its gradient (exact for weight 1: the same bits as without weights).
        rw = None if row_weights is None else row_weights[start:end].to(result.values.dtype)
        stats[0, start:end] = result.values if rw is None else result.values * rw
        stats[1, start:end] = result.nll
        stats[2, start:end] = result.entropy
        stats[3, start:end] = result.is_top1
        for row, name in enumerate(plan.metric_names, start=len(STAT_ROWS)):
            stats[row, start:end] = result.metrics[name]
        if not needs.any:
            continue
        # fp16 would flush the small entries of (p - e_y)/N to zero in the cast below: there 1/N goes on the float32
        # products at the end instead, as the Triton path's `alpha` does.
        grad_z = result.grad
        if rw is not None:
            grad_z.mul_((rw if late_scale else rw * scale)[:, None])
        elif not late_scale:
            grad_z.mul_(scale)
        grad_z = plan.transform.chain_(grad_z, z)
        del z, result
        if needs.bias:
            grad_bias += grad_z.sum(0)
        # Like the rest of the backward pass, the logits gradient enters the products in the
        # compute dtype; the products accumulate in float32.
        grad_z = grad_z.to(compute_dtype)
        if needs.hidden:
            grad_hidden[start:end] = mm_float32(grad_z, w)
        if needs.weight:
            addmm_float32_(grad_weight, grad_z.t(), h)
        if needs.down:
            grad_down[start:end] = mm_float32(grad_z, up)
        if needs.up:
            addmm_float32_(grad_up, grad_z.t(), a)
    if late_scale:
        for grad in (grad_hidden, grad_weight, grad_bias, grad_down, grad_up):
            if grad is not None:
                grad.mul_(scale)
    return stats, _held_all(hidden, weight, bias, adapter, grad_hidden, grad_weight, grad_bias, grad_down, grad_up)


def _held_all(hidden, weight, bias, adapter, *grads):
    """Every gradient as kept from forward to backward (`_held`), in the order of `_FusedLinearLoss`'s inputs."""
    likes = (hidden.dtype, weight.dtype, bias, *((adapter.down.dtype, adapter.up.dtype) if adapter else (None, None)))
    return tuple(_held(g, like) for g, like in zip(grads, likes))


def _held(grad: torch.Tensor | None, like) -> torch.Tensor | None:
    """A gradient as kept from forward to backward: in its parameter's dtype, except fp16, kept in float32.

    The gradient is formed unscaled in forward; fp16 training scales it in backward by GradScaler's factor (2**16 at
    first, itself above fp16's largest 65,504), and the unscaled entries of a mean over many tokens sit below fp16's
    smallest subnormal. Kept in float32 and rounded once after the scale, fp16 gets the gradient the logits path
    computes under the same scale (seen on an H100: in fp16 every element overflowed to inf or flushed to 0)."""
    if grad is None:
        return None
    dtype = like.dtype if isinstance(like, torch.Tensor) else like
    return grad if dtype == torch.float16 and grad.dtype == torch.float32 else grad.to(dtype)


def _target_logits(h, w, bias, targets, transform: HeadTransform, a=None, up=None) -> torch.Tensor:
    """`z_y` of every row as a float32 dot product (see `_triton.py` for why not from the logits); `a`, `up`: the
    rows' adapter activations and its up-projection (`HeadAdapter`)."""
    z_y = torch.linalg.vecdot(h.float(), w[targets].float())
    if a is not None:
        z_y += torch.linalg.vecdot(a.float(), up[targets].float())
    if bias is not None:
        z_y += bias[targets].float()
    return transform.apply_(z_y)


def _run_triton(plan: _Plan, hidden, weight, bias, targets, scale, needs: _Needs):
    """The GPU chunk step: compute-dtype logits, one row-kernel launch per chunk, in-place gradient."""
    n_tokens, vocab = hidden.shape[0], weight.shape[0]
    device, cd = hidden.device, plan.compute_dtype
    stats = torch.empty(len(STAT_ROWS) + len(plan.metric_names), n_tokens, device=device, dtype=torch.float32)
    w = weight if weight.dtype == cd else weight.to(cd)
    h_all = hidden if hidden.dtype == cd else hidden.to(cd)
    rows = plan.chunk_rows(vocab, n_tokens)
    buffer = torch.empty(rows, vocab, device=device, dtype=cd)
    scratch_rows = math.ceil(rows * plan.spec.scratch_rows)
    scratch = torch.empty(scratch_rows, vocab, device=device, dtype=cd) if scratch_rows else None
    # bf16 has float32's range, so 1/N goes into the kernel (no host sync). fp16 would flush the
    # small entries of (p - e_y)/N to zero: there the kernel writes the unscaled gradient and
    # the products apply 1/N in float32 (`alpha`).
    if cd == torch.float16:
        grad_scale = torch.ones(1, device=device, dtype=torch.float32)
        alpha = float(scale)
    else:
        grad_scale = scale.to(torch.float32).reshape(1)
        alpha = 1.0
    # fp16 parameters get float32 accumulators (see `_held`).
    hidden_acc_dtype = torch.float32 if hidden.dtype == torch.float16 else hidden.dtype
    grad_hidden = torch.empty(hidden.shape, device=device, dtype=hidden_acc_dtype) if needs.hidden else None
    weight_acc_dtype = torch.float32 if plan.fp32_weight_grad or weight.dtype == torch.float16 else weight.dtype
    grad_weight = torch.zeros(weight.shape, device=device, dtype=weight_acc_dtype) if needs.weight else None
    grad_bias = torch.zeros(bias.shape, device=device, dtype=torch.float32) if needs.bias else None
    adapter, row_weights = plan.adapter, plan.row_weights
    if adapter is not None:
        down_all, up = adapter.down.to(cd), adapter.up.to(cd)
        grad_down = torch.empty(adapter.down.shape, device=device, dtype=torch.float32) if needs.down else None
        grad_up = torch.zeros(adapter.up.shape, device=device, dtype=torch.float32) if needs.up else None
    else:
        down_all = up = grad_down = grad_up = a = None
    for start in range(0, n_tokens, rows):
        end = min(start + rows, n_tokens)
        n = end - start
        h = h_all[start:end]
        z = buffer[:n]
        torch.mm(h, w.t(), out=z)
        if adapter is not None:
            a = down_all[start:end]
            z.addmm_(a, up.t())
        chunk_targets = targets[start:end]
        launch = _triton.RowLaunch(
            z=z,
            targets=chunk_targets,
            target_logits=_target_logits(h, w, bias, chunk_targets, plan.transform, a, up),
            bias=bias,
            stats=stats[:, start:end],
            grad_scale=grad_scale,
            logit_scale=plan.transform.logit_scale,
            softcap=plan.transform.softcap,
            write_grad=needs.any,
            scratch=scratch,
        )
        plan.spec.row_kernel(launch, **plan.chunk_hparams(start, end))
        # Per-token weights, applied outside the row kernels (no kernel reads them): on the row's term, and on the
        # products' `[n, H]` and `[n, r]` operands and results instead of the `[n, V]` gradient, which needs no extra
        # pass over the chunk.
        rw = None if row_weights is None else row_weights[start:end].to(torch.float32)
        if rw is not None:
            stats[0, start:end].mul_(rw)
        if not needs.any:
            continue
        # `z` now holds ∂ℓ/∂y for the chunk.
        if needs.bias:
            weighted = z if rw is None else z * rw[:, None]  # float32 products (a rare head with a bias)
            grad_bias.add_(weighted.sum(0, dtype=torch.float32), alpha=alpha)
        if needs.hidden:
            if grad_hidden.dtype == cd:
                torch.mm(z, w, out=grad_hidden[start:end])
                if alpha != 1.0:
                    grad_hidden[start:end].mul_(alpha)
            else:
                # A float32 `∂h` (autocast): the product leaves the GEMM in float32, before 1/N.
                grad_hidden[start:end] = mm_float32(z, w).mul_(alpha)
            if rw is not None:
                grad_hidden[start:end].mul_(rw[:, None])
        if needs.weight:
            accumulate_product_(grad_weight, z.t(), h if rw is None else (h * rw[:, None]).to(cd), alpha=alpha)
        if needs.down:
            grad_down[start:end] = mm_float32(z, up).mul_(alpha if rw is None else rw[:, None] * alpha)
        if needs.up:
            addmm_float32_(grad_up, z.t(), a if rw is None else (a * rw[:, None]).to(cd))
    if grad_up is not None and alpha != 1.0:
        grad_up.mul_(alpha)
    return stats, _held_all(hidden, weight, bias, adapter, grad_hidden, grad_weight, grad_bias, grad_down, grad_up)


class _FusedLinearLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, scale, plan: _Plan, down=None, up=None):
        # `down` and `up` are `plan.adapter`'s tensors, inputs here so that autograd hands them their gradients.
        needs = _Needs(
            hidden=plan.want_grad and ctx.needs_input_grad[0],
            weight=plan.want_grad and ctx.needs_input_grad[1],
            bias=plan.want_grad and bias is not None and ctx.needs_input_grad[2],
            down=plan.want_grad and down is not None and ctx.needs_input_grad[6],
            up=plan.want_grad and up is not None and ctx.needs_input_grad[7],
        )
        run = _run_triton if plan.backend == "triton" else _run_torch
        _prepare(plan, hidden, weight, bias, targets)
        stats, grads = run(plan, hidden, weight, bias, targets, scale, needs)
        # Saved tensors (not plain ctx attributes) are freed as soon as backward has run.
        ctx.present = tuple(g is not None for g in grads)
        ctx.dtypes = (hidden.dtype, weight.dtype, *(None if t is None else t.dtype for t in (bias, down, up)))
        ctx.save_for_backward(*(g for g in grads if g is not None))
        loss = stats[0].sum() * scale
        ctx.mark_non_differentiable(stats)
        return loss, stats

    @staticmethod
    def backward(ctx, grad_loss, _grad_stats):
        saved = iter(ctx.saved_tensors)
        grads = [next(saved) if present else None for present in ctx.present]
        # The incoming gradient is 1 unless the loss was rescaled (DDP token averaging, fp16 loss
        # scaling): then the stored gradients are scaled, otherwise handed over without a copy.
        # fp16 gradients arrive here in float32 (`_held`) and are rounded once, after the scale.
        # In place: the held gradient is consumed here (no copy of a head-sized gradient at the backward's peak, as in
        # Liger's fused loss), so a second backward through the same graph (`retain_graph`) is not supported. The
        # factor multiplies in the gradient's own arithmetic (a 1/3 from accumulation is not rounded to bf16 first).
        if grad_loss is not None and not bool(grad_loss == 1):
            for g in grads:
                if g is not None:
                    g.mul_(grad_loss)
        grads = [None if g is None else g.to(dtype) for g, dtype in zip(grads, ctx.dtypes)]
        hidden, weight, bias, down, up = grads
        return hidden, weight, bias, None, None, None, down, up


@dataclass
class FusedLossOutput:
    """The loss and, per row, the objective, cross-entropy, entropy, top-1 and extras.

    The rows are the target positions, unless the loss read label rows too (`LossSpec.label_rows`): then
    `target_rows` marks the rows that are target positions. The objective's rows sum to the loss (times its
    normalizer), their per-token weights included; the other statistics mean something on target rows only, and
    are unweighted (`weights`, each row's weight, None without weights, weighs them in a mean)."""

    loss: torch.Tensor
    token_losses: torch.Tensor
    nll: torch.Tensor
    entropy: torch.Tensor
    is_top1: torch.Tensor
    metrics: dict[str, torch.Tensor]
    target_rows: torch.Tensor | None = None
    weights: torch.Tensor | None = None


def resolve_backend(backend: str, spec: LossSpec, device: torch.device, dtype: torch.dtype) -> str:
    """`"triton"` or `"torch"` for this call (see the module docstring)."""
    if backend not in BACKENDS:
        raise ValueError(f"fused backend must be one of {', '.join(BACKENDS)}, got {backend!r}.")
    if backend == "torch":
        return "torch"
    usable = spec.row_kernel is not None and dtype != torch.float64 and _triton.triton_usable(device, backend == "triton")
    if backend == "triton":
        if not usable:
            why = (
                "Triton is not installed" if not _triton.HAS_TRITON
                else f"the loss {spec.name!r} has no row kernel" if spec.row_kernel is None
                else "float64 inputs run on the PyTorch path" if dtype == torch.float64
                else f"tensors on {device.type} need CUDA (or TRITON_INTERPRET=1 on the CPU)"
            )
            raise ValueError(f"fused backend 'triton' is not available here: {why}.")
        return "triton"
    return "triton" if usable and spec.name not in _BROKEN_ROW_KERNELS else "torch"


def _is_triton_build_error(exc: BaseException) -> bool:
    module = type(exc).__module__ or ""
    return module.startswith("triton") and type(exc).__name__ in ("CompilationError", "OutOfResources", "PTXASError")


def fused_linear_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    spec: LossSpec,
    hparams: dict | None = None,
    *,
    bias: torch.Tensor | None = None,
    num_items_in_batch: int | torch.Tensor | None = None,
    chunk_size: int | None = None,
    chunk_memory: int | None = None,
    transform: HeadTransform | None = None,
    backend: str = "auto",
    fp32_weight_grad: bool = False,
    weights: torch.Tensor | None = None,
    adapter: HeadAdapter | None = None,
) -> FusedLossOutput:
    """`Σ_t w_t ℓ_t / N` for the positions `hidden [N, H]` (already without `-100`) and head `weight`.

    `N` is `num_items_in_batch` when given, else the sum of the weights (the number of positions without
    weights). `weights` `[N]`: each row's per-token loss weight (non-negative; rows read only as label rows carry 0),
    applied as the loss declares (`LossSpec.token_weights`); weight 1 everywhere gives the same bits as no weights.
    `adapter`: a low-rank term of the head (`HeadAdapter`, a LoRA adapter on the output layer). `hparams` are the
    loss's keyword arguments (for EMO, `cost_embedding` among them). `backend`: `"auto"`
    (Triton row kernels on CUDA when available, else PyTorch), `"triton"` or `"torch"`.
    `chunk_size` (positions) or `chunk_memory` (bytes for one chunk's `[n, V]` buffers) set the
    chunking. With no positions the loss is an exact zero that is still connected to `hidden`
    and `weight`, so an all-masked micro-batch back-propagates (zeros) like any other.
    """
    hparams = dict(hparams or {})
    transform = transform or HeadTransform()
    device = hidden.device
    roles = hparams.get(ROLES)
    if weights is not None:
        weights = weights.to(device=device, dtype=torch.float64 if hidden.dtype == torch.float64 else torch.float32)
        if not spec.scales_by_weight:
            hparams[TOKEN_WEIGHTS] = token_weight_rows(weights, roles if isinstance(roles, RowTensors) else None)
    for key, value in hparams.items():
        if isinstance(value, TokenAligned) or key == "cost_embedding" and value is not None:
            hparams[key] = value.to(device)

    target_rows = roles["target"] if isinstance(roles, RowTensors) else None
    if num_items_in_batch is not None:
        count = num_items_in_batch
    elif weights is not None:  # the weight of the target positions (label-only rows weigh 0 here)
        count = weights.sum()
    else:  # the target positions (rows read only as label rows are not tokens)
        count = hidden.shape[0] if target_rows is None else target_rows.sum()
    acc_dtype = torch.float64 if hidden.dtype == torch.float64 else torch.float32
    scale = 1.0 / normalizer(count, device, acc_dtype)
    compute_dtype = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else hidden.dtype
    resolved = resolve_backend(backend, spec, device, compute_dtype)

    if hidden.shape[0] == 0:
        metric_names = spec.metrics if (spec.row_kernel if resolved == "triton" else spec.chunk_kernel) else ()
        zero = hidden.sum() * 0.0 + weight.sum() * 0.0
        for extra in (bias, *((adapter.down, adapter.up) if adapter is not None else ())):
            if extra is not None:
                zero = zero + extra.sum() * 0.0
        empty = hidden.new_zeros(0, dtype=acc_dtype)
        return FusedLossOutput(
            zero.to(acc_dtype), empty, empty, empty, empty, {m: empty for m in metric_names}, target_rows, weights
        )

    want_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad
        for t in (hidden, weight, bias, *((adapter.down, adapter.up) if adapter is not None else ()))
    )
    plan = _Plan(
        spec=spec,
        hparams=hparams,
        transform=transform,
        backend=resolved,
        chunk_size=chunk_size,
        chunk_memory=chunk_memory,
        compute_dtype=compute_dtype,
        want_grad=want_grad,
        fp32_weight_grad=fp32_weight_grad,
        row_weights=weights if spec.scales_by_weight else None,
        adapter=adapter,
    )
    down, up = (adapter.down, adapter.up) if adapter is not None else (None, None)
    # Autocast would silently run the float32 products in half precision again.
    with torch.autocast(device.type, enabled=False):
        try:
            loss, stats = _FusedLinearLoss.apply(hidden, weight, bias, targets, scale, plan, down, up)
        except Exception as exc:
            if resolved != "triton" or backend == "triton" or not _is_triton_build_error(exc):
                raise
            _BROKEN_ROW_KERNELS[spec.name] = f"{type(exc).__name__}: {exc}"
            logger.warning(
                "The Triton kernel of loss %r could not be built on this GPU (%s); using the PyTorch chunk path "
                "(slower, same result). Set fused_backend='torch' to silence this.",
                spec.name,
                _BROKEN_ROW_KERNELS[spec.name].splitlines()[0][:300],
            )
            plan.backend = "torch"
            plan.hparams = hparams  # as given: `prepare` runs again for the PyTorch kernels
            loss, stats = _FusedLinearLoss.apply(hidden, weight, bias, targets, scale, plan, down, up)
    metrics = {name: stats[len(STAT_ROWS) + i] for i, name in enumerate(plan.metric_names)}
    return FusedLossOutput(loss, stats[0], stats[1], stats[2], stats[3], metrics, target_rows, weights)
