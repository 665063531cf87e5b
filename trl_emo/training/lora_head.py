"""A LoRA adapter on the output layer, in the fused path: its low-rank term on the scored rows only.

With `lm_head` among a LoRA configuration's `target_modules` (tied to the input embedding or not), PEFT wraps the head
as `peft.tuners.lora.Linear`: `y = h W^T + b + Σ_a s_a B_a A_a dropout_a(h)`. TRL 1.16's fused head multiplies by
`lm_head.weight` alone, so TRL refuses such a head (`trl_compat.trl_accepts_adapter_on_head`). Here each active adapter
runs its own `lora_A` and dropout on the hidden states of the scored rows (`[N, r]`, through autograd: `A`, the
dropout and the scale get their gradients there) and hands the fused path that activation and `lora_B.weight`
(`trl_emo.losses.fused.HeadAdapter`), which adds `a B^T` to each chunk's logits and returns the gradients of `a` and
`B` (and of `W` when it trains), never forming the `[tokens, vocab]` logits. The dropout is PEFT's own module on the
same rows, so `lora_dropout > 0` trains exactly as PEFT's forward would (the same distribution of masks; the logits of
positions without a target, which PEFT would also compute, are never used). A `lora_bias` adds `s b_B` to the head's
bias.

`modules_to_save=["lm_head"]` needs nothing here: PEFT's `ModulesToSaveWrapper` exposes its trainable copy's weight as
the head's. What the fused path cannot compute is refused in one line when the trainer is built (`check`): DoRA (its
column norms need the whole adapted head `W + s B A` at every step), any other kind of adapter, a head whose base
layer is not a plain linear layer (a quantized head), and a loss that reads a lagged copy of the model (PSFT, CurioSFT:
the copy's head would need its own adapter's term); `loss_implementation="logits"` runs PEFT's own forward and takes
them all. A reference that is the base model with the adapters off (ASFT, EKSFT under PEFT) reads the base head, which
is exactly that model's.
"""

from __future__ import annotations

import torch

from ..losses.fused import HeadAdapter

_WAY_OUT = "or train it with loss_implementation='logits' (PEFT's own forward builds the full logits)"


def _lora_layer(head):
    """`head` as a PEFT LoRA layer, or None when it is not one (a plain head, `ModulesToSaveWrapper`, no PEFT)."""
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:  # pragma: no cover - PEFT is a dependency of the training extra
        return None
    return head if isinstance(head, LoraLayer) else None


def _active(layer) -> list[str]:
    if layer.disable_adapters or layer.merged:
        return []  # the base layer alone (merged: the adapter is already in the base weight)
    return [name for name in layer.active_adapters if name in layer.lora_A]


def check(model, lagged_role: str | None = None) -> None:
    """Refuse, in one line, an adapter on `model`'s output layer that the fused path cannot compute (see the module
    docstring). Call it on the base model (`get_base_model()` under PEFT). `lagged_role`: the loss reads a lagged copy
    of the model (PSFT's "old policy", CurioSFT's "teacher"), whose head would need its own lagged adapter's term."""
    head = model.get_output_embeddings()
    try:
        from peft.tuners.tuners_utils import BaseTunerLayer
    except ImportError:  # pragma: no cover
        return
    if not isinstance(head, BaseTunerLayer):
        return
    layer = _lora_layer(head)
    if layer is None:
        raise ValueError(
            f"A {type(head).__name__} adapter on lm_head is not computed by the fused loss (LoRA is): target lm_head "
            f"with LoRA, leave it out of target_modules, {_WAY_OUT}."
        )
    base = layer.get_base_layer()
    if type(base) is not torch.nn.Linear:
        raise ValueError(
            f"lm_head's base layer is a {type(base).__name__}, not a plain linear layer: the fused loss reads its weight "
            f"directly, so a quantized head with an adapter is not supported; keep lm_head unquantized, {_WAY_OUT}."
        )
    if lagged_role is not None and _active(layer):
        raise ValueError(
            f"A LoRA adapter on lm_head with a lagged {lagged_role}: the fused loss reads the {lagged_role}'s head without "
            f"its adapter; leave lm_head out of target_modules, {_WAY_OUT}."
        )
    for name in _active(layer):
        if name in getattr(layer, "lora_variant", {}):
            variant = type(layer.lora_variant[name]).__name__
            what = "DoRA" if "Dora" in variant else variant
            raise ValueError(
                f"{what} on lm_head (adapter {name!r}) is not supported by the fused loss: its column norms need the whole "
                f"adapted head at every step; set use_dora=False, leave lm_head out of target_modules, {_WAY_OUT}."
            )


def _full(tensor):
    """An FSDP2 parameter's full tensor (gradients flow back to the shards), any other tensor as it is."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def adapter_read_parameters(head, with_down: bool = False) -> list:
    """The adapter parameters the fused path reads outside their module's forward (`lora_B`'s weight and bias; with
    `with_down`, `lora_A`'s weight too, which `merged_head` reads): under ZeRO-3 they are gathered with the head
    (`trl_compat.gather_lm_head`). The loss runs `lora_A` as a module."""
    layer = _lora_layer(head)
    if layer is None:
        return []
    params = []
    for name in _active(layer):
        params.append(layer.lora_B[name].weight)
        if layer.lora_B[name].bias is not None:
            params.append(layer.lora_B[name].bias)
        if with_down:
            params.append(layer.lora_A[name].weight)
    return params


@torch.no_grad()
def merged_head(head, weight: torch.Tensor, bias: torch.Tensor | None):
    """`(W + Σ s B A, b + Σ s b_B)`: the head with its active LoRA adapters merged, a new tensor (a head's size), for
    a computation outside training that reads the whole head once (SED's threshold calibration); `(weight, bias)` as
    given without an active adapter."""
    layer = _lora_layer(head)
    names = [] if layer is None else _active(layer)
    if not names:
        return weight, bias
    merged = weight.detach().clone()
    for name in names:
        lora_a, lora_b, scaling = layer.lora_A[name], layer.lora_B[name], layer.scaling[name]
        merged += (scaling * _full(lora_b.weight).float() @ _full(lora_a.weight).float()).to(merged.dtype)
        if lora_b.bias is not None:
            term = (scaling * _full(lora_b.bias)).to(merged.dtype)
            bias = term if bias is None else bias.detach() + term.to(bias.dtype)
    return merged, bias


def head_adapter(head, rows: torch.Tensor) -> tuple[HeadAdapter | None, torch.Tensor | None]:
    """The low-rank term of the LoRA adapters active on `head` for the hidden states `rows` `[N, H]` of the scored
    positions, and the head's bias with the adapters' `lora_B` biases added; `(None, None)` without an active
    adapter (then the caller keeps the head's own bias)."""
    layer = _lora_layer(head)
    names = [] if layer is None else _active(layer)
    if not names:
        return None, None
    downs, ups = [], []
    bias = head.bias
    bias = None if bias is None else _full(bias)
    for name in names:
        lora_a, lora_b = layer.lora_A[name], layer.lora_B[name]
        scaling = layer.scaling[name]
        x = layer._cast_input_dtype(rows, lora_a.weight.dtype)
        downs.append(lora_a(layer.lora_dropout[name](x)) * scaling)
        ups.append(_full(lora_b.weight))
        if lora_b.bias is not None:
            term = _full(lora_b.bias) * scaling
            bias = term if bias is None else bias + term.to(bias.dtype)
    if len(names) == 1:
        return HeadAdapter(downs[0], ups[0]), bias
    dtype = ups[0].dtype
    return HeadAdapter(torch.cat([d.to(dtype) for d in downs], dim=-1), torch.cat([u.to(dtype) for u in ups], dim=-1)), bias


def adapts(model) -> bool:
    """Whether `model`'s output layer carries an active LoRA adapter (which TRL's fused head would leave out)."""
    layer = _lora_layer(model.get_output_embeddings())
    return layer is not None and bool(_active(layer))
