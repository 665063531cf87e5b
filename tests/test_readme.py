"""The README runs as written: every Python and shell block marked `run` in its info string (```` ```python run ````)
is executed verbatim, offline, from an empty folder, and must succeed; every other Python block must at least
compile. A block the suite cannot run (an install, a GPU recipe, a Hub download, minutes of training) is left
unmarked, and the README gives its time."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
BLOCKS = [(m.group(1), m.group(2).split(), m.group(3), (ROOT / "README.md").read_text()[: m.start()].count("\n") + 1)
          for m in BLOCK.finditer((ROOT / "README.md").read_text())]
RUN = [(language, code, line) for language, words, code, line in BLOCKS if "run" in words]


def test_the_readme_marks_its_runnable_blocks():
    assert {language for language, _, _ in RUN} == {"python", "bash"} and len(RUN) >= 3
    for language, words, code, line in BLOCKS:
        if language == "python":
            compile(code, f"README.md:{line}", "exec")  # a fragment still parses


@pytest.mark.parametrize("language, code, line", RUN, ids=[f"README.md:{line}" for _, _, line in RUN])
def test_a_readme_block_runs_verbatim_offline(language, code, line, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRL_EMO_CACHE": str(tmp_path / "cache")}
    command = [sys.executable, "-c", code] if language == "python" else ["bash", "-euo", "pipefail", "-c", code]
    start = time.perf_counter()
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    seconds = time.perf_counter() - start
    assert result.returncode == 0, f"README.md:{line} failed after {seconds:.0f} s\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    print(f"README.md:{line} ({language}) ran in {seconds:.1f} s")
