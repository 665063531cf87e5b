"""Virtual environments of other fine-tuning frameworks, for the tests that run our losses inside them.

`python tests/framework_venvs.py llamafactory` builds LLaMA-Factory 0.9.5's environment once (its own pinned TRL,
transformers, PEFT, accelerate and datasets, on the local CPU torch 2.13.0) under the cache, keyed by everything that
goes into it; .ci/run runs it before pytest, and `tests/test_outside_trl.py` requires it (a cold build takes longer
than a test may). Run again with the same requirements it returns at once.

Why the environment holds what it holds:
- torch is the local CPU wheel: LLaMA-Factory's own dependencies name torchvision/torchaudio, whose newest releases
  pull a 4.6 GB CUDA torch. So LLaMA-Factory goes in with `--no-deps`, and what it imports to train goes in beside it.
- Of its dependencies, `llamafactory.train.sft` and `llamafactory.data` import only TRL, transformers, PEFT,
  accelerate, datasets, omegaconf and torchaudio (checked on 0.9.5 by importing them with nothing else installed).
- torchaudio: `llamafactory/data/mm_plugin.py` imports it at module level, for audio inputs only. No release is built
  for torch 2.13 (2.11.0 is the newest) and its compiled extension does not load on 2.13, so it is installed without
  its `lib/*.so`: torchaudio then imports without its extension (as it does when deployed as a zip), and nothing of
  text fine-tuning calls it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

CACHE = Path(os.environ.get("TRL_EMO_CACHE", Path.home() / ".cache" / "trl_emo")) / "venvs"
TORCH = "torch==2.13.0"

# name -> (requirements installed with their dependencies, packages installed without them)
FRAMEWORKS = {
    "llamafactory": (
        [TORCH, "transformers==5.6.0", "trl==0.24.0", "peft==0.18.1", "accelerate==1.11.0", "datasets==4.0.0",
         "omegaconf==2.3.0"],
        ["llamafactory==0.9.5", "torchaudio==2.11.0"],
    ),
}
# Files removed after installing (see the module docstring): paths relative to site-packages, glob patterns.
REMOVE = {"llamafactory": ["torchaudio/lib/*.so"]}
# Bump to rebuild every environment after a change of how they are built.
RECIPE_VERSION = 1
DONE = "trl_emo_venv_complete.json"


def key(name: str) -> str:
    """What the environment is made of: its requirements, what is removed, this Python."""
    with_deps, without = FRAMEWORKS[name]
    text = json.dumps([RECIPE_VERSION, with_deps, without, REMOVE.get(name, []), sys.version, sys.platform])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def venv_dir(name: str) -> Path:
    return CACHE / f"{name}-{key(name)}"


def python_of(name: str) -> Path | None:
    """The environment's interpreter, or None when it has not been built (or its build did not finish)."""
    folder = venv_dir(name)
    return folder / "bin" / "python" if (folder / DONE).is_file() else None


def build_command(name: str) -> str:
    return f"python tests/framework_venvs.py {name}"


def _site_packages(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def _run(command: list[str]) -> None:
    """Run pip quietly (its index warnings would fill CI's log); its output only when it fails."""
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}")


def build(name: str) -> Path:
    """Build the environment unless a complete one is cached; returns its interpreter."""
    ready = python_of(name)
    if ready is not None:
        print(f"{name}: the environment is built already ({venv_dir(name)})", flush=True)
        return ready
    folder = venv_dir(name)
    with_deps, without = FRAMEWORKS[name]
    # Said before the silent part (pip runs quietly): what is built, where, and that it takes minutes once.
    print(f"{name}: building its virtual environment once in {folder} (a few minutes; pip from the package index): "
          f"{', '.join(with_deps + without)}", flush=True)
    shutil.rmtree(folder, ignore_errors=True)  # an unfinished build
    folder.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    # No pip inside: this interpreter's pip installs into it (`--python`), which saves bootstrapping one.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    python = folder / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check", "--no-input", "install",
           "--quiet"]
    # `torch==2.13.0` among them keeps every dependency's torch requirement on the local CPU wheel.
    print(f"{name}: 1/2 pip install {' '.join(with_deps)} (with their dependencies)", flush=True)
    _run([*pip, *with_deps])
    print(f"{name}: 2/2 pip install --no-deps {' '.join(without)}", flush=True)
    _run([*pip, "--no-deps", *without])
    site = _site_packages(python)
    for pattern in REMOVE.get(name, []):
        for path in site.glob(pattern):
            path.unlink()
    seconds = round(time.monotonic() - start, 1)
    (folder / DONE).write_text(json.dumps({"requirements": with_deps + without, "seconds": seconds}) + "\n")
    print(f"built {name} in {seconds} s: {folder}")
    return python


if __name__ == "__main__":
    names = sys.argv[1:] or list(FRAMEWORKS)
    unknown = sorted(set(names) - set(FRAMEWORKS))
    if unknown:
        sys.exit(f"unknown framework(s) {', '.join(unknown)}; known: {', '.join(FRAMEWORKS)}")
    for framework in names:
        print(build(framework))
