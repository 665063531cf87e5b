"""The `trl-emo` console script: `trl-emo {sft,dpo,eval,demo,losses,recipes} [options]`."""

from __future__ import annotations

import sys

USAGE = """usage: trl-emo <command> [options]

commands:
  sft      supervised fine-tuning with any loss   (same as: python -m trl_emo.sft)
  dpo      DPO on top of an SFT model or adapter  (same as: python -m trl_emo.dpo)
  eval     best-of-n evaluation with a reward model (same as: python -m trl_emo.evaluate)
  demo     GEM vs cross-entropy on a tiny model, offline, a few minutes on CPU (--quick: a smoke test)
  losses   list the registered loss types
  recipes  list the packaged recipes; `trl-emo recipes copy NAME [DEST] [--force]` writes one out to edit

sft, dpo and eval take --recipe NAME (a packaged recipe, e.g. gem_ultrafeedback) or --recipe FILE.yaml,
flags override the recipe, and --dry_run (sft, dpo) prints the resolved configuration and examples.
Every command takes --help."""


def _losses(argv) -> int:
    import argparse

    from .losses import get_loss, list_losses
    from .losses.registry import TRL_LOSS_TYPES

    argparse.ArgumentParser(
        prog="trl-emo losses", description="List the registered loss types (SFTConfig.loss_type) and their fields."
    ).parse_args(argv)

    for name in list_losses():
        if name in TRL_LOSS_TYPES and name != "nll":
            print(f"{name:<12} (TRL's own)")
            continue
        spec = get_loss(name)
        fields = ", ".join(spec.config_fields.values())
        note = "(computed by TRL in training) " if name in TRL_LOSS_TYPES else ""
        print(f"{name:<12} {note}{spec.description}" + (f"  [{fields}]" if fields else ""))
    return 0


def _recipes(argv) -> int:
    import argparse

    from .recipe_catalog import RecipeNotFound, copy_recipe, describe, packaged_recipe, recipe_names

    parser = argparse.ArgumentParser(
        prog="trl-emo recipes",
        description="List the recipes shipped with trl_emo (use one with --recipe NAME), or copy one out to edit it.",
    )
    sub = parser.add_subparsers(dest="action")
    copy = sub.add_parser("copy", help="write a packaged recipe to a file (default: ./NAME.yaml) for editing")
    copy.add_argument("name", help="recipe name, e.g. gem_ultrafeedback or accelerate/zero2")
    copy.add_argument("dest", nargs="?", default=None, help="file or existing folder to write to (default: .)")
    copy.add_argument("--force", action="store_true", help="overwrite an existing file")
    args = parser.parse_args(argv)
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


def main(argv=None) -> int:
    from .noise import quiet_optional_packages

    quiet_optional_packages()
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "sft":
        from .sft import main as run
    elif command == "dpo":
        from .dpo import main as run
    elif command in ("eval", "evaluate"):
        from .evaluation.cli import main as run
    elif command == "demo":
        from .demo import main as run
    elif command == "losses":
        run = _losses
    elif command == "recipes":
        run = _recipes
    else:
        print(f"trl-emo: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    return run(rest)


if __name__ == "__main__":
    raise SystemExit(main())
