"""Why a ``--kernel`` cannot be had, as the exit codes tell them apart
(``dcpcheck.exit_codes``): :class:`KernelLoadError` for what a revision decides (125, which
``git bisect run`` skips), :class:`KernelSpecError` for what no revision would fix (2).

The loaders of files and modules (``loading``) and of vLLM releases (``releases``) raise
them and their subclasses, so every command and op that loads a kernel tells them apart by
type alone: a release cache that cannot be trusted is a :class:`KernelSpecError` wherever
it is found, whichever op's file it was.
"""

from __future__ import annotations


class KernelLoadError(RuntimeError):
    """The kernel cannot be imported, compiled or found (exit code 125)."""


class KernelSpecError(KernelLoadError):
    """The ``--kernel`` spec (or its adapter, or the release cache it reads) is wrong in
    itself: no revision of any file would load it, so it is bad input (exit code 2), not a
    revision to skip (125)."""
