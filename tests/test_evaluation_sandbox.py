"""The code sandbox against hostile programs, and the verdict harness against shortcuts.

Every hostile program is bounded by construction (its loops and sleeps end on their own, its allocation
is one request), so a broken sandbox makes a test fail, never hang. All programs of a group run in one
`run_checks` call, the way an evaluation runs them: each must be contained and counted as a failure while
the others carry on. Here every layer the machine has is on (Landlock, network namespace, and as root the
privilege drop); `test_evaluation_sandbox_drop.py` shows the privilege drop alone.
"""

import os
import shutil
import socket
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox targets Linux")

from trl_emo.evaluation.sandbox import (  # noqa: E402
    MARKER_VARIABLE, CodeJob, Sandbox, SandboxLimits, confinement, run_checks,
)

SETUP = "def check(candidate):\n    assert candidate(3) == 9\n    assert candidate(-2) == 4\n"
GOOD = "def square(x):\n    return x * x\n"
SECRET = "trl-emo-test-secret-4f1c"


def sandbox_processes() -> list[int]:
    """Processes started by any sandbox (their environment carries the marker), still alive."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as handle:
                environ = handle.read()
            with open(f"/proc/{name}/stat", "rb") as handle:
                state = handle.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if MARKER_VARIABLE.encode() + b"=" in environ and state not in (b"Z", b"X"):
            found.append(int(name))
    return found


def snapshot(root):
    out = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            stat = os.lstat(path)
            content = open(path, "rb").read() if os.path.isfile(path) else None
            out[os.path.relpath(path, root)] = (stat.st_mode, stat.st_size, stat.st_mtime_ns, content)
    return out


@pytest.fixture(scope="module")
def open_folder():
    """A folder others may enter (pytest's own is mode 700), as most of the machine is: what is contained must
    be contained by the sandbox, not by the test's folder."""
    folder = Path(tempfile.mkdtemp(prefix="trl-emo-test-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def hostile(open_folder):
    """Run the hostile programs of the issue (and a good one) together; return their verdicts and the world."""
    root = open_folder
    watched = root / "watched"  # stands for everything outside the sandbox directory
    (watched / "sub").mkdir(parents=True)
    (watched / "keep.txt").write_text("keep me")
    (watched / "sub" / "data.bin").write_bytes(b"\x00\x01" * 100)
    home = root / "home"  # the user's real HOME, as far as the programs can tell
    home.mkdir()
    (home / "canary").write_text("alive")
    escape = root / "escape.txt"
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    os.environ["TRL_EMO_TEST_SECRET"] = SECRET
    layers = confinement()
    programs = {
        "good": GOOD,
        "infinite loop": "def square(x):\n    while True:\n        pass\n",
        "sleeping children": (
            "import os, time\n"
            "for i in range(20):\n"
            "    if os.fork() == 0:\n"
            "        if i == 0:\n"
            "            os.setsid()  # escapes the process group; the sweep still finds it\n"
            "        time.sleep(60)\n"
            "        os._exit(0)\n"
            "def square(x):\n    return x * x + 1\n"
        ),
        "50 GB allocation": "block = bytearray(50 * 2**30)\ndef square(x):\n    return x * x\n",
        "writes outside": (
            f"import os\nopen({str(escape)!r}, 'w').write('escaped')\n"
            f"open({str(watched / 'keep.txt')!r}, 'w').write('overwritten')\n"
            "def square(x):\n    return x * x\n"
        ),
        "deletes outside": (
            f"import os\nos.remove({str(watched / 'sub' / 'data.bin')!r})\ndef square(x):\n    return x * x\n"
        ),
        "deletes HOME": (
            "import os, shutil\n"
            "shutil.rmtree(os.path.expanduser('~'), ignore_errors=True)\n"
            f"shutil.rmtree({str(home)!r}, ignore_errors=True)\n"
            f"open({str(home / 'canary')!r}, 'w').write('dead')\n"
        ),
        "reads the parent's environment": (
            "import os\n"
            "def leaked():\n"
            "    found = os.environ.get('TRL_EMO_TEST_SECRET', '')\n"
            # Without Landlock, /proc/<pid>/environ of a same-user process is readable: only Landlock hides it.
            f"    for pid in {[os.getpid(), 1] if layers['landlock'] else []}:\n"
            "        try:\n"
            "            found += open(f'/proc/{pid}/environ').read()\n"
            "        except OSError:\n"
            "            pass\n"
            f"    return {SECRET!r} in found\n"
            "def square(x):\n    return x * x if leaked() else None\n"
        ),
        "network": None if not (layers["network"] or layers["landlock"] >= 4) else (
            "import socket\n"
            "def square(x):\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=1).close()\n"
            "    return x * x\n"
        ),
        "sys.exit(0) before the checks": "import sys\nsys.exit(0)\ndef square(x):\n    return x * x\n",
        "os._exit(0) before the checks": "import os\nos._exit(0)\n",
        "always-equal answer": (
            "class Always:\n"
            "    def __eq__(self, other): return True\n"
            "    def __ne__(self, other): return False\n"
            "def square(x):\n    return Always()\n"
        ),
        "prints 1 GB": "import sys\nchunk = 'x' * 2**20\nfor _ in range(1024):\n    sys.stdout.write(chunk)\n",
    }
    sandbox = Sandbox(SandboxLimits(timeout=3), workers=4, base_dir=str(root / "sandboxes"))
    os.makedirs(sandbox.base_dir)
    programs = {name: source for name, source in programs.items() if source is not None}
    before = snapshot(watched)
    try:
        jobs = [CodeJob(source, SETUP, "check(square)\n") for source in programs.values()]
        verdicts = dict(run_checks(sandbox, jobs))
    finally:
        del os.environ["TRL_EMO_TEST_SECRET"]
        listener.close()
    return {
        "verdicts": {name: verdicts[i] for i, name in enumerate(programs)},
        "watched_before": before, "watched": watched, "home": home, "escape": escape, "sandbox": sandbox,
        "survivors": sandbox_processes(),
    }


def test_only_the_good_program_passes(hostile):
    verdicts = hostile["verdicts"]
    assert verdicts["good"]["passed"] and verdicts["good"]["status"] == "passed"
    failed = [name for name, verdict in verdicts.items() if name != "good" and verdict["passed"]]
    assert failed == []


@pytest.mark.parametrize(
    "name, status",
    [
        ("infinite loop", "timeout"),
        ("50 GB allocation", "memory"),
        ("sys.exit(0) before the checks", "exited_early"),
        ("os._exit(0) before the checks", "exited_early"),
        ("always-equal answer", "untrusted_result"),
        ("prints 1 GB", "output_limit"),
        # The 17th fork fails first (as root through the privilege drop); root without it: all 20 children
        # start (the kernel never limits root's processes) and the answer is wrong.
        ("sleeping children", "failed" if os.getuid() == 0 and not confinement()["drop"] else "error"),
        ("reads the parent's environment", "failed"),
    ],
)
def test_each_hostile_program_is_contained_and_counted_as_a_failure(hostile, name, status):
    verdict = hostile["verdicts"][name]
    assert not verdict["passed"]
    assert verdict["status"] == status, verdict


def test_no_background_process_survives(hostile):
    # 20 children slept 60 s, one in a session of its own: none is left once the evaluation moves on.
    assert hostile["survivors"] == []


def test_nothing_outside_the_sandbox_directory_changes(hostile):
    if not confinement()["landlock"]:
        pytest.skip("this kernel has no Landlock: writes outside the sandbox directory cannot be blocked")
    verdicts = hostile["verdicts"]
    for name in ("writes outside", "deletes outside"):
        # Refused (Landlock, the uid), or the path is not there at all (bubblewrap shows no such folder).
        detail = verdicts[name]["detail"]
        assert verdicts[name]["status"] == "error", name
        assert detail.startswith(("PermissionError", "FileNotFoundError")), (name, detail)
    assert snapshot(hostile["watched"]) == hostile["watched_before"]
    assert not hostile["escape"].exists()
    assert (hostile["home"] / "canary").read_text() == "alive"
    assert os.listdir(hostile["sandbox"].base_dir) == []  # every program's directory was removed


def test_network_and_secrets_are_out_of_reach(hostile):
    verdicts = hostile["verdicts"]
    if "network" in verdicts:  # blocked by a network namespace or Landlock
        assert verdicts["network"]["status"] == "error"
    # The parent's variable, /proc/<parent>/environ and /proc/1/environ: none readable (the test passes only
    # if the secret is found).
    assert verdicts["reads the parent's environment"]["status"] == "failed"


def test_the_program_sees_an_empty_directory_home_and_environment():
    sandbox = Sandbox(SandboxLimits(timeout=5), workers=1)
    result = sandbox.run(
        "import os, sys\n"
        "print(sorted(os.environ))\n"
        "print(os.getcwd() == os.environ['HOME'] == os.environ['TMPDIR'], os.listdir('.'))\n"
        "print(sys.stdin.read() == '', SANDBOX_INPUT)\n",
        b"payload",
    )
    assert result.ok, result.stderr
    names, home, stdin = result.stdout.splitlines()
    assert eval(names) == sorted(
        ["PATH", "LANG", "LC_ALL", "HOME", "TMPDIR", "PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE", "PYTHONIOENCODING",
         MARKER_VARIABLE]
    )
    assert home == "True []" and stdin == "True b'payload'"
    assert "sandbox" in sandbox.describe() or "process" in sandbox.describe()


def test_the_sandbox_benchmark_runs(capsys):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from benchmarks import sandbox_bench

    assert sandbox_bench.main(["--programs", "2", "--workers", "1"]) == 0
    table = capsys.readouterr().out
    assert "| bare | 1 |" in table and "| sandbox | 1 |" in table
