"""The sparse-topk-remap op: each DCP rank's local slots of a sparse attention's top-k token
picks, which must be where the write side put those tokens, on their owner and nowhere
else. ``contract`` holds its protocol, ``case`` a batch of picks laid out for every rank
and launched into guarded buffers, ``checks`` its contract, ``kernel`` the project's
Triton kernel, ``mutants`` it with one bug each; ``reference.sparse_topk_remap`` is its
oracle, built on the write side's (``reference.slot_mapping``). ``PACKAGE`` is what the
command line asks of it.
"""

from __future__ import annotations

from typing import Any

from dcpcheck.op_registry import SPARSE_TOPK_REMAP
from dcpcheck.ops import OpPackage
from dcpcheck.ops.sparse_topk_remap import cost, scenario


def _kernels():  # defines Triton kernels: only once the backend is chosen
    from dcpcheck.ops.sparse_topk_remap import kernels

    return kernels


def _runner():
    from dcpcheck.ops.sparse_topk_remap import runner

    return runner


def _search():
    from dcpcheck.ops.sparse_topk_remap import search

    return search


def _selftest(backend: Any, on_row: Any = None) -> Any:
    from dcpcheck.ops.sparse_topk_remap import selftest

    return selftest.run_selftest(backend, on_row)


PACKAGE = OpPackage(
    name=SPARSE_TOPK_REMAP,
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
