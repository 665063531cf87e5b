"""The sandbox's own failures, apart from what a program does: raised by the parts of the sandbox that set up a layer
(the uid leases, the standard library's copy), so they live below all of them."""

from __future__ import annotations


class SandboxError(RuntimeError):
    """The sandbox itself failed (not the program): a confinement layer could not be applied."""


class UnconfinedError(SandboxError):
    """Neither Landlock nor a privilege drop is available, and running unconfined was not accepted."""
