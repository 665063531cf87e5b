"""GEM's adaptive beta (`gem_target_entropy`): the update rule, its bounds and its saved state."""

from __future__ import annotations

import math

import pytest

from trl_emo.gem_schedule import GemBetaSchedule, check_target_entropy


def schedule(**kw):
    values = dict(beta=0.7, target_entropy=2.0, beta_min=0.3, step_size=0.1)
    values.update(kw)
    return GemBetaSchedule(**values)


def test_too_little_entropy_lowers_beta_and_too_much_raises_it():
    low = schedule()
    low.observe(entropy_sum=10.0, count=10)  # mean 1.0 < target 2.0
    assert low.update() == pytest.approx(0.7 * math.exp(-0.1))
    high = schedule()
    high.observe(entropy_sum=30.0, count=5)  # micro-batches add up: mean (30 + 10) / 10 = 4.0
    high.observe(entropy_sum=10.0, count=5)
    assert high.update() == pytest.approx(min(1.0, 0.7 * math.exp(0.2)))


def test_beta_stays_within_its_bounds_and_a_step_without_tokens_changes_nothing():
    s = schedule(step_size=10.0)
    s.observe(0.0, 4)
    assert s.update() == pytest.approx(0.3)  # clipped at gem_beta_min
    s.observe(400.0, 4)
    assert s.update() == 1.0  # clipped at 1
    assert s.update() == 1.0  # nothing observed since: unchanged


def test_the_state_round_trips_exactly(tmp_path):
    s = schedule()
    s.observe(13.0, 7)
    s.update()
    s.save(str(tmp_path))
    restored = schedule(beta=0.9)
    assert restored.load(str(tmp_path)) and restored.beta == s.beta
    assert not schedule().load(str(tmp_path / "elsewhere"))


@pytest.mark.parametrize("target", [0.0, -1.0, math.log(100), 10.0])
def test_unreachable_targets_are_refused(target):
    with pytest.raises(ValueError, match=r"gem_target_entropy must be in \(0, ln V\)"):
        check_target_entropy(target, 100)
    check_target_entropy(2.0, 100)
