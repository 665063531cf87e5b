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
  and processes where the limit binds (not for root, whose process count the kernel never limits);
- where the kernel has Landlock (Linux >= 5.13), a filesystem policy: write anywhere beneath its directory,
  read and execute only the Python installation, the system library folders and its directory; no TCP
  connect/bind (Landlock ABI >= 4) and no signals to processes outside the sandbox (ABI >= 6);
- where user namespaces are allowed, a network namespace of its own: no network at all;
- a wall-clock timeout and an output cap (stdout + stderr, read incrementally as it is produced): past either,
  the process group is killed;
- at the end, whatever happened, SIGKILL to its process group, then to every process still in its session
  or carrying its marker (children that started their own session); then its directory is deleted.

A confinement layer that was found available (`confinement()`) and then fails to apply in a child is an
error (`SandboxError`), never a silent run without it.
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

# Exit status of a child that could not put its confinement in place (the program never ran).
SETUP_FAILED = 121
# How much of stdout / stderr is kept for the caller (the rest is counted against the cap, then dropped).
STDOUT_TAIL = 16 * 1024
STDERR_TAIL = 4 * 1024
MARKER_VARIABLE = "TRL_EMO_SANDBOX"

# Landlock (include/uapi/linux/landlock.h). The syscall numbers are the same on every architecture.
_LANDLOCK_CREATE_RULESET, _LANDLOCK_ADD_RULE, _LANDLOCK_RESTRICT_SELF = 444, 445, 446


class SandboxError(RuntimeError):
    """The sandbox itself failed (not the program): a confinement layer could not be applied."""


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
    # Processes the program may start (RLIMIT_NPROC, counted from the user's current processes);
    # the kernel does not apply this limit to root.
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
# The child side: run with `python -s -S -P -c _BOOTSTRAP <fd> <flags> <limits> <dirs>` before the program.
# Standard library only, and only what is cheap to import (no json, re or ast: every program pays for them).
# ----------------------------------------------------------------------------------------------------------

_BOOTSTRAP = r'''
import os, sys, resource

def _landlock(abi, write_dir, read_dirs, read_files):
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    fs_rights = (1 << 13) - 1                       # ABI 1: execute .. make_sym
    if abi >= 2: fs_rights |= 1 << 13               # refer
    if abi >= 3: fs_rights |= 1 << 14               # truncate
    if abi >= 5: fs_rights |= 1 << 15               # ioctl_dev
    net_rights = 3 if abi >= 4 else 0               # bind_tcp | connect_tcp: none allowed
    scoped = 3 if abi >= 6 else 0                   # abstract unix sockets, signals: own domain only
    attr = (ctypes.c_uint64 * 3)(fs_rights, net_rights, scoped)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = libc.syscall(%(create)d, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")

    class PathBeneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    read = (1 << 0) | (1 << 2) | (1 << 3)           # execute, read_file, read_dir
    file_rights = (1 << 0) | (1 << 1) | (1 << 2) | (((1 << 14) if abi >= 3 else 0))

    def allow(path, rights, required):
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            if required:
                raise
            return
        try:
            if not os.path.isdir(path):
                rights &= file_rights
            rule = PathBeneath(rights & fs_rights, fd)
            added = libc.syscall(%(add)d, ctypes.c_int(ruleset), ctypes.c_int(1), ctypes.byref(rule), ctypes.c_uint32(0))
            if added < 0:
                if required:
                    raise OSError(ctypes.get_errno(), "landlock_add_rule " + path)
        finally:
            os.close(fd)

    allow(write_dir, fs_rights, True)
    for path in read_dirs:
        allow(path, read, False)
    for path in read_files:
        allow(path, 1 << 2, False)                  # read_file
    allow("/dev/null", (1 << 1) | (1 << 2) | (1 << 14), False)   # read, write, truncate
    if libc.prctl(38, 1, 0, 0, 0) != 0:             # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.syscall(%(restrict)d, ctypes.c_int(ruleset), ctypes.c_uint32(0)) < 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    os.close(ruleset)

def _own_network():
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(0x10000000 | 0x40000000) != 0:  # CLONE_NEWUSER | CLONE_NEWNET
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUSER | CLONE_NEWNET)")

def _user_processes(uid):
    count = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                count += os.stat("/proc/" + name).st_uid == uid
            except OSError:
                pass
    return count

def _boot():
    fd = int(sys.argv[1])
    flags = sys.argv[2]
    cpu, memory, fsize, nofile, nproc, abi = (int(v) for v in sys.argv[3].split(","))
    write_dir = sys.argv[4]
    read_dirs = [p for p in sys.argv[5].split("\n") if p]
    read_files = [p for p in sys.argv[6].split("\n") if p]
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    data = b"".join(chunks)
    del chunks
    split = data.index(b"\n")
    size = int(data[:split])
    source = data[split + 1 : split + 1 + size].decode("utf-8")
    payload = data[split + 1 + size :]
    del data
    try:
        uid = os.getuid()
        # A new user namespace counts its processes from zero; otherwise the limit counts all of the user's
        # (counted now: Landlock hides /proc). Root is never limited by the kernel.
        base = 0 if uid == 0 or "n" in flags else _user_processes(uid)
        if "n" in flags:
            _own_network()
        if "l" in flags:
            _landlock(abi, write_dir, read_dirs, read_files)
        if uid != 0:
            resource.setrlimit(resource.RLIMIT_NPROC, (base + nproc, base + nproc))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    except BaseException as exc:
        os.write(2, ("sandbox setup failed: %%r\n" %% (exc,)).encode())
        os._exit(%(failed)d)
    sys.argv = [""]
    namespace = {"__name__": "__main__", "__builtins__": __builtins__, "SANDBOX_INPUT": payload}
    del payload
    exec(compile(source, "<sandbox>", "exec"), namespace)

_boot()
''' % {
    "create": _LANDLOCK_CREATE_RULESET, "add": _LANDLOCK_ADD_RULE, "restrict": _LANDLOCK_RESTRICT_SELF,
    "failed": SETUP_FAILED,
}


# ----------------------------------------------------------------------------------------------------------
# The parent side.
# ----------------------------------------------------------------------------------------------------------


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 when Landlock is absent (or not Linux)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        version = libc.syscall(_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    except (OSError, AttributeError):
        return 0
    return max(0, int(version))


def _read_dirs() -> list[str]:
    """Where a sandboxed interpreter may read and execute: its installation and the system library folders."""
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    roots |= {"/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin"}
    return sorted(os.path.realpath(p) for p in roots if p and os.path.isdir(p))


_READ_FILES = ("/dev/zero", "/dev/urandom", "/dev/random", "/etc/ld.so.cache", "/etc/localtime")

_CONFINEMENT: dict | None = None
_CONFINEMENT_LOCK = threading.Lock()


def confinement() -> dict:
    """Which layers this machine can apply: `{"landlock": abi or 0, "network": bool}` (probed once per process)."""
    global _CONFINEMENT
    with _CONFINEMENT_LOCK:
        if _CONFINEMENT is None:
            abi = landlock_abi()
            probe = Sandbox(SandboxLimits(timeout=20), landlock=False, network=False)
            layers = {"landlock": 0, "network": False}
            # Each layer is tried alone: a child that cannot apply it exits with SETUP_FAILED.
            if abi and probe._run_raw("", b"", landlock=abi, network=False).returncode == 0:
                layers["landlock"] = abi
            if sys.platform.startswith("linux") and probe._run_raw("", b"", landlock=0, network=True).returncode == 0:
                layers["network"] = True
            _CONFINEMENT = layers
        return dict(_CONFINEMENT)


class Sandbox:
    """Runs untrusted Python programs, one process each, `workers` at a time.

    `landlock` / `network`: apply that confinement layer (`None`: when the machine supports it, see
    `confinement()`). `base_dir`: where the per-program directories are made (default: the system's temporary
    folder).
    """

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        workers: int | None = None,
        base_dir: str | None = None,
        landlock: bool | None = None,
        network: bool | None = None,
    ):
        self.limits = limits or SandboxLimits()
        self.workers = max(1, int(workers or os.cpu_count() or 1))
        self.base_dir = base_dir
        if landlock is None or network is None:
            layers = confinement()
            landlock = bool(layers["landlock"]) if landlock is None else landlock
            network = layers["network"] if network is None else network
        self.landlock = landlock_abi() if landlock else 0
        if landlock and not self.landlock:
            raise SandboxError("Landlock was requested but this kernel does not have it.")
        self.network = bool(network)
        self._live: dict[int, subprocess.Popen] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._read_dirs = _read_dirs()

    # ------------------------------------------------------------------ description

    def describe(self) -> str:
        """One line saying what runs, where, and under which limits."""
        limits = self.limits
        layers = []
        layers.append(
            f"writes only inside its directory (Landlock ABI {self.landlock})" if self.landlock
            else "NO filesystem confinement (this kernel has no Landlock: the program can write wherever this user can)"
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
        result = self._run_raw(source, data, landlock=self.landlock, network=self.network)
        if result.status == "exited" and result.returncode == SETUP_FAILED and "sandbox setup failed" in result.stderr:
            raise SandboxError(result.stderr.strip().splitlines()[-1])
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

    def _run_raw(self, source: str, data: bytes, landlock: int, network: bool) -> SandboxResult:
        limits = self.limits
        workdir = tempfile.mkdtemp(prefix="trl-emo-sandbox-", dir=self.base_dir)
        os.chmod(workdir, 0o700)
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
        flags = ("l" if landlock else "") + ("n" if network else "") or "-"
        numbers = ",".join(
            str(v) for v in (
                limits.cpu_seconds, limits.memory_mb << 20, limits.file_size_mb << 20, limits.open_files,
                limits.processes, landlock,
            )
        )
        python_flags = ["-s", "-S"] + (["-P"] if sys.version_info >= (3, 11) else [])
        argv = [
            sys.executable, *python_flags, "-c", _BOOTSTRAP, str(fd), flags, numbers, workdir,
            "\n".join(self._read_dirs), "\n".join(_READ_FILES),
        ]
        started = time.monotonic()
        process = None
        try:
            try:
                process = subprocess.Popen(
                    argv, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, start_new_session=True, pass_fds=(fd,), close_fds=True,
                )
            finally:
                os.close(fd)
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
            _sweep(process.pid, marker, start_ticks)
        finally:
            if process is not None:
                with self._lock:
                    self._live.pop(process.pid, None)
                for stream in (process.stdout, process.stderr):
                    stream.close()
            _remove_tree(workdir)
        if status == "exited" and returncode < 0:
            # SIGXCPU (or the SIGKILL past the hard limit) is the CPU-time limit: a timeout too.
            cpu_limit = returncode in (-signal.SIGXCPU, -signal.SIGKILL) and time.monotonic() - started >= limits.cpu_seconds - 0.5
            status = "timeout" if cpu_limit else "signaled"
        return SandboxResult(
            status=status, returncode=returncode, stdout=stdout.decode("utf-8", "replace"),
            stderr=stderr.decode("utf-8", "replace"), wall_time=time.monotonic() - started,
        )

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


def _anonymous_file(blob: bytes) -> int:
    """A readable fd holding `blob`, with no name in any directory (memfd, else an unlinked temporary file)."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("trl-emo-sandbox-input", os.MFD_CLOEXEC)
    else:
        handle = tempfile.TemporaryFile()
        fd = os.dup(handle.fileno())
        handle.close()
    view = memoryview(blob)
    while view:
        written = os.write(fd, view)
        view = view[written:]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _wait_unreaped(pid: int, deadline: float) -> bool:
    """Wait until `pid` has exited without reaping it (so its pid stays ours); False at the deadline."""
    while True:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None:
                return True
        except ChildProcessError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.002)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _proc_stat(pid: str) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (state is [0], pgrp [2], session [3], starttime [19])."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            text = handle.read()
    except OSError:
        return None
    return text[text.rfind(b")") + 2 :].decode().split()


def _start_time(pid: int) -> int:
    fields = _proc_stat(str(pid))
    return int(fields[19]) if fields else 0


def _sweep(leader: int, marker: str, start_ticks: int) -> None:
    """SIGKILL every process left in the program's session or group, or carrying its marker (a child that
    started its own session); repeat until none is found (a dying process may have forked)."""
    if not os.path.isdir("/proc"):
        return
    needle = f"{MARKER_VARIABLE}={marker}".encode()
    me = os.getpid()
    for _ in range(10):
        found = False
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) == me:
                continue
            fields = _proc_stat(name)
            if fields is None or fields[0] in ("Z", "X"):
                continue
            ours = int(fields[2]) == leader or int(fields[3]) == leader
            if not ours and int(fields[19]) >= start_ticks:
                try:
                    with open(f"/proc/{name}/environ", "rb") as handle:
                        ours = needle in handle.read()
                except OSError:
                    pass
            if ours:
                found = True
                try:
                    os.kill(int(name), signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        if not found:
            return
        time.sleep(0.01)


def _remove_tree(path: str) -> None:
    """Delete a program's directory (its processes are dead by now), whatever modes it left on its folders.

    Symlinks are removed, never followed; a program that replaced its own directory by a link loses the link only.
    """
    if os.path.islink(path):
        os.unlink(path)
        return
    if not os.path.isdir(path):
        return
    # Without root, a folder the program made unreadable (chmod 000) would stop rmtree.
    for root, dirs, _ in os.walk(path):
        for name in dirs:
            folder = os.path.join(root, name)
            if not os.path.islink(folder):
                try:
                    os.chmod(folder, 0o700)
                except OSError:
                    pass
    shutil.rmtree(path, ignore_errors=True)
