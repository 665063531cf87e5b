"""The bubblewrap (`bwrap`) command line: an extra layer on top of the privilege drop, where it is installed."""

from __future__ import annotations

import os
from collections.abc import Iterable


def bubblewrap_argv(
    bwrap: str, workdir: str, read_dirs: Iterable[str], read_files: Iterable[str], network: bool
) -> list[str]:
    """The `bwrap` command line that runs the child (appended after it) in namespaces of its own, where only
    `read_dirs` and `read_files` (read-only) and `workdir` (read-write) exist, plus a private `/proc`, `/dev` and
    `/tmp`. The child starts as root with only CAP_SETUID and CAP_SETGID, which it needs for the privilege drop
    and loses with it."""
    argv = [
        bwrap, "--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
        *(["--unshare-net"] if network else []),
        "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
        # Before the binds: a bind below /tmp (the directory, the standard library's copy) must not be hidden.
        "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
    ]
    # Not --new-session: the child stays in the program's process group, which is how it is killed; it has no
    # controlling terminal to misuse (the sandbox already started it in a session of its own).
    made = {"/", "/proc", "/dev", "/tmp"}
    bound: list[str] = []

    def inside(path: str, folders: Iterable[str]) -> bool:
        return any(path == f or path.startswith(f.rstrip("/") + "/") for f in folders)

    def add(path: str, how: str) -> None:
        if inside(path, bound) or (path.startswith("/dev/") and how == "--ro-bind"):
            return  # already visible through a bound folder; /dev has its own
        if how == "--ro-bind" and os.path.islink(path):  # /lib64 -> usr/lib64: the loader's path must exist
            how, source = "--symlink", os.readlink(path)
        else:
            source = path
        chain, current = [], os.path.dirname(path)
        while current not in made and not inside(current, bound):
            chain.append(current)
            current = os.path.dirname(current)
        # bwrap makes missing parents with mode 700, which the dropped uid could not enter: make them 755.
        for folder in reversed(chain):
            argv.extend(["--dir", folder])
            made.add(folder)
        argv.extend([how, source, path])
        bound.append(path)

    for path in sorted(read_dirs, key=lambda p: (len(p), p)):
        add(path, "--ro-bind")
    for path in read_files:
        if os.path.exists(path):
            add(path, "--ro-bind")
    add(workdir, "--bind")
    # Without CAP_DAC_OVERRIDE root may not enter the directory (the dropped uid's, mode 700): the child enters
    # it once it runs as that uid.
    argv.extend(["--chdir", "/", "--"])
    return argv
