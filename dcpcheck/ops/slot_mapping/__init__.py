"""The slot-mapping op: every rank's slot of every batch row in every cache group under
DCP, and every rank's local length of every request (docs/dcp-contract.md, "Ownership"),
which every cache write and every decode attention of a layer follow. ``contract`` holds
its protocols, ``case`` a batch laid out for every rank and launched into guarded buffers,
``checks`` and ``seq_lens`` its contract, ``kernel`` the project's Triton kernels,
``mutants`` those kernels with one bug each, ``vllm`` and ``vllm_v1`` vLLM's routines;
``reference.slot_mapping`` is its oracle. ``PACKAGE`` is what the command line asks of it.
"""

from __future__ import annotations

from typing import Any

from dcpcheck.op_registry import SLOT_MAPPING
from dcpcheck.ops import OpPackage
from dcpcheck.ops.slot_mapping import cost, scenario


def _kernels():  # defines Triton kernels: only once the backend is chosen
    from dcpcheck.ops.slot_mapping import kernels

    return kernels


def _runner():
    from dcpcheck.ops.slot_mapping import runner

    return runner


def _search():
    from dcpcheck.ops.slot_mapping import search

    return search


def _selftest(backend: Any, on_row: Any = None) -> Any:
    from dcpcheck.ops.slot_mapping import selftest

    return selftest.run_selftest(backend, on_row)


PACKAGE = OpPackage(
    name=SLOT_MAPPING,
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
