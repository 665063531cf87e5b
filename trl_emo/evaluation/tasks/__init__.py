"""The built-in evaluation tasks, one module each; importing this package registers them (`register_task`, in
`trl_emo.evaluation.task_registry`, where `get_task` finds them by name). Another package adds its own with an entry
point in the group `trl_emo.evaluation_tasks` whose module calls `register_task`.
"""

from __future__ import annotations

from ..task_registry import _TASKS, field_owners, get_task, register_task, task_names  # noqa: F401 - `_TASKS`: the same dict
from .base import COMMON_FIELDS, EvalTask, GenerationPlan, ModelRun

__all__ = [
    "COMMON_FIELDS", "EvalTask", "GenerationPlan", "ModelRun", "field_owners", "get_task", "register_task",
    "task_names",
]

# Importing the built-in task modules registers them.
from . import bon, continuation, creative, humaneval, icl, ifeval, math, mbpp  # noqa: E402,F401 - registers every task
