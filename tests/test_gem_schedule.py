"""GEM's adaptive beta (`gem_target_entropy`): the update rule, its bounds and its saved state."""

from __future__ import annotations

import math

import pytest

from trl_emo.training.gem_schedule import GemBetaSchedule, check_target_entropy


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


def test_a_target_out_of_reach_is_reported_once():
    s = schedule(step_size=10.0)
    messages = []
    for _ in range(25):
        s.observe(400.0, 100)  # mean 4.0 > target 2.0 even at beta = 1
        s.update()
        messages.append(s.saturation_message())
    reported = [m for m in messages if m]
    assert len(reported) == 1 and "out of GEM's reach" in reported[0] and "4.000 nats" in reported[0]
    low = schedule(step_size=10.0)
    for _ in range(20):
        low.observe(0.0, 100)
        low.update()
    assert "gem_beta_min=0.3" in low.saturation_message()


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


# -- in the trainer -------------------------------------------------------------------------------


def _betas(trainer):
    return [row["gem_beta"] for row in trainer.state.log_history if "gem_beta" in row]


def _gem_trainer(tmp_path, make_model, tokenizer, pc_dataset, **overrides):
    from conftest import cpu_config

    from trl_emo import SFTTrainer

    args = cpu_config(tmp_path, loss_type="gem", gem_beta=0.7, gem_beta_step=0.2, **overrides)
    return SFTTrainer(model=make_model(), args=args, train_dataset=pc_dataset, processing_class=tokenizer)


def test_the_trainer_moves_beta_toward_the_target_and_logs_it(tmp_path, make_model, tokenizer, pc_dataset):
    # The tiny model starts near the uniform entropy (ln 320 = 5.77 nats): a low target raises beta, a target
    # above what it has lowers it.
    low = _gem_trainer(tmp_path / "low", make_model, tokenizer, pc_dataset, gem_target_entropy=1.0, max_steps=4)
    low.train()
    betas = _betas(low)
    assert len(betas) == 4 and betas[0] > 0.7 and betas == sorted(betas)
    assert low._objective.hparams["beta"] == betas[-1]
    high = _gem_trainer(tmp_path / "high", make_model, tokenizer, pc_dataset, gem_target_entropy=5.76, max_steps=4,
                        learning_rate=3e-2)
    high.train()
    assert _betas(high)[-1] < min(_betas(high)[0], 0.7)


def test_beta_is_restored_exactly_on_resume(tmp_path, make_model, tokenizer, pc_dataset):
    common = dict(gem_target_entropy=1.0, max_steps=4, save_strategy="steps", save_steps=2)
    whole = _gem_trainer(tmp_path / "whole", make_model, tokenizer, pc_dataset, **common)
    whole.train()
    first = _gem_trainer(tmp_path / "cut", make_model, tokenizer, pc_dataset, **{**common, "max_steps": 2})
    first.train()
    assert (tmp_path / "cut" / "checkpoint-2" / "trl_emo_gem_beta.json").is_file()
    resumed = _gem_trainer(tmp_path / "cut", make_model, tokenizer, pc_dataset, **common)
    resumed.train(resume_from_checkpoint=True)
    assert _betas(resumed)[-2:] == _betas(whole)[-2:]


def test_a_target_beyond_ln_v_is_refused_when_the_trainer_is_built(tmp_path, make_model, tokenizer, pc_dataset):
    with pytest.raises(ValueError, match=r"gem_target_entropy must be in \(0, ln V\) = \(0, 5.768\)"):
        _gem_trainer(tmp_path, make_model, tokenizer, pc_dataset, gem_target_entropy=6.0)
