"""Every objective from hidden states and the head, chunk by chunk, never the whole logits.

For `N` target positions with hidden states `h [N, H]` and a head `W [V, H]`, the positions are
taken `chunk_size` at a time: the chunk's float32 logits are built, the kernel turns them into
the loss and `∂ℓ/∂z`, and that is immediately folded into `∂h = (∂ℓ/∂z) W` and
`∂W += (∂ℓ/∂z)^T h`. Peak extra memory is a few `[chunk_size, V]` float32 buffers, independent of
batch size and sequence length. The gradient is formed during the forward pass (three products per
chunk; recomputing the logits in backward would take four) and scaled by the incoming gradient in
backward, so the function returns a scalar.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .kernels import autograd_kernel
from .precision import addmm_float32_, mm_float32
from .registry import LossSpec

# Bytes of one [chunk, V] float32 buffer when `chunk_size` is not given. A kernel keeps about
# four such buffers alive (logits, probabilities, gradient, and q or the cost similarities).
DEFAULT_CHUNK_BYTES = 128 * 2**20
# Bounds of the automatic chunk size: small chunks starve the matrix units, large ones only
# cost memory.
_MIN_CHUNK, _MAX_CHUNK = 64, 8192


def auto_chunk_size(vocab_size: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> int:
    return int(min(_MAX_CHUNK, max(_MIN_CHUNK, chunk_bytes // (4 * vocab_size))))


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


# Rows of the statistics tensor returned beside the loss.
STAT_ROWS = ("token_losses", "nll", "entropy", "is_top1")


class _FusedLinearLoss(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        hidden,
        weight,
        bias,
        targets,
        scale,
        kernel,
        hparams,
        metric_names,
        transform,
        chunk_size,
        compute_dtype,
        want_grad,
    ):
        n_tokens, vocab = hidden.shape[0], weight.shape[0]
        need_hidden = want_grad and ctx.needs_input_grad[0]
        need_weight = want_grad and ctx.needs_input_grad[1]
        need_bias = want_grad and bias is not None and ctx.needs_input_grad[2]
        any_grad = need_hidden or need_weight or need_bias
        acc_dtype = torch.float64 if hidden.dtype == torch.float64 else torch.float32

        stats = torch.empty(len(STAT_ROWS) + len(metric_names), n_tokens, device=hidden.device, dtype=acc_dtype)
        grad_hidden = torch.empty(hidden.shape, device=hidden.device, dtype=acc_dtype) if need_hidden else None
        grad_weight = torch.zeros(weight.shape, device=weight.device, dtype=acc_dtype) if need_weight else None
        grad_bias = torch.zeros(bias.shape, device=bias.device, dtype=acc_dtype) if need_bias else None
        w = weight.to(compute_dtype)

        for start in range(0, n_tokens, chunk_size):
            end = min(start + chunk_size, n_tokens)
            h = hidden[start:end].to(compute_dtype)
            z = mm_float32(h, w.t())
            if bias is not None:
                z.add_(bias.to(z.dtype))
            transform.apply_(z)
            result = kernel(z, targets[start:end], any_grad, **hparams)
            stats[0, start:end] = result.values
            stats[1, start:end] = result.nll
            stats[2, start:end] = result.entropy
            stats[3, start:end] = result.is_top1
            for row, name in enumerate(metric_names, start=len(STAT_ROWS)):
                stats[row, start:end] = result.metrics[name]
            if not any_grad:
                continue
            grad_z = transform.chain_(result.grad.mul_(scale), z)
            del z, result
            if bias is not None and need_bias:
                grad_bias += grad_z.sum(0)
            # Like the rest of the backward pass, the logits gradient enters the products in the
            # compute dtype; the products accumulate in float32.
            grad_z = grad_z.to(compute_dtype)
            if need_hidden:
                grad_hidden[start:end] = mm_float32(grad_z, w)
            if need_weight:
                addmm_float32_(grad_weight, grad_z.t(), h)

        grads = (
            None if grad_hidden is None else grad_hidden.to(hidden.dtype),
            None if grad_weight is None else grad_weight.to(weight.dtype),
            None if grad_bias is None else grad_bias.to(bias.dtype),
        )
        # Saved tensors (not plain ctx attributes) are freed as soon as backward has run.
        ctx.present = tuple(g is not None for g in grads)
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
        if grad_loss is not None and not bool(grad_loss == 1):
            grads = [None if g is None else g * grad_loss.to(g.dtype) for g in grads]
        return (*grads, None, None, None, None, None, None, None, None, None)


@dataclass
class FusedLossOutput:
    """The loss and, per target position, the objective, cross-entropy, entropy, top-1 and extras."""

    loss: torch.Tensor
    token_losses: torch.Tensor
    nll: torch.Tensor
    entropy: torch.Tensor
    is_top1: torch.Tensor
    metrics: dict[str, torch.Tensor]


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
    transform: HeadTransform | None = None,
) -> FusedLossOutput:
    """`Σ_t ℓ_t / N` for the positions `hidden [N, H]` (already without `-100`) and head `weight`.

    `N` is `num_items_in_batch` when given, else the number of positions. `hparams` are the
    loss's keyword arguments (for EMO, `cost_embedding` among them). With no positions the loss
    is an exact zero that is still connected to `hidden` and `weight`, so an all-masked
    micro-batch back-propagates (zeros) like any other.
    """
    hparams = dict(hparams or {})
    transform = transform or HeadTransform()
    kernel = spec.chunk_kernel or autograd_kernel(spec.per_token)
    metric_names = spec.metrics if spec.chunk_kernel is not None else ()
    device = hidden.device
    if "cost_embedding" in hparams and hparams["cost_embedding"] is not None:
        hparams["cost_embedding"] = hparams["cost_embedding"].to(device)

    count = hidden.shape[0] if num_items_in_batch is None else num_items_in_batch
    acc_dtype = torch.float64 if hidden.dtype == torch.float64 else torch.float32
    scale = 1.0 / torch.as_tensor(count, device=device, dtype=acc_dtype).clamp(min=1)

    if hidden.shape[0] == 0:
        zero = hidden.sum() * 0.0 + weight.sum() * 0.0
        if bias is not None:
            zero = zero + bias.sum() * 0.0
        empty = hidden.new_zeros(0, dtype=acc_dtype)
        return FusedLossOutput(zero.to(acc_dtype), empty, empty, empty, empty, {m: empty for m in metric_names})

    compute_dtype = (
        torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else hidden.dtype
    )
    chunk = chunk_size or auto_chunk_size(weight.shape[0])
    want_grad = torch.is_grad_enabled() and (
        hidden.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    )
    # Autocast would silently run the float32 products in half precision again.
    with torch.autocast(device.type, enabled=False):
        loss, stats = _FusedLinearLoss.apply(
            hidden,
            weight,
            bias,
            targets,
            scale,
            kernel,
            hparams,
            metric_names,
            transform,
            chunk,
            compute_dtype,
            want_grad,
        )
    metrics = {name: stats[len(STAT_ROWS) + i] for i, name in enumerate(metric_names)}
    return FusedLossOutput(loss, stats[0], stats[1], stats[2], stats[3], metrics)
