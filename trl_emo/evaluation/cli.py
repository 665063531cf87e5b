"""`python -m trl_emo.evaluate` / `trl-emo eval`: evaluate several models side by side on one task."""

from __future__ import annotations

import os
import sys

from ..cli_utils import ConfigError, parse_config
from .config import EvalConfig, EvaluationError


def main(argv: list[str] | None = None) -> int:
    """Parse a recipe (`--recipe FILE`) and flags, run or resume the evaluation, print the table.

    Returns 0 on success, 2 for an unusable configuration or input (the message goes to stderr).
    `--list_tasks` prints the registered tasks and exits.
    """
    from ..noise import quiet_optional_packages

    quiet_optional_packages()
    if argv is None:
        argv = sys.argv[1:]
    if "--list_tasks" in argv:
        from .tasks import get_task, task_names

        for name in task_names():
            task = get_task(name)
            print(f"{name:<12} {task.title}")
        return 0
    try:
        (config,) = parse_config([EvalConfig], argv)
        from .pipeline import run_evaluation

        run_evaluation(config)
    except (ConfigError, EvaluationError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    with open(f"{config.output_dir}/summary.md", encoding="utf-8") as handle:
        print(handle.read())
    entries = sorted(
        e + ("/" if os.path.isdir(os.path.join(config.output_dir, e)) else "") for e in os.listdir(config.output_dir)
    )
    print(f"Results in {config.output_dir}/ ({', '.join(entries)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
