"""`CommandParser`: the parser of the recipe-driven commands (`trl_emo.sft`, `trl_emo.dpo`, `trl_emo.evaluate`).

A subclass of TRL's `TrlParser`, so a command's `make_parser(subparsers=None)` looks like TRL's scripts'; kept apart
from `command_line` because importing TRL is slow and the light helpers there are imported everywhere.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import os
import re
from collections.abc import Iterable, Sequence

from trl import TrlParser

from .command_line import (
    BF16_WITHOUT_GPU,
    RECIPE_HELP,
    RENAMED_FIELDS,
    CommandLine,
    _field_default,
    _given_flags,
    _known_fields,
    _rename_flags,
    _renames,
    load_yaml_mapping,
    normalize_argv,
    unknown_key_message,
)
from ..core.errors import ConfigError


class CommandParser(TrlParser):
    """TRL's `TrlParser` (a YAML recipe and flags, flags win) with what it lacks: `--recipe` as an alias of
    `--config` that also takes the name of a packaged recipe; clear errors for a missing file, a file that is not a
    YAML mapping, an unknown key (with the closest valid names) or a bad value; the record of which fields the
    user set; deprecated field names translated (a flag under either name wins); dry runs without a GPU.

    `parse_command_line(argv)` returns a `CommandLine`; `parse_args_and_config(argv)` returns the dataclass
    instances, as TRL's does. Parsing leaves the parser as it was, so one parser serves several command lines.
    """

    def __init__(self, dataclass_types=None, extra_known: Iterable[str] = (), **kwargs):
        if dataclass_types:
            kwargs["description"] = "\n\n".join(filter(None, (kwargs.get("description"), RECIPE_HELP)))
            kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(dataclass_types, **kwargs)
        self.extra_known = tuple(extra_known)
        known = _known_fields(self.dataclass_types)
        self._renames = _renames(known)
        # TRL's configs default the deprecated name (`gradient_checkpointing=True`), which makes transformers warn
        # about a value nobody wrote: the same default goes under the new name.
        defaults = {
            new: _field_default(self.dataclass_types, old)
            for old, new in self._renames.items()
            if old in RENAMED_FIELDS
        }
        self.set_defaults_with_config(**{key: value for key, value in defaults.items() if value is not None})

    def error(self, message: str):
        # argparse prints the whole usage before its message (235 lines for GRPO's options): one line instead, the
        # command's own prefix and exit status 2 added by `run_command`.
        raise ConfigError(f"{message} (--help-all lists the options)")

    def parse_args_and_config(self, args=None, return_remaining_strings=False, **kwargs):
        if return_remaining_strings:  # TRL's own command-line launcher asks for this
            return super().parse_args_and_config(args, return_remaining_strings=True, **kwargs)
        return self.parse_command_line(args).values

    def parse_command_line(self, argv: Sequence[str] | None = None) -> CommandLine:
        """Parse `argv` (default `sys.argv[1:]`; a recipe plus flags, flags win) into a `CommandLine`.

        The recipe is read once. A `--dry_run` on a machine without a GPU gets past transformers' bf16 check (it
        loads no model); training with `bf16: true` there is a one-line error.
        """
        known = _known_fields(self.dataclass_types)
        argv = _rename_flags(normalize_argv(argv), self._renames, known)
        argv, config, recipe = self._read_recipe(argv, known)
        try:
            return _dtype_follows_bf16(self._parse_once(argv, config, recipe, known), _given_flags(argv, known))
        except ConfigError as exc:
            if BF16_WITHOUT_GPU not in str(exc):
                raise
            error = exc
        # Only `use_cpu` lets transformers accept bf16 without a GPU; parse again with it to see if this is a
        # dry run.
        parsed = self._parse_once([*argv, "--use_cpu", "true"], config, recipe, known)
        if not any(getattr(values, "dry_run", False) is True for values in parsed.values):
            raise ConfigError(
                "bf16 is on but this machine has no GPU that supports it: train on a GPU, "
                "or pass --bf16 false to train in float32 on the CPU (a --dry_run works here as it is)."
            ) from error
        parsed.notes.append(
            "no GPU here: bf16 was checked as if --use_cpu true (a dry run loads no model); training with this "
            "configuration needs a GPU, or --bf16 false"
        )
        return parsed

    def _read_recipe(self, argv: list[str], known: set[str]) -> tuple[list[str], dict, str | None]:
        """(argv without `--config FILE`, the recipe's values under the installed names, the recipe file); the
        recipe's `env` mapping goes to the environment, as TrlParser does."""
        from .recipes import RecipeNotFound, resolve_recipe

        if "--config" not in argv:
            return argv, {}, None
        renames = self._renames
        index = argv.index("--config")
        if index + 1 >= len(argv):
            raise ConfigError("--recipe/--config needs a file path or the name of a packaged recipe.")
        try:
            recipe = resolve_recipe(argv[index + 1])
        except RecipeNotFound as exc:
            raise ConfigError(str(exc)) from None
        argv = argv[:index] + argv[index + 2 :]
        config = load_yaml_mapping(recipe)
        accepted = known | set(renames) | {"env", *self.extra_known}
        unknown = [key for key in config if key not in accepted]
        if unknown:
            raise ConfigError(unknown_key_message(unknown, known, f"recipe {recipe}"))
        clashes = [f"{old!r} and {new!r}" for old, new in renames.items() if old in config and new in config]
        if clashes:
            raise ConfigError(f"Recipe {recipe} sets both {', '.join(clashes)} (the same setting); keep one.")
        config = {renames.get(key, key): value for key, value in config.items()}
        env = config.pop("env", None) or {}
        if not isinstance(env, dict):
            raise ConfigError(f"`env` in recipe {recipe} must be a mapping of variable: value.")
        for key, value in env.items():
            os.environ[str(key)] = str(value)
        for key in self.extra_known:
            config.pop(key, None)
        return argv, config, recipe

    def _parse_once(self, argv: list[str], config: dict, recipe: str | None, known: set[str]) -> CommandLine:
        """The flags over the recipe's values; the recipe is the parser's defaults for this parse only."""
        saved = [(action, action.default, action.required) for action in self._actions]
        try:
            self.set_defaults_with_config(**config)
            values = self.parse_args_into_dataclasses(args=argv)
        except ValueError as exc:
            unused = _UNUSED.match(str(exc))
            if unused:  # HfArgumentParser's words for flags no field takes
                raise ConfigError(unknown_flags_message(ast.literal_eval(unused.group(1)), known)) from None
            # A dataclass rejected a value in `__post_init__` (bad loss_type, out-of-range hyper-parameter).
            raise ConfigError(str(exc)) from exc
        except SystemExit as exc:
            if exc.code in (0, None):
                raise  # --help: argparse printed it; exit 0 as every command-line tool does
            # Another exit argparse took after printing its message: an error the caller can catch.
            raise ConfigError(f"Invalid command line: {' '.join(argv)}") from exc
        finally:
            for action, default, required in saved:
                action.default, action.required = default, required
        return CommandLine(tuple(values), frozenset(set(config) | _given_flags(argv, known)), recipe)

def _dtype_follows_bf16(parsed: CommandLine, flags: set[str]) -> CommandLine:
    """`--bf16 false` on the command line means float32 training: a recipe's `dtype: bfloat16` would otherwise load
    the weights in bf16 and train them in pure bf16 (no mixed precision, a worse loss), the opposite of what the flag
    asks. So the model's dtype becomes float32, with a note, unless `--dtype` is given on the command line too."""
    if "bf16" not in flags or "dtype" in flags:
        return parsed
    training = next((v for v in parsed.values if hasattr(v, "bf16")), None)
    model = next((v for v in parsed.values if hasattr(v, "dtype") and not hasattr(v, "bf16")), None)
    if training is None or model is None or training.bf16 or str(model.dtype) != "bfloat16":
        return parsed
    model.dtype = "float32"
    parsed.notes.append("--bf16 false: the model loads and trains in float32 (the recipe's dtype: bfloat16 would train "
                        "it in pure bf16); pass --dtype bfloat16 to keep bf16 weights")
    return parsed


_UNUSED = re.compile(r"Some specified arguments are not used by the HfArgumentParser: (\[.*\])", re.DOTALL)


def unknown_flags_message(remaining: Sequence[str], known: Iterable[str]) -> str:
    """One line for flags no field takes, each with the closest field names."""
    known = sorted(known)
    parts = []
    for arg in remaining:
        if not str(arg).startswith("--"):
            continue
        name = str(arg)[2:].split("=", 1)[0].replace("-", "_")
        close = difflib.get_close_matches(name, known, n=2, cutoff=0.6)
        parts.append(f"--{name}" + (f" (did you mean {', '.join('--' + c for c in close)}?)" if close else ""))
    listed = "; ".join(parts) or " ".join(map(str, remaining))
    return f"unknown option(s): {listed}; --help-all lists the options"


def command_parser(dataclass_types, subparsers=None, name: str | None = None, help: str | None = None, **kwargs):  # noqa: A002
    """A `CommandParser` for `dataclass_types`; with `subparsers`, registered there as the command `name` (the
    subparsers must come from `add_subparsers(parser_class=CommandParser)`, as TRL's scripts expect a `TrlParser`)."""
    if subparsers is not None:
        return subparsers.add_parser(name, help=help, dataclass_types=dataclass_types, **kwargs)
    return CommandParser(dataclass_types, **kwargs)


def parse_command_line(
    dataclass_types: Sequence[type],
    argv: Sequence[str] | None = None,
    extra_known: Iterable[str] = (),
    prog: str | None = None,
    description: str | None = None,
) -> CommandLine:
    """`CommandParser(dataclass_types, ...).parse_command_line(argv)` : a recipe plus flags
    (flags win) parsed into instances of `dataclass_types`. `extra_known` names recipe keys consumed elsewhere; `prog`
    and `description` head the `--help` text."""
    parser = CommandParser(dataclass_types, extra_known=extra_known, prog=prog, description=description)
    return parser.parse_command_line(argv)


def parse_config(dataclass_types: Sequence[type], argv: Sequence[str] | None = None, extra_known: Iterable[str] = ()):
    """`parse_command_line(...).values`: the parsed dataclass instances."""
    return parse_command_line(dataclass_types, argv, extra_known).values
