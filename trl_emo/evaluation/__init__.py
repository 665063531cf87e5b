"""Evaluation of several models side by side (`python -m trl_emo.evaluate`, `trl-emo eval`).

Tasks (`tasks/`, one module each, registered by name): `bon` (best-of-n with a reward model,
diversity and GSM8K metrics), `ifeval` (lm-eval's IFEval checkers, via `ifeval_checkers`),
`math` (MATH with math-verify equivalence, via `math_answers`), `humaneval` / `mbpp` (pass@k of
programs checked in `sandbox/`, the code sandbox: a subpackage of its own with one public face),
`creative` (GEM's creative-writing diversity).
Shared machinery: `config` (EvalConfig), `prompts` (prompt sets),
`generation` (HF generate / vLLM), `scoring` (reward model), `metrics` (pure metric functions),
`embeddings` (all-MiniLM-L6-v2), `loading` (devices, dtypes, and evaluation errors around
`trl_emo.models.sources`, which loads models and LoRA adapters for training and evaluation alike), `cache`
(JSONL cache and resume), `report` (summary.json / summary.md / figures), `pipeline` (the whole run,
calling the task's hooks; `eval_sources`, the Hub ids a task declares), `task_registry` (tasks by name),
`errors` (`EvaluationError`). The command itself is `trl_emo.commands.evaluate`. Prompt sets are read by
`trl_emo.data.loading` and rendered in training's prompt formats.
"""

from . import tasks  # noqa: F401 - registers the built-in tasks before any lookup by name
from .config import EvalConfig
from .errors import EvaluationError

__all__ = ["EvalConfig", "EvaluationError", "run_evaluation"]


def run_evaluation(config: EvalConfig) -> dict:
    """Run or resume the evaluation; see `trl_emo.evaluation.pipeline.run_evaluation`."""
    from .pipeline import run_evaluation as run

    return run(config)
