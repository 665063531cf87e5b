"""The import names of modules that moved when the package was grouped by role (issue 27), kept importable.

Until 0.1 the package top held every module (`trl_emo.config`, `trl_emo.sources`, `trl_emo.run_config`...). They now
live in the subpackage of their layer (`docs/architecture.md`). A user's `import trl_emo.sources`,
`from trl_emo.run_config import end_run` or `python -m trl_emo.demo` keeps working: the finder below answers the old
name with the module that now holds it, the same module object (so a monkeypatch through either name patches both),
and a `DeprecationWarning` names the new place. `trl_emo.hub_check` and `trl_emo.cli_utils` were split; each old name
is a module that looks its attributes up in the new ones. The code sandbox's modules, once at `trl_emo.evaluation`'s
top (`trl_emo.evaluation.sandbox_uids`, `trl_emo.evaluation.code_execution`, ...), are private modules of the
subpackage `trl_emo.evaluation.sandbox` (issue 35); their old names answer the same way, and the warning names the
package to import from.

It lives in the top layer because it names modules of every layer; it imports one only when a user asks for an old
name (`importlib`, so the import contracts do not see these edges: the table below is the whole of them).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
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
    # The code sandbox, once ten modules at `evaluation/`'s top, is the subpackage `trl_emo.evaluation.sandbox`
    # (issue 35): its old module `trl_emo.evaluation.sandbox` is now that package, whose face exports the same public
    # names; the other nine answer with the private module that now holds them (every name they had still resolves).
    "trl_emo.evaluation.code_execution": "trl_emo.evaluation.sandbox._code_execution",
    "trl_emo.evaluation.code_runner": "trl_emo.evaluation.sandbox._code_runner",
    "trl_emo.evaluation.sandbox_bootstrap": "trl_emo.evaluation.sandbox._bootstrap",
    "trl_emo.evaluation.sandbox_bubblewrap": "trl_emo.evaluation.sandbox._bubblewrap",
    "trl_emo.evaluation.sandbox_errors": "trl_emo.evaluation.sandbox._errors",
    "trl_emo.evaluation.sandbox_files": "trl_emo.evaluation.sandbox._files",
    "trl_emo.evaluation.sandbox_interpreter": "trl_emo.evaluation.sandbox._interpreter",
    "trl_emo.evaluation.sandbox_processes": "trl_emo.evaluation.sandbox._processes",
    "trl_emo.evaluation.sandbox_uids": "trl_emo.evaluation.sandbox._uids",
}
# old name -> the modules its attributes now live in, searched in order
SPLIT = {
    "trl_emo.cli_utils": ("trl_emo.commands.command_line", "trl_emo.commands.parser", "trl_emo.core.errors"),
    "trl_emo.hub_check": (
        "trl_emo.core.hub", "trl_emo.core.errors", "trl_emo.models.hub_ids", "trl_emo.commands.preflight",
        "trl_emo.evaluation.pipeline",
    ),
}
_HERE = os.path.abspath(__file__)


def _warn(old: str, new: str) -> None:
    """A `DeprecationWarning` attributed to the user's import, past the import machinery's frames (so that the default
    filters, which show it for `__main__` code, see the user's line, whether the import was a statement, an
    `importlib.import_module` or an unpickling)."""
    level, frame = 1, sys._getframe(1)
    while frame is not None and (
        frame.f_code.co_filename == _HERE or "importlib" in frame.f_code.co_filename
        or frame.f_code.co_filename.startswith("<frozen")
    ):
        frame, level = frame.f_back, level + 1
    face = _public_face(new)
    where = f"{new} (private: import from {face})" if face else new
    warnings.warn(f"{old} moved to {where}; the old name will be removed in a future release.", DeprecationWarning,
                  stacklevel=level)


def _public_face(name: str) -> str | None:
    """The package a private module stands behind (`a.b._c` -> `a.b`, what users import instead); None when no part
    of `name` is private."""
    parts = name.split(".")
    private = next((i for i, part in enumerate(parts) if part.startswith("_") and not part.startswith("__")), None)
    return None if private is None else ".".join(parts[:private])


class _SplitModule(types.ModuleType):
    """An old module whose attributes now live in several modules."""

    def __init__(self, name: str, targets: tuple[str, ...]):
        super().__init__(name, f"Moved: see {', '.join(targets)}.")
        self._targets = targets

    def __getattr__(self, attr: str):
        if attr == "__all__":  # `from trl_emo.hub_check import *`
            return [name for name in self.__dir__() if not name.startswith("_")]
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
    """Executes an old name by putting the module that now holds it in `sys.modules` under that name (the import
    system then returns that entry): the moved module itself is never touched. `get_code` serves `python -m <old>`."""

    def __init__(self, old: str):
        self.old = old

    def create_module(self, spec):
        return None  # a blank module, replaced in `exec_module`

    def exec_module(self, module):
        if self.old in MOVED:
            _warn(self.old, MOVED[self.old])
            sys.modules[self.old] = importlib.import_module(MOVED[self.old])
        else:
            _warn(self.old, " and ".join(SPLIT[self.old]))
            sys.modules[self.old] = _SplitModule(self.old, SPLIT[self.old])

    def _new_name(self) -> str:
        if self.old not in MOVED:
            raise ImportError(f"{self.old} was split into {', '.join(SPLIT[self.old])} and cannot be run")
        return MOVED[self.old]

    def get_code(self, fullname):
        """`python -m <old>`: run the new module as `__main__` (its relative imports need its own package)."""
        new = self._new_name()
        _warn(self.old, new)
        return compile(f"import runpy\nrunpy.run_module({new!r}, run_name='__main__', alter_sys=True)\n",
                       f"<{self.old}: moved to {new}>", "exec")

    def get_source(self, fullname):
        return importlib.util.find_spec(self._new_name()).loader.get_source(self._new_name())

    def is_package(self, fullname):
        return False


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
