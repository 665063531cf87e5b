"""`python -m trl_emo.evaluate` / `trl-emo eval`: evaluate several models side by side on one task.

In the shape of TRL's scripts: `make_parser(subparsers=None)` and `main(args)` on the parsed command line (a recipe
and flags into one `EvalConfig`); `run(argv)` does both and returns the exit status.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from .command_line import CommandLine, check_parsed, one_line, run_command
from ..core.errors import ConfigError
from ..evaluation.config import EvalConfig
from ..evaluation.errors import EvaluationError

NAME = "trl_emo.evaluate"
HELP = "Evaluate several models side by side on one task (best-of-n by default); --list_tasks lists the tasks."


class ListTasks(argparse.Action):
    """`--list_tasks`: print the registered tasks and exit, like `--help` (before the configuration is checked)."""

    def __call__(self, parser, namespace, values, option_string=None):
        from ..evaluation.task_registry import get_task, task_names

        for name in task_names():
            print(f"{name:<12} {get_task(name).title}")
        parser.exit(0)


def make_parser(subparsers=None, prog: str | None = None):
    """The command's parser (`trl_emo.commands.parser.CommandParser` over `EvalConfig`); with `subparsers`, registered
    there as `eval`."""
    from .parser import command_parser

    parser = command_parser(
        (EvalConfig,), subparsers, name="eval", help="evaluate models side by side (best-of-n by default)",
        prog=prog or f"{NAME} (trl-emo eval)", description=HELP,
    )
    parser.add_argument(
        "--list_tasks", action=ListTasks, nargs=0, default=argparse.SUPPRESS, help="Print the tasks and exit."
    )
    return parser


def main(args: CommandLine) -> int:
    """Run or resume the evaluation of a parsed command line and print the table.

    Returns 0 on success, 2 for an unusable configuration or input (the message goes to stderr).
    """
    from ..core.errors import HubAccessError
    from ..core.logs import setup_command_logging
    from ..core.noise import quiet_optional_packages
    from ..models.sources import SourceError

    check_parsed(args, NAME)
    quiet_optional_packages()
    setup_command_logging(logging.INFO)
    (config,) = args.values
    try:
        from ..evaluation.pipeline import run_evaluation

        run_evaluation(config)
    except (ConfigError, EvaluationError, SourceError, HubAccessError) as exc:
        print(f"{NAME}: error: {one_line(exc)}", file=sys.stderr)
        return 2
    with open(f"{config.output_dir}/summary.md", encoding="utf-8") as handle:
        print(handle.read())
    entries = sorted(
        e + ("/" if os.path.isdir(os.path.join(config.output_dir, e)) else "") for e in os.listdir(config.output_dir)
    )
    print(f"Results in {config.output_dir}/ ({', '.join(entries)})")
    return 0


def run(argv: list[str] | None = None) -> int:
    """Parse `argv` (default: `sys.argv[1:]`), then `main`; the exit status. `--list_tasks` prints the tasks."""
    return run_command(make_parser, main, argv, error_prefix=NAME)


if __name__ == "__main__":
    raise SystemExit(run())
