"""The `trl-emo` console script: `trl-emo {sft,dpo,grpo,eval,demo,losses,recipes} [options]`.

Dispatched through argparse subparsers the way TRL's own `trl` command registers its scripts
(`trl/cli/commands/training.py`): each command is a subparser here, and the command's module, with its own
`make_parser()` and `main(args)`, is imported only when that command runs (TRL takes seconds to import, which
`trl-emo recipes` and `trl-emo --help` need not pay). `losses` and `recipes` are small enough to live here, in the
same shape.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# command -> (module, one-line help, prefix of its error messages)
COMMANDS = {
    "sft": ("trl_emo.commands.sft", "supervised fine-tuning with any loss (same as: python -m trl_emo.sft)",
            "trl_emo.sft"),
    "dpo": ("trl_emo.commands.dpo", "DPO on top of an SFT model or adapter (same as: python -m trl_emo.dpo)",
            "trl_emo.dpo"),
    "grpo": ("trl_emo.commands.grpo", "GRPO with verifiable rewards on top of an SFT model or adapter (same as: python "
             "-m trl_emo.grpo)", "trl_emo.grpo"),
    "eval": ("trl_emo.commands.evaluate", "evaluate models side by side, best-of-n by default (same as: python -m "
             "trl_emo.evaluate)", "trl_emo.evaluate"),
    "demo": ("trl_emo.commands.demo", "GEM vs cross-entropy on a tiny model, offline, a few minutes on CPU (--quick: a "
             "smoke test)", "trl-emo demo"),
    "losses": ("trl_emo.commands.main", "list the registered loss types", "trl-emo losses"),
    "recipes": ("trl_emo.commands.main", "list the packaged recipes; `trl-emo recipes copy NAME [DEST] [--force]` "
                "writes one out to edit", "trl-emo recipes"),
}
ALIASES = {"evaluate": "eval"}
EPILOG = """sft, dpo, grpo and eval take --recipe NAME (a packaged recipe, e.g. gem_ultrafeedback) or --recipe
FILE.yaml, flags override the recipe, and --dry_run (sft, dpo, grpo) prints the resolved configuration and examples.
Every command takes --help (sft, dpo and grpo: the options changed most; --help-all: every option)."""


def make_parser() -> argparse.ArgumentParser:
    """The top-level parser: one subparser per command, which only names it (its module parses its arguments)."""
    parser = argparse.ArgumentParser(
        prog="trl-emo", description="EMO, GEM and friends as TRL losses: train, evaluate, try.", epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from .. import __version__

    parser.add_argument("--version", action="version", version=f"trl-emo {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="<command>", title="commands")
    for name, (_, help_text, _) in COMMANDS.items():
        aliases = [alias for alias, target in ALIASES.items() if target == name]
        subparsers.add_parser(name, help=help_text, add_help=False, aliases=aliases)
    return parser


# -- trl-emo losses ----------------------------------------------------------------------------------------------------


def make_losses_parser(subparsers=None, prog: str | None = None):
    kwargs = dict(description="List the registered loss types (SFTConfig.loss_type) and their fields.")
    if subparsers is not None:
        return subparsers.add_parser("losses", help=COMMANDS["losses"][1], **kwargs)
    return argparse.ArgumentParser(prog=prog or "trl-emo losses", **kwargs)


def losses_main(args) -> int:
    from ..losses import get_loss, list_losses
    from ..losses.registry import TRL_LOSS_TYPES

    for name in list_losses():
        if name in TRL_LOSS_TYPES and name != "nll":
            print(f"{name:<12} (TRL's own)")
            continue
        spec = get_loss(name)
        fields = ", ".join(spec.config_fields.values())
        note = "(computed by TRL in training) " if name in TRL_LOSS_TYPES else ""
        print(f"{name:<12} {note}{spec.description}" + (f"  [{fields}]" if fields else ""))
    return 0


# -- trl-emo recipes ---------------------------------------------------------------------------------------------------


def make_recipes_parser(subparsers=None, prog: str | None = None):
    kwargs = dict(
        description="List the recipes shipped with trl_emo (use one with --recipe NAME), or copy one out to edit it."
    )
    if subparsers is not None:
        parser = subparsers.add_parser("recipes", help=COMMANDS["recipes"][1], **kwargs)
    else:
        parser = argparse.ArgumentParser(prog=prog or "trl-emo recipes", **kwargs)
    actions = parser.add_subparsers(dest="action")
    copy = actions.add_parser("copy", help="write a packaged recipe to a file (default: ./NAME.yaml) for editing")
    copy.add_argument("name", help="recipe name, e.g. gem_ultrafeedback or accelerate/zero2")
    copy.add_argument("dest", nargs="?", default=None, help="file or existing folder to write to (default: .)")
    copy.add_argument("--force", action="store_true", help="overwrite an existing file")
    return parser


def recipes_main(args) -> int:
    from .recipes import RecipeNotFound, copy_recipe, describe, packaged_recipe, recipe_names

    if args.action == "copy":
        try:
            target = copy_recipe(args.name, args.dest, force=args.force)
        except (RecipeNotFound, FileExistsError) as exc:
            print(f"trl-emo recipes: error: {exc}", file=sys.stderr)
            return 2
        print(f"wrote {target}; use it with --recipe {target}")
        return 0
    names = recipe_names()
    width = max(len(name) for name in names) + 2
    for name in names:
        print(f"{name:<{width}}{describe(packaged_recipe(name))}")
    return 0


def _command(name: str):
    """(make_parser, main, short_help or None) of a command."""
    if name == "losses":
        return make_losses_parser, losses_main, None
    if name == "recipes":
        return make_recipes_parser, recipes_main, None
    module = importlib.import_module(COMMANDS[name][0])
    return module.make_parser, module.main, getattr(module, "short_help", None)


def main(argv=None) -> int:
    from .command_line import run_command
    from ..core.noise import quiet_optional_packages

    quiet_optional_packages()
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = make_parser()
    if not argv:
        parser.print_help()
        return 2
    try:
        # argparse picks the command (or prints the help, or an "invalid choice" error); the command parses the rest.
        namespace, _ = parser.parse_known_args(argv[:1])
    except SystemExit as exc:
        return 0 if exc.code is None else exc.code
    if namespace.command is None:
        parser.print_usage(sys.stderr)
        print(f"trl-emo: error: the first argument must be a command, got {argv[0]!r}", file=sys.stderr)
        return 2
    name = ALIASES.get(namespace.command, namespace.command)
    make_command_parser, command_main, short_help = _command(name)
    prog = f"trl-emo {name}"
    return run_command(lambda: make_command_parser(prog=prog), command_main, argv[1:], COMMANDS[name][2],
                       short_help=short_help and (lambda: short_help(prog)))


if __name__ == "__main__":
    raise SystemExit(main())
