"""What the processes of a launch agree on before a run touches its checkpoints: small Python objects sent over the
process group that accelerate (or torch elastic) set up, and the same calls as no-ops in a single process.

Every process calls each function at the same point, so none waits on a collective the others skip: a process that
fails sends its failure instead of raising alone (`first_failure`), and every process then raises it.
"""

from __future__ import annotations

import os
import socket


def _distributed() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if _distributed() else 1


def rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if _distributed() else 0


def broadcast(value):
    """The main process's `value`, on every process."""
    if not _distributed():
        return value
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather(value) -> list:
    """Every process's `value`, in rank order, on every process."""
    if not _distributed():
        return [value]
    import torch.distributed as dist

    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def first_failure(failure: str | None) -> str | None:
    """The first process's failure (a one-line text, or None when it succeeded), the same on every process."""
    return next((text for text in gather(failure) if text), None)


def node() -> str:
    """This process as a message names it: its node (torch elastic's `GROUP_RANK`), host and global rank."""
    number = os.environ.get("GROUP_RANK") or os.environ.get("NODE_RANK") or "0"
    return f"node {number} (host {socket.gethostname()}, rank {rank()})"
