"""The reshape-and-cache-flash op: the paged K/V cache write of non-MLA attention, which under
DCP must write, on each rank, exactly the tokens its slot mapping gives it and nothing else.
``contract`` holds its protocol, ``case`` a step's tokens laid out for every rank and
launched into poisoned caches, ``checks`` its contract, ``kernel`` the project's Triton
kernel, ``mutants`` it with one bug each, ``vllm`` a release's function as its attention
backend calls it; ``reference.reshape_and_cache_flash`` is its oracle. ``PACKAGE`` is what
the command line asks of it.
"""

from __future__ import annotations

from typing import Any

from dcpcheck.op_registry import RESHAPE_AND_CACHE_FLASH
from dcpcheck.ops import OpPackage
from dcpcheck.ops.reshape_and_cache_flash import cost, scenario


def _kernels():  # defines Triton kernels: only once the backend is chosen
    from dcpcheck.ops.reshape_and_cache_flash import kernels

    return kernels


def _runner():
    from dcpcheck.ops.reshape_and_cache_flash import runner

    return runner


def _search():
    from dcpcheck.ops.reshape_and_cache_flash import search

    return search


def _selftest(backend: Any, on_row: Any = None) -> Any:
    from dcpcheck.ops.reshape_and_cache_flash import selftest

    return selftest.run_selftest(backend, on_row)


PACKAGE = OpPackage(
    name=RESHAPE_AND_CACHE_FLASH,
    scenarios=scenario.SCENARIOS,
    load_scenarios=scenario.load_scenarios,
    load_scenario=scenario.load_scenario,
    kernel=lambda spec: _kernels().load(spec),
    judged_files=lambda spec: _kernels().judged_files(spec),
    canonical=lambda spec: _kernels().canonical(spec),
    kernels=lambda: dict(_kernels().DESCRIPTIONS),
    run_scenario=lambda *args: _runner().run_scenario(*args),
    save_failed_case=lambda *args: _runner().save_failed_case(*args),
    search=lambda *args: _search().search(*args),
    save_search=lambda *args: _search().save_outcome(*args),
    selftest=_selftest,
    check_cost=cost.check_cost,
)
