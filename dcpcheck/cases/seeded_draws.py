"""Seeded property searches that draw the same examples in every process.

Hypothesis (from 6.131) mixes into its draws, now and then, constants it finds in the
source of the project's modules loaded at that moment (``hypothesis.internal.conjecture.
providers``: ``_get_local_constants``). So one seed would draw different examples in a
process that has imported more of dcpcheck (a test suite's worker) than in one that has
not (a ``dcpcheck run``), and a search could find a failure in one and miss it in the
other. A seeded search promises its draws, so inside :func:`seed_alone` that pool is empty
and the draws depend on the seed and the strategy only. Where the installed Hypothesis has no such
pool, there is nothing to empty.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def seed_alone() -> Iterator[None]:
    """Inside the ``with``, Hypothesis draws no constant of the loaded modules' source
    (module docstring); its cache of constants is emptied on the way in and out, so no
    draw outside sees the empty pool either."""
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:  # a Hypothesis without the module has no pool to empty
        yield
        return
    pool = getattr(providers, "_get_local_constants", None)
    constants = getattr(providers, "Constants", None)
    cache = getattr(getattr(providers, "CONSTANTS_CACHE", None), "cache", None)
    if pool is None or constants is None:
        yield
        return
    empty = constants()
    providers._get_local_constants = lambda: empty
    if cache is not None:
        cache.clear()
    try:
        yield
    finally:
        providers._get_local_constants = pool
        if cache is not None:
            cache.clear()
