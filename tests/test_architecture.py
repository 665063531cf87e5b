"""The package's layers (docs/architecture.md): the import-linter contracts in pyproject.toml hold, and fail with the
import chain named on a deliberate violation; no module-level import cycle, lazy imports included; the package top
holds only `__init__` and thin entry modules; the old module names still import."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "trl_emo"
ENTRY_MODULES = {"sft", "dpo", "evaluate", "cli", "real_model", "grpo", "samples"}

# Strongly connected components of grimp's module graph (every import statement, inside functions too).
CYCLES = textwrap.dedent(
    """
    import json, sys
    import grimp

    graph = grimp.build_graph("trl_emo", cache_dir=None)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in sorted(graph.modules)}
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):  # Tarjan's algorithm, iteratively deep enough for this package
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    sys.setrecursionlimit(10000)
    for module in edges:
        if module not in index:
            visit(module)
    print(json.dumps({"modules": len(edges), "cycles": cycles}))
    """
)


def _env(path: Path) -> dict:
    return {**os.environ, "PYTHONPATH": str(path), "PYTHONDONTWRITEBYTECODE": "1"}


def lint(path: Path) -> subprocess.CompletedProcess:
    """`lint-imports` with this project's contracts, on the `trl_emo` package found under `path`."""
    return subprocess.run(
        [sys.executable, "-c", "from importlinter.cli import lint_imports_command; lint_imports_command()",
         "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=path, env=_env(path), capture_output=True, text=True, timeout=120,
    )


def cycles(path: Path) -> dict:
    import json

    result = subprocess.run([sys.executable, "-c", CYCLES], cwd=path, env=_env(path), capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture
def package_copy(tmp_path):
    """A copy of the package to break on purpose (the checkout stays as it is)."""
    shutil.copytree(PACKAGE, tmp_path / "trl_emo", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def append(path: Path, code: str) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        handle.write("\n\n" + textwrap.dedent(code))


def test_the_contracts_hold():
    result = lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    for contract in ("Layers:", "No import cycle", "The losses import nothing", "The code sandbox has one face"):
        assert contract in result.stdout
    assert "4 kept, 0 broken" in result.stdout


def test_no_import_cycle_between_modules_lazy_imports_included():
    found = cycles(ROOT)
    assert found["modules"] > 90
    assert found["cycles"] == []


def test_an_upward_lazy_import_breaks_the_layers_with_its_chain_named(package_copy):
    # The bottom reaching up from inside a function, the kind of import that once tied 31 files into one cycle.
    append(package_copy / "trl_emo" / "losses" / "gem.py", """
        def _config_default():
            from ..training.config import SFTConfig

            return SFTConfig
    """)
    result = lint(package_copy)
    assert result.returncode != 0
    assert "BROKEN" in result.stdout
    assert "trl_emo.losses.gem -> trl_emo.training.config" in result.stdout


def test_evaluation_and_training_must_not_know_each_other(package_copy):
    append(package_copy / "trl_emo" / "evaluation" / "metrics.py", """
        def _trainer():
            from ..training import trainer

            return trainer
    """)
    result = lint(package_copy)
    assert result.returncode != 0
    assert "trl_emo.evaluation.metrics -> trl_emo.training.trainer" in result.stdout


def test_a_cycle_inside_a_layer_is_found(package_copy):
    # `prepare` imports `schemas`; the reverse, even lazily, closes a cycle inside `data`.
    append(package_copy / "trl_emo" / "data" / "schemas.py", """
        def _prepare():
            from . import prepare

            return prepare
    """)
    found = cycles(package_copy)
    assert any({"trl_emo.data.prepare", "trl_emo.data.schemas"} <= set(c) for c in found["cycles"])
    result = lint(package_copy)
    assert result.returncode != 0 and "No import cycle" in result.stdout and "BROKEN" in result.stdout


def test_the_code_sandbox_is_one_package_with_one_face():
    """Issue 35: the sandbox and code-execution modules live in `evaluation/sandbox/`, none at `evaluation/`'s top;
    behind `__init__` every module is private (a leading underscore), which the `sandbox-private` contract guards."""
    evaluation = PACKAGE / "evaluation"
    assert not [p.name for p in evaluation.glob("*.py") if p.name.startswith(("sandbox", "code_"))]
    modules = {p.stem for p in (evaluation / "sandbox").glob("*.py")} - {"__init__"}
    assert {"_sandbox", "_bootstrap", "_code_execution", "_code_runner"} <= modules
    assert all(name.startswith("_") for name in modules), modules


def test_a_private_sandbox_module_imported_from_outside_breaks_its_contract(package_copy):
    # The code tasks reaching past the sandbox's face, lazily, into the module that holds it (the tree's own imports
    # between the private modules, `_code_execution -> _sandbox`, are allowed: they are inside the package).
    append(package_copy / "trl_emo" / "evaluation" / "tasks" / "code.py", """
        def _refusal():
            from ..sandbox._sandbox import _refusal

            return _refusal
    """)
    result = lint(package_copy)
    assert result.returncode != 0
    assert "imports its private (_) modules BROKEN" in " ".join(result.stdout.split())  # the name wraps
    assert "trl_emo.evaluation.tasks.code -> trl_emo.evaluation.sandbox._sandbox" in result.stdout


def test_the_package_top_holds_init_and_thin_entry_modules_only():
    modules = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}
    assert modules == ENTRY_MODULES
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert packages == {"commands", "core", "data", "evaluation", "losses", "models", "training"}
    for name in ENTRY_MODULES:
        tree = ast.parse((PACKAGE / f"{name}.py").read_text(encoding="utf-8"))
        body = [node for node in tree.body if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))]
        statements = sum(1 for node in body for _ in ast.walk(node) if isinstance(_, ast.stmt))
        assert statements <= 8, f"trl_emo/{name}.py is not thin ({statements} statements)"


def test_the_module_names_of_0_1_0_are_gone():
    """The aliases of the pre-layout module names (`commands/moved.py`) were removed (CHANGELOG.md, 0.2.0): an old
    name is an ordinary ImportError, and importing the package installs no import hook."""
    import importlib
    import trl_emo

    for old in ("trl_emo.config", "trl_emo.sources", "trl_emo.hub_check", "trl_emo.evaluation.sandbox_uids"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(old)
    assert not any("trl_emo" in type(finder).__module__ for finder in sys.meta_path)
    assert trl_emo.SFTConfig.__module__ == "trl_emo.training.config"
