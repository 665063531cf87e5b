"""What a sandboxed interpreter needs to reach: the folders and files Landlock and bubblewrap let it read, and, for
a dropped uid that cannot enter the folders Python is installed in, a copy of the standard library it can.

A Python installation under root's mode-700 home (pyenv) is out of reach of an unprivileged uid; rather than open
that home (no mode of the original ever changes), the standard library is shown to the uid as hard links in a
root-owned, world-readable folder (`interpreter_view`), and the child rewrites `sys.path` to it.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
import tempfile
import threading

from ._errors import SandboxError

# Not mirrored for a dropped uid: installed packages (`-S` never imports them) and CPython's own test suite.
_STDLIB_SKIP = frozenset({"site-packages", "dist-packages", "test"})


def _system_paths() -> set[str]:
    """The interpreter's installation and the system library folders, as named (some are links)."""
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    roots |= {"/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin"}
    return {os.path.abspath(p) for p in roots if p and os.path.isdir(p)}


def _read_dirs() -> list[str]:
    """Where a sandboxed interpreter may read and execute: its installation and the system library folders."""
    return sorted({os.path.realpath(p) for p in _system_paths()})


_READ_FILES = ("/dev/zero", "/dev/urandom", "/dev/random", "/etc/ld.so.cache", "/etc/localtime")


def _blocked_folder(path: str) -> str | None:
    """The first folder on the way to `path` (itself included) that a user who is neither its owner nor in its
    group may not enter, as written and once links are resolved; None when there is none. (What does not exist
    yet is not judged: whoever makes it chooses its mode.)"""
    for candidate in dict.fromkeys((os.path.abspath(path), os.path.realpath(path))):
        current = "/"
        for part in [""] + [p for p in candidate.split("/") if p]:
            current = os.path.join(current, part) if part else "/"
            try:
                mode = os.stat(current).st_mode
            except FileNotFoundError:
                break
            except OSError:
                return current
            if not mode & stat.S_IXOTH:
                return current
    return None


def _mode(path: str) -> str:
    try:
        return oct(stat.S_IMODE(os.stat(path).st_mode))[2:]
    except OSError:
        return "?"


def _stdlib_folders() -> list[str]:
    """The folders a `-s -S` interpreter imports from (the standard library, its extension modules), outermost."""
    import sysconfig

    found = {sysconfig.get_path("stdlib"), sysconfig.get_path("platstdlib")}
    found |= {p for p in sys.path if os.path.basename(p) == "lib-dynload"}
    found = sorted(os.path.abspath(p) for p in found if p and os.path.isdir(p))
    return [p for p in found if not any(p.startswith(q.rstrip("/") + "/") for q in found if q != p)]


def _reachable(folder: str) -> bool:
    if _blocked_folder(folder) is not None:
        return False
    probe = os.path.join(folder, "os.py")  # a library installed with umask 077 is unreadable beyond its folders
    return not os.path.exists(probe) or bool(os.stat(probe).st_mode & stat.S_IROTH)


def _mirror(source: str, target: str) -> None:
    """Rebuild `source` under `target`: folders 755, files as hard links (same inode, mode and owner: nothing
    becomes writable), copies where a link is impossible (another filesystem) or the file is not world-readable."""
    for folder, dirs, files in os.walk(source):
        relative = os.path.relpath(folder, source)
        out = target if relative == "." else os.path.join(target, relative)
        os.makedirs(out, exist_ok=True)
        os.chmod(out, 0o755)
        if relative == ".":
            dirs[:] = [d for d in dirs if d not in _STDLIB_SKIP]
        links = [d for d in dirs if os.path.islink(os.path.join(folder, d))]
        dirs[:] = [d for d in dirs if d not in links]
        for name in files + links:
            src, dst = os.path.join(folder, name), os.path.join(out, name)
            info = os.lstat(src)
            if stat.S_ISLNK(info.st_mode):
                os.symlink(os.readlink(src), dst)
                continue
            if not stat.S_ISREG(info.st_mode):
                continue
            if info.st_mode & stat.S_IROTH:
                try:
                    os.link(src, dst)
                    continue
                except OSError:
                    pass
            shutil.copy2(src, dst)
            os.chmod(dst, 0o755 if info.st_mode & 0o111 else 0o644)


_VIEW: tuple[str | None, list[tuple[str, str]]] | None = None
_VIEW_LOCK = threading.Lock()


def interpreter_view() -> tuple[str | None, list[tuple[str, str]]]:
    """How an unprivileged uid reaches the standard library: `(None, [])` when its folders are open to others;
    otherwise `(folder, moves)`: a root-owned, world-readable copy made once per process (hard links) and the
    `(original, copy)` pairs the child rewrites `sys.path` with. The originals' modes are never changed: a home
    of mode 700 keeps everything else in it private. The copy is removed when the process exits."""
    global _VIEW
    with _VIEW_LOCK:
        if _VIEW is not None:
            return _VIEW
        hidden = [folder for folder in _stdlib_folders() if not _reachable(folder)]
        if not hidden:
            _VIEW = (None, [])
            return _VIEW
        places = [p for p in dict.fromkeys((tempfile.gettempdir(), "/tmp", "/var/tmp", "/dev/shm"))
                  if os.path.isdir(p) and _blocked_folder(p) is None]
        if not places:
            raise SandboxError(
                f"The standard library ({hidden[0]}) is out of reach of the unprivileged uid the programs run as "
                f"({_blocked_folder(hidden[0])} has mode {_mode(_blocked_folder(hidden[0]))}) and no temporary "
                "folder that uid may enter can hold a copy; install Python outside a private home (e.g. /opt or "
                "/usr/local) or let others enter its parents (chmod o+x)."
            )
        root = tempfile.mkdtemp(prefix="trl-emo-python-", dir=places[0])
        import atexit

        atexit.register(shutil.rmtree, root, True)
        moves = []
        try:
            for folder in hidden:
                copy = root + folder
                _mirror(folder, copy)
                moves.append((folder, copy))
                real = os.path.realpath(folder)
                if real != folder:
                    moves.append((real, copy))
            for _, copy in moves:  # the folders above each copy, from the temporary folder's own (700) down
                current = os.path.dirname(copy)
                while len(current) >= len(root):
                    os.chmod(current, 0o755)
                    current = os.path.dirname(current)
        except OSError as exc:
            shutil.rmtree(root, ignore_errors=True)
            raise SandboxError(
                f"The standard library ({hidden[0]}) is out of reach of the unprivileged uid the programs run as "
                f"and copying it to {places[0]} failed ({exc}); install Python outside a private home (e.g. /opt "
                "or /usr/local) or let others enter its parents (chmod o+x)."
            ) from None
        _VIEW = (root, moves)
        return _VIEW
