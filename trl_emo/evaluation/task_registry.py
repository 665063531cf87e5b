"""The evaluation tasks of `trl-emo eval`, registered by name (`EvalConfig.task`).

Built-in tasks live in `trl_emo.evaluation.tasks`, one module each, and register themselves with `register_task` when
that package is imported (the `trl_emo.evaluation` package imports it, so they are registered before any lookup);
another package adds its own with an entry point in the group `trl_emo.evaluation_tasks` whose module calls
`register_task`. The registry sits apart from the tasks so that the configuration can look a task up by name without
importing the task modules, which import the configuration.
"""

from __future__ import annotations

import difflib

from ..core.errors import ConfigError
from ..core.plugins import load_plugins

_TASKS: dict[str, type] = {}


def register_task(cls: type) -> type:
    """Class decorator: make `cls` (an `EvalTask` subclass) selectable as `task: <cls.name>`."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no `name`.")
    if cls.name in _TASKS and _TASKS[cls.name] is not cls:
        raise ValueError(f"An evaluation task named {cls.name!r} is already registered ({_TASKS[cls.name].__name__}).")
    _TASKS[cls.name] = cls
    return cls


def _load_entry_points() -> None:
    load_plugins("trl_emo.evaluation_tasks")


def task_names() -> list[str]:
    _load_entry_points()
    return sorted(_TASKS)


def get_task(name: str) -> type:
    if name not in _TASKS:
        _load_entry_points()
    if name not in _TASKS:
        valid = task_names()
        close = difflib.get_close_matches(str(name), valid, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"Unknown task {name!r}.{hint} Tasks: {', '.join(valid)}.")
    return _TASKS[name]


def field_owners() -> dict[str, tuple[str, ...]]:
    """Task-specific `EvalConfig` field -> the tasks that own it (tasks may share one, as `humaneval` and `mbpp` do)."""
    _load_entry_points()
    owners: dict[str, tuple[str, ...]] = {}
    for task in _TASKS.values():
        for name in task.fields:
            owners[name] = (*owners.get(name, ()), task.name)
    return owners
