"""The studies' one statistics module (`benchmarks/study_stats.py`) against cases with a known answer: Student's t in
closed form, the two-way bootstrap's exact variance and its exact distribution on a case small enough to enumerate,
Holm's adjustment by hand, and the sample-size formula at its boundary."""

from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import study_stats as st  # noqa: E402


@pytest.mark.parametrize("df", [1, 2])
@pytest.mark.parametrize("q", [0.6, 0.9, 0.975, 0.995])
def test_student_t_matches_its_closed_forms(df, q):
    # df 1 is Cauchy: tan(π (q − ½)); df 2: (2q − 1) / sqrt(2 q (1 − q)).
    exact = math.tan(math.pi * (q - 0.5)) if df == 1 else (2 * q - 1) / math.sqrt(2 * q * (1 - q))
    assert st.t_quantile(q, df) == pytest.approx(exact, rel=1e-9)
    assert st.t_cdf(exact, df) == pytest.approx(q, abs=1e-12)
    assert st.t_quantile(1 - q, df) == pytest.approx(-exact, rel=1e-9)


def test_student_t_matches_the_printed_tables():
    # The 97.5 % points every t table prints.
    for df, value in ((3, 3.182446), (5, 2.570582), (10, 2.228139), (30, 2.042272)):
        assert st.t_quantile(0.975, df) == pytest.approx(value, abs=1e-6)


def test_paired_seeds_give_students_t_interval():
    a, b = {0: 1.0, 1: 2.0, 2: 1.5}, {0: 0.0, 1: 0.5, 2: 0.2}
    effect = st.compare_seeds(a, b)
    diffs = [1.0, 1.5, 1.3]
    mean, sd = sum(diffs) / 3, float(np.std(diffs, ddof=1))
    half = 4.302652729749464 * sd / math.sqrt(3)
    assert effect.effect == pytest.approx(mean) and effect.low == pytest.approx(mean - half)
    assert effect.high == pytest.approx(mean + half) and effect.label() == "better"
    assert effect.label(higher_is_better=False) == "worse"
    # The p-value is where the interval reaches 0: 2 (1 − F(t)), t = mean / (sd / √n).
    assert effect.p == pytest.approx(2 * (1 - st.t_cdf(mean / (sd / math.sqrt(3)), 2)))
    assert st.compare_summary(mean, sd, 3).low == pytest.approx(effect.low)
    # One seed, or identical differences (discrete accuracies can coincide): no spread, no interval.
    assert st.compare_seeds({0: 2.0}, {0: 1.0}).label() == "cannot tell"
    assert st.compare_seeds({0: 2.0, 1: 3.0}, {0: 1.0, 1: 2.0}).low is None


def test_rounded_figures_never_give_a_stronger_label_than_the_exact_ones():
    exact = st.compare_summary(0.0123, 0.0031, 3)
    printed = st.compare_summary(0.012, 0.003, 3, rounding=0.0005)
    assert printed.low < exact.low and printed.high > exact.high and printed.p > exact.p
    # 0.04 ± 0.00: the exact spread is unknown, at most 0.005; the interval takes that.
    assert st.compare_summary(0.04, 0.0, 3, rounding=0.005).low == pytest.approx(
        0.04 - 4.302652729749464 * 0.005 / math.sqrt(3) - 0.005)


def _grid(rng, seeds, items, offset=0.0):
    return {s: list(rng.binomial(8, 0.3, size=items) / 8 * 100 + offset) for s in range(seeds)}


def test_the_bootstrap_variance_is_its_closed_form():
    rng = np.random.default_rng(3)
    a, b = _grid(rng, 2, 64, 5.0), _grid(rng, 2, 64)
    c = _grid(rng, 3, 64)
    for first, second in ((a, b), (a, c), (a, None)):
        groups, _ = st.groups_of(first, second)
        draws = st.bootstrap_draws(groups, replicates=40_000, seed=11)
        # 40,000 replicates: the variance of a sample variance is ~2σ⁴/B, about 0.7 % here; 4 % is beyond chance.
        assert draws.var() == pytest.approx(st.bootstrap_variance(groups), rel=0.04)


def test_the_bootstrap_distribution_on_a_case_small_enough_to_enumerate():
    # Two paired seeds x two items: each replicate draws 2 seeds and 2 items, 16 equally likely outcomes.
    a = {0: [3.0, 1.0], 1: [2.0, 0.0]}
    b = {0: [0.0, 0.0], 1: [0.0, 0.0]}
    d = np.array([a[0], a[1]])
    outcomes = [d[np.ix_(seeds, items)].mean()
                for seeds in itertools.product(range(2), repeat=2) for items in itertools.product(range(2), repeat=2)]
    effect = st.compare_items(a, b, replicates=64_000)
    assert effect.effect == pytest.approx(1.5)
    # The exact 2.5 % and 97.5 % points of the 16 outcomes, and P(draw ≤ 0) = 1/16 (seed 1 and item 2 twice).
    ordered = sorted(outcomes)
    assert effect.low == min(outcomes) == 0.0 and effect.high == max(outcomes) == 3.0
    assert effect.p == pytest.approx(2 * sum(o <= 0 for o in ordered) / 16, abs=0.01)


def test_a_label_from_the_interval_and_one_from_p_agree():
    rng = np.random.default_rng(5)
    for shift in np.linspace(-6, 6, 25):
        effect = st.compare_items(_grid(rng, 2, 32, shift), _grid(rng, 2, 32), replicates=4000)
        told = effect.label() != "cannot tell"
        assert told == (effect.p <= 0.05), (shift, effect)
        assert effect.low <= effect.effect <= effect.high


def test_unpaired_seeds_compare_grand_means_and_the_bootstrap_is_deterministic():
    rng = np.random.default_rng(7)
    a, b = _grid(rng, 3, 16, 2.0), _grid(rng, 2, 16)
    effect = st.compare_items(a, b, replicates=2000)
    assert effect.effect == pytest.approx(np.mean(list(a.values())) - np.mean(list(b.values())))
    assert "against 2" in effect.method and effect.seeds == (3, 2)
    assert st.compare_items(a, b, replicates=2000) == effect  # seeded: a regenerated report is the same


def test_holm_by_hand():
    # Sorted 0.01, 0.03, 0.04 of m = 3: 0.03, 0.06, max(0.06, 0.04) = 0.06; None is no comparison.
    assert st.holm([0.01, 0.04, None, 0.03]) == pytest.approx([0.03, 0.06, None, 0.06])
    assert st.holm([0.5, 0.9]) == [1.0, 1.0]
    rows = st.judged([{"effect": st.Effect(1.0, 0.1, 2.0, 0.02, "t", (3, 3), 0)},
                      {"effect": st.Effect(-1.0, -2.0, -0.1, 0.04, "t", (3, 3), 0), "higher_is_better": False}])
    assert [r["label"] for r in rows] == ["better", "better"]  # lower is better in the second
    # 0.02 x 2 and 0.04 x 1: both 0.04 after Holm, still at most 0.05.
    assert rows[0]["holm_p"] == pytest.approx(0.04) and rows[1]["holm_p"] == pytest.approx(0.04)
    assert [r["holm_label"] for r in rows] == ["better", "better"]
    rows[1]["effect"] = st.Effect(-1.0, -2.0, -0.1, 0.03, "t", (3, 3), 0)
    rows.append({"effect": st.Effect(0.5, -0.1, 1.1, 0.6, "t", (3, 3), 0)})
    st.judged(rows)  # 0.02 x 3 = 0.06: no longer told after Holm; 0.03 x 2 = 0.06 either
    assert [r["holm_label"] for r in rows] == ["cannot tell"] * 3
    assert st.comparisons_line(rows).startswith("3 comparisons")


def test_variance_components_and_the_sample_size_at_its_boundary():
    # Seed effect only on the first arm's seeds, item effect shared, sampling noise: the ANOVA recovers them.
    rng = np.random.default_rng(9)
    items, seeds = 400, 6
    item = rng.normal(0, 3, size=items)
    a = {s: list(item + rng.normal(0, 2) + rng.normal(0, 4, size=items)) for s in range(seeds)}
    b = {s: list(rng.normal(0, 4, size=items)) for s in range(seeds + 1)}  # unpaired: one seed more
    parts = st.variance_components(a, b)
    assert parts["item"] == pytest.approx(9, rel=0.25) and parts["residual"] == pytest.approx(32, rel=0.1)
    assert 0.5 < parts["seed"] < 12
    # The smallest n whose standard error reaches the target, and n − 1 does not.
    effect = 1.0
    target = (effect / st.z_needed()) ** 2
    n = st.sample_size(parts, effect, items=100)
    assert st.standard_error(parts, n, 100) ** 2 <= target < st.standard_error(parts, n - 1, 100) ** 2
    p = st.sample_size(parts, effect, seeds=400)
    assert st.standard_error(parts, 400, p) ** 2 <= target < st.standard_error(parts, 400, p - 1) ** 2
    # When the problems' part alone is larger than the target, no number of seeds suffices.
    assert st.sample_size({"seed": 0.0, "item": 100.0, "residual": 0.0}, 1.0, items=64) is None
    assert st.z_needed() == pytest.approx(1.959964 + 0.841621, abs=1e-5)
