"""What the commands (`trl_emo.sft`, `trl_emo.dpo`, `trl_emo.evaluate`, `trl-emo demo`) share for their command line.

The recipe-driven commands parse with `trl_emo.commands.parser.CommandParser`, TRL's `TrlParser` (YAML file + CLI
flags, CLI wins) plus what it lacks: `--recipe` as an alias of `--config` that also takes the name of a packaged
recipe, clear errors for a missing file, a file that is not a YAML mapping, or an unknown key (with the closest valid
names), the record of which fields the user set explicitly (`CommandLine`), deprecated field names translated (so a
flag under either name wins), and dry runs that do not need a GPU. This module holds the light pieces (no TRL
import): the recipe-reading helpers, `CommandLine`, `run_command` (parse, then the command's `main`, with exit
statuses) and the helpers that print configurations; `ConfigError` is `trl_emo.core.errors`' (re-exported), and
parsing itself (`parse_command_line`, `parse_config`) is `trl_emo.commands.parser`'s.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import sys
from collections.abc import Iterable, Sequence

from ..core.errors import ConfigError, HubAccessError


def _known_fields(dataclass_types: Iterable[type]) -> set[str]:
    names = set()
    for cls in dataclass_types:
        names.update(f.name for f in dataclasses.fields(cls) if f.init)
    return names


def _field_default(dataclass_types: Iterable[type], name: str):
    for cls in dataclass_types:
        for f in dataclasses.fields(cls):
            if f.name == name and f.init:
                if f.default is not dataclasses.MISSING:
                    return f.default
                if f.default_factory is not dataclasses.MISSING:
                    return f.default_factory()
    return None


def unknown_key_message(keys: Sequence[str], known: Iterable[str], where: str) -> str:
    known = sorted(known)
    lines = [f"Unknown key(s) in {where}:"]
    for key in keys:
        close = difflib.get_close_matches(key, known, n=3, cutoff=0.6)
        hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
        lines.append(f"  - {key!r}{hint}")
    return "\n".join(lines)


def load_yaml_mapping(path: str | os.PathLike) -> dict:
    import yaml

    if not os.path.isfile(path):
        raise ConfigError(f"Recipe file not found: {path}")
    with open(path, encoding="utf-8") as handle:
        try:
            config = yaml.safe_load(handle)
        except yaml.YAMLError as exc:
            raise ConfigError(f"Recipe file {path} is not valid YAML: {exc}") from exc
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise ConfigError(f"Recipe file {path} must contain a YAML mapping of field: value, got {type(config).__name__}.")
    return config


# Deprecated names that TRL's configs still fill in by default (`gradient_checkpointing=True` in TRL's base config),
# mapped to the names that replace them. A flag given under either name must win over the recipe, and no run should
# print a deprecation warning for a value the user never wrote, so both spellings are translated to the one the
# installed transformers reads without warning (the old one where the new one does not exist yet).
RENAMED_FIELDS = {
    "gradient_checkpointing": "activation_checkpointing",
    "gradient_checkpointing_kwargs": "activation_checkpointing_kwargs",
}
BF16_WITHOUT_GPU = "support bf16/gpu"  # transformers' check in `TrainingArguments.__post_init__`


def _flag_name(arg: str) -> str | None:
    if not arg.startswith("--") or len(arg) == 2:
        return None
    return arg[2:].split("=", 1)[0].replace("-", "_")


def normalize_argv(argv: Sequence[str] | None) -> list[str]:
    """Map `--recipe FILE` / `--recipe=FILE` to TrlParser's `--config FILE`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    out = []
    for arg in argv:
        if arg == "--recipe":
            out.append("--config")
        elif arg.startswith("--recipe=") or arg.startswith("--config="):
            out.extend(["--config", arg.split("=", 1)[1]])
        else:
            out.append(arg)
    if out.count("--config") > 1:
        raise ConfigError("Give one recipe: --recipe (or --config) was passed more than once.")
    return out


def _renames(known: set[str]) -> dict[str, str]:
    """old -> new where the installed classes have both names; new -> old where they only have the old one."""
    renames = {}
    for old, new in RENAMED_FIELDS.items():
        if old in known and new in known:
            renames[old] = new
        elif old in known:
            renames[new] = old
    return renames


def _rename_flags(argv: list[str], renames: dict[str, str], known: set[str]) -> list[str]:
    out = []
    for arg in argv:
        name = _flag_name(arg)
        if name is not None and name.startswith("no_") and name[3:] in renames and name not in known:
            # `--no_gradient_checkpointing` (argparse's negation of a True default) under the new name.
            out.extend([f"--{renames[name[3:]]}", "false"])
        elif name in renames:
            out.append(f"--{renames[name]}" + (arg[arg.index("="):] if "=" in arg else ""))
        else:
            out.append(arg)
    return out


def _given_flags(argv: Sequence[str], known: set[str]) -> set[str]:
    names = set()
    for arg in argv:
        name = _flag_name(arg)
        if name is None:
            continue
        if name.startswith("no_") and name not in known and name[3:] in known:
            name = name[3:]
        names.add(name)
    return names


@dataclasses.dataclass
class CommandLine:
    """What `parse_command_line` read.

    Attributes:
        values: one instance per dataclass type, in order.
        explicit: the field names the user set (in the recipe or as a flag); the rest are defaults.
        recipe: the recipe file used (a packaged recipe resolved from its name), or None.
        notes: lines worth telling the user (e.g. how a dry run got past a check that only training needs).
    """

    values: tuple
    explicit: frozenset
    recipe: str | None = None
    notes: list = dataclasses.field(default_factory=list)


RECIPE_HELP = (
    "--recipe NAME|FILE.yaml (or --config): a packaged recipe (`trl-emo recipes` lists them, e.g.\n"
    "gem_ultrafeedback) or a YAML file of the fields below; flags given here override it."
)


def check_parsed(args, command: str) -> None:
    """A command's `main` takes the parsed command line; a list of strings there is a caller's mistake worth naming."""
    if not isinstance(args, CommandLine):
        raise TypeError(
            f"{command}.main() takes the parsed command line (`make_parser().parse_command_line(argv)`), got "
            f"{type(args).__name__}; `{command}.run(argv)` parses and runs."
        )


def one_line(exc: BaseException) -> str:
    """An error's message on one line (an unknown recipe key's or a missing dataset column's message spans several)."""
    return " ".join(line.strip() for line in str(exc).splitlines() if line.strip())


def run_command(make_parser, main, argv: Sequence[str] | None = None, error_prefix: str = "trl-emo",
                short_help=None) -> int:
    """Parse `argv` (default `sys.argv[1:]`) with `make_parser()` and run `main` on the result; the exit status.

    The notices of unused optional packages are held back before anything is imported (`trl_emo.core.noise`). An unusable
    command line, or a Hub id the command cannot load (`trl_emo.core.errors.HubAccessError`, raised by `main`), is a
    one-line error on stderr naming the command (`error_prefix: error: ...`, status 2); `--help` prints the help (status 0): `short_help()`'s text when given, before
    the parser is built (which imports TRL), and the parser's full help for `--help-all`.
    """
    from ..core.noise import quiet_optional_packages

    argv = list(sys.argv[1:] if argv is None else argv)
    if short_help is not None:
        if any(arg in ("-h", "--help") for arg in argv):
            print(short_help())
            return 0
        argv = ["--help" if arg == "--help-all" else arg for arg in argv]
    quiet_optional_packages()
    parser = make_parser()
    try:
        if hasattr(parser, "parse_command_line"):
            args = parser.parse_command_line(argv)
        else:
            args = parser.parse_args(argv)
    except ConfigError as exc:
        print(f"{error_prefix}: error: {one_line(exc)}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help (0), or an error argparse already printed (2)
        return 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 2
    try:
        return main(args)
    except HubAccessError as exc:  # for every command, `trl-emo demo --model` included
        print(f"{error_prefix}: error: {one_line(exc)}", file=sys.stderr)
        return 2


def plain(value):
    """`value` as YAML-safe builtins (enums by value, unknown objects as text), for printing configurations."""
    import enum

    if isinstance(value, enum.Enum):
        return plain(value.value)
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def non_default_fields(obj) -> dict:
    """The init fields of dataclass `obj` whose value differs from the field's default."""
    values = {}
    for f in dataclasses.fields(obj):
        if not f.init:
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = dataclasses.MISSING
        value = getattr(obj, f.name)
        if default is dataclasses.MISSING or value != default:
            values[f.name] = value
    return values


def dump_sections(sections: dict) -> str:
    import yaml

    return yaml.safe_dump(plain(sections), sort_keys=False, default_flow_style=False, allow_unicode=True)
