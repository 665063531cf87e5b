"""Command-line parsing shared by `trl_emo.sft`, `trl_emo.dpo` and `trl_emo.evaluate`.

All of them are built on TRL's `TrlParser` (YAML file + CLI flags, CLI wins). This module only adds
what TrlParser lacks: `--recipe` as an alias of `--config`, and clear errors for a missing file, a
file that is not a YAML mapping, or an unknown key (with the closest valid names).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import sys
from collections.abc import Iterable, Sequence


class ConfigError(ValueError):
    """A recipe or command line that cannot be used as given."""


def _known_fields(dataclass_types: Iterable[type]) -> set[str]:
    names = set()
    for cls in dataclass_types:
        names.update(f.name for f in dataclasses.fields(cls) if f.init)
    return names


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


def parse_config(dataclass_types: Sequence[type], argv: Sequence[str] | None = None, extra_known: Iterable[str] = ()):
    """Parse `argv` into instances of `dataclass_types` with TrlParser, after checking the recipe.

    `extra_known` names YAML keys that are consumed elsewhere (TrlParser handles `env`).
    """
    from trl import TrlParser

    argv = normalize_argv(argv)
    known = _known_fields(dataclass_types) | {"env", *extra_known}
    if "--config" in argv:
        index = argv.index("--config")
        if index + 1 >= len(argv):
            raise ConfigError("--recipe/--config needs a file path.")
        path = argv[index + 1]
        config = load_yaml_mapping(path)
        unknown = [key for key in config if key not in known]
        if unknown:
            raise ConfigError(unknown_key_message(unknown, known, f"recipe {path}"))
    parser = TrlParser(list(dataclass_types))
    try:
        return parser.parse_args_and_config(args=argv)
    except ValueError as exc:
        # A dataclass rejected a value in `__post_init__` (bad loss_type, out-of-range hyper-parameter).
        raise ConfigError(str(exc)) from exc
    except SystemExit as exc:
        # argparse already printed its message (unknown flag, bad value); turn it into an error
        # the caller can catch, and keep the exit status.
        raise ConfigError(f"Invalid command line: {' '.join(argv)}") from exc


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
