"""The uids of the privilege drop: one per running program, leased through a lock file so that no two programs,
even of two evaluations, share one; a crashed evaluator's leases end with it (flock), and whatever it left running
as a uid is killed before the uid is used again."""

from __future__ import annotations

import os
import stat
import tempfile
import threading

from ._errors import SandboxError
from ._processes import _kill_uid

# The uids (and gids, same numbers) root's programs run as, one per running program. Inside 16 bits, so they
# exist in containers that map only 0-65535; in the block systemd documents as unused (60578-61183: above
# regular users, below its DynamicUser range 61184-65519). A number NSS knows as a user or group is skipped.
UNPRIVILEGED_UIDS = range(60600, 61100)


_NAMED: dict[int, bool] = {}
_SWEPT: set[int] = set()
# Lock fds of uids whose processes could not be cleared away; held until this process exits.
_RETIRED: list[int] = []
_LEASES_LOCK = threading.Lock()


def _named(number: int) -> bool:
    """Whether `number` is a user or a group the system knows (NSS): such a number is never leased."""
    with _LEASES_LOCK:
        if number not in _NAMED:
            import grp
            import pwd

            known = False
            for lookup in (pwd.getpwuid, grp.getgrgid):
                try:
                    lookup(number)
                    known = True
                except KeyError:
                    pass
            _NAMED[number] = known
        return _NAMED[number]


def _leases_folder() -> str:
    """Root's private folder of lock files, one per uid in use (on /run: emptied at boot)."""
    parent = "/run" if os.path.isdir("/run") and os.access("/run", os.W_OK) else tempfile.gettempdir()
    folder = os.path.join(parent, "trl-emo-sandbox-uids")
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0 or info.st_mode & 0o077:
        raise SandboxError(
            f"{folder} holds the locks of the sandbox's unprivileged uids and must be a folder of root's with mode "
            "700; it is not (someone else made it?): remove it."
        )
    return folder


def _lease_uid(uids: range) -> tuple[int, int]:
    """`(uid, lock fd)`: a uid no other program (of this evaluation or another) is running as, until the lock fd
    is closed. flock, so a crashed evaluator's leases end with it."""
    import fcntl

    folder = _leases_folder()
    for uid in uids:
        if _named(uid):
            continue
        fd = os.open(os.path.join(folder, str(uid)), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        with _LEASES_LOCK:
            first = uid not in _SWEPT
            _SWEPT.add(uid)
        if first:  # a crashed evaluator may have left processes running as it
            _kill_uid(uid)
        return uid, fd
    raise SandboxError(
        f"All {len(uids)} unprivileged uids of the sandbox ({uids.start}-{uids.stop - 1}) are in use or named "
        "users; run fewer programs at once."
    )
