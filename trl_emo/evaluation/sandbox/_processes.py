"""Finding and killing what a program left running: its process group, its session, the processes that carry its
marker or run as its uid (read from `/proc`), without reaping its leader before its group is dead (so that the
group's id cannot be reused by another process meanwhile)."""

from __future__ import annotations

import os
import signal
import time

# In every program's environment, with a value drawn per run: how the sweep recognizes a child that left the
# program's session.
MARKER_VARIABLE = "TRL_EMO_SANDBOX"


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


def _real_uid(pid: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status", "rb") as handle:
            for line in handle:
                if line.startswith(b"Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _kill_uid(uid: int) -> None:
    """SIGKILL every process running as `uid`, until none is left (a dying process may have forked)."""
    for _ in range(20):
        found = False
        for name in os.listdir("/proc"):
            if name.isdigit() and _real_uid(name) == uid:
                fields = _proc_stat(name)
                if fields is None or fields[0] in ("Z", "X"):
                    continue
                found = True
                try:
                    os.kill(int(name), signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        if not found:
            return
        time.sleep(0.01)


def _sweep(leader: int, marker: str, start_ticks: int, uid: int | None = None) -> bool:
    """SIGKILL every process left in the program's session or group, carrying its marker (a child that started
    its own session) or running as its uid (which also finds one that erased its environment); repeat until none
    is found (a dying process may have forked). With a uid, also wait (2 s at most) until its killed processes
    are reaped: until then the kernel counts them against the next program's `RLIMIT_NPROC`. Returns whether
    nothing of the uid is left."""
    if not os.path.isdir("/proc"):
        return True
    needle = f"{MARKER_VARIABLE}={marker}".encode()
    me = os.getpid()
    for _ in range(10 if uid is None else 200):
        found = reaping = False
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) == me:
                continue
            fields = _proc_stat(name)
            if fields is None:
                continue
            dead = fields[0] in ("Z", "X")
            recent = int(fields[19]) >= start_ticks
            if dead:
                reaping = reaping or (uid is not None and recent and _real_uid(name) == uid)
                continue
            ours = int(fields[2]) == leader or int(fields[3]) == leader
            if not ours and recent:
                ours = uid is not None and _real_uid(name) == uid
                if not ours:
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
        if not found and not reaping:
            return True
        time.sleep(0.01)
    return False
