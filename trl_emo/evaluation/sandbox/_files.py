"""The files of one run: its input (a file descriptor with no name), the removal of its directory, and what its
uid left in the machine's world-writable folders."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile


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


def _remove_tree(path: str) -> None:
    """Delete a program's directory (its processes are dead by now), whatever modes it left on its folders.

    Symlinks are removed, never followed; a program that replaced its own directory by a link loses the link only.
    """
    if os.path.islink(path):
        os.unlink(path)
        return
    if not os.path.isdir(path):
        return
    # Without root, a folder the program made unreadable (chmod 000) would stop rmtree. Root needs no chmod to delete,
    # and must not make one: a process of the program still alive could swap a folder for a link between the check
    # and the chmod (rmtree itself never follows links).
    for root, dirs, _ in ([] if os.geteuid() == 0 else os.walk(path)):
        for name in dirs:
            folder = os.path.join(root, name)
            if not os.path.islink(folder):
                try:
                    os.chmod(folder, 0o700)
                except OSError:
                    pass
    shutil.rmtree(path, ignore_errors=True)


# The places besides its own directory where an unprivileged uid may create files.
_WORLD_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm")


def _remove_left_behind(uid: int) -> None:
    """Delete what `uid` made in the world-writable folders (and world-writable folders inside them)."""

    def clean(folder: str, depth: int) -> None:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            return
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if info.st_uid == uid:
                if stat.S_ISDIR(info.st_mode):
                    _remove_tree(entry.path)
                else:
                    try:
                        os.unlink(entry.path)
                    except OSError:
                        pass
            elif stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_IWOTH and depth < 3:
                clean(entry.path, depth + 1)

    for folder in dict.fromkeys((tempfile.gettempdir(), *_WORLD_WRITABLE)):
        if os.path.isdir(folder):
            clean(folder, 0)
