"""The reshape-and-cache-flash op's part of ``dcpcheck selftest`` (``op_cases.selftest``):
the project's kernel passes every shipped scenario of the op at every DCP size it names,
and each mutant (``mutants``) fails at least one."""

from __future__ import annotations

from collections.abc import Callable

from dcpcheck.backend import Backend
from dcpcheck.cases.verdicts import SelftestReport, SelftestRow
from dcpcheck.ops import op_cases
from dcpcheck.ops.reshape_and_cache_flash.kernels import DESCRIPTIONS, KERNELS
from dcpcheck.ops.reshape_and_cache_flash.runner import OP_CASES
from dcpcheck.ops.reshape_and_cache_flash.scenario import load_scenarios


def run_selftest(
    backend: Backend, on_row: Callable[[SelftestRow], None] | None = None
) -> SelftestReport:
    """The op's selftest (module docstring)."""
    scenarios = load_scenarios([])
    return op_cases.selftest(OP_CASES, KERNELS, DESCRIPTIONS, scenarios, backend, on_row)
