"""Matrix products whose result is float32 whatever the input dtype.

Half-precision logits summed over a 128k vocabulary lose enough to bias training, so every
product whose result feeds a softmax or a gradient accumulator is formed in float32. On CUDA,
`out_dtype=torch.float32` does it without widening the inputs; elsewhere the inputs are widened.
"""

from __future__ import annotations

import torch


def _native_fp32_out(a: torch.Tensor) -> bool:
    return a.device.type == "cuda" and a.dtype in (torch.float16, torch.bfloat16)


def mm_float32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`a @ b` as float32."""
    if _native_fp32_out(a):
        return torch.mm(a, b, out_dtype=torch.float32)
    if a.dtype == torch.float32 and b.dtype == torch.float32:
        return a @ b
    if a.dtype == torch.float64 or b.dtype == torch.float64:
        # float64 inputs (gradcheck) keep their precision
        return a.double() @ b.double()
    return a.float() @ b.float()


def addmm_float32_(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """`acc += a @ b` in place, for a float32 (or float64) accumulator."""
    if _native_fp32_out(a) and acc.dtype == torch.float32:
        torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
    else:
        acc.addmm_(a.to(acc.dtype), b.to(acc.dtype))


def accumulate_product_(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, alpha: float = 1.0) -> None:
    """`acc += alpha * (a @ b)` in place, for an accumulator in the inputs' dtype or in float32.

    In the inputs' dtype, the product accumulates in float32 inside the GEMM and `acc` is rounded
    once per call. A float32 accumulator of half-precision inputs uses `out_dtype` on CUDA (no
    widened copies of the inputs).
    """
    if acc.dtype == a.dtype:
        acc.addmm_(a, b, alpha=alpha)
    elif _native_fp32_out(a) and acc.dtype == torch.float32:
        torch.addmm(acc, a, b, alpha=alpha, out_dtype=torch.float32, out=acc)
    else:
        acc.addmm_(a.to(acc.dtype), b.to(acc.dtype), alpha=alpha)
