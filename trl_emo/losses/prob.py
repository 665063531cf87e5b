"""The probability-based objectives of "Beyond Log Likelihood" (Li et al., arXiv 2510.00526, ICML 2026), as the
authors' code computes them (`GaotangLi/Beyond-Log-Likelihood` at 220589d, `main_verl/trainer/fsdp_sft_trainer.py`,
`_compute_loss_and_backward`, L368-476).

Per target token, with `p_y` the model's probability of the target and `q ≥ 0` (`prob_q`):

    ℓ = (1 − p_y^q) / q          "GeneralFamily-q" (L382-385); q = 1 is "p", `1 − p_y` (L376-378)
    ∂ℓ/∂z = p_y^q (p − e_y)      DFT's gradient (`sg(p_y)` weights it) at q = 1; cross-entropy's at q → 0

`q = 0` is cross-entropy, the limit (their code divides by zero there). The thresholded variants keep only the tokens
whose `p_y` is at least (`prob_only: top`, "OnlyTopP-t" / "OnlyTopLogP-t") or at most (`bottom`, "OnlyBottomP-t" /
"OnlyBottomLogP-t") `prob_threshold`, and average over the kept tokens only (their `loss_mask` is multiplied by the
comparison before the count, L386-410, L468-476): "P" is `q = 1`, "LogP" `q = 0`, and any `q` combines with a threshold
here. The comparison has no gradient. In the trainer's token-weighted reduction each kept row gets the weight `T / K`
(`T` target tokens of the micro-batch, `K` kept), so a micro-batch contributes `T ·` its mean over the kept tokens, as
EKSFT's selection does; a micro-batch alone is exactly their loss.

Fused, the unthresholded objective is one pass like DFT's (the same `w (p − e_y)` gradient, `w = p_y^q`); a threshold
adds a first pass over the chunks that computes every row's `log p_y` (`target_stats`) to count the kept tokens. The
comparison is made on `log p_y` rounded to a multiple of `eksft.TIE_QUANTUM` (2⁻¹² nats, a relative 2.4e-4 in `p_y`):
a token whose probability is within it of the threshold counts as at the threshold (kept by `top` and by `bottom`), so
the backends and chunk sizes, whose float32 `log p_y` differ by ~1e-7, decide every row alike.

The row kernel here (`launch_rows`: `w · (1 − p_y^q) / q` and `w p_y^q (p − e_y)` with a per-row `w`) is also the loss
pass of `iw_sft` and `slm` (`q = 0`: weighted cross-entropy).
"""

from __future__ import annotations

import math

import torch

from ._common import log_softmax, softmax_stats, target_log_prob
from ._triton import RowLaunch, row_inputs, softmax_pass, store_stats, tl, triton, weighted_ce_grad
from .eksft import TIE_QUANTUM
from .registry import LossSpec, RowTensors
from .target_stats import launch_statistics, reference_chunk, target_log_probs

ONLY = ("top", "bottom")
METRICS = ("prob_kept",)


def check(hp: dict) -> None:
    q, only, threshold = hp["q"], hp["only"], hp["threshold"]
    if isinstance(q, bool) or not isinstance(q, (int, float)) or not math.isfinite(q) or q < 0:
        raise ValueError(f"prob_q must be a finite number >= 0 (0 is cross-entropy, 1 is 1 - p), got {q!r}.")
    if only is None:
        if threshold is not None:
            raise ValueError(f"prob_threshold is set ({threshold!r}) but prob_only is null: set prob_only to top or "
                             "bottom (which tokens are kept), or remove prob_threshold.")
        return
    if only not in ONLY:
        raise ValueError(f"prob_only must be top, bottom or null, got {only!r}.")
    if threshold is None:
        raise ValueError(f"prob_only is {only!r} but prob_threshold is null: set the probability threshold that "
                         f"decides which tokens are kept (their OnlyTopP-t / OnlyBottomP-t), or remove prob_only.")
    number = isinstance(threshold, (int, float)) and not isinstance(threshold, bool)
    # The authors' asserts (L388, L394): top 0 <= t < 1, bottom 0 < t <= 1.
    ok = number and (0 <= threshold < 1 if only == "top" else 0 < threshold <= 1)
    if not ok:
        bounds = "[0, 1)" if only == "top" else "(0, 1]"
        raise ValueError(f"prob_threshold must be in {bounds} with prob_only={only}, got {threshold!r}.")


def kept(logp_y: torch.Tensor, only: str, threshold: float) -> torch.Tensor:
    """Which rows a threshold keeps: `p_y ≥ t` (`top`) or `p_y ≤ t` (`bottom`), compared on `log p_y` rounded to a
    multiple of `TIE_QUANTUM` (see the module docstring)."""
    key = torch.round(logp_y.double() / TIE_QUANTUM)
    if threshold <= 0:
        bound = -math.inf
    else:
        bound = float(torch.round(torch.tensor(math.log(threshold), dtype=torch.float64) / TIE_QUANTUM))
    return key >= bound if only == "top" else key <= bound


def share(keep: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Per row `T / K` where kept (`T` rows, `K` kept), else 0: a token mean over the kept rows in the trainer's
    `Σ ℓ / T` (0 when none is kept, as the authors' `Σ / (0 + 1e-8)`)."""
    count = int(keep.sum())
    if count == 0:
        return torch.zeros(keep.shape, dtype=dtype, device=keep.device)
    return keep.to(dtype) * (keep.numel() / count)


def value_of(logp_y: torch.Tensor, q: float) -> torch.Tensor:
    """`(1 − p_y^q) / q`, and `−log p_y` at `q = 0`. The value by `expm1` (exact as `q → 0`); the gradient by `exp`:
    autograd's `expm1` backward is `result + 1`, which rounds `p_y^q` below the float epsilon to 0 (at `q = 10` every
    target under 0.2 would get no gradient)."""
    if q == 0:
        return -logp_y
    x = q * logp_y
    a = torch.exp(x)
    return -torch.expm1(x.detach()) / q - (a - a.detach()) / q


# -- the logits path (the reference implementation) -------------------------------------------------------------------


def per_token(logits, targets, q, only, threshold):
    """`(1 − p_y^q) / q` per row; with a threshold, `T / K` times it on the kept rows of this call (one micro-batch)."""
    logp_y = target_log_prob(log_softmax(logits), targets)
    values = value_of(logp_y, q)
    if only is None:
        return values
    return values * share(kept(logp_y.detach(), only, threshold), values.dtype)


# -- the fused path ---------------------------------------------------------------------------------------------------


def prepare(statistics, hparams: dict) -> dict:
    """With a threshold: every row's `log p_y` over the chunks, the kept rows, their weights (`LossSpec.prepare`)."""
    if hparams["only"] is None:
        return {**hparams, "weights": None}
    logp, _ = target_log_probs(statistics, "prob")
    keep = kept(logp, hparams["only"], hparams["threshold"])
    return {**hparams, "weights": RowTensors({"w": share(keep, logp.dtype), "prob_kept": keep.to(logp.dtype)})}


def weighted_power(s, targets, want_grad: bool, q: float, w: torch.Tensor | None):
    """Values `w (1 − p_y^q) / q` and gradient `w p_y^q (p − e_y)` of a chunk (`s`: its `softmax_stats`, whose `p` the
    gradient overwrites); `w = None` is 1."""
    logp_y = -s.nll
    values = value_of(logp_y, q)
    a = torch.ones_like(logp_y) if q == 0 else torch.exp(q * logp_y)
    if w is not None:
        values = values * w
        a = a * w
    grad = None
    if want_grad:
        grad = s.p.mul_(a[:, None])
        grad[s.rows, targets] -= a
    return values, grad


def chunk(z, targets, want_grad, q, only, threshold, weights=None):
    s = softmax_stats(z, targets)
    values, grad = weighted_power(s, targets, want_grad, q, None if weights is None else weights["w"])
    kept_rows = torch.ones_like(values) if weights is None else weights["prob_kept"]
    return s.result(values, grad, prob_kept=kept_rows)


@triton.jit
def _neg_expm1(x):
    # -(e^x - 1) without the cancellation of 1 - e^x near 0 (libdevice's expm1 does not run in the interpreter): a
    # Taylor polynomial for |x| < 0.1 (relative error < 1e-9), 1 - e^x beyond (relative error < 1e-6 in float32).
    series = -x * (1.0 + x * (0.5 + x * (1.0 / 6.0 + x * (1.0 / 24.0 + x * (1.0 / 120.0 + x * (1.0 / 720.0 + x / 5040.0))))))
    return tl.where(tl.abs(x) < 0.1, series, 1.0 - tl.exp(x))


@triton.jit
def _rows(
    Z, z_stride, Y, ZY, BIAS, STATS, stats_stride, GRAD_SCALE, V, logit_scale, softcap,
    q, W,
    HAS_W: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, WRITE_GRAD: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row, Z_row, y, z_y = row_inputs(Z, z_stride, Y, ZY)
    lse, entropy, idx = softmax_pass(Z_row, BIAS, V, logit_scale, softcap, HAS_BIAS, HAS_SOFTCAP, BLOCK)
    nll = lse - z_y
    x = -q * nll  # q log p_y
    a = tl.exp(x)  # p_y^q
    value = tl.where(q == 0.0, nll, _neg_expm1(x) / tl.where(q == 0.0, 1.0, q))
    if HAS_W:
        w = tl.load(W + row)
        value = w * value
        a = w * a
    store_stats(STATS, stats_stride, row, value, nll, entropy, (idx == y).to(tl.float32))
    if WRITE_GRAD:
        weighted_ce_grad(Z_row, BIAS, V, lse, y, a, GRAD_SCALE, logit_scale, softcap, HAS_BIAS, HAS_SOFTCAP, BLOCK)


def launch_rows(launch: RowLaunch, name: str, q: float, w: torch.Tensor | None = None) -> None:
    """The loss pass of one chunk: `w (1 − p_y^q) / q` and its gradient per row (`w`: the chunk's `[n]` row weights, or
    None for 1), with the launch configuration `name`."""
    table = w.to(torch.float32).contiguous() if w is not None else launch.stats
    _rows[(launch.rows,)](*launch.args(), float(q), table, HAS_W=w is not None, **launch.meta(name))


def weighted_ce_chunk(name: str, z, targets, want_grad, weights, metrics: tuple[str, ...]):
    """The loss pass of a loss whose first pass computed per-row weights (`iw_sft`, `slm`): `w (−log p_y)` and
    `w (p − e_y)` with `weights["w"]`, its metrics read from `weights`."""
    if weights is None:
        raise ValueError(f"{name}'s chunks need the weights of its first pass (LossSpec.prepare).")
    s = softmax_stats(z, targets)
    values, grad = weighted_power(s, targets, want_grad, 0.0, weights["w"])
    return s.result(values, grad, **{metric: weights[metric] for metric in metrics})


def weighted_ce_rows(name: str, launch: RowLaunch, reference, weights, metrics: tuple[str, ...]) -> None:
    """The row launcher of such a loss: with `weights`, weighted cross-entropy and the metrics copied from them;
    without, the first pass's log-normalizers of the chunk, the reference's logits in the loss's extra buffer or a new
    one (how the ahead-of-time compile launches `target_stats._statistics`; a run computes them in `prepare`)."""
    if weights is None:
        buffer = launch.scratch if launch.scratch is not None else torch.empty_like(launch.z)
        launch_statistics(launch, name, reference, reference_chunk(reference, buffer, 0, launch.rows))
        return
    launch_rows(launch, name, 0.0, weights["w"])
    for i, metric in enumerate(metrics):
        launch.stats[4 + i].copy_(weights[metric])


def rows(launch: RowLaunch, q, only, threshold, weights=None):
    """The loss pass of a chunk; with a threshold and no `weights`, the first pass's log-normalizers instead (how the
    ahead-of-time compile launches `target_stats._statistics` for this loss)."""
    if weights is None and only is not None:
        launch_statistics(launch, "prob")
        return
    launch_rows(launch, "prob", q, None if weights is None else weights["w"])
    if weights is None:
        launch.stats[4].fill_(1.0)
    else:
        launch.stats[4].copy_(weights["prob_kept"])


LOSS = LossSpec(
    name="prob",
    per_token=per_token,
    chunk_kernel=chunk,
    row_kernel=rows,
    config_fields={"q": "prob_q", "only": "prob_only", "threshold": "prob_threshold"},
    # Their math script (scripts/training/math/example.sh:36): `trainer.objective_trans=GeneralFamily-10`.
    defaults={"q": 10.0, "only": None, "threshold": None},
    validate=check,
    description="Beyond Log Likelihood: (1 - p_y^q) / q per token (q=1: 1 - p; 0: cross-entropy), optionally only "
    "the tokens above or below a probability threshold (arXiv 2510.00526)",
    metrics=METRICS,
    prepare=prepare,
    prepared_rows=("w", "prob_kept"),
)
