"""The lse-combine op's cases, one per scenario and DCP size, as ``CaseResult`` s
(``op_cases.run_scenario``): every rank's partials built, every rank's merge run in a
simulated group, the checks run over what the ranks returned. A kernel that cannot be
asked a case (an adapter's ``not_applicable``), or a DCP size that does not divide the
heads (a ``--dcp`` over a scenario's own sizes), has its checks skipped with the reason."""

from __future__ import annotations

from collections.abc import Callable

from dcpcheck.cases.verdicts import CheckResult
from dcpcheck.op_registry import LSE_COMBINE
from dcpcheck.ops import op_cases
from dcpcheck.ops.lse_combine import checks
from dcpcheck.ops.lse_combine.case import CombineBatch, CombineCase, build_case, launch_all
from dcpcheck.ops.lse_combine.chain import chain
from dcpcheck.ops.lse_combine.contract import CombineKernel, Merged
from dcpcheck.ops.lse_combine.paths import judge_paths
from dcpcheck.ops.lse_combine.scenario import SCENARIOS, scenario_to_toml

Launch = Callable[[CombineKernel, CombineCase], list[Merged]]
"""Every rank's merge of a case: ``case.launch_all`` (simulated ranks) or a real group's
(``real_ranks``)."""


def judged(
    kernel: CombineKernel, batch: CombineBatch, size: int, device, launch: Launch = launch_all
) -> list[CheckResult]:
    """Every check of the op on one case, its ranks' merges run by ``launch``; the
    kernel's exception propagates as a ``KernelError`` (the case's error)."""
    reason = op_cases.not_applicable(kernel, [(batch, size)])
    if batch.heads % size:
        reason = f"{size} ranks cannot share the {batch.heads} heads the query is gathered into"
    if reason:
        return list(checks.skipped(reason))
    case = build_case(batch, size, device)
    merged = launch(op_cases.raising(kernel), case)
    judged_here = [
        *checks.judge(case, merged),
        chain(kernel, case, device),
        *judge_paths(kernel, case, merged, launch),
    ]
    return op_cases.with_skips(judged_here, kernel)


OP_CASES = op_cases.OpCases(LSE_COMBINE, SCENARIOS, scenario_to_toml, judged)
