"""The child side of `_sandbox`: the bootstrap program that puts a program's confinement in place, then runs it.

`Sandbox` starts every program as `python -s -S -P -c BOOTSTRAP ...`; the bootstrap applies the layers the parent
chose (Landlock, a network namespace, the privilege drop, the resource limits) through system calls made with
ctypes, says it is ready on a pipe, and only then runs the program. The parent's probe of the same Landlock call
(`landlock_abi`) lives here too, so that the system-call numbers are written once.
"""

from __future__ import annotations

import sys

# Exit status of a child that could not put its confinement in place (the program never ran).
SETUP_FAILED = 121

# Landlock (include/uapi/linux/landlock.h). The syscall numbers are the same on every architecture.
_LANDLOCK_CREATE_RULESET, _LANDLOCK_ADD_RULE, _LANDLOCK_RESTRICT_SELF = 444, 445, 446


# ----------------------------------------------------------------------------------------------------------
# The child side: run with `python -s -S -P -c BOOTSTRAP <fd> <status fd> <flags> <numbers> <dirs> <moves>`
# before the program. Flags: l (Landlock), n (network namespace), d (privilege drop). Standard library only, and
# only what is cheap to import (no json, re or ast: every program pays for them).
# ----------------------------------------------------------------------------------------------------------

BOOTSTRAP = r'''
import os, sys, resource

def _libc():
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return ctypes, libc

def _no_new_privs(ctypes, libc):
    if libc.prctl(38, 1, 0, 0, 0) != 0:             # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")

def _landlock(abi, write_dir, read_dirs, read_files):
    ctypes, libc = _libc()
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
    _no_new_privs(ctypes, libc)
    if libc.syscall(%(restrict)d, ctypes.c_int(ruleset), ctypes.c_uint32(0)) < 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    os.close(ruleset)

def _own_network(root):
    ctypes, libc = _libc()
    # Root needs no user namespace for a network namespace, and one would leave the dropped uid unmapped.
    flags = 0x40000000 if root else 0x10000000 | 0x40000000     # CLONE_NEWNET (| CLONE_NEWUSER)
    if libc.unshare(flags) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET)" if root else "unshare(CLONE_NEWUSER | CLONE_NEWNET)")

def _drop(uid, gid):
    ctypes, libc = _libc()                          # imported while the standard library is still in reach
    _no_new_privs(ctypes, libc)                     # a setuid-root program (su, sudo, mount) gives no root back
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid) or os.getgroups():
        raise OSError("the privilege drop to uid %%d did not take" %% uid)
    try:
        os.setuid(0)
    except PermissionError:
        pass
    else:
        raise OSError("the privilege drop to uid %%d could be undone" %% uid)
    try:
        os.kill(-1, 9)                              # whatever a crashed evaluator left running as this uid
    except (ProcessLookupError, PermissionError):
        pass

def _relocate(moves):
    # The standard library's folders as this uid reaches them: in sys.path and in packages already imported
    # (encodings imports its codecs lazily).
    def move(path):
        for old, new in moves:
            if path == old or path.startswith(old + "/"):
                return new + path[len(old):]
        return path
    sys.path[:] = [move(p) for p in sys.path]
    for module in list(sys.modules.values()):
        search = getattr(module, "__path__", None)
        if isinstance(search, list):
            search[:] = [move(p) for p in search]
    sys.path_importer_cache.clear()

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
    fd, status = int(sys.argv[1]), int(sys.argv[2])
    flags = sys.argv[3]
    cpu, memory, fsize, nofile, nproc, abi, uid, gid = (int(v) for v in sys.argv[4].split(","))
    write_dir = sys.argv[5]
    read_dirs = [p for p in sys.argv[6].split("\n") if p]
    read_files = [p for p in sys.argv[7].split("\n") if p]
    moves = [line.split("\t") for line in sys.argv[8].split("\n") if line]
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
        root = os.geteuid() == 0
        drop = "d" in flags
        # The limit counts all of the user's processes: a dropped uid has only this one (its leftovers are
        # killed below); a new user namespace counts from zero; otherwise count them now (Landlock hides /proc).
        # Root is never limited by the kernel.
        base = 1 if drop else 0 if root or "n" in flags else _user_processes(os.getuid())
        if "n" in flags:
            _own_network(root)
        if "l" in flags:
            _landlock(abi, write_dir, read_dirs, read_files)
        if drop:
            _drop(uid, gid)
            os.chdir(write_dir)                     # under bubblewrap, only the dropped uid may enter it
            os.environ.pop("PWD", None)             # set by bubblewrap: the environment is ours alone
        if drop or not root:
            resource.setrlimit(resource.RLIMIT_NPROC, (base + nproc, base + nproc))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        if moves:
            _relocate(moves)
        os.write(status, b"1")                      # ready: everything above is in place
        os.close(status)
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
