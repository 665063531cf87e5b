"""glibc's allocator on a CPU-only training run: keep freed memory for the next step instead of returning it.

A training step on the CPU allocates the same large buffers every time: each layer's activations (saved for the
backward pass), a fused head's `[positions, vocabulary]` tile (340 MB for SmolLM2-135M's 49,152 tokens at a GRPO step of
16 x 108 positions), its gradients. glibc serves every allocation above its mmap threshold (128 KiB, rising to 32 MiB
as it adapts) with a fresh `mmap` and returns it to the system on `free`, and trims the top of its heap as it frees,
so each step faults the same gigabytes of pages back in, zero-filled: measured at 1.0-6.4 s of a 19-25 s GRPO
step (docs/benchmarks.md, "GRPO step time (CPU)"). Serving allocations up to 1 GiB from the heap and never trimming
it keeps those pages mapped between steps; the process's resident memory then stays at its peak, which a training
process reaches at every step anyway.

`keep_freed_memory()` does it with `mallopt` for the allocations that follow (the same as starting the process with
`GLIBC_TUNABLES=glibc.malloc.mmap_threshold=1073741824:glibc.malloc.trim_threshold=...`); it does nothing where the C
library is not glibc. CUDA memory has its own caching allocator, so a GPU run does not need it.

The reuse is not immediate on every glibc. torch's CPU allocator asks for 64-byte-aligned blocks (`posix_memalign`),
and Debian 12's glibc 2.36-9+deb12u14 (measured here 2026-11-28) serves such a request above a block just freed for
the first several allocations of a size: a 64 MiB buffer allocated 24 times faulted in afresh at 8 of the first 9 and at
none of the 15 after, and the heap held about 9 such buffers (peak resident 732 MB against 285 MB with the system's
allocator). A training run reaches that steady state in its first steps; the kept heap is the cost stated above.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD = -1  # mallopt's parameters (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 1 << 30  # allocations up to 1 GiB come from the heap (and go back to it)
NO_TRIM = -1  # never give the top of the heap back to the system


def keep_freed_memory() -> bool:
    """Make glibc keep the memory a step frees for the next one (see the module docstring); True when it did."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018 - glibc only (musl has no mallopt thresholds)
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # Both, each on its own (`and` would skip the second when the first fails): either alone saves part of it.
    served_from_heap = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    never_trimmed = bool(mallopt(M_TRIM_THRESHOLD, NO_TRIM))
    return served_from_heap and never_trimmed
