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
ENTRY_MODULES = {"sft", "dpo", "evaluate", "cli", "real_model", "grpo"}

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


OLD_NAMES = textwrap.dedent(
    """
    import warnings
    warnings.simplefilter("error", DeprecationWarning)
    import trl_emo
    import trl_emo.core.hub as core_hub
    import trl_emo.training.config as new
    try:
        import trl_emo.config
    except DeprecationWarning as exc:
        print("warned:", exc)
    try:
        import trl_emo.evaluation.sandbox_uids
    except DeprecationWarning as exc:
        print("warned:", exc)
    warnings.simplefilter("ignore", DeprecationWarning)
    import trl_emo.config as old
    assert old is new and old.__spec__.name == "trl_emo.training.config", old.__spec__
    from trl_emo.run_config import end_run
    from trl_emo.training.finish import end_run as end_run_new
    assert end_run is end_run_new
    from trl_emo.sources import locate, load_causal_lm
    from trl_emo.tiny import build_tiny_model
    from trl_emo.trainer import SFTTrainer
    assert SFTTrainer is trl_emo.SFTTrainer
    import trl_emo.hub_check as hub_check
    from trl_emo.evaluation.pipeline import eval_sources
    assert hub_check.eval_sources is eval_sources and hub_check.HubAccessError is not None
    assert hub_check.check_sources is core_hub.check_sources
    from trl_emo.cli_utils import ConfigError, parse_config, run_command
    from trl_emo.evaluation.cli import run as eval_run
    from trl_emo.evaluate import run as evaluate_run
    assert eval_run is evaluate_run
    from trl_emo.sft import run, main, make_parser, NAME
    assert NAME == "trl_emo.sft"
    from trl_emo.real_model import smollm2_instruct
    import trl_emo.evaluation.sandbox as sandbox
    from trl_emo.evaluation.code_execution import CodeJob, verdict
    from trl_emo.evaluation.sandbox_uids import UNPRIVILEGED_UIDS, _lease_uid
    assert CodeJob is sandbox.CodeJob and UNPRIVILEGED_UIDS is sandbox.UNPRIVILEGED_UIDS and verdict and _lease_uid
    try:
        trl_emo.hub_check.no_such_name
    except AttributeError as exc:
        print("missing:", exc)
    print("ok")
    """
)


def test_the_old_module_names_still_import():
    result = subprocess.run([sys.executable, "-c", OLD_NAMES], env={**os.environ, "HF_HUB_OFFLINE": "1"},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[-1] == "ok"
    assert "warned: trl_emo.config moved to trl_emo.training.config" in result.stdout
    assert ("warned: trl_emo.evaluation.sandbox_uids moved to trl_emo.evaluation.sandbox._uids (private: import from "
            "trl_emo.evaluation.sandbox)") in result.stdout
    assert any(line.startswith("missing: module 'trl_emo.hub_check' has no attribute 'no_such_name'") for line in lines)


EVERY_OLD_NAME = textwrap.dedent(
    """
    import importlib, warnings
    warnings.simplefilter("ignore", DeprecationWarning)
    from trl_emo.commands.moved import MOVED, SPLIT
    for old, new in MOVED.items():
        module = importlib.import_module(old)
        assert module is importlib.import_module(new), (old, new)
    for old, places in SPLIT.items():
        module = importlib.import_module(old)
        for name in getattr(module, "__all__", []):
            getattr(module, name)  # every name the split module answers resolves in its new home
    from trl_emo import *  # the public API, star-imported
    assert SFTTrainer and SFTConfig
    from trl_emo.core.errors import HubAccessError
    import trl_emo.hub_check as hub_check
    assert hub_check.HubAccessError is HubAccessError
    print("every old name ok")
    """
)


def test_every_old_name_resolves_to_its_new_home_and_runs_as_a_module():
    """Each entry of the alias table imports the same module object as its target; `python -m` on an old command
    name (`trl_emo.demo`) still runs the command."""
    result = subprocess.run([sys.executable, "-c", EVERY_OLD_NAME], env={**os.environ, "HF_HUB_OFFLINE": "1"},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().endswith("every old name ok")
    demo = subprocess.run([sys.executable, "-m", "trl_emo.demo", "--help"], env={**os.environ, "HF_HUB_OFFLINE": "1"},
                          capture_output=True, text=True, timeout=120)
    assert demo.returncode == 0 and "usage:" in demo.stdout, demo.stderr[-2000:]
