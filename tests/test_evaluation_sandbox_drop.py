"""The code sandbox without Landlock (issue 23): the privilege drop alone contains hostile programs, and
without Landlock or a privilege drop the sandbox refuses unless the risk is accepted explicitly.

The containment tests need root (CI runs as root; so do many cloud notebooks): there every program runs as an
unprivileged uid of its own. Landlock, the network namespace and bubblewrap are turned off, as on kernels
before 5.13 or in containers whose seccomp profile blocks them, so each attack is stopped by the uid alone.
The programs run in an evaluator process of their own, through `run_checks` as the `humaneval` task runs
them; its environment holds a secret. A hostile program is right only if its attack worked: for it, "passed"
means "breached". Every program is bounded by construction (sleeps of a few seconds, 40 forks at most), so a
broken sandbox fails these tests, never hangs them. The refusal tests run everywhere.
"""

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox targets Linux")

from trl_emo.evaluation.sandbox import _sandbox as sandbox_module  # noqa: E402
from trl_emo.evaluation.config import EvalConfig  # noqa: E402
from trl_emo.evaluation.sandbox import (  # noqa: E402
    MARKER_VARIABLE, UNPRIVILEGED_UIDS, Sandbox, SandboxError, SandboxLimits, UnconfinedError, bubblewrap_argv,
    confinement,
)

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="the privilege drop needs root (CI runs as root)")
SECRET = "trl-emo-issue-23-secret-9d2e"
SETUP = "def check(candidate):\n    assert candidate(3) == 9\n    assert candidate(-2) == 4\n"
GOOD = "def square(x):\n    return x * x\n"
PROCESSES = SandboxLimits().processes
EVALUATOR_GROUP = 4242  # a supplementary group the evaluator runs with (root's groups may be empty)

# The evaluator: runs the programs as the humaneval task does and reports their verdicts, what it saw of the
# attacks on itself (SIGUSR1 received) and how the sandbox described itself.
EVALUATOR = textwrap.dedent(
    """
    import json, os, signal, sys
    from trl_emo.evaluation.sandbox import CodeJob, Sandbox, SandboxLimits, run_checks

    received = []
    signal.signal(signal.SIGUSR1, lambda number, frame: received.append(number))
    spec = json.load(sys.stdin)
    sandbox = Sandbox(SandboxLimits(timeout=spec["timeout"]), workers=4, base_dir=spec["base_dir"], **spec["layers"])
    names = list(spec["programs"])
    pid = str(os.getpid())
    jobs = [CodeJob(spec["programs"][name].replace("EVALUATOR_PID", pid), spec["setup"], "check(square)\\n")
            for name in names]
    verdicts = {names[i]: verdict for i, verdict in run_checks(sandbox, jobs)}
    print(json.dumps({"verdicts": verdicts, "received": received, "describe": sandbox.describe()}))
    """
)


def attack(body: str) -> str:
    """A solution that is right only if `body`, run once when the program starts, sets `breached`."""
    return "import os, signal, shutil, time\nbreached = False\n" + textwrap.dedent(body) + (
        "\ndef square(x):\n    return x * x if breached else None\n"
    )


def snapshot(root: Path) -> dict:
    out = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            info = os.lstat(path)
            content = open(path, "rb").read() if os.path.isfile(path) else None
            out[os.path.relpath(path, root)] = (info.st_mode, info.st_uid, info.st_size, info.st_mtime_ns, content)
    return out


def processes_of(uids: range) -> list[int]:
    """Live processes whose real uid is one of `uids`, or that carry a sandbox marker."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            status = open(f"/proc/{name}/status").read()
            environ = open(f"/proc/{name}/environ", "rb").read()
        except OSError:
            continue
        uid = int(status.split("\nUid:")[1].split()[0])
        state = status.split("\nState:")[1].split()[0]
        if state not in ("Z", "X") and (uid in uids or MARKER_VARIABLE.encode() + b"=" in environ):
            found.append(int(name))
    return found


@pytest.fixture(scope="module")
def world():
    """What the programs must not touch, laid out as on a real machine: folders others may enter (mode 755),
    files they may read (644), a secret only its owner may read (600), a HOME; and a folder anyone may write."""
    root = Path(tempfile.mkdtemp(prefix="trl-emo-test-"))
    root.chmod(0o755)
    (root / "watched" / "sub").mkdir(parents=True)
    (root / "watched" / "keep.txt").write_text("keep me")
    (root / "watched" / "sub" / "data.bin").write_bytes(b"\x00\x01" * 100)
    (root / "secret.txt").write_text(SECRET)
    (root / "secret.txt").chmod(0o600)
    (root / "group-secret.txt").write_text(SECRET)  # readable by a supplementary group of the evaluator's
    (root / "group-secret.txt").chmod(0o640)
    if ROOT:
        os.chown(root / "group-secret.txt", 0, EVALUATOR_GROUP)
    (root / "home").mkdir()
    (root / "home" / "canary").write_text("alive")
    (root / "shared").mkdir()
    (root / "shared").chmod(0o777)  # like /tmp: where two programs could meet
    (root / "sandboxes").mkdir()
    for folder in (root / "watched", root / "watched" / "sub", root / "home", root / "sandboxes"):
        folder.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def hostile_programs(world: Path) -> tuple[dict, list[str]]:
    """The attacks of issue 23 (and the correct programs run with them); also the files one leaves in /tmp."""
    watched, shared = world / "watched", world / "shared"
    leftovers = [f"/tmp/trl-emo-test-leftover-{os.getpid()}", f"/dev/shm/trl-emo-test-leftover-{os.getpid()}"]
    victim_pid = shared / "victim.pid"
    programs = {
        # Started first, so that both run at the same time (4 workers).
        "victim (a correct program another one tries to kill)": (
            "import os, time\n"
            f"open({str(shared / 'pid.tmp')!r}, 'w').write(str(os.getpid()))\n"
            f"os.rename({str(shared / 'pid.tmp')!r}, {str(victim_pid)!r})\n"
            "time.sleep(2.5)\n" + GOOD
        ),
        "signals another program": attack(f"""
            deadline = time.time() + 2
            while time.time() < deadline and not os.path.exists({str(victim_pid)!r}):
                time.sleep(0.01)
            if not os.path.exists({str(victim_pid)!r}):
                raise RuntimeError("no victim to attack")  # the test would prove nothing
            try:
                os.kill(int(open({str(victim_pid)!r}).read()), signal.SIGKILL)
                breached = True
            except (OSError, ValueError):
                pass
        """),
        "reads a 0600 file of the evaluator": attack(f"""
            try:
                breached = open({str(world / 'secret.txt')!r}).read() == {SECRET!r}
            except OSError:
                pass
        """),
        "reads a 0640 file of the evaluator's group": attack(f"""
            try:
                breached = open({str(world / 'group-secret.txt')!r}).read() == {SECRET!r}
            except OSError:
                pass
        """),
        "reads its ancestors' environment through /proc": attack(f"""
            pid = os.getppid()
            while pid > 1:
                try:
                    breached = breached or {SECRET!r} in open(f"/proc/{{pid}}/environ", errors="replace").read()
                except OSError:
                    pass
                try:
                    pid = int(open(f"/proc/{{pid}}/stat").read().rsplit(")", 1)[1].split()[1])
                except (OSError, ValueError, IndexError):
                    break
        """),
        "writes outside its directory": attack(f"""
            for path, mode in (({str(watched / 'keep.txt')!r}, "w"), ({str(watched / 'new.txt')!r}, "x")):
                try:
                    open(path, mode).write("breached")
                    breached = True
                except OSError:
                    pass
        """),
        "deletes outside its directory": attack(f"""
            try:
                os.remove({str(watched / 'sub' / 'data.bin')!r})
                breached = True
            except OSError:
                pass
        """),
        "deletes the evaluator's HOME by absolute path": attack(f"""
            shutil.rmtree({str(world / 'home')!r}, ignore_errors=True)
            breached = not os.path.exists({str(world / 'home' / 'canary')!r})
        """),
        "signals the evaluator": attack("""
            try:
                os.kill(EVALUATOR_PID, signal.SIGUSR1)
                breached = True
            except OSError:
                pass
        """),
        "kills the evaluator": attack("""
            try:
                os.kill(EVALUATOR_PID, signal.SIGKILL)
                breached = True
            except OSError:
                pass
        """),
        "becomes root again": attack("""
            try:
                os.setresuid(0, 0, 0)
                breached = True
            except OSError:
                pass
        """),
        "forks past the process limit": attack(f"""
            children = 0
            for _ in range(40):
                try:
                    if os.fork() == 0:
                        time.sleep(3)
                        os._exit(0)
                except OSError:
                    break
                children += 1
            breached = children > {PROCESSES}
        """),
        "good": GOOD,
        "good, with the standard library": (
            "import collections, decimal, fractions, json, math, os, tempfile\n"
            "assert 'é'.encode('latin-1') == b'\\xe9'  # a codec imported on first use\n"
            "with open(os.path.join(tempfile.gettempdir(), 'scratch'), 'w') as f:  # its HOME/TMPDIR, by path\n"
            "    f.write(json.dumps(sorted(collections.Counter('abca'))))\n"
            "def square(x):\n"
            "    return int(fractions.Fraction(x) * x) + math.floor(decimal.Decimal('0.5'))\n"
        ),
        "good, but leaves files in world-writable folders": (
            "import os\n"
            + "".join(f"open({path!r}, 'w').write('left')\n" for path in leftovers)
            + GOOD
        ),
        # Last: no program starts after it, whose uid could be the same (the sweep alone must find it).
        "good, but leaves a process behind (own session, no environment)": (
            "import os, time\n"
            "child = os.fork()\n"
            "if child == 0:\n"
            "    os.setsid()  # out of its group and session, and without the marker the sweep looks for\n"
            "    os.execve('/bin/sleep', ['sleep', '20'], {})\n"
            "deadline = time.time() + 2\n"
            "while time.time() < deadline:  # until it has escaped\n"
            "    try:\n"
            "        if open(f'/proc/{child}/cmdline', 'rb').read().startswith(b'sleep'):\n"
            "            break\n"
            "    except OSError:\n"
            "        pass\n"
            "    time.sleep(0.01)\n" + GOOD
        ),
    }
    return programs, leftovers


@pytest.fixture(scope="module")
def drop_only(world):
    """The hostile programs run as an evaluation runs them, with the privilege drop as the only layer."""
    if not ROOT:
        pytest.skip("the privilege drop needs root (CI runs as root)")
    programs, leftovers = hostile_programs(world)
    before = {name: snapshot(world / name) for name in ("watched", "home")}
    spec = {
        "programs": programs, "setup": SETUP, "timeout": 6, "base_dir": str(world / "sandboxes"),
        "layers": {"landlock": False, "network": False, "bubblewrap": False},
    }
    env = {**os.environ, "TRL_EMO_TEST_SECRET": SECRET}  # in the evaluator's /proc/<pid>/environ
    done = subprocess.run(
        [sys.executable, "-c", EVALUATOR], input=json.dumps(spec), capture_output=True, text=True, env=env,
        timeout=120, extra_groups=[EVALUATOR_GROUP],
    )
    assert done.returncode == 0, f"the evaluator died ({done.returncode}): {done.stderr[-2000:]}"
    report = json.loads(done.stdout)
    return {
        **report, "before": before, "leftovers": leftovers, "world": world,
        "survivors": processes_of(UNPRIVILEGED_UIDS),
    }


HOSTILE = [
    "signals another program", "reads a 0600 file of the evaluator", "reads a 0640 file of the evaluator's group",
    "reads its ancestors' environment through /proc",
    "writes outside its directory", "deletes outside its directory", "deletes the evaluator's HOME by absolute path",
    "signals the evaluator", "kills the evaluator", "becomes root again", "forks past the process limit",
]


@needs_root
@pytest.mark.parametrize("name", HOSTILE)
def test_each_attack_is_stopped_by_the_privilege_drop_alone(drop_only, name):
    verdict = drop_only["verdicts"][name]
    assert not verdict["passed"], f"{name}: the attack got through"
    assert verdict["status"] in ("failed", "error"), verdict
    assert "no victim to attack" not in verdict["detail"]


@needs_root
def test_correct_programs_still_pass_without_landlock(drop_only):
    verdicts = drop_only["verdicts"]
    good = [name for name in verdicts if name.startswith(("good", "victim"))]
    assert len(good) == 5
    for name in good:
        assert verdicts[name]["passed"], (name, verdicts[name])


@needs_root
def test_the_evaluator_and_its_files_are_untouched(drop_only):
    world = drop_only["world"]
    assert drop_only["received"] == []  # no SIGUSR1 reached it (and SIGKILL did not: it reported)
    for name, before in drop_only["before"].items():
        assert snapshot(world / name) == before, name
    assert (world / "secret.txt").read_text() == SECRET
    assert stat.S_IMODE((world / "secret.txt").stat().st_mode) == 0o600
    assert "unprivileged uid" in drop_only["describe"] and "Landlock ABI" not in drop_only["describe"]


@needs_root
def test_nothing_of_the_programs_is_left(drop_only):
    # Not a process (the fork bomb's children sleep 3 s, the escaped `sleep` 20 s), not a directory, not what one
    # wrote in /tmp and /dev/shm.
    assert drop_only["survivors"] == []
    assert os.listdir(drop_only["world"] / "sandboxes") == []
    assert [path for path in drop_only["leftovers"] if os.path.lexists(path)] == []


@needs_root
def test_each_program_runs_as_a_uid_of_its_own_with_no_groups():
    sandbox = Sandbox(SandboxLimits(timeout=10), workers=2, landlock=False, network=False, bubblewrap=False)
    source = (
        "import json, os, time\n"
        "time.sleep(0.5)  # both run at once\n"
        "status = open('/proc/self/status').read()\n"
        "print(json.dumps([os.getresuid(), os.getresgid(), os.getgroups(), os.stat('.').st_uid,\n"
        "                  os.stat('.').st_mode & 0o777, status.split('NoNewPrivs:')[1].split()[0],\n"
        "                  os.access('/root', os.R_OK)]))\n"
    )
    results = [result for _, result in sandbox.map([(source, b""), (source, b"")])]
    seen = []
    for result in results:
        assert result.ok, result.stderr
        uids, gids, groups, owner, mode, no_new_privs, reads_root = json.loads(result.stdout)
        uid = uids[0]
        assert uid in UNPRIVILEGED_UIDS and uids == [uid] * 3 and gids == [uid] * 3
        assert groups == [] and owner == uid and mode == 0o700
        assert no_new_privs == "1" and not reads_root
        seen.append(uid)
    assert len(set(seen)) == 2  # two programs at once never share a uid: they cannot signal each other


@needs_root
def test_an_unreachable_standard_library_is_shown_through_links():
    sandbox = Sandbox(SandboxLimits(timeout=10), workers=1, landlock=False, network=False, bubblewrap=False)
    folder, moves = sandbox_module.interpreter_view()
    stdlib = os.path.dirname(os.__file__)
    if sandbox_module._blocked_folder(stdlib) is None:
        assert (folder, moves) == (None, [])
        return
    # This machine's layout (pyenv under root's mode-700 home): the original stays private, a copy is used.
    assert stat.S_IMODE(os.stat(sandbox_module._blocked_folder(stdlib)).st_mode) & 0o007 == 0
    copy = dict(moves)[stdlib]
    assert os.path.samefile(os.path.join(copy, "os.py"), os.__file__) or open(
        os.path.join(copy, "os.py"), "rb").read() == open(os.__file__, "rb").read()
    assert not os.path.exists(os.path.join(copy, "site-packages"))
    result = sandbox.run("import os, json, decimal\nprint(os.__file__.startswith(%r), json.__file__)" % stdlib)
    assert result.ok, result.stderr
    assert result.stdout.split()[1].startswith(copy)


def test_a_program_cannot_pass_for_a_sandbox_failure():
    # It prints what a failed setup prints and exits with its status: still an ordinary failed program.
    sandbox = Sandbox(SandboxLimits(timeout=10), workers=1)
    result = sandbox.run(
        "import os, sys\nsys.stderr.write('sandbox setup failed: OSError()\\n')\nsys.stderr.flush()\n"
        f"os._exit({sandbox_module.SETUP_FAILED})\n"
    )
    assert result.status == "exited" and result.returncode == sandbox_module.SETUP_FAILED


# ------------------------------------------------------------------------------------------ refusing


def test_without_landlock_or_privilege_drop_it_refuses_in_one_line():
    with pytest.raises(UnconfinedError) as caught:
        Sandbox(landlock=False, network=False, drop_privileges=False, bubblewrap=False)
    message = str(caught.value)
    assert "\n" not in message
    assert "Landlock (turned off)" in message and "privilege drop (turned off)" in message
    assert "--allow_unconfined_code_execution true" in message


def test_a_machine_without_either_layer_is_named_in_the_refusal(monkeypatch):
    # A kernel before 5.13, an evaluator that is not root.
    monkeypatch.setattr(sandbox_module, "_CONFINEMENT", {"landlock": 0, "network": False, "drop": False,
                                                         "bubblewrap": None})
    monkeypatch.setattr(sandbox_module, "landlock_abi", lambda: 0)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(UnconfinedError) as caught:
        Sandbox(SandboxLimits(timeout=10))
    message = str(caught.value)
    assert "\n" not in message and "needs Linux 5.13 or later" in message
    assert "it needs root, and the evaluator runs as uid 1000" in message and "uid 1000" in message
    with pytest.raises(SandboxError, match="needs the evaluator to run as root"):
        Sandbox(SandboxLimits(timeout=10), drop_privileges=True)
    accepted = Sandbox(SandboxLimits(timeout=10), workers=1, allow_unconfined=True)
    assert "NO filesystem confinement" in accepted.describe()
    assert accepted.run("print(6 * 7)").stdout.strip() == "42"


def test_the_risk_is_accepted_by_a_documented_config_field():
    field = EvalConfig.__dataclass_fields__["allow_unconfined_code_execution"]
    assert field.default is False and field.metadata["help"]
    assert "allow_unconfined_code_execution (`bool`" in EvalConfig.__doc__


# ------------------------------------------------------------------------------------------ bubblewrap


def test_the_bubblewrap_command_line(tmp_path):
    # Everywhere: how the command is built (the layer itself runs only where bwrap is installed).
    linked = tmp_path / "lib64"
    (tmp_path / "usr" / "lib64").mkdir(parents=True)
    linked.symlink_to("usr/lib64")
    cache = tmp_path / "ld.so.cache"
    cache.write_text("")
    workdir = "/tmp/base/trl-emo-sandbox-x"
    argv = bubblewrap_argv(
        "bwrap", workdir, [str(tmp_path / "usr"), str(linked), "/tmp/trl-emo-python-y"], [str(cache), "/dev/urandom"],
        network=True,
    )
    assert argv[0] == "bwrap" and argv[-1] == "--"
    joined = " ".join(argv)
    for flag in ("--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-net", "--proc /proc", "--dev /dev"):
        assert flag in joined
    assert "--new-session" not in argv  # the child stays in the process group the sandbox kills
    # Only the capabilities of the privilege drop, which it loses with it.
    assert joined.count("--cap-add") == 2 and "--cap-drop ALL --cap-add CAP_SETUID --cap-add CAP_SETGID" in joined
    # A private /tmp first, then what lives below it; parents made 755 (bwrap's own are 700).
    tmpfs = joined.index("--tmpfs /tmp")
    assert tmpfs < joined.index(f"--bind {workdir} {workdir}")
    assert tmpfs < joined.index("--ro-bind /tmp/trl-emo-python-y")
    assert joined.index("--dir /tmp/base") < joined.index(f"--bind {workdir}")
    assert f"--symlink usr/lib64 {linked}" in joined and f"--ro-bind {cache} {cache}" in joined
    assert "/dev/urandom" not in joined and "--ro-bind / /" not in joined
    assert "--unshare-net" not in bubblewrap_argv("bwrap", workdir, [], [], network=False)


@needs_root
def test_under_bubblewrap_only_its_own_world_is_visible(world):
    if not confinement()["bubblewrap"]:
        pytest.skip("bubblewrap is not installed (an extra layer, not a requirement)")
    sandbox = Sandbox(SandboxLimits(timeout=10), workers=1, landlock=False, bubblewrap=True)
    result = sandbox.run(
        "import json, os\n"
        "print(json.dumps([[p for p in os.listdir('/proc') if p.isdigit()], os.path.exists(%r), os.listdir('/tmp')]))\n"
        % str(world / "secret.txt")
    )
    assert result.ok, result.stderr
    pids, secret_visible, tmp = json.loads(result.stdout)
    assert len(pids) <= 3 and not secret_visible  # its own processes only; the evaluator's files do not exist
    assert all(name.startswith(("trl-emo-sandbox-", "trl-emo-python-")) for name in tmp)
