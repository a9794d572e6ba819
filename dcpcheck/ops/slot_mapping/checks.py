"""The slot-mapping op's contract (docs/dcp-contract.md, "Ownership"), each check a small
function over a launched case that returns a ``CheckResult``:

* ``slots``: every rank's slot of every row in every group is the oracle's
  (``reference.slot_mapping``), exactly: slots are integers, there is no tolerance;
* ``ownership``: in a sharded group every owned row has a slot on exactly one rank, and in
  a replicated group every rank gives it the same slot: the partition the cache writes
  follow, stated without the oracle, so a failure says which rule broke;
* ``padding``: padding rows and the rows of a request that owns no blocks get ``-1`` on
  every rank, in every group (a slot there would write a cache entry for nothing);
* ``guard``: nothing past the last row is written, and the inputs are left as they were.

A finding names the group (``slot_mapping[g]``), the rank, the first bad row and whether
that row is owned by the rank, another rank's, or padding.
"""

from __future__ import annotations

import torch

from dcpcheck.cases import op_checks
from dcpcheck.cases.verdicts import CheckResult, Finding
from dcpcheck.ops.slot_mapping.case import POISON, SlotMappingCase, launch_all, owned_rows
from dcpcheck.ops.slot_mapping.contract import PAD_SLOT, SlotMappingInputs, SlotMappingKernel
from reference import slot_mapping as oracle

CHECKS = ("slots", "ownership", "padding", "guard")
"""The checks of this module, in the order reports list them."""

INPUT_TENSORS = ("query_start_loc", "positions", "idx_mapping", "block_tables")
"""The tensors of a rank's inputs, which a launch must leave as they were."""


def expected_slots(inputs: SlotMappingInputs, max_num_tokens: int) -> torch.Tensor:
    """The oracle's mapping of one rank (``[groups, max_num_tokens]``, on the CPU)."""
    return oracle.slot_mappings(
        inputs.query_start_loc,
        inputs.positions,
        inputs.idx_mapping,
        inputs.block_tables,
        list(inputs.block_sizes),
        list(inputs.sharded),
        inputs.dcp_size,
        inputs.dcp_rank,
        inputs.interleave,
        max_num_tokens,
    )


def _finding(
    case: SlotMappingCase,
    group: int,
    rank: int | None,
    bad: torch.Tensor,
    detail: str,
    expected: torch.Tensor | None = None,
) -> Finding:
    """A finding over the rows ``bad`` marks; the first one's ownership on ``rank``:
    padding, else owned or foreign by ``expected`` (the rank's oracle mapping, which a
    finding on a row that is not padding comes with)."""
    rows = bad.nonzero().flatten().tolist()
    first = rows[0]
    ownership = None
    if rank is not None:
        ownership = "padding"
        if owned_rows(case)[first]:
            ownership = "owned" if int(expected[group, first]) >= 0 else "foreign"
    return Finding(
        field=f"slot_mapping[{group}]",
        rank=rank,
        detail=detail.format(count=len(rows)),
        token=first,
        ownership=ownership,
        count=len(rows),
        tokens=tuple(rows),
    )


def check_slots(case: SlotMappingCase) -> CheckResult:
    """Every rank's mapping equals the oracle's (module docstring)."""
    findings = []
    for rank, inputs in enumerate(case.ranks):
        got = case.outputs(rank).cpu()
        expected = expected_slots(inputs, case.max_num_tokens)
        for group in range(got.shape[0]):
            bad = got[group] != expected[group]
            if bad.any():
                unwritten = bool((got[group][bad] == POISON).all())
                detail = "never written" if unwritten else "differ from the oracle's"
                detail = "{count} row(s) " + detail
                findings.append(_finding(case, group, rank, bad, detail, expected))
    return CheckResult("slots", tuple(findings))


def check_ownership(case: SlotMappingCase) -> CheckResult:
    """Sharded groups: each owned row on exactly one rank; replicated: one slot on all."""
    owned = torch.tensor(owned_rows(case))
    outputs = torch.stack([case.outputs(rank).cpu() for rank in range(case.dcp_size)])
    findings = []
    for group, sharded in enumerate(case.batch.sharded):
        slots = outputs[:, group]  # [ranks, rows]
        if sharded:
            holders = (slots >= 0).sum(dim=0)
            bad = owned & (holders != 1)
            detail = "{count} owned row(s) have a slot on no rank or on several"
        else:
            bad = owned & (slots != slots[0]).any(dim=0)
            detail = "{count} row(s) of a replicated group differ between ranks"
        if bad.any():
            findings.append(_finding(case, group, None, bad, detail))
    return CheckResult("ownership", tuple(findings))


def check_padding(case: SlotMappingCase) -> CheckResult:
    """Padding rows and rows of requests without blocks: ``-1`` on every rank."""
    unowned = ~torch.tensor(owned_rows(case))
    findings = []
    for rank in range(case.dcp_size):
        got = case.outputs(rank).cpu()
        for group in range(got.shape[0]):
            bad = unowned & (got[group] != PAD_SLOT)
            if bad.any():
                detail = "{count} padding row(s) or row(s) without blocks are not -1"
                findings.append(_finding(case, group, rank, bad, detail))
    return CheckResult("padding", tuple(findings))


def check_guard(case: SlotMappingCase, before: tuple[SlotMappingInputs, ...]) -> CheckResult:
    """Nothing written past the last row; every input as it was (``before``: copies)."""
    findings = []
    for rank, (inputs, kept) in enumerate(zip(case.ranks, before, strict=True)):
        guard = case.buffers[rank][:, case.max_num_tokens :].cpu()
        for group in range(guard.shape[0]):
            bad = guard[group] != POISON
            if bad.any():
                rows = bad.nonzero().flatten().tolist()
                findings.append(
                    Finding(
                        field=f"slot_mapping[{group}]",
                        rank=rank,
                        detail=f"{len(rows)} slot(s) written past the last row",
                        count=len(rows),
                    )
                )
        findings.extend(op_checks.modified_inputs(rank, inputs, kept, INPUT_TENSORS))
    return CheckResult("guard", tuple(findings))


def check_launched(
    case: SlotMappingCase, before: tuple[SlotMappingInputs, ...]
) -> tuple[CheckResult, ...]:
    """Every check of the op on a launched case, in the order reports list them."""
    return (
        check_slots(case),
        check_ownership(case),
        check_padding(case),
        check_guard(case, before),
    )


LAUNCH_CHECKS: op_checks.LaunchChecks[SlotMappingKernel, SlotMappingCase] = op_checks.LaunchChecks(
    CHECKS, INPUT_TENSORS, launch_all, check_launched
)
"""How a case of the op is judged (``op_checks.LaunchChecks``)."""

snapshot = LAUNCH_CHECKS.snapshot
judge = LAUNCH_CHECKS.judge
skipped = LAUNCH_CHECKS.skipped
