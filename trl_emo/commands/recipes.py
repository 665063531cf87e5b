"""The recipes that ship with trl_emo: where they are, how a `--recipe` value finds one, listing and copying.

The recipes live in the repository's top-level `recipes/` folder and are installed inside the package as
`trl_emo/recipes/` (see `pyproject.toml`), so `--recipe gem_ultrafeedback` works after a plain `pip install`,
from any directory. A `--recipe` value that names an existing file is always that file: a user's own
`recipes/gem_ultrafeedback.yaml` wins over the packaged one of the same name.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

SUFFIX = ".yaml"


class RecipeNotFound(FileNotFoundError):
    """A `--recipe` value that is neither a file nor the name of a packaged recipe."""


def recipes_dir() -> Path:
    """The folder of the packaged recipes: `trl_emo/recipes/` when installed, `recipes/` in a source checkout."""
    package = Path(__file__).resolve().parent.parent  # trl_emo/ (this module is trl_emo/commands/recipes.py)
    installed = package / "recipes"
    if installed.is_dir():
        return installed
    checkout = package.parent / "recipes"
    if checkout.is_dir() and (package.parent / "pyproject.toml").is_file():
        return checkout
    raise RecipeNotFound(
        f"The packaged recipes are missing (looked in {installed} and {checkout}); reinstall trl-emo."
    )


def recipe_names() -> list[str]:
    """Names of the packaged recipes (`gem_ultrafeedback`, ..., `accelerate/zero2`), sorted."""
    root = recipes_dir()
    return sorted(p.relative_to(root).with_suffix("").as_posix() for p in root.rglob(f"*{SUFFIX}"))


def describe(path: str | os.PathLike) -> str:
    """A recipe's one-line description: the first sentence of its first comment line."""
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            text = line.strip()
            if text.startswith("#"):
                text = text.lstrip("#").strip()
                return text.split(". ", 1)[0].rstrip(".") + "." if ". " in text else text
            if text:
                break
    return ""


def packaged_recipe(name: str) -> Path | None:
    """The packaged recipe called `name` (with or without `.yaml`), or None."""
    name = name.replace("\\", "/")
    stem = name[: -len(SUFFIX)] if name.endswith(SUFFIX) else name
    if not stem or stem.startswith("/") or ".." in stem.split("/"):
        return None
    # `recipes/gem_ultrafeedback.yaml` as written in the README, run outside the repository.
    for candidate in (stem, stem[len("recipes/"):] if stem.startswith("recipes/") else None):
        if candidate:
            path = recipes_dir() / f"{candidate}{SUFFIX}"
            if path.is_file():
                return path
    return None


def resolve_recipe(value: str) -> str:
    """The file a `--recipe` value means: an existing file as given, else the packaged recipe of that name."""
    if os.path.isfile(value):
        return value
    path = packaged_recipe(value)
    if path is not None:
        return str(path)
    raise RecipeNotFound(
        f"Recipe file not found: {value}, and no packaged recipe has that name (`trl-emo recipes` lists them: "
        f"{', '.join(n for n in recipe_names() if '/' not in n)})."
    )


def copy_recipe(name: str, destination: str | os.PathLike | None = None, force: bool = False) -> Path:
    """Write the packaged recipe `name` to `destination` (a file, or a folder to put `<name>.yaml` in; default: the
    current folder) for editing. An existing file is kept unless `force`."""
    source = packaged_recipe(name)
    if source is None:
        raise RecipeNotFound(f"No packaged recipe called {name!r}; `trl-emo recipes` lists them.")
    target = Path(destination) if destination is not None else Path.cwd()
    if target.is_dir() or (destination is not None and str(destination).endswith(("/", os.sep))):
        target = target / source.name
    if target.exists() and not force:
        raise FileExistsError(f"{target} exists; pass --force to overwrite it.")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    return target
