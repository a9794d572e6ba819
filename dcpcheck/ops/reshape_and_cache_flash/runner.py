"""The reshape-and-cache-flash op's cases, one per scenario and DCP size, as
``CaseResult`` s: the run's data model the reports and the console already speak. A case
builds every rank's inputs, launches the kernel on each rank and runs the checks; a kernel
that cannot be asked the case has them skipped with the reason.
"""

from __future__ import annotations

import torch

from dcpcheck.cases.verdicts import CheckResult
from dcpcheck.op_registry import RESHAPE_AND_CACHE_FLASH
from dcpcheck.ops import op_cases
from dcpcheck.ops.op_cases import not_applicable, raising, with_skips
from dcpcheck.ops.reshape_and_cache_flash import checks
from dcpcheck.ops.reshape_and_cache_flash.case import CacheWriteBatch, build_case
from dcpcheck.ops.reshape_and_cache_flash.contract import CacheWriteKernel
from dcpcheck.ops.reshape_and_cache_flash.scenario import (
    SCENARIOS,
    scenario_to_toml,
)


def _judged(
    kernel: CacheWriteKernel, batch: CacheWriteBatch, size: int, device: torch.device
) -> list[CheckResult]:
    """Every check of the op on one case, or every check skipped with the reason the
    kernel cannot be asked it. A kernel that raises propagates (the case's error)."""
    case = build_case(batch, size, device)
    reason = not_applicable(kernel, case.ranks)
    if reason:
        return list(checks.skipped(reason))
    return with_skips(checks.judge(raising(kernel), case), kernel)


OP_CASES = op_cases.OpCases(
    RESHAPE_AND_CACHE_FLASH, SCENARIOS, scenario_to_toml, _judged
)
