"""A device fault: a CUDA error (an illegal address, a device-side assert) that a launch
reports at the process's next synchronising call, after which the device runs nothing more.

It is the kernel's to answer for, not a bug of dcpcheck's, wherever it surfaces (often in
one of dcpcheck's checks), so a run stops on it with a crash record
(``dcpcheck.workflows.session``). A property search must stop on it too: Hypothesis would
replay and shrink the failing example on a device that can run nothing more, see the fault
surface at a different call each time, and end with "flaky" or "distinct failures" instead
of the fault. :func:`unshrunk` carries it past Hypothesis, and :func:`raised_as_itself`
raises it again where the search was called.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

import torch

P = ParamSpec("P")
R = TypeVar("R")


def device_fault(exc: BaseException) -> str | None:
    """The CUDA error ``exc`` reports, if it is a device fault: torch's
    ``AcceleratorError``, or a ``RuntimeError`` that says "CUDA error" as older torch
    raises it; else None."""
    said = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    accelerator = getattr(torch, "AcceleratorError", None)
    if accelerator is not None and isinstance(exc, accelerator):
        return said
    if isinstance(exc, RuntimeError) and said.startswith("CUDA error"):
        return said
    return None


class _Escaping(BaseException):
    """A device fault on its way out of a Hypothesis test: not an ``Exception``, so
    Hypothesis neither replays nor shrinks it, and lets it through at once."""

    def __init__(self, fault: Exception) -> None:
        super().__init__(str(fault))
        self.fault = fault


def unshrunk(body: Callable[P, R]) -> Callable[P, R]:
    """``body``, a Hypothesis test's, with a device fault it raises carried past
    Hypothesis (module docstring); any other exception is Hypothesis's to shrink."""

    @functools.wraps(body)
    def carried(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return body(*args, **kwargs)
        except Exception as exc:
            if device_fault(exc) is None:
                raise
            raise _Escaping(exc) from None

    return carried


@contextmanager
def raised_as_itself() -> Iterator[None]:
    """Around the call of a Hypothesis test whose body is :func:`unshrunk`: the device
    fault it carried out, raised as itself, with the traceback of where it surfaced."""
    try:
        yield
    except _Escaping as escaping:
        raise escaping.fault from None
