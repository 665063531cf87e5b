"""The GSM8K-answer reward of `trl_emo.evaluation.rewards`, unchanged, with every group's rewards written down.

TRL logs `frac_reward_zero_std`, the share of groups whose completions all got the same reward (no advantage, nothing
learned), but not whether they were all wrong (the prompt is out of reach) or all right (already learned): the cure
differs, so the SFT-then-RL study records the rewards of each call (one GRPO step's completions, each prompt repeated
`num_generations` times) and splits the share itself (`zero_spread_shares`). The recipe names this function as
`benchmarks.real_model.logged_rewards:gsm8k_answer`, so TRL's metric keys stay `rewards/gsm8k_answer/...`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

# The file the rewards go to: set by the study around each GRPO run; unset, nothing is written.
LOG_VARIABLE = "TRL_EMO_STUDY_REWARD_LOG"


def gsm8k_answer(prompts=None, completions=None, answer=None, **kwargs):
    from trl_emo.evaluation.rewards import gsm8k_answer as reward

    rewards = reward(prompts=prompts, completions=completions, answer=answer, **kwargs)
    path = os.environ.get(LOG_VARIABLE)
    if path:
        keys = [json.dumps(p, sort_keys=True) if not isinstance(p, str) else p for p in (prompts or [])]
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"prompts": keys, "rewards": rewards}) + "\n")
    return rewards


def zero_spread_shares(path: Path) -> list[dict]:
    """Per logged call (one GRPO step): the share of prompt groups whose rewards are all equal, split into all wrong
    (every reward 0) and all right (every reward 1 — or all equal and above 0, for a graded reward)."""
    steps = []
    if not Path(path).exists():
        return steps
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            row = json.loads(line)
            groups: dict[str, list[float]] = {}
            for prompt, reward in zip(row["prompts"], row["rewards"]):
                groups.setdefault(prompt, [])
                if reward is not None:  # TRL leaves an unscored completion out of the group's statistics
                    groups[prompt].append(float(reward))
            groups = {prompt: values for prompt, values in groups.items() if values}
            flat = [values for values in groups.values() if max(values) == min(values)]
            count = max(len(groups), 1)
            steps.append({"groups": len(groups), "zero_spread": len(flat) / count,
                          "all_wrong": sum(1 for v in flat if v[0] <= 0) / count,
                          "all_right": sum(1 for v in flat if v[0] > 0) / count})
    return steps
