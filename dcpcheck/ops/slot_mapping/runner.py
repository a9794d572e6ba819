"""The slot-mapping op's cases, one per scenario and DCP size, as ``CaseResult`` s: the
run's data model the reports and the console already speak.

A case builds every rank's inputs, launches each routine of the kernel (``Routines``: the
slot mappings, the local sequence lengths) on each rank, then runs that routine's checks
(a local-length routine its release's callers ask in more than one way, its ``asks``, is
judged each way, each finding naming its way);
a routine that is absent, or cannot be asked the case, has its checks skipped with the
reason; one its caller asks the case otherwise than as given (the V1 table at the
interleave its runner builds it with) has its failures say so.
"""

from __future__ import annotations

from dcpcheck.cases.verdicts import CheckResult
from dcpcheck.op_registry import SLOT_MAPPING
from dcpcheck.ops import op_cases
from dcpcheck.ops.op_cases import not_applicable, raising, with_caller_notes, with_skips
from dcpcheck.ops.slot_mapping import checks as checks_of_slots
from dcpcheck.ops.slot_mapping import seq_lens
from dcpcheck.ops.slot_mapping.case import SlotMappingBatch, build_case
from dcpcheck.ops.slot_mapping.contract import Routines
from dcpcheck.ops.slot_mapping.scenario import SCENARIOS, scenario_to_toml


def _judged(kernel: Routines, batch: SlotMappingBatch, size: int, device) -> list[CheckResult]:
    """Every check of the op on one case: each routine launched on every rank and judged,
    or its checks skipped with the reason it is absent or cannot be asked. A routine
    that raises propagates (the case's error)."""
    slot_case = build_case(batch, size, device)
    reason = kernel.absent if kernel.slot_mappings is None else None
    reason = reason or not_applicable(kernel.slot_mappings, slot_case.ranks)
    if reason:
        checks = list(checks_of_slots.skipped(reason))
    else:
        assert kernel.slot_mappings is not None
        judged = checks_of_slots.judge(raising(kernel.slot_mappings), slot_case)
        noted = with_caller_notes(judged, kernel.slot_mappings, slot_case.ranks)
        checks = with_skips(noted, kernel.slot_mappings)
    lengths_case = seq_lens.build_case(batch, size, device)
    routine = kernel.local_seq_lens
    if routine is None:
        return checks + list(seq_lens.skipped(kernel.absent))
    by_ask = []
    for label, ask in getattr(routine, "asks", (("", routine),)):
        reason = not_applicable(ask, lengths_case.ranks)
        if reason:
            by_ask.append((label, seq_lens.skipped(reason)))
        else:
            judged = seq_lens.judge(raising(ask), lengths_case)
            by_ask.append((label, tuple(with_skips(judged, routine))))
    return checks + seq_lens.merged(by_ask)


OP_CASES = op_cases.OpCases(SLOT_MAPPING, SCENARIOS, scenario_to_toml, _judged)
