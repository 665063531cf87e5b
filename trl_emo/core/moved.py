"""The import names of modules that moved when the package was grouped by role (issue 27), kept importable.

Until 0.1 the package top held every module (`trl_emo.config`, `trl_emo.sources`, `trl_emo.run_config`...). They now
live in the subpackage of their layer (`docs/architecture.md`). A user's `import trl_emo.sources` or
`from trl_emo.run_config import end_run` keeps working: the finder below answers the old name with the module that now
holds it, the same module object (so a monkeypatch through either name patches both), and a `DeprecationWarning` names
the new place. `trl_emo.hub_check` and `trl_emo.cli_utils` were split; each old name is a module that looks its attributes up in\nthe new ones.

The table names modules of higher layers as strings only: nothing here imports them until a user asks for an old name.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings

# old name -> new module
MOVED = {
    "trl_emo._trl_compat": "trl_emo.training.trl_compat",
    "trl_emo.cli_parser": "trl_emo.commands.parser",
    "trl_emo.config": "trl_emo.training.config",
    "trl_emo.demo": "trl_emo.commands.demo",
    "trl_emo.dry_run": "trl_emo.commands.dry_run",
    "trl_emo.evaluation.cli": "trl_emo.commands.evaluate",
    "trl_emo.gem_schedule": "trl_emo.training.gem_schedule",
    "trl_emo.generation_eos": "trl_emo.models.generation_eos",
    "trl_emo.heldout": "trl_emo.training.heldout",
    "trl_emo.noise": "trl_emo.core.noise",
    "trl_emo.objective": "trl_emo.training.objective",
    "trl_emo.plugins": "trl_emo.core.plugins",
    "trl_emo.recipe_catalog": "trl_emo.commands.recipes",
    "trl_emo.reference": "trl_emo.training.reference",
    "trl_emo.run_config": "trl_emo.commands.run_config",
    "trl_emo.sources": "trl_emo.models.sources",
    "trl_emo.tiny": "trl_emo.models.tiny",
    "trl_emo.trainer": "trl_emo.training.trainer",
}
# old name -> the modules its attributes now live in, searched in order
SPLIT = {
    "trl_emo.cli_utils": ("trl_emo.commands.command_line", "trl_emo.commands.parser", "trl_emo.core.errors"),
    "trl_emo.hub_check": (
        "trl_emo.core.hub", "trl_emo.core.errors", "trl_emo.models.hub_ids", "trl_emo.commands.preflight",
        "trl_emo.evaluation.pipeline",
    ),
}


def _warn(old: str, new: str) -> None:
    warnings.warn(f"{old} moved to {new}; the old name will be removed in a future release.", DeprecationWarning,
                  stacklevel=3)


class _SplitModule(types.ModuleType):
    """An old module whose attributes now live in several modules."""

    def __init__(self, name: str, targets: tuple[str, ...]):
        super().__init__(name, f"Moved: see {', '.join(targets)}.")
        self._targets = targets

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        for target in self._targets:
            module = importlib.import_module(target)
            if hasattr(module, attr):
                return getattr(module, attr)
        raise AttributeError(f"module {self.__name__!r} has no attribute {attr!r} (it moved to one of "
                             f"{', '.join(self._targets)})")

    def __dir__(self):
        names = set()
        for target in self._targets:
            names.update(n for n in dir(importlib.import_module(target)) if not n.startswith("_"))
        return sorted(names)


class _Loader(importlib.abc.Loader):
    def __init__(self, old: str):
        self.old = old

    def create_module(self, spec):
        if self.old in MOVED:
            _warn(self.old, MOVED[self.old])
            module = importlib.import_module(MOVED[self.old])
            self.spec = module.__spec__
            return module
        _warn(self.old, " and ".join(SPLIT[self.old]))
        return _SplitModule(self.old, SPLIT[self.old])

    def exec_module(self, module):
        # The module is the new one, already executed; the import system registers it under the old name too, and
        # has set its `__spec__` to the alias's: the real one is put back (pickling and `reload` read it).
        if self.old in MOVED:
            module.__spec__ = self.spec


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Answers an old module name with the module that now holds it."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED and fullname not in SPLIT:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Loader(fullname))


def install() -> None:
    """Put the finder on `sys.meta_path` once (after the standard finders: a real module of the name wins)."""
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())
