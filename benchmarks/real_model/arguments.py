"""The command line the real-model studies share (`benchmarks/real_model_study.py`, `benchmarks/sft_then_rl_study.py`).

Each study takes `--model`, `--output_dir` and `--quick` first, then its own options, then `--from_results`,
`--threads` and one option per size of its `DEFAULTS`; a size left unset takes the `--quick` value with `--quick`,
the default study's otherwise. Before any work, `prepare_process` applies what every study does first: no Hub unless
the model is a Hub id, the torch thread count, quiet optional packages.
"""

from __future__ import annotations

import argparse


def study_parser(doc: str, output_dir: str, model_help: str, quick_help: str) -> argparse.ArgumentParser:
    """The parser, described by the first paragraph of the study's `doc`, with `--model`, `--output_dir` and
    `--quick`; the study adds its own options, then calls `parse_study_args`."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model", default=None, help=model_help)
    parser.add_argument("--output_dir", default=output_dir)
    parser.add_argument("--quick", action="store_true", help=quick_help)
    return parser


def parse_study_args(parser: argparse.ArgumentParser, argv, defaults: dict, quick: dict,
                     from_results_help: str) -> argparse.Namespace:
    """Add `--from_results`, `--threads` and one option per size (`defaults`: name -> the default study's value, whose
    type the option takes), parse `argv` and fill every size left unset from `quick` (with `--quick`) or
    `defaults`."""
    parser.add_argument("--from_results", default=None, metavar="RESULTS_JSON", help=from_results_help)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice).")
    sizes = parser.add_argument_group("sizes (defaults: the default study; --quick replaces unset ones)")
    for name, value in defaults.items():
        sizes.add_argument(f"--{name}", type=type(value), default=None, help=f"Default {value}.")
    args = parser.parse_args(argv)
    for name, value in (quick if args.quick else defaults).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def prepare_process(args: argparse.Namespace) -> None:
    """What a study does before loading anything: stay offline unless `--model` is a Hub id (the packaged GGUF and a
    local folder need no Hub), set torch's thread count (`--threads`), silence the optional packages' noise."""
    from trl_emo.core.hub import offline_unless_hub

    offline_unless_hub(args.model)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    from trl_emo.core.noise import quiet_optional_packages

    quiet_optional_packages()
