"""The losses outside TRL: the `trl-emo-losses` wheel installs where only torch is and imports nothing of TRL's stack,
and LLaMA-Factory 0.9.5's own SFT trainer trains with our fused loss in its own environment (README, "Outside TRL")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement

import framework_venvs
from conftest import CORPUS

ROOT = Path(__file__).resolve().parent.parent
PACKAGING = ROOT / "packaging" / "trl-emo-losses"
SCRIPTS = Path(__file__).resolve().parent / "scripts"
# What a framework with another TRL must never get from importing our losses.
FORBIDDEN = ("trl", "transformers", "peft", "accelerate", "datasets")


def _tomllib():
    return pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")


def _clean_env(**extra) -> dict:
    """No PYTHONPATH (nothing of the checkout), offline."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", **extra)
    return env


@pytest.fixture(scope="module")
def losses_wheel(tmp_path_factory) -> Path:
    """The `trl-emo-losses` wheel, built by setuptools' PEP 517 hook (what `pip wheel` calls) from a copy of the
    two packages and the subfolder's pyproject, so that the build leaves nothing in the checkout."""
    import shutil

    src = tmp_path_factory.mktemp("losses_src")
    ignore = shutil.ignore_patterns("__pycache__")
    for package in ("losses", "core"):
        shutil.copytree(ROOT / "trl_emo" / package, src / "trl_emo" / package, ignore=ignore)
    shutil.copytree(PACKAGING, src / "packaging" / "trl-emo-losses", ignore=ignore)
    dist = tmp_path_factory.mktemp("losses_dist")
    built = subprocess.run(
        [sys.executable, "-c", f"from setuptools import build_meta; print(build_meta.build_wheel({str(dist)!r}))"],
        cwd=src / "packaging" / "trl-emo-losses", capture_output=True, text=True, timeout=300,
    )
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    return dist / built.stdout.split()[-1]


def test_the_losses_distribution_carries_the_losses_and_core_only(losses_wheel):
    names = zipfile.ZipFile(losses_wheel).namelist()
    packages = {n.rsplit("/", 1)[0] for n in names if n.endswith(".py")}
    assert packages == {"trl_emo/losses", "trl_emo/core"}  # no trl_emo/__init__.py: a namespace package
    on_disk = {p.relative_to(ROOT).as_posix() for d in ("losses", "core") for p in (ROOT / "trl_emo" / d).glob("*.py")}
    assert on_disk <= set(names)
    tomllib = _tomllib()
    losses = tomllib.loads((PACKAGING / "pyproject.toml").read_text())["project"]
    plugin = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert losses["version"] == plugin["version"] and losses["dependencies"] == ["torch>=2.4"]


def _torch_only_path(folder: Path) -> Path:
    """A folder holding links to torch and the distributions it requires (and theirs) from this environment, and
    nothing else: put on a virtual environment's path by a .pth file, it gives torch without reinstalling its 900 MB
    (a fresh `pip install torch==2.13.0` from the local wheel takes ~35 s) and without anything else of this
    environment (TRL and the rest stay invisible, which the test checks)."""
    folder.mkdir()
    todo, seen = ["torch"], set()
    while todo:
        dist = metadata.distribution(todo.pop())
        name = dist.metadata["Name"].lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        for requirement in dist.requires or []:
            req = Requirement(requirement)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops - {"bin", "__pycache__"}:
            target = Path(dist.locate_file(top))
            if target.exists() and not (folder / top).exists():
                (folder / top).symlink_to(target)
    return folder


CHECK = """
import importlib.util, json, sys
forbidden = {forbidden!r}
visible = [name for name in forbidden if importlib.util.find_spec(name) is not None]
import torch
from trl_emo.losses import FusedLinearLoss
g = torch.Generator().manual_seed(0)
hidden = torch.randn(2, 9, 16, generator=g, requires_grad=True)
weight = torch.randn(50, 16, generator=g, requires_grad=True)
labels = torch.randint(0, 50, (2, 9), generator=g)
labels[0, :3] = -100
loss = FusedLinearLoss("gem", beta=0.7)(hidden, weight, labels)
loss.backward()
print(json.dumps(dict(
    visible=visible,
    imported=sorted({{m.split(".")[0] for m in sys.modules}} & set(forbidden)),
    loss=loss.item(), grad=weight.grad.abs().sum().item(),
    trl_emo=list(sys.modules["trl_emo"].__path__),
)))
"""


def test_the_losses_install_and_run_where_only_torch_is(losses_wheel, tmp_path):
    """A fresh virtual environment with torch and nothing else: pip installs the wheel (its requirement, torch, is
    met), and importing the losses plus a fused GEM forward and backward imports none of TRL, transformers, PEFT,
    accelerate or datasets, which could not even be found there."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    (site / "torch_only.pth").write_text(str(_torch_only_path(tmp_path / "torch_only")) + "\n")
    pip = [sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check", "--no-input"]
    installed = subprocess.run([*pip, "install", "--no-index", str(losses_wheel)], capture_output=True, text=True,
                               timeout=300)
    assert installed.returncode == 0, installed.stdout[-2000:] + installed.stderr[-2000:]
    ran = subprocess.run([str(python), "-c", CHECK.format(forbidden=FORBIDDEN)], cwd=tmp_path, env=_clean_env(),
                         capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-3000:]
    out = json.loads(ran.stdout.strip().splitlines()[-1])
    assert out["visible"] == [] and out["imported"] == []
    assert out["loss"] > 0 and out["grad"] > 0
    assert out["trl_emo"] == [str(site / "trl_emo")]  # the installed wheel, not the checkout


@pytest.fixture(scope="module")
def llamafactory_python() -> Path:
    python = framework_venvs.python_of("llamafactory")
    if python is None:
        # Never a skip: CI builds it before pytest (.ci/run), and a missing environment must not pass unnoticed.
        pytest.fail(
            f"LLaMA-Factory's environment is not built: run `{framework_venvs.build_command('llamafactory')}` "
            f"(.ci/run runs it before pytest; it builds once into {framework_venvs.venv_dir('llamafactory')})."
        )
    return python


def _max_relative_difference(got: dict, want: dict) -> float:
    assert got.keys() == want.keys()
    return max(float((got[n] - want[n]).abs().max() / want[n].abs().max().clamp_min(1e-12)) for n in want)


def test_llamafactory_trains_with_our_fused_loss(llamafactory_python, losses_wheel, tmp_path):
    """LLaMA-Factory 0.9.5's `CustomSeq2SeqTrainer`, subclassed so that `compute_loss` calls our fused loss
    (tests/scripts/llamafactory_sft.py), trains a tiny Llama two steps on an Alpaca-format dataset of its own
    (`dataset_info.json`), in its own environment (TRL 0.24.0, transformers 5.6.0, PEFT 0.18.1, accelerate 1.11.0,
    datasets 4.0.0) with only the `trl-emo-losses` wheel added: fused GEM equals GEM from the logits in loss and every
    parameter's gradient at both steps. (The script also runs fused DFT against LLaMA-Factory's own `use_dft_loss`:
    `--runs dft_fused,dft_llamafactory`, equal to 4e-7 relative on 2026-11-27; left out here for the suite's time.)"""
    from trl_emo.models.tiny import save_tiny_causal_lm

    model = save_tiny_causal_lm(CORPUS, vocab_size=320, hidden_size=32, intermediate_size=64)  # cached
    data = tmp_path / "data"
    data.mkdir()
    rows = [{"instruction": f"what is {i} plus {i % 7}?", "input": "", "output": f"The answer is {i + i % 7}."}
            for i in range(8)]
    (data / "tiny_alpaca.json").write_text(json.dumps(rows))
    (data / "dataset_info.json").write_text(json.dumps({"tiny_alpaca": {"file_name": "tiny_alpaca.json"}}))
    # The wheel's files on the path, as installed (a wheel is a zip of them), so the cached environment stays as built.
    wheel_files = tmp_path / "wheel"
    zipfile.ZipFile(losses_wheel).extractall(wheel_files)
    out = tmp_path / "out"
    out.mkdir()
    ran = subprocess.run(
        [str(llamafactory_python), str(SCRIPTS / "llamafactory_sft.py"), model, str(data), str(out)],
        cwd=tmp_path, env=_clean_env(PYTHONPATH=str(wheel_files), HF_HOME=str(tmp_path / "hf")),
        capture_output=True, text=True, timeout=600,
    )
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-5000:]
    results = torch.load(out / "results.pt")
    assert results["trl_emo_path"] == [str(wheel_files / "trl_emo")]
    assert {m.split(".")[1] for m in results["trl_emo_modules"] if "." in m} == {"losses", "core"}
    got, want = results["gem_fused"], results["gem_logits"]
    assert len(got["losses"]) == len(want["losses"]) == 2 and len(got["grads"]) == len(want["grads"]) == 2
    assert got["losses"][0] != got["losses"][1]  # the first step changed the model
    torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(want["losses"]), rtol=1e-5, atol=1e-7)
    for step in range(2):
        assert _max_relative_difference(got["grads"][step], want["grads"][step]) < 1e-5, step
