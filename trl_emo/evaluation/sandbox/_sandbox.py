"""Running untrusted Python programs: one process each, with limits, in an empty directory, leaving nothing behind.

Nothing here knows about benchmarks. `Sandbox.run(source, data)` runs the Python program `source` in a new
interpreter and returns its exit status and the tails of its output; `Sandbox.map` runs many at a time.
What every program gets, whatever it does:

- its own process, in a new session (its own process group), started `python -s -S -P` (no user or system
  site-packages, nothing prepended to `sys.path`: only the standard library is importable; starts in 15 ms
  instead of 40) from a fresh empty temporary directory that is also its HOME and TMPDIR. Not `-I`: its `-E`
  would only drop our own variables (the environment is built from scratch) and with them PYTHONHASHSEED;
- an environment built from scratch: PATH, the C.UTF-8 locale, HOME/TMPDIR, `PYTHONHASHSEED=0` (the same
  program gives the same result on every run) and a marker naming the run; nothing of the caller's
  environment (tokens, keys, paths) is inherited;
- stdin closed (`/dev/null`); `data` arrives on a private file descriptor that is read and closed before the
  program starts, and is handed to it as the global `SANDBOX_INPUT` (bytes);
- resource limits set in the child before the program runs: CPU time, address space, file size, open files,
  and processes (`RLIMIT_NPROC`, which the kernel never applies to root: it binds because root's programs
  run as another uid, below);
- when the evaluator runs as root, a privilege drop: the program runs as an unprivileged uid and gid of its
  own (one per running program, from `UNPRIVILEGED_UIDS`, leased through a lock so that no two programs,
  even of two evaluations, share one; no supplementary groups; `no_new_privs`, so no setuid program gives
  root back) that owns only its directory. It cannot read the evaluator's private files or
  `/proc/<pid>/environ`, write or delete what it does not own, or signal the evaluator or the other
  programs. After it, every process of that uid is killed and whatever the uid left in the machine's
  world-writable folders (`/tmp`, `/var/tmp`, `/dev/shm`) is deleted. A Python installation that uid cannot
  reach (under root's mode-700 home, as pyenv puts it) is shown to it as a read-only copy of the standard
  library, made of hard links in a root-owned folder (`interpreter_view`); no mode of the original changes;
- where bubblewrap (`bwrap`) is installed and works, with the privilege drop only: its own mount, PID, IPC and
  UTS namespaces, in which only the Python installation, the system libraries and its directory exist and
  `/proc` shows its own processes only. An extra layer, not a requirement;
- where the kernel has Landlock (Linux >= 5.13), a filesystem policy: write anywhere beneath its directory,
  read and execute only the Python installation, the system library folders and its directory; no TCP
  connect/bind (Landlock ABI >= 4) and no signals to processes outside the sandbox (ABI >= 6);
- where namespaces are allowed, a network namespace of its own: no network at all;
- a wall-clock timeout and an output cap (stdout + stderr, read incrementally as it is produced): past either,
  the process group is killed;
- at the end, whatever happened, SIGKILL to its process group, then to every process still in its session,
  carrying its marker (children that started their own session) or running as its uid; then its directory
  is deleted.

Neither Landlock nor the privilege drop available (no Landlock, not root): `Sandbox` refuses, in one line
naming what is missing, unless `allow_unconfined=True` accepts that programs run as the evaluator's own uid.
A confinement layer that was found available (`confinement()`) and then fails to apply in a child is an
error (`SandboxError`), never a silent run without it; the child says it is ready on a pipe the program never
sees, so a program cannot pass for a failed setup (or the reverse).

This module is the entry point (`Sandbox`, `SandboxLimits`, `SandboxResult`, `confinement()`, the errors; callers
import them from the package, `trl_emo.evaluation.sandbox`) and runs the programs; the layers are in private
modules of their own beside it: `_bootstrap` (the child side: the system calls of Landlock, the network namespace,
the privilege drop and the limits), `_interpreter` (what the interpreter may read; the standard library's copy for a
dropped uid), `_uids` (leasing the uids), `_bubblewrap` (bwrap's command line), `_processes` (finding and killing
what a program left running), `_files` (its input, its directory, what its uid left behind), `_errors`.
"""

from __future__ import annotations

import math
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass

from ._bootstrap import BOOTSTRAP, SETUP_FAILED, landlock_abi
from ._bubblewrap import bubblewrap_argv
from ._errors import SandboxError, UnconfinedError
from ._files import _anonymous_file, _remove_left_behind, _remove_tree
from ._interpreter import _READ_FILES, _blocked_folder, _mode, _read_dirs, _system_paths, interpreter_view
from ._processes import MARKER_VARIABLE, _kill_group, _kill_uid, _start_time, _sweep, _wait_unreaped
from ._uids import _RETIRED, UNPRIVILEGED_UIDS, _lease_uid

# The sandbox's public names, wherever they are defined: the package's face (`__init__`) exports them.
__all__ = [
    "MARKER_VARIABLE", "SETUP_FAILED", "UNPRIVILEGED_UIDS", "Sandbox", "SandboxError", "SandboxLimits",
    "SandboxResult", "UnconfinedError", "bubblewrap_argv", "confinement", "interpreter_view", "landlock_abi",
]

# How much of stdout / stderr is kept for the caller (the rest is counted against the cap, then dropped).
STDOUT_TAIL = 16 * 1024
STDERR_TAIL = 4 * 1024


@dataclass(frozen=True)
class SandboxLimits:
    """What one program may use. Times in seconds, sizes in MiB unless said otherwise."""

    timeout: float = 10.0
    # CPU seconds (RLIMIT_CPU); None: the wall-clock timeout rounded up, plus one second so that a busy loop
    # meets the wall clock first (one cause, one status: "timeout"); the CPU limit stays as a backstop.
    cpu_time: int | None = None
    memory_mb: int = 2048
    file_size_mb: int = 16
    open_files: int = 64
    # Processes (and threads) the program may start (RLIMIT_NPROC, counted from the user's current processes;
    # a dropped uid has none). The kernel does not apply it to root: it binds for root's programs through the
    # privilege drop only.
    processes: int = 16
    # stdout + stderr together, in bytes.
    output_bytes: int = 1 << 20

    @property
    def cpu_seconds(self) -> int:
        return int(self.cpu_time) if self.cpu_time is not None else max(1, math.ceil(self.timeout)) + 1


@dataclass
class SandboxResult:
    """What became of one program."""

    # "exited" (returncode says how), "signaled" (killed by a signal, e.g. SIGXCPU/SIGKILL from a limit),
    # "timeout" (wall clock) or "output_limit" (too much output).
    status: str
    returncode: int | None
    stdout: str
    stderr: str
    wall_time: float

    @property
    def ok(self) -> bool:
        return self.status == "exited" and self.returncode == 0


# ----------------------------------------------------------------------------------------------------------
# Which layers this machine can apply, and the refusal when none keeps a program from the evaluator's files.
# ----------------------------------------------------------------------------------------------------------

_CONFINEMENT: dict | None = None
_CONFINEMENT_LOCK = threading.Lock()


def _is_root() -> bool:
    return sys.platform.startswith("linux") and os.geteuid() == 0


def confinement() -> dict:
    """Which layers this machine can apply (probed once per process): `{"landlock": abi or 0, "network": bool,
    "drop": bool (root can run programs as an unprivileged uid), "bubblewrap": path of a working bwrap or None}`."""
    global _CONFINEMENT
    with _CONFINEMENT_LOCK:
        if _CONFINEMENT is None:
            abi = landlock_abi()
            # In a folder the dropped uid may enter, so that the probe finds out whether root can drop privileges;
            # a base_dir it cannot enter is a separate, named error (`Sandbox`).
            where = next((p for p in (tempfile.gettempdir(), "/tmp") if _blocked_folder(p) is None), None)
            probe = Sandbox(
                SandboxLimits(timeout=20), base_dir=where, landlock=False, network=False, drop_privileges=False,
                bubblewrap=False, allow_unconfined=True,
            )
            layers = {"landlock": 0, "network": False, "drop": False, "bubblewrap": None}

            def works(**layer) -> bool:
                return probe._run_raw("", b"", **{"landlock": 0, "network": False, **layer})[1]

            # Each layer is tried alone (bubblewrap only on top of the drop): a child that cannot apply it never
            # says it is ready.
            if abi and works(landlock=abi):
                layers["landlock"] = abi
            linux = sys.platform.startswith("linux")
            if linux and works(network=True):
                layers["network"] = True
            if _is_root() and works(drop=True):
                layers["drop"] = True
            bwrap = shutil.which("bwrap") if layers["drop"] else None
            if bwrap and works(drop=True, network=layers["network"], bubblewrap=bwrap):
                layers["bubblewrap"] = bwrap
            _CONFINEMENT = layers
        return dict(_CONFINEMENT)


def _refusal(landlock: bool | None, drop: bool | None) -> str:
    """The one line `Sandbox` refuses with when no layer keeps a program from the evaluator's own files."""
    import platform

    euid = os.geteuid() if hasattr(os, "geteuid") else -1
    if landlock is False:
        no_landlock = "turned off"
    elif not sys.platform.startswith("linux"):
        no_landlock = "Linux only"
    elif not landlock_abi():
        no_landlock = (f"this kernel, Linux {platform.release()}, does not offer it: it needs Linux 5.13 or later, "
                       "and containers or seccomp profiles may block it")
    else:
        no_landlock = "the kernel has it, but it could not be applied here"
    if drop is False:
        no_drop = "turned off"
    elif euid != 0:
        no_drop = f"it needs root, and the evaluator runs as uid {euid}"
    else:
        no_drop = "root here cannot change to another uid"
    return (
        f"Refusing to run model-written code: neither Landlock ({no_landlock}) nor a privilege drop ({no_drop}) is "
        f"available, so each program would run as uid {euid} and could read, change and delete that user's files "
        "and signal its processes; run on a kernel with Landlock or as root, or pass "
        "`--allow_unconfined_code_execution true` to accept the risk."
    )


# ----------------------------------------------------------------------------------------------------------
# The sandbox.
# ----------------------------------------------------------------------------------------------------------


class Sandbox:
    """Runs untrusted Python programs, one process each, `workers` at a time.

    `landlock` / `network` / `drop_privileges` / `bubblewrap`: apply that confinement layer (`None`: when the
    machine supports it, see `confinement()`; `False` turns it off, e.g. to test the others alone).
    `allow_unconfined`: run programs even when neither Landlock nor the privilege drop is on (they then run
    as the evaluator's own uid); otherwise that is refused with `UnconfinedError`. `base_dir`: where the
    per-program directories are made (default: the system's temporary folder). `uids`: the unprivileged uids
    (and gids) of the privilege drop.
    """

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        workers: int | None = None,
        base_dir: str | None = None,
        landlock: bool | None = None,
        network: bool | None = None,
        drop_privileges: bool | None = None,
        bubblewrap: bool | None = None,
        allow_unconfined: bool = False,
        uids: range | None = None,
    ):
        self.limits = limits or SandboxLimits()
        self.workers = max(1, int(workers or os.cpu_count() or 1))
        self.base_dir = base_dir
        self.uids = uids if uids is not None else UNPRIVILEGED_UIDS
        asked = {"landlock": landlock, "drop": drop_privileges}
        layers = confinement() if None in (landlock, network, drop_privileges, bubblewrap) else None
        if landlock is None:
            landlock = bool(layers["landlock"])
        if network is None:
            network = layers["network"]
        if drop_privileges is None:
            drop_privileges = layers["drop"]
        self.landlock = landlock_abi() if landlock else 0
        if landlock and not self.landlock:
            raise SandboxError("Landlock was requested but this kernel does not have it.")
        self.network = bool(network)
        if drop_privileges and not _is_root():
            raise SandboxError(f"The privilege drop needs the evaluator to run as root; it runs as uid {os.geteuid()}.")
        self.drop_privileges = bool(drop_privileges)
        if bubblewrap is None:
            bwrap = layers["bubblewrap"] if self.drop_privileges else None
        elif bubblewrap:
            bwrap = shutil.which("bwrap")
            if not bwrap:
                raise SandboxError("bubblewrap was requested but `bwrap` is not installed.")
            if not self.drop_privileges:
                raise SandboxError("bubblewrap is used on top of the privilege drop only (the evaluator runs as root).")
        else:
            bwrap = None
        self.bubblewrap = bwrap
        self.allow_unconfined = bool(allow_unconfined)
        if not self.landlock and not self.drop_privileges and not self.allow_unconfined:
            raise UnconfinedError(_refusal(asked["landlock"], asked["drop"]))
        self._view_root, self._moves = None, []
        if self.drop_privileges:
            where = base_dir or tempfile.gettempdir()
            blocked = _blocked_folder(where)
            if blocked is not None:
                raise SandboxError(
                    f"The programs' directories would be made in {where}, but the unprivileged uid they run as cannot "
                    f"enter {blocked} (mode {_mode(blocked)}); choose a base_dir whose parents others may enter, "
                    "such as /tmp."
                )
            self._view_root, self._moves = interpreter_view()
        self._live: dict[int, subprocess.Popen] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._read_dirs = _read_dirs() + ([self._view_root] if self._view_root else [])
        # bubblewrap recreates the links among them (/lib64 -> usr/lib64) as well as what they point to.
        self._bubblewrap_dirs = sorted(set(self._read_dirs) | _system_paths())

    # ------------------------------------------------------------------ description

    def describe(self) -> str:
        """One line saying what runs, where, and under which limits."""
        limits = self.limits
        layers = []
        if self.drop_privileges:
            layers.append(
                f"runs as an unprivileged uid of its own ({self.uids.start}-{self.uids.stop - 1}, no groups) that owns "
                "only its directory"
                + (f" (the standard library shown to it as links under {self._view_root})" if self._view_root else "")
            )
        if self.bubblewrap:
            layers.append("inside bubblewrap (sees only Python, the system libraries, its directory and its processes)")
        if self.landlock:
            layers.append(f"writes only inside its directory (Landlock ABI {self.landlock})")
        elif self.bubblewrap:
            # bubblewrap binds only the directory writable (and a private /tmp); everything else it sees is read-only.
            layers.append("no Landlock: writes only inside its directory and a private /tmp (bubblewrap's mounts)")
        elif self.drop_privileges:
            layers.append("no Landlock: it may also write in world-writable folders (emptied after it)")
        else:
            layers.append(
                f"NO filesystem confinement (no Landlock, no privilege drop: the program runs as uid {os.geteuid()} "
                "and can read, write and delete whatever this user can; allowed by allow_unconfined)"
            )
        layers.append("no network (own network namespace)" if self.network else (
            "no TCP (Landlock)" if self.landlock >= 4 else "network NOT blocked"))
        where = self.base_dir or tempfile.gettempdir()
        return (
            f"each program in its own `{os.path.basename(sys.executable)} -s -S` process, {self.workers} at a time, "
            f"in a fresh empty directory under {where} (its HOME), with an empty environment; limits "
            f"{limits.timeout:g} s wall, {limits.cpu_seconds} s CPU, {limits.memory_mb} MB memory, "
            f"{limits.output_bytes // 1024} KB output; {'; '.join(layers)}"
        )

    # ------------------------------------------------------------------ running

    def run(self, source: str, data: bytes = b"") -> SandboxResult:
        """Run `source` (its global `SANDBOX_INPUT` holds `data`) and return how it ended."""
        result, started = self._run_raw(
            source, data, landlock=self.landlock, network=self.network, drop=self.drop_privileges,
            bubblewrap=self.bubblewrap,
        )
        if not started and result.status != "timeout":
            lines = result.stderr.strip().splitlines()
            raise SandboxError(
                lines[-1] if lines else f"the sandbox could not start a program (exit {result.returncode})"
            )
        return result

    def map(self, jobs: Iterable[tuple[str, bytes]]) -> Iterator[tuple[int, SandboxResult]]:
        """Run every `(source, data)` job, `workers` at a time; yield `(job index, result)` as they finish.

        Closing the iterator early (an error or Ctrl-C in the consumer) kills the running programs.
        """
        jobs = list(jobs)
        executor = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="sandbox")
        pending = set()
        try:
            queue = iter(enumerate(jobs))
            index_of = {}

            def submit_next() -> bool:
                item = next(queue, None)
                if item is None:
                    return False
                future = executor.submit(self.run, *item[1])
                index_of[future] = item[0]
                pending.add(future)
                return True

            # Keep only a few jobs queued ahead, so an interruption leaves little work submitted.
            for _ in range(2 * self.workers):
                if not submit_next():
                    break
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    pending.discard(future)
                    submit_next()
                    yield index_of.pop(future), future.result()
        finally:
            for future in pending:
                future.cancel()
            if pending:
                self.kill_all()
            executor.shutdown(wait=True)

    def kill_all(self) -> None:
        """SIGKILL every program still running (their process groups)."""
        with self._lock:
            live = list(self._live)
        for pid in live:
            _kill_group(pid)

    def _run_raw(
        self, source: str, data: bytes, landlock: int, network: bool, drop: bool = False, bubblewrap: str | None = None,
    ) -> tuple[SandboxResult, bool]:
        """Run one program with the given layers: its result, and whether the child put every layer in place and
        started it (it says so on a pipe it closes before the program runs)."""
        limits = self.limits
        uid = gid = lease = None
        if drop:
            uid, lease = _lease_uid(self.uids)
            gid = uid
        process = None
        swept = clean = False
        ready_read = None
        workdir = None
        try:
            workdir = tempfile.mkdtemp(prefix="trl-emo-sandbox-", dir=self.base_dir)
            os.chmod(workdir, 0o700)
            if drop:
                os.chown(workdir, uid, gid)
            marker = secrets.token_hex(12)
            env = {
                "PATH": "/usr/local/bin:/usr/bin:/bin",
                "LANG": "C.UTF-8",
                "LC_ALL": "C.UTF-8",
                "HOME": workdir,
                "TMPDIR": workdir,
                "PYTHONHASHSEED": "0",
                "PYTHONDONTWRITEBYTECODE": "1",
                "PYTHONIOENCODING": "utf-8",
                MARKER_VARIABLE: marker,
            }
            encoded = source.encode("utf-8")
            blob = str(len(encoded)).encode() + b"\n" + encoded + data
            fd = _anonymous_file(blob)
            ready_read, ready_write = os.pipe()
            os.set_blocking(ready_read, False)
            # Under bubblewrap the network namespace is its own (--unshare-net).
            flags = ("l" if landlock else "") + ("n" if network and not bubblewrap else "") + ("d" if drop else "")
            numbers = ",".join(
                str(v) for v in (
                    limits.cpu_seconds, limits.memory_mb << 20, limits.file_size_mb << 20, limits.open_files,
                    limits.processes, landlock, uid if drop else -1, gid if drop else -1,
                )
            )
            python_flags = ["-s", "-S"] + (["-P"] if sys.version_info >= (3, 11) else [])
            moves = self._moves if drop else []
            argv = [
                sys.executable, *python_flags, "-c", BOOTSTRAP, str(fd), str(ready_write), flags or "-", numbers,
                workdir, "\n".join(self._read_dirs), "\n".join(_READ_FILES),
                "\n".join(f"{old}\t{new}" for old, new in moves),
            ]
            if bubblewrap:
                argv = bubblewrap_argv(bubblewrap, workdir, self._bubblewrap_dirs, _READ_FILES, network) + argv
            started = time.monotonic()
            try:
                process = subprocess.Popen(
                    argv, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, start_new_session=True, pass_fds=(fd, ready_write), close_fds=True,
                )
            finally:
                os.close(fd)
                os.close(ready_write)
            with self._lock:
                self._live[process.pid] = process
            start_ticks = _start_time(process.pid)
            status, stdout, stderr = self._collect(process, started + limits.timeout)
            # Kill the group while the leader is unreaped (so its pid, the group's id, cannot be reused), then
            # reap it: on a timeout or the output cap at once; after a normal exit, the children it left.
            _kill_group(process.pid)
            _wait_unreaped(process.pid, time.monotonic() + 10)
            _kill_group(process.pid)
            returncode = process.wait()
            clean = _sweep(process.pid, marker, start_ticks, uid)
            swept = True
            try:
                ready = os.read(ready_read, 1) == b"1"
            except BlockingIOError:
                ready = False  # still setting up when it was killed
        finally:
            if process is not None:
                if not swept:  # interrupted: nothing of this run may outlive it
                    _kill_group(process.pid)
                    if uid is not None:
                        _kill_uid(uid)
                with self._lock:
                    self._live.pop(process.pid, None)
                for stream in (process.stdout, process.stderr):
                    stream.close()
            if ready_read is not None:
                os.close(ready_read)
            if workdir is not None:
                _remove_tree(workdir)
            if uid is not None:
                _remove_left_behind(uid)
                # The uid is free for the next program once nothing of this one is left. A process that is never
                # reaped (a PID 1 that does not reap orphans) keeps it leased, so it is not reused in this process.
                # A setup that failed before the program started (no process) ran nothing as the uid.
                if (swept and clean) or process is None:
                    os.close(lease)
                else:
                    _RETIRED.append(lease)
        if bubblewrap and 128 < returncode < 128 + signal.NSIG:
            # bwrap reports its child's death by a signal as 128 + the signal number.
            returncode = 128 - returncode
        if status == "exited" and returncode < 0:
            # SIGXCPU (or the SIGKILL past the hard limit) is the CPU-time limit: a timeout too.
            cpu_limit = returncode in (-signal.SIGXCPU, -signal.SIGKILL) and time.monotonic() - started >= limits.cpu_seconds - 0.5
            status = "timeout" if cpu_limit else "signaled"
        result = SandboxResult(
            status=status, returncode=returncode, stdout=stdout.decode("utf-8", "replace"),
            stderr=stderr.decode("utf-8", "replace"), wall_time=time.monotonic() - started,
        )
        return result, ready

    def _collect(self, process: subprocess.Popen, deadline: float) -> tuple[str, bytes, bytes]:
        """Read stdout and stderr as they come until the program exits (then what it wrote before exiting), the
        deadline passes or the cap is reached. Children that keep the pipes open do not keep us waiting."""
        out, err = process.stdout.fileno(), process.stderr.fileno()
        tails = {out: bytearray(), err: bytearray()}
        keep = {out: STDOUT_TAIL, err: STDERR_TAIL}
        total = 0
        status = None
        try:
            exit_fd = os.pidfd_open(process.pid)
        except (AttributeError, OSError):
            exit_fd = None  # no pidfd (old kernel, not Linux): poll the exit
        exited = False
        with selectors.DefaultSelector() as selector:
            for fd in tails:
                selector.register(fd, selectors.EVENT_READ)
            if exit_fd is not None:
                selector.register(exit_fd, selectors.EVENT_READ)
            while status is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    status = "timeout"
                    break
                wait_for = 0.0 if exited else remaining if exit_fd is not None else min(remaining, 0.02)
                events = selector.select(wait_for)
                got_data = False
                for key, _ in events:
                    if key.fd == exit_fd:
                        exited = True
                        continue
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        selector.unregister(key.fd)
                        continue
                    got_data = True
                    total += len(chunk)
                    tail = tails[key.fd]
                    tail += chunk
                    if len(tail) > keep[key.fd]:
                        del tail[: len(tail) - keep[key.fd]]
                if total > self.limits.output_bytes:
                    status = "output_limit"
                elif not (set(selector.get_map()) & {out, err}):
                    status = "exited"  # both pipes closed
                elif exited and not got_data:
                    status = "exited"  # it exited and what it wrote is read; its children's output does not count
                elif exit_fd is None and not exited:
                    exited = _wait_unreaped(process.pid, 0)
        if exit_fd is not None:
            os.close(exit_fd)
        if status == "exited" and not _wait_unreaped(process.pid, deadline):
            status = "timeout"  # closed its output but kept running
        return status, bytes(tails[out]), bytes(tails[err])
