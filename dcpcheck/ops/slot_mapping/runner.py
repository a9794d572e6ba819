"""The slot-mapping op's cases, one per scenario and DCP size, as ``CaseResult`` s: the
run's data model the reports and the console already speak.

A case builds every rank's inputs, launches each routine of the kernel (``Routines``: the
slot mappings, the local sequence lengths) on each rank, then runs that routine's checks
(a release's every routine of a kind, ``EachRoutine``, and a local-length routine its
release's callers ask in more than one way, its ``asks``, are judged each way, each
finding naming its way);
a routine that is absent, or cannot be asked the case, has its checks skipped with the
reason; one its caller asks the case otherwise than as given (the V1 table at the
interleave its runner builds it with) has its failures say so.
"""

from __future__ import annotations

from dcpcheck.cases.verdicts import CheckResult
from dcpcheck.op_registry import SLOT_MAPPING
from dcpcheck.ops import op_cases
from dcpcheck.ops.op_cases import judged_each_way
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
    if kernel.slot_mappings is None:
        checks = list(checks_of_slots.skipped(kernel.absent))
    else:
        checks = judged_each_way(
            kernel.slot_mappings,
            slot_case.ranks,
            lambda launch: checks_of_slots.judge(launch, slot_case),
            checks_of_slots.skipped,
        )
    if kernel.local_seq_lens is None:
        return checks + list(seq_lens.skipped(kernel.absent))
    lengths_case = seq_lens.build_case(batch, size, device)
    return checks + judged_each_way(
        kernel.local_seq_lens,
        lengths_case.ranks,
        lambda launch: seq_lens.judge(launch, lengths_case),
        seq_lens.skipped,
    )


OP_CASES = op_cases.OpCases(SLOT_MAPPING, SCENARIOS, scenario_to_toml, _judged)
