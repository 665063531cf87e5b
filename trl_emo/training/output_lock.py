"""One run per `output_dir`: a lock file taken before anything is written there.

Two runs on one `output_dir` (a relaunch while the first is still alive, a scheduler's duplicate job) would interleave
their checkpoints, and one's cleanup of the staging folder would break the other's save. So the process that saves
(the main process; each node's with `save_on_each_node`) takes `output_dir/_trl_emo.lock` first:

- The file holds the holder: pid, host, when it started (and the process's start time in the kernel's clock, which
  tells a live pid from a reused one).
- The lock itself is the kernel's `flock` on that file, held for the life of the run. The kernel drops it when the
  process dies, however it dies (SIGKILL, a preempted machine's NFS lease expiring), so a lock left by a dead run
  is never in the way: it is taken over with a warning naming the dead holder. A second launch while the holder is
  alive gets `OutputDirLocked` (a `ConfigError`: one line, exit status 2) naming it.
- Where the filesystem refuses `flock` (some FUSE mounts), the file alone decides: a holder on this host whose pid is
  gone (or now another process) is stale and taken over; a holder on another host cannot be checked from here and is
  refused, the line saying which file to delete if that run is gone.

The file is not deleted when the run ends (deleting it would let a third launch create a new one while a second still
holds the old); its content is cleared. Its name starts with `_`: the Hub upload skips it.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import time

from ..core.errors import ConfigError

logger = logging.getLogger(__name__)

LOCK_FILE = "_trl_emo.lock"
_HELD: dict[str, "OutputLock"] = {}  # this process's locks, by real path of the output_dir


class OutputDirLocked(ConfigError):
    """Another live run holds the `output_dir`."""


class OutputLock:
    def __init__(self, output_dir: str, fd: int):
        self.output_dir, self.fd = output_dir, fd

    def release(self) -> None:
        """Clear the holder from the file and drop the lock (the file stays: see the module docstring)."""
        _HELD.pop(os.path.realpath(self.output_dir), None)
        try:
            os.ftruncate(self.fd, 0)
        except OSError:
            pass
        try:
            _unlock(self.fd)
        finally:
            os.close(self.fd)


def holder_text(holder: dict) -> str:
    started = holder.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if isinstance(started, (int, float)) else "?"
    return f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}, started {when}"


def take(output_dir: str) -> OutputLock:
    """Take the lock of `output_dir` (created if needed) for this process; `OutputDirLocked` when a live run holds it.
    Taking it again in the same process returns the held lock."""
    key = os.path.realpath(output_dir)
    if key in _HELD:
        return _HELD[key]
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, LOCK_FILE)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        locked = _try_lock(fd)
        holder = _read(fd)
        if locked is False:
            raise OutputDirLocked(_refusal(output_dir, path, holder))
        if holder:
            if locked is None and not _stale(holder):  # no flock here: the file alone decides
                raise OutputDirLocked(_refusal(output_dir, path, holder, checked=holder.get("host") == _host()))
            logger.warning("output_dir %s: the lock of an earlier run (%s) was left behind and no process holds it any "
                           "more; taking it over", output_dir, holder_text(holder))
        _write(fd, {"pid": os.getpid(), "host": _host(), "started": time.time(), "proc_start": _proc_start(os.getpid())})
    except BaseException:
        os.close(fd)
        raise
    lock = OutputLock(output_dir, fd)
    _HELD[key] = lock
    return lock


def held(output_dir: str) -> OutputLock | None:
    return _HELD.get(os.path.realpath(output_dir))


def release_all() -> None:
    """Give back every lock this process holds (the end of a command, whichever way it ends)."""
    for lock in list(_HELD.values()):
        lock.release()


def _refusal(output_dir: str, path: str, holder: dict, checked: bool = True) -> str:
    who = holder_text(holder) if holder else "another process"
    if checked:
        return (f"output_dir: {output_dir} is in use by another run ({who}; lock file {path}); wait for it to end, stop "
                "it, or choose another output_dir.")
    return (f"output_dir: {output_dir} is held by a run on another host ({who}; lock file {path}), which cannot be "
            "checked from here; if that run has ended, delete the lock file, or choose another output_dir.")


def _try_lock(fd: int) -> bool | None:
    """True: locked; False: another process holds it; None: this filesystem has no `flock`."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        return None


def _unlock(fd: int) -> None:
    try:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_UN)
    except (ImportError, OSError):
        pass


def _read(fd: int) -> dict:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        data = b""
        while chunk := os.read(fd, 65536):
            data += chunk
        holder = json.loads(data) if data.strip() else {}
        return holder if isinstance(holder, dict) else {}
    except (OSError, ValueError):
        return {}


def _write(fd: int, holder: dict) -> None:
    data = json.dumps(holder).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
    os.fsync(fd)


def _host() -> str:
    return socket.gethostname()


def _proc_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux `/proc/<pid>/stat`, field 22), or None."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _stale(holder: dict) -> bool:
    """Without `flock`: a holder on this host whose process is gone (or whose pid is now another process's)."""
    if holder.get("host") != _host():
        return False
    pid = holder.get("pid")
    if not isinstance(pid, int):
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass
    recorded = holder.get("proc_start")
    return recorded is not None and _proc_start(pid) not in (None, recorded)
