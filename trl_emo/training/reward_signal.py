"""A GRPO run whose reward never fires says so.

GRPO learns from the spread of rewards inside each group of completions: when every completion of every group scores
0, the advantages are all zero, and so are the loss and the gradient, at every step (TRL logs `reward 0`,
`frac_reward_zero_std 1`, `loss 0`, `grad_norm 0`). The usual cause is a model that was never taught the answer
format the reward reads (`gsm8k_answer` reads "The answer is N" or "#### N"): nothing in TRL's log says the run is
learning nothing. `RewardNeverFires` watches TRL's logged `reward` and `frac_reward_zero_std` over the first
`first_steps` optimizer steps and warns once when every logged window had reward 0 with no spread.
"""

from __future__ import annotations

import logging

from transformers import TrainerCallback

logger = logging.getLogger(__name__)

FIRST_STEPS = 4


def never_fired_message(steps: int, rewards: list[str]) -> str:
    names = ", ".join(rewards) or "the rewards"
    return (f"GRPO: in the first {steps} step(s) every completion of every group scored reward 0 "
            f"(frac_reward_zero_std 1), so the advantages, the loss and the gradient are all zero and the run learns "
            f"nothing. The reward never fires: do the completions state their answer in the form {names} read(s) "
            "(gsm8k_answer: 'The answer is N' or '#### N'; math_answer: \\boxed{...})? Teach it first by SFT on data "
            "in that format (the gem_metamath recipe, or `trl-emo demo --chain`'s GSM8K-style sample), or add the "
            "`format` reward with a small weight.")


class RewardNeverFires(TrainerCallback):
    """Warn once when, over the first `first_steps` steps, every group scored reward 0 with zero spread."""

    def __init__(self, rewards: list[str] = (), first_steps: int = FIRST_STEPS):
        self.rewards, self.first_steps = list(rewards), first_steps
        self.windows, self.all_zero, self.done = 0, True, False

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.done or not logs or "reward" not in logs or "eval_reward" in logs:
            return
        self.windows += 1
        self.all_zero &= logs["reward"] == 0 and logs.get("frac_reward_zero_std", 0) == 1
        if not self.all_zero:
            self.done = True
        elif state.global_step >= min(self.first_steps, state.max_steps if state.max_steps > 0 else self.first_steps):
            self._warn(state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        if not self.done and self.windows and self.all_zero:
            self._warn(state.global_step)

    def _warn(self, steps: int) -> None:
        self.done = True
        if steps > 0:
            logger.warning(never_fired_message(steps, self.rewards))
