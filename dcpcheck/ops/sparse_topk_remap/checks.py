"""The sparse-topk-remap op's contract, each check a small function over a launched case
that returns a ``CheckResult``:

* ``slots``: each rank's row holds exactly the slots the oracle gives the row's picks on
  that rank (``reference.sparse_topk_remap``, the write side's slots, numbered as rows of
  the cache's flat view: ``block_stride_rows`` rows from one block to the next): column by
  column when not compacted, as a set when compacted (the order there is not part of the
  API); slots are integers, there is no tolerance;
* ``partition``: the rows read back into picks, without the oracle: each rank's slots
  decoded through its own block table into the positions they hold (a position decoded
  on a rank is one that rank stores, so no two ranks can read one pick), which must be
  picks of the row; over the ranks, every pick of the row read;
* ``unused``: a pick of ``-1`` yields nothing (its column stays ``-1`` when not compacted;
  a row of unused picks, a padding row's, is ``-1`` on every rank);
* ``compaction``: a compacted row is its slots and then ``-1``, nothing after the first
  ``-1``;
* ``valid_counts``: where the caller asks for them, each row's count is the number of its
  entries that are slots;
* ``guard``: nothing written past the last row, nor to a count buffer the caller did not
  hand over, and the inputs left as they were;
* ``workspace``: for a prefill chunk over the gathered workspace, each rank's row holds
  exactly the oracle's rows of that workspace (``reference.sparse_topk_remap``), the same
  on every rank, column by column or as a set as ``slots`` compares.

A prefill row's entries are rows of the workspace, not cache slots: ``slots`` judges only
the decode rows of a call with a prefill workspace (a mixed batch's, request id ``-1``), and
is skipped where it has none (``workspace`` holds the prefill rows to the oracle);
``partition`` reads each entry of a prefill row back through the workspace's layout (the
rank whose part holds it, the request's start, the local index there) into the position it
holds; every rank attends the whole context, so each rank must read every pick of the row
that the block table can hold, and nothing else. A decode row's are read back as without a
workspace.

A finding names the field (``out``, ``valid_counts``), the rank and the first bad row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from dcpcheck.cases import op_checks
from dcpcheck.cases.op_checks import rows_finding
from dcpcheck.cases.verdicts import CheckResult, Finding
from dcpcheck.ops.sparse_topk_remap.case import POISON, RemapCase, launch_all
from dcpcheck.ops.sparse_topk_remap.contract import NO_SLOT, RemapInputs, RemapKernel
from reference import sparse_topk_remap as oracle

CHECKS = ("slots", "partition", "unused", "compaction", "valid_counts", "guard", "workspace")
"""The checks of this module, in the order reports list them."""

INPUT_TENSORS = ("req_id", "block_table", "token_indices")
"""The tensors of a rank's inputs, which a launch must leave as they were."""

WORKSPACE_TENSORS = ("request_ids", "starts")
"""The tensors of a prefill chunk's workspace, which a launch must leave as they were."""

NOT_CACHE_SLOTS = "a prefill chunk's entries are rows of the gathered workspace: see workspace"


def prefill_rows(inputs: RemapInputs) -> torch.Tensor:
    """Which rows are prefill rows, whose picks map into the gathered workspace (``[rows]``
    bool, on the CPU): those with a request id ``>= 0`` in a call with a prefill workspace,
    none without one."""
    if inputs.workspace is None:
        return torch.zeros(inputs.token_indices.shape[0], dtype=torch.bool)
    return inputs.workspace.request_ids.cpu() >= 0


def expected_slots(inputs: RemapInputs) -> torch.Tensor:
    """The oracle's entries of one rank, column by column (``[rows, k]``, on the CPU): in a
    call with a prefill workspace, a prefill row's are its rows of the workspace."""
    workspace = inputs.workspace
    if workspace is not None:
        return oracle.prefill_call_entries(
            inputs.req_id, inputs.block_table, workspace.request_ids, workspace.starts,
            inputs.token_indices, workspace.rank_stride, inputs.block_size, inputs.dcp_size,
            inputs.dcp_rank, inputs.interleave, inputs.block_stride_rows,
        )  # fmt: skip
    return oracle.rank_slots(
        inputs.req_id,
        inputs.block_table,
        inputs.token_indices,
        inputs.block_size,
        inputs.dcp_size,
        inputs.dcp_rank,
        inputs.interleave,
        inputs.block_stride_rows,
    )


def _slots_of(row: list[int]) -> set[int]:
    return {s for s in row if s != NO_SLOT}


def _against_oracle(
    case: RemapCase, name: str, judged: Callable[[RemapInputs], torch.Tensor], what: str
) -> CheckResult:
    """Each rank's rows where ``judged(inputs)`` hold exactly the oracle's entries
    (``expected_slots``), ``what`` naming them: as a set when compacted, else column by
    column."""
    findings = []
    for rank, inputs in enumerate(case.ranks):
        got, want = case.out(rank).to(torch.int64), expected_slots(inputs)
        rows = judged(inputs).nonzero().flatten().tolist()
        if case.batch.compact:
            got_rows, want_rows = got.tolist(), want.tolist()
            bad = [t for t in rows if _slots_of(got_rows[t]) != _slots_of(want_rows[t])]
            detail = f"{{count}} row(s) hold other {what} than the oracle's"
        else:
            differs = (got != want).any(dim=1).tolist()
            bad = [t for t in rows if differs[t]]
            detail = f"{{count}} row(s) differ from the oracle's {what}, column by column"
        if bad:
            unwritten = bool((got[bad[0]] == POISON).any())
            suffix = " (row {first} has entries never written)" if unwritten else ""
            findings.append(rows_finding("out", rank, bad, detail + suffix))
    return CheckResult(name, tuple(findings))


def check_slots(case: RemapCase) -> CheckResult:
    """Each rank's decode rows hold exactly the oracle's slots (module docstring)."""
    if bool(prefill_rows(case.ranks[0]).all()):
        return CheckResult("slots", skipped=NOT_CACHE_SLOTS)
    return _against_oracle(case, "slots", lambda inputs: ~prefill_rows(inputs), "slots")


def check_workspace(case: RemapCase) -> CheckResult:
    """Each rank's prefill rows hold exactly the oracle's rows of the gathered workspace
    (module docstring)."""
    if case.ranks[0].workspace is None:
        return CheckResult("workspace", skipped="the caller maps no prefill chunk to a workspace")
    return _against_oracle(case, "workspace", prefill_rows, "workspace rows")


@dataclass(frozen=True)
class ReadBack:
    """One rank's entries read back into the positions they hold, from the rank's block
    table and (for a prefill chunk) its workspace's layout, copied to the host once: a
    read of one element of a device tensor is a copy and a wait of its own."""

    inputs: RemapInputs
    columns: list[dict[int, int]]
    """Per row, the column of each block of the row's request's block table."""
    starts: list[int] | None
    """Per row, where its request's tokens start in each rank's part of the gathered
    workspace (None without a workspace; a decode row's entry is unused)."""

    @classmethod
    def of(cls, inputs: RemapInputs) -> ReadBack:
        tables = inputs.block_table.cpu().tolist()
        by_request = [{block: column for column, block in enumerate(t)} for t in tables]
        columns = [by_request[request] for request in inputs.req_id.cpu().tolist()]
        workspace, starts = inputs.workspace, None
        if workspace is not None:
            request_starts = workspace.starts.cpu().tolist()
            starts = [request_starts[r] for r in workspace.request_ids.cpu().tolist()]
        return cls(inputs, columns, starts)

    def slots(self, row: int, slots: list[int]) -> list[int | None]:
        """The position each slot of row ``row`` holds on this rank: a slot is a row of the
        flat view, its block the one ``stride_rows`` rows apart from the next, its offset
        what lies past the block's first row; the column of the slot's block is the virtual
        block (``block_size * dcp_size`` positions), its offset the rank's local index
        there, whose runs of ``interleave`` are the rank's among every rank's (None: a slot
        in no block of the row's request, or in the rows between two blocks)."""
        inputs, column_of = self.inputs, self.columns[row]
        size, ranks, interleave = inputs.block_size, inputs.dcp_size, inputs.interleave
        positions: list[int | None] = []
        for slot in slots:
            block, offset = divmod(slot, inputs.stride_rows)
            column = column_of.get(block)
            if column is None or offset >= size:
                positions.append(None)
                continue
            local = column * size + offset  # the rank's local index of the token
            runs, within = divmod(local, interleave)
            positions.append((runs * ranks + inputs.dcp_rank) * interleave + within)
        return positions

    def workspace_rows(self, row: int, entries: list[int]) -> list[int | None]:
        """The position each gathered-workspace row of row ``row``'s entries holds, read
        back through the workspace's layout: the rank whose part holds it, the local index
        past the request's start there, whose runs of ``interleave`` are that rank's among
        every rank's (None: a row outside every rank's part, or before the request's
        start)."""
        workspace = self.inputs.workspace
        assert workspace is not None and self.starts is not None
        start = self.starts[row]
        ranks, interleave = self.inputs.dcp_size, self.inputs.interleave
        stride = workspace.rank_stride
        positions: list[int | None] = []
        for entry in entries:
            rank, local = divmod(entry, stride) if stride else (0, entry)
            local -= start
            if rank >= ranks or local < 0:
                positions.append(None)
                continue
            runs, within = divmod(local, interleave)
            positions.append((runs * ranks + rank) * interleave + within)
        return positions


def check_partition(case: RemapCase) -> CheckResult:
    """The ranks' slots, read back into positions, are the row's picks, and every pick is
    read (module docstring); a prefill chunk's, on every rank."""
    first = case.ranks[0]
    picks = first.token_indices.cpu()
    prefill = prefill_rows(first).tolist()
    capacity = first.block_table.shape[1] * first.block_size * first.dcp_size
    picks = torch.where(picks < capacity, picks, NO_SLOT)  # past it only a prefill row's
    picked_rows = [{p for p in row if p >= 0} for row in picks.tolist()]
    findings = []
    read: list[set[int]] = [set() for _ in range(case.num_rows)]
    for rank, inputs in enumerate(case.ranks):
        out, back = case.out(rank).tolist(), ReadBack.of(inputs)
        foreign, unread = [], []
        for row in range(case.num_rows):
            slots = [s for s in out[row] if s >= 0]
            read_back = back.workspace_rows if prefill[row] else back.slots
            mine: set[int] = set()
            for position in read_back(row, slots):
                if position is None or position not in picked_rows[row]:
                    foreign.append(row)
                    break
                mine.add(position)
            read[row] |= mine
            if prefill[row] and picked_rows[row] - mine:
                unread.append(row)
        if foreign:
            detail = "{count} row(s) read a slot that holds no pick of the row on this rank"
            findings.append(rows_finding("out", rank, sorted(set(foreign)), detail))
        if unread:
            detail = "{count} row(s) of a prefill chunk leave a pick unread on this rank"
            findings.append(rows_finding("out", rank, unread, detail))
    missed = [
        row for row in range(case.num_rows) if not prefill[row] and picked_rows[row] - read[row]
    ]
    if missed:
        detail = "{count} row(s) have a pick no rank reads"
        findings.append(rows_finding("out", None, missed, detail))
    return CheckResult("partition", tuple(findings))


def check_unused(case: RemapCase) -> CheckResult:
    """A pick of ``-1`` yields nothing (module docstring)."""
    picks = case.ranks[0].token_indices.cpu()
    unused = picks < 0
    empty = unused.all(dim=1)
    findings = []
    for rank in range(case.dcp_size):
        out = case.out(rank)
        if case.batch.compact:
            bad = empty & (out != NO_SLOT).any(dim=1)
            detail = "{count} row(s) of unused picks are not -1"
        else:
            bad = (unused & (out != NO_SLOT)).any(dim=1)
            detail = "{count} row(s) have a slot in a column whose pick is -1"
        if bad.any():
            findings.append(rows_finding("out", rank, bad.nonzero().flatten().tolist(), detail))
    return CheckResult("unused", tuple(findings))


def check_compaction(case: RemapCase) -> CheckResult:
    """A compacted row is its slots, then ``-1`` (module docstring)."""
    if not case.batch.compact:
        return CheckResult("compaction", skipped="the caller does not ask for packed rows")
    findings = []
    for rank in range(case.dcp_size):
        tail = case.out(rank) == NO_SLOT
        # after the first -1, every entry is -1: the running "seen a -1" never clears
        after_gap = tail.to(torch.int32).cummax(dim=1).values.bool()
        bad = (after_gap & ~tail).any(dim=1)
        if bad.any():
            detail = "{count} row(s) have a slot after a -1"
            findings.append(rows_finding("out", rank, bad.nonzero().flatten().tolist(), detail))
    return CheckResult("compaction", tuple(findings))


def check_valid_counts(case: RemapCase) -> CheckResult:
    """Each row's count is the number of its slots (module docstring)."""
    if not case.batch.count_valid:
        return CheckResult("valid_counts", skipped="the caller does not ask for the counts")
    findings = []
    for rank in range(case.dcp_size):
        slots = (case.out(rank) >= 0).sum(dim=1).to(torch.int32)
        bad = case.valid_counts(rank) != slots
        if bad.any():
            detail = "{count} row(s) counted other than their slots"
            findings.append(
                rows_finding("valid_counts", rank, bad.nonzero().flatten().tolist(), detail)
            )
    return CheckResult("valid_counts", tuple(findings))


def check_guard(case: RemapCase, before: tuple[RemapInputs, ...]) -> CheckResult:
    """Nothing written past the last row; every input as it was (``before``: copies)."""
    findings = []
    for rank, (inputs, kept) in enumerate(zip(case.ranks, before, strict=True)):
        guards = [("out", case.outs[rank][case.num_rows :])]
        guards.append(("valid_counts", case.counts[rank][case.num_rows :]))
        if not case.batch.count_valid:
            guards.append(("valid_counts", case.counts[rank][: case.num_rows]))
        for field, guard in guards:
            written = int((guard.cpu() != POISON).sum())
            if written:
                detail = f"{written} entries written that the caller did not hand over"
                findings.append(Finding(field=field, rank=rank, detail=detail, count=written))
        findings.extend(op_checks.modified_inputs(rank, inputs, kept, INPUT_TENSORS))
        if inputs.workspace is not None and kept.workspace is not None:
            findings.extend(
                op_checks.modified_inputs(rank, inputs.workspace, kept.workspace, WORKSPACE_TENSORS)
            )
    return CheckResult("guard", tuple(findings))


def check_launched(case: RemapCase, before: tuple[RemapInputs, ...]) -> tuple[CheckResult, ...]:
    """Every check of the op on a launched case, in the order reports list them."""
    return (
        check_slots(case),
        check_partition(case),
        check_unused(case),
        check_compaction(case),
        check_valid_counts(case),
        check_guard(case, before),
        check_workspace(case),
    )


class _RemapLaunchChecks(op_checks.LaunchChecks[RemapKernel, RemapCase]):
    """The op's launch checks, whose copies before a launch hold the prefill workspace's
    tensors too (the guard check compares them)."""

    def snapshot(self, case: RemapCase) -> tuple[RemapInputs, ...]:
        kept = super().snapshot(case)
        return tuple(
            replace(k, workspace=op_checks.snapshot((k.workspace,), WORKSPACE_TENSORS)[0])
            if k.workspace is not None
            else k
            for k in kept
        )


LAUNCH_CHECKS: op_checks.LaunchChecks[RemapKernel, RemapCase] = _RemapLaunchChecks(
    CHECKS, INPUT_TENSORS, launch_all, check_launched
)
"""How a case of the op is judged (``op_checks.LaunchChecks``)."""

snapshot = LAUNCH_CHECKS.snapshot
judge = LAUNCH_CHECKS.judge
skipped = LAUNCH_CHECKS.skipped
