"""The statistics every verdict of the three studies uses (oracle, real-model, SFT -> RL): an effect, its 95 %
interval, a two-sided p-value, one of three labels, and Holm's adjustment over the comparisons of one table.

**The test.** A comparison is "arm A against arm B on one metric", each arm measured on the same test items (problems,
prompts) for one or more seeds. Which interval depends on what the study kept:

- **Per-item values** (a pass rate per test problem per seed): a two-way bootstrap. Each replicate draws the items
  with replacement once, shared by every arm and seed (every arm is scored on the same problems, so their difficulty
  cancels: the comparison is paired over items), and draws each arm's seeds with replacement (seeds are blocks: a
  seed's items stay together). When both arms have the same seeds, a seed draw is shared too (paired over seeds: the
  seed also fixes the data order); otherwise each arm's seeds are drawn on their own. The effect is the difference of
  the two grand means; the interval is the 2.5 and 97.5 % percentiles of `REPLICATES` replicates; the p-value is
  twice the smaller tail beyond 0. The percentile rule is chosen so that "the interval excludes 0" and "p ≤ 0.05" are
  the same event. The bootstrap's variance has a closed form (`bootstrap_variance`), which the tests check.
- **Per-seed values only** (the real-model and oracle studies keep one figure per run): Student's t over the paired
  per-seed differences, `n - 1` degrees of freedom (a bootstrap over two or three values would give their range as
  the interval: far too narrow). With one seed, or seeds whose differences are identical (no spread to estimate:
  accuracies on 64 problems move in steps of 1/64), there is no interval: "cannot tell".

**Labels.** "better" when the whole interval lies on the better side of 0 (above it, or below it for a metric where
lower is better), "worse" when it lies on the other side, "cannot tell" when it contains 0. Every test is two-sided.
**Several comparisons**: Holm's step-down adjustment of the p-values of one table (`holm`), and the label again at the
adjusted p ("after Holm"); the table states how many comparisons it holds.

**Deterministic**: every bootstrap starts from the same seed (`SEED`), so a report regenerated from the same results
is the same to the byte (on the same numpy: its generator's stream is stable across releases in practice).

**What it would take** (`sample_size`): the variance components of a per-item comparison (seed, item and residual),
estimated by the two-way analysis of variance, give the standard error of the effect for S seeds per arm and P items,
`SE² = (σ²_seed,A + σ²_seed,B) / S + σ²_item / P + (σ²_res,A + σ²_res,B) / (S·P)`, and a true effect δ is told from 0
at level α with power 1 − β when `|δ| ≥ (z_{1−α/2} + z_{1−β}) · SE`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from statistics import NormalDist

import numpy as np

LEVEL = 0.95
REPLICATES = 20_000
SEED = 20261128
BETTER, WORSE, CANNOT_TELL = "better", "worse", "cannot tell"


@dataclass(frozen=True)
class Effect:
    """One comparison: `effect` = A − B (in the metric's own units), its interval (`low`, `high`; None: no interval),
    the two-sided p-value, and how they were computed."""

    effect: float
    low: float | None
    high: float | None
    p: float | None
    method: str
    seeds: tuple[int, int]  # seeds of A and of B
    items: int  # per-item values per seed (0: per-seed values only)

    def label(self, higher_is_better: bool = True) -> str:
        return label(self.low, self.high, higher_is_better)

    def as_dict(self) -> dict:
        return asdict(self)


def label(low: float | None, high: float | None, higher_is_better: bool = True) -> str:
    """"better" / "worse" / "cannot tell" from a 95 % interval (None: no interval)."""
    if low is None or high is None:
        return CANNOT_TELL
    if low > 0:
        return BETTER if higher_is_better else WORSE
    if high < 0:
        return WORSE if higher_is_better else BETTER
    return CANNOT_TELL


def _grid(values) -> np.ndarray:
    """Per-seed rows of per-item values as a float64 array [seeds, items]."""
    grid = np.asarray(values, dtype=np.float64)
    if grid.ndim != 2 or grid.shape[0] < 1 or grid.shape[1] < 1:
        raise ValueError(f"expected per-seed rows of per-item values, got shape {grid.shape}")
    return grid


def groups_of(a: Mapping[object, Sequence[float]], b: Mapping[object, Sequence[float]] | None = None
              ) -> tuple[list[tuple[np.ndarray, float]], bool]:
    """A − B as bootstrap groups (per-seed rows of per-item values, with their sign), and whether the seeds are
    paired: with the same seeds in both arms, one group of the per-seed differences (a seed draw is shared); else
    A and −B, each with its own seed draws; A alone when `b` is None."""
    seeds_a = sorted(a)
    if b is not None and sorted(b) == seeds_a:
        return [(_grid([a[s] for s in seeds_a]) - _grid([b[s] for s in seeds_a]), 1.0)], True
    groups = [(_grid([a[s] for s in seeds_a]), 1.0)]
    if b is not None:
        groups.append((_grid([b[s] for s in sorted(b)]), -1.0))
    if any(g.shape[1] != groups[0][0].shape[1] for g, _ in groups):
        raise ValueError("the arms were measured on different numbers of items")
    return groups, False


def compare_items(a: Mapping[object, Sequence[float]], b: Mapping[object, Sequence[float]] | None = None,
                  replicates: int = REPLICATES, seed: int = SEED) -> Effect:
    """A − B (or A against 0 when `b` is None) from per-item values per seed (`{seed: [value per item]}`, the items in
    the same order everywhere): the two-way bootstrap of the module's docstring."""
    groups, paired = groups_of(a, b)
    items = groups[0][0].shape[1]
    effect = float(sum(sign * g.mean() for g, sign in groups))
    low, high, p = percentile_interval(bootstrap_draws(groups, replicates, seed))
    seeds = (len(a), len(b) if b is not None else 0)
    method = (f"bootstrap: {items} items × {seeds[0]} seed{'s' * (seeds[0] != 1)}"
              + ("" if b is None else (", paired" if paired else f" against {seeds[1]}")))
    return Effect(effect, low, high, p, method, seeds, items)


def bootstrap_draws(groups: list[tuple[np.ndarray, float]], replicates: int = REPLICATES,
                    seed: int = SEED) -> np.ndarray:
    """`replicates` bootstrap values of `Σ sign · mean(group)`: the items drawn once per replicate for every group,
    each group's seeds drawn on their own."""
    rng = np.random.default_rng(seed)
    items = groups[0][0].shape[1]
    picks = rng.integers(0, items, size=(replicates, items))
    total = np.zeros(replicates)
    for grid, sign in groups:
        # Each seed's mean over the drawn items [replicates, seeds], then the mean over drawn seeds.
        per_seed = grid[:, picks].mean(axis=2).T
        seeds = rng.integers(0, grid.shape[0], size=(replicates, grid.shape[0]))
        total += sign * np.take_along_axis(per_seed, seeds, axis=1).mean(axis=1)
    return total


def percentile_interval(draws: np.ndarray, level: float = LEVEL) -> tuple[float, float, float]:
    """The percentile interval and the two-sided p-value of bootstrap draws. With k = ⌊B·α/2⌋, the interval is the
    (k+1)-th smallest and (k+1)-th largest draw, and p = 2·min(#draws ≤ 0, #draws ≥ 0) / B: the interval lies above
    0 exactly when p ≤ α with the lower tail the smaller (and below 0 likewise), so a label from the interval and
    one from p agree."""
    ordered = np.sort(draws)
    count = len(ordered)
    k = int(math.floor(count * (1 - level) / 2))
    tails = min(int(np.sum(ordered <= 0)), int(np.sum(ordered >= 0)))
    return float(ordered[k]), float(ordered[count - 1 - k]), min(1.0, 2 * tails / count)


def bootstrap_variance(groups: list[tuple[np.ndarray, float]]) -> float:
    """The exact variance of `bootstrap_draws` (infinitely many replicates). Each group decomposes as
    `x_si = m + α_s + β_i + e_si` (double-centred), and the draws are independent, so
    `Var = Σ_g v(α_g)/S_g + v(Σ_g sign_g β_g)/P + Σ_g v(e_g)/(S_g P)`, v the mean square."""
    items = groups[0][0].shape[1]
    total = 0.0
    beta = np.zeros(items)
    for grid, sign in groups:
        m = grid.mean()
        alpha = grid.mean(axis=1) - m
        b = grid.mean(axis=0) - m
        e = grid - m - alpha[:, None] - b[None, :]
        seeds = grid.shape[0]
        total += np.mean(alpha ** 2) / seeds + np.mean(e ** 2) / (seeds * items)
        beta += sign * b
    return float(total + np.mean(beta ** 2) / items)


def compare_seeds(a: Mapping[object, float], b: Mapping[object, float] | None = None,
                  level: float = LEVEL) -> Effect:
    """A − B from one value per seed: Student's t over the paired differences of the seeds both arms have (or over
    A's values against 0 when `b` is None)."""
    seeds = sorted(set(a) & set(b)) if b is not None else sorted(a)
    diffs = [a[s] - (b[s] if b is not None else 0.0) for s in seeds]
    if not diffs:
        raise ValueError("no seed in common")
    n = len(diffs)
    mean = math.fsum(diffs) / n
    sd = math.sqrt(math.fsum((d - mean) ** 2 for d in diffs) / (n - 1)) if n > 1 else 0.0
    return compare_summary(mean, sd, n, level, (len(a), len(b) if b is not None else 0))


def compare_summary(mean: float, sd: float, n: int, level: float = LEVEL, seeds: tuple[int, int] | None = None,
                    rounding: float = 0.0) -> Effect:
    """Student's t from the mean and the sample standard deviation of `n` paired per-seed differences (all a report
    that kept "mean ± std over seeds" of the differences allows). `rounding`: half a unit of the last digit those
    were printed with; the interval is then the widest the printed figures allow (the standard deviation taken
    `rounding` larger, the interval widened by `rounding` on each side, the p-value from the mean taken `rounding`
    closer to 0), so a label read from a rounded table is never stronger than the exact figures would give."""
    seeds = seeds or (n, n)
    if n < 2:
        return Effect(mean, None, None, None, "one paired seed: no interval", seeds, 0)
    sd += rounding
    # Identical differences (discrete accuracies can coincide) give sd 0: no spread to estimate, no interval.
    if sd <= 1e-12 * max(1.0, abs(mean)):
        return Effect(mean, None, None, None, f"{n} paired seeds, no spread: no interval", seeds, 0)
    se = sd / math.sqrt(n)
    q = t_quantile(1 - (1 - level) / 2, n - 1)
    p = min(1.0, 2 * (1 - t_cdf(max(0.0, abs(mean) - rounding) / se, n - 1)))
    method = f"t over {n} paired seeds" + (", from rounded figures" if rounding else "")
    return Effect(mean, mean - q * se - rounding, mean + q * se + rounding, p, method, seeds, 0)


# -- several comparisons ------------------------------------------------------------------------------------------------


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values (None stays None and does not count as a comparison): the i-th smallest of
    m p-values is multiplied by m − i + 1, then made non-decreasing, capped at 1."""
    present = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    m = len(present)
    adjusted: list[float | None] = [None] * len(p_values)
    running = 0.0
    for rank, (p, i) in enumerate(present):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[i] = running
    return adjusted


def label_at(effect: Effect, p: float | None, higher_is_better: bool = True, alpha: float = 1 - LEVEL) -> str:
    """The label at a (Holm-adjusted) p-value: the effect's side when p ≤ α, else "cannot tell"."""
    if p is None or p > alpha + 1e-12 or effect.effect == 0:
        return CANNOT_TELL
    return label(effect.effect, effect.effect, higher_is_better)


# -- what it would take ---------------------------------------------------------------------------------------------------


def variance_components(a: Mapping[object, Sequence[float]], b: Mapping[object, Sequence[float]] | None = None) -> dict:
    """Unbiased (two-way analysis of variance, method of moments, truncated at 0) variance components of A − B from
    per-item values per seed, for the groups the bootstrap draws (`groups_of`): `seed` (Σ σ²_seed of the groups: the
    spread of a seed's mean beyond what its items explain), `item` (σ² of the items' difference, common to every seed)
    and `residual` (Σ σ²_res of the groups). With one seed in a group its seed and residual parts cannot be told
    apart: `seed` and `residual` are None and the residual is inside `item`."""
    groups, _ = groups_of(a, b)
    items = groups[0][0].shape[1]
    estimable = all(g.shape[0] > 1 for g, _ in groups)
    seed_var = residual = 0.0
    item_means = np.zeros(items)
    for grid, sign in groups:
        seeds = grid.shape[0]
        item_means += sign * grid.mean(axis=0)
        if seeds > 1:
            m = grid.mean()
            seed_means = grid.mean(axis=1)
            e = grid - seed_means[:, None] - grid.mean(axis=0)[None, :] + m
            ms_res = float(np.sum(e ** 2) / ((seeds - 1) * (items - 1)))
            ms_seed = float(items * np.sum((seed_means - m) ** 2) / (seeds - 1))
            residual += ms_res
            seed_var += max(0.0, (ms_seed - ms_res) / items)
    item = float(np.var(item_means, ddof=1))
    if estimable:
        # The items' spread of the seed-averaged difference also holds each group's residual over its seeds.
        item = max(0.0, item - sum(_residual(g) / g.shape[0] for g, _ in groups))
    return {"seed": seed_var if estimable else None, "item": item, "residual": residual if estimable else None,
            "seeds": tuple(g.shape[0] for g, _ in groups), "items": items}


def _residual(grid: np.ndarray) -> float:
    seeds, items = grid.shape
    e = grid - grid.mean(axis=1)[:, None] - grid.mean(axis=0)[None, :] + grid.mean()
    return float(np.sum(e ** 2) / ((seeds - 1) * (items - 1)))


def standard_error(components: dict, seeds: float, items: float) -> float:
    """The effect's standard error with `seeds` seeds per arm and `items` items (`math.inf`: unlimited)."""
    seed = components["seed"] or 0.0
    residual = components["residual"] or 0.0
    return math.sqrt(seed / seeds + (components["item"] / items if items != math.inf else 0.0)
                     + (residual / (seeds * items) if items != math.inf else 0.0))


def z_needed(level: float = LEVEL, power: float = 0.8) -> float:
    normal = NormalDist()
    return normal.inv_cdf(1 - (1 - level) / 2) + normal.inv_cdf(power)


def sample_size(components: dict, effect: float, level: float = LEVEL, power: float = 0.8,
                items: float | None = None, seeds: float | None = None) -> int | None:
    """The fewest seeds per arm (given `items`, `math.inf` for unlimited) or items (given `seeds`) with which a true
    effect `effect` is told from 0 with the given power: the smallest n with `SE² ≤ (|δ| / (z_{1−α/2} + z_{1−β}))²`
    (`standard_error`), solved in closed form; None when no number does (the other factor's part alone is larger)."""
    if effect == 0:
        return None
    target = (abs(effect) / z_needed(level, power)) ** 2
    seed = components["seed"] or 0.0
    item = components["item"]
    residual = components["residual"] or 0.0
    if items is not None:  # seed / S + item / P + residual / (S P) <= target
        room = target - (item / items if items != math.inf else 0.0)
        need = seed + (residual / items if items != math.inf else 0.0)
    else:  # item / P + residual / (S P) <= target - seed / S
        room = target - seed / seeds
        need = item + residual / seeds
    if room <= 0:
        return None
    return max(1, math.ceil(need / room - 1e-12))


# -- Student's t, without scipy ---------------------------------------------------------------------------------------


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _incomplete_beta(a: float, b: float, x: float) -> float:
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T ≤ t) for Student's t with `df` degrees of freedom."""
    tail = 0.5 * _incomplete_beta(df / 2, 0.5, df / (df + t * t))
    return 1 - tail if t > 0 else tail


def t_quantile(q: float, df: float) -> float:
    """The `q` quantile of Student's t (bisection on `t_cdf`)."""
    if not 0 < q < 1:
        raise ValueError(f"quantile {q} outside (0, 1)")
    if q < 0.5:
        return -t_quantile(1 - q, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < q:
        high *= 2
    for _ in range(200):
        middle = (low + high) / 2
        if t_cdf(middle, df) < q:
            low = middle
        else:
            high = middle
    return (low + high) / 2


# -- reports ------------------------------------------------------------------------------------------------------------


def p_text(p: float | None) -> str:
    if p is None:
        return "—"
    if p < 0.001:
        return "<0.001"
    return f"{p:.3f}"


def interval_text(effect: Effect, digits: int = 1) -> str:
    """`+1.2 [−0.3, +2.6]`, or `+1.2 (no interval)`."""
    value = f"{effect.effect:+.{digits}f}"
    if effect.low is None:
        return f"{value} (no interval)"
    return f"{value} [{effect.low:+.{digits}f}, {effect.high:+.{digits}f}]"


def judged(rows: list[dict]) -> list[dict]:
    """Each row (`effect`: an Effect, `higher_is_better`) with its label, its Holm-adjusted p over `rows` and the label
    at that p; returns the rows completed."""
    adjusted = holm([row["effect"].p for row in rows])
    for row, p in zip(rows, adjusted):
        higher = row.get("higher_is_better", True)
        row["label"] = row["effect"].label(higher)
        row["holm_p"] = p
        row["holm_label"] = label_at(row["effect"], p, higher)
    return rows


def comparisons_line(rows: list[dict]) -> str:
    """The sentence beside a verdict table: how many comparisons, how many have an interval, and the adjustment."""
    tested = sum(row["effect"].p is not None for row in rows)
    text = f"{len(rows)} comparisons in this table"
    if tested != len(rows):
        text += f" ({tested} with an interval; the others cannot be told: no interval)"
    return text + ("; Holm's adjustment over the " + (f"{tested}" if tested != len(rows) else "table's")
                   + " p-values in the last two columns.")
