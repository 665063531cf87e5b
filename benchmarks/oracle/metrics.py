"""The oracle study's math, as pure functions of log-probabilities, token ids and numbers.

Conventions: a distribution over the vocabulary is given by its log-probabilities on the last
axis (`[..., V]`, any float dtype; everything is computed in float64). Perplexities are
`exp(mean negative log-likelihood per token)` with the natural logarithm; KLs and entropies are in
nats per token.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np
import torch


def perplexity(mean_nll: float) -> float:
    """`exp(mean NLL per token)`: 1 for a model certain of every token, `V` for a uniform one."""
    if not math.isfinite(mean_nll):
        return math.inf
    return math.exp(mean_nll)


def token_nll(log_probs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """`-log p(target)` at every position: `log_probs` `[..., V]`, `targets` `[...]` (token ids)."""
    return -log_probs.double().gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)


def entropy(log_p: torch.Tensor) -> torch.Tensor:
    """`H(p) = -Σ_v p_v log p_v` at every position (`[..., V]` → `[...]`); `0 · log 0 = 0`."""
    log_p = log_p.double()
    p = log_p.exp()
    return -torch.where(p > 0, p * log_p, torch.zeros_like(p)).sum(-1)


def kl_divergence(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """Exact `KL(p ‖ q) = Σ_v p_v (log p_v − log q_v)` at every position (`[..., V]` → `[...]`).

    Terms with `p_v = 0` contribute 0; `p_v > 0 = q_v` gives `inf`. Tiny negative values from
    rounding are clipped to 0.
    """
    log_p, log_q = log_p.double(), log_q.double()
    p = log_p.exp()
    terms = torch.where(p > 0, p * (log_p - log_q), torch.zeros_like(p))
    return terms.sum(-1).clamp_min(0.0)


def forward_kl(log_oracle: torch.Tensor, log_student: torch.Tensor) -> torch.Tensor:
    """`KL(oracle ‖ student)`: the recall side (the student must cover what the oracle says)."""
    return kl_divergence(log_oracle, log_student)


def reverse_kl(log_oracle: torch.Tensor, log_student: torch.Tensor) -> torch.Tensor:
    """`KL(student ‖ oracle)`: the precision side (the student must not say what the oracle would not)."""
    return kl_divergence(log_student, log_oracle)


def mean_std(values: Iterable[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (`ddof=1`; 0 for a single value) of finite numbers."""
    array = np.asarray(list(values), dtype=float)
    if array.size == 0:
        raise ValueError("mean_std of no values")
    std = float(array.std(ddof=1)) if array.size > 1 else 0.0
    return float(array.mean()), std


def ids_to_text(ids: Sequence[int]) -> str:
    """Token ids as space-separated words, so that word-level diversity metrics (distinct-n,
    self-BLEU) treat every token id as one word."""
    return " ".join(str(int(i)) for i in ids)


class Accumulator:
    """Running sums of per-token quantities, so that a mean over many batches is exact."""

    def __init__(self):
        self.sums: dict[str, float] = {}
        self.count = 0

    def add(self, count: int, **sums: float) -> None:
        self.count += int(count)
        for key, value in sums.items():
            self.sums[key] = self.sums.get(key, 0.0) + float(value)

    def means(self) -> dict[str, float]:
        if self.count == 0:
            raise ValueError("no tokens accumulated")
        return {key: value / self.count for key, value in self.sums.items()}


def interpolate(xs: Sequence[float], ys: Sequence[float], x: float, log: bool = False) -> float | None:
    """Piecewise-linear interpolation of the curve `(xs, ys)` at `x`; `None` outside `[min xs, max xs]`.

    The points need not be sorted. `log=True` interpolates `log y` (for perplexities, i.e. linearly
    in cross-entropy) and returns `exp` of the result.
    """
    points = sorted(zip(xs, ys))
    if not points or not points[0][0] <= x <= points[-1][0]:
        return None
    transform = math.log if log else (lambda v: v)
    for (x0, y0), (x1, y1) in zip(points, points[1:] or points):
        if x0 <= x <= x1:
            if x1 == x0:
                value = transform(y0)
            else:
                t = (x - x0) / (x1 - x0)
                value = (1 - t) * transform(y0) + t * transform(y1)
            return math.exp(value) if log else value
    return None
