"""The process's entry point, ``python -m dcpcheck`` and the ``dcpcheck`` script: the
command line (``dcpcheck.cli.command_line``), its modules loaded with Python's cyclic
garbage collector off (:func:`uncollected`)."""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Iterator
from typing import NoReturn


@contextlib.contextmanager
def uncollected() -> Iterator[None]:
    """Inside, the cyclic garbage collector does not run; what was loaded is frozen on the
    way out (``gc.freeze``: no later collection walks it), then the collector runs again
    if it ran before.

    Why: loading torch, Triton and dcpcheck makes about a million objects that live as
    long as the process, and the collector walks them over and over while they load: on 2
    CPU cores, 0.38 s of the 2.9 s ``dcpcheck run`` spends importing, and every full
    collection of the run after it walks them again. Module objects hold few cycles to
    reclaim, so freezing them keeps nothing alive that a collection would have freed but
    those few."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if collecting:
            gc.enable()


def main() -> NoReturn:
    """``dcpcheck ARGS``: the command line, loaded :func:`uncollected`; in a resident
    server's fork where the environment asks for one (``dcpcheck.resident``)."""
    from dcpcheck import resident  # no torch: it decides whether this process needs it

    if resident.wanted():
        resident.run_command(sys.argv[1:])
    with uncollected():
        from dcpcheck.cli import command_line  # here: inside ``uncollected``

    command_line()


if __name__ == "__main__":
    main()
