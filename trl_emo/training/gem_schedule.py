"""GEM with a target entropy: `gem_beta` adapted after every optimizer step.

GEM's `beta` sets how much entropy the fine-tuned model keeps (its maintainer's advice: 0.8-0.9 to
fit the data, 0.6-0.7 for diversity): a smaller `beta` keeps more. Instead of picking it, give the
mean token entropy you want (`gem_target_entropy`, nats per target token): after each optimizer
step `log beta` moves against the gap between that target and the step's mean entropy (measured
over every micro-batch and every process, so all processes take the same step),

    log beta <- clip(log beta - gem_beta_step * (target - mean_entropy), log gem_beta_min, 0)

i.e. too little entropy lowers `beta`, too much raises it, and the log keeps the step relative. The
state is one number, saved next to each checkpoint and restored on resume, so an interrupted run
continues with the same `beta` it would have had.

A target GEM cannot reach pins `beta` at a bound: at 1 when cross-entropy itself already keeps more
entropy than the target (GEM is then cross-entropy), at `gem_beta_min` when even that keeps too
little. That is reported once, with the numbers, after `SATURATION_STEPS` steps at a bound. The step
is that of an integral controller on an entropy that follows `beta` with a lag: the default 0.05 settles
within a few dozen steps of ~1k tokens each in the oracle study (`docs/oracle_study.md`), 0.2
oscillates there; long noisy runs may want less.
"""

from __future__ import annotations

import json
import math
import os

STATE_FILE = "trl_emo_gem_beta.json"
# Consecutive optimizer steps at a bound before the target is reported unreachable.
SATURATION_STEPS = 20


class GemBetaSchedule:
    """The adaptive `beta` of GEM; `observe` entropies during a step, `update` at its end."""

    def __init__(self, beta: float, target_entropy: float, beta_min: float, step_size: float):
        self.beta = float(beta)
        self.target = float(target_entropy)
        self.beta_min = float(beta_min)
        self.step_size = float(step_size)
        self._entropy_sum = 0.0
        self._count = 0.0
        self.last_mean_entropy: float | None = None
        self._steps_at_bound = 0
        self._reported = False

    def observe(self, entropy_sum: float, count: float) -> None:
        """Add the summed token entropy and token count of one micro-batch (already summed over processes)."""
        self._entropy_sum += float(entropy_sum)
        self._count += float(count)

    def update(self) -> float:
        """Move `beta` after an optimizer step; a step that saw no target token leaves it unchanged."""
        if self._count > 0:
            mean = self._entropy_sum / self._count
            self.last_mean_entropy = mean
            log_beta = math.log(self.beta) - self.step_size * (self.target - mean)
            self.beta = math.exp(min(0.0, max(math.log(self.beta_min), log_beta)))
            at_bound = self.beta == 1.0 or self.beta == self.beta_min
            self._steps_at_bound = self._steps_at_bound + 1 if at_bound else 0
        self._entropy_sum, self._count = 0.0, 0.0
        return self.beta

    def saturation_message(self) -> str | None:
        """Once, after `SATURATION_STEPS` steps at a bound: why the target is out of reach."""
        if self._reported or self._steps_at_bound < SATURATION_STEPS:
            return None
        self._reported = True
        mean = self.last_mean_entropy
        if self.beta == 1.0:
            return (
                f"gem_beta has stayed at 1 for {self._steps_at_bound} steps: the mean token entropy ({mean:.3f} nats) is "
                f"above gem_target_entropy={self.target:g} even at beta = 1, where GEM is cross-entropy, and a smaller "
                "beta only adds entropy. The target is out of GEM's reach for this model and data; training continues as "
                "cross-entropy (lower the temperature at sampling time to reduce entropy)."
            )
        return (
            f"gem_beta has stayed at gem_beta_min={self.beta_min:g} for {self._steps_at_bound} steps: the mean token "
            f"entropy ({mean:.3f} nats) is still below gem_target_entropy={self.target:g}. Lower gem_beta_min to let GEM "
            "keep more entropy, or lower the target."
        )

    def save(self, folder: str) -> None:
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, STATE_FILE), "w", encoding="utf-8") as handle:
            # repr round-trips a float exactly, so a resumed run continues bit for bit
            json.dump({"gem_beta": repr(self.beta)}, handle)

    def load(self, folder: str) -> bool:
        """Restore `beta` from a checkpoint; False when the checkpoint has none."""
        path = os.path.join(folder, STATE_FILE)
        if not os.path.isfile(path):
            return False
        with open(path, encoding="utf-8") as handle:
            self.beta = float(json.load(handle)["gem_beta"])
        return True


def check_target_entropy(target: float, vocab_size: int) -> None:
    """The target must be reachable: strictly between 0 and the uniform distribution's `ln V`."""
    ceiling = math.log(vocab_size)
    if not 0.0 < target < ceiling:
        raise ValueError(
            f"gem_target_entropy must be in (0, ln V) = (0, {ceiling:.3f}) for this model's {vocab_size}-token "
            f"vocabulary, got {target!r}."
        )
