"""`python -m trl_emo.evaluate` / `trl-emo eval`: best-of-n and diversity evaluation of several models."""

from __future__ import annotations

import sys

from ..cli_utils import ConfigError, parse_config
from .config import EvalConfig, EvaluationError


def main(argv: list[str] | None = None) -> int:
    """Parse a recipe (`--recipe FILE`) and flags, run or resume the evaluation, print the table.

    Returns 0 on success, 2 for an unusable configuration or input (the message goes to stderr).
    """
    from ..noise import quiet_optional_packages

    quiet_optional_packages()
    try:
        (config,) = parse_config([EvalConfig], argv)
        from .pipeline import run_evaluation

        run_evaluation(config)
    except (ConfigError, EvaluationError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    with open(f"{config.output_dir}/summary.md", encoding="utf-8") as handle:
        print(handle.read())
    print(f"Results in {config.output_dir}/ (summary.json, summary.md, generations/, rewards/)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
