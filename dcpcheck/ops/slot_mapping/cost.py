"""The memory a run of a slot-mapping scenario holds at its peak, estimated before anything
is allocated and checked against the budget every op's estimate is (``dcpcheck.cases.
memory``): every request's block table is as wide as the longest request needs at the
smallest block size, so one long request among a thousand, at block size 1, asks for
tables of billions of entries.

A scenario's cases run one DCP size after another (``op_cases.run_scenario``), so the peak
is the largest case's. A case holds its inputs (each row's position, every group's block
table; one set, every rank's inputs share it), every rank's copy of them taken before the
launch (``checks.snapshot``, for the guard check), every rank's poisoned, guarded int64
mappings, and the largest of its transients: the block ids drawn as Python lists of ints
and stacked into one tensor (``case.build_case``), the oracle's mapping of a rank
(``reference.slot_mapping``: each row's request found among every request's bounds, the
tables as int64, the per-row arithmetic of each group), or the ``ownership`` check's
stack of every rank's mappings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dcpcheck.cases import memory
from dcpcheck.cases.limits import BLOCK_SIZE_MAX
from dcpcheck.cases.scenario_files import batch_rows
from dcpcheck.ops.slot_mapping.case import GUARD_ROWS, SlotMappingBatch

INT32_BYTES = 4
"""Block tables, request starts and table rows are int32."""

INT64_BYTES = 8
"""Positions and every rank's mapping are int64, as are the oracle's tables."""

PY_LIST_BYTES_PER_INT = 36
"""Bytes a Python int held in a list takes: the list's pointer and the int object (28
bytes for any int past CPython's small-int cache)."""

ROW_REQUEST_BYTES = 11
"""Bytes per (row, request) pair the oracle holds while it finds each row's request: two
comparisons and their conjunction as bools, and the rows that have one as int64."""

ORACLE_ROW_VALUES = 14
"""int64 values per row the oracle holds besides that: the row's request, table row,
position and the masks, and per group the virtual block, offset, owner, local index and
block number."""


@dataclass(frozen=True)
class _Shape:
    """The numbers of a scenario that size its run, free to be changed one at a time
    (``memory.driving_key``) without the scenario's own checks."""

    requests: tuple[tuple[int, int], ...]  # (prefix, new)
    padding: int
    block_sizes: tuple[int, ...]
    dcp_sizes: tuple[int, ...]

    @classmethod
    def of(cls, batch: SlotMappingBatch, dcp_sizes: Sequence[int]) -> _Shape:
        return cls(batch.requests, batch.padding, batch.block_sizes, tuple(dcp_sizes))

    @property
    def rows(self) -> int:
        return batch_rows(self.requests, self.padding)

    @property
    def table_entries(self) -> int:
        """Block ids of every group's table: a row per request, as wide as the longest
        request needs at the smallest block size."""
        longest = max(prefix + new for prefix, new in self.requests)
        width = -(-longest // min(self.block_sizes))
        return len(self.block_sizes) * len(self.requests) * width

    def case(self, dcp_size: int) -> memory.Peak:
        """What the case at ``dcp_size`` holds at its peak (module docstring)."""
        rows, groups, requests = self.rows, len(self.block_sizes), len(self.requests)
        inputs = rows * INT64_BYTES + (self.table_entries + 2 * requests + 1) * INT32_BYTES
        mappings = dcp_size * groups * (rows + GUARD_ROWS) * INT64_BYTES
        drawing = self.table_entries * (PY_LIST_BYTES_PER_INT + INT32_BYTES)
        drawing += rows * PY_LIST_BYTES_PER_INT
        oracle = rows * requests * ROW_REQUEST_BYTES + self.table_entries * INT64_BYTES
        oracle += rows * (ORACLE_ROW_VALUES + groups) * INT64_BYTES
        return memory.Peak(
            {
                "the inputs": inputs,
                "every rank's copy of the inputs": dcp_size * inputs,
                "every rank's slot mappings": mappings,
                "working memory (the tables drawn, the oracle, the checks)": max(
                    drawing, oracle, mappings
                ),
            }
        )

    def cheapest(self) -> dict[str, dict[str, object]]:
        """Each scenario key that may drive the size, with the fields at its cheapest value:
        the new tokens or the cached prefix of the requests (named by the request with the
        most), ``padding``, ``block_sizes`` (the widest blocks make the narrowest tables) or
        ``dcp``."""
        requests = self.requests
        most_new = max(range(len(requests)), key=lambda i: requests[i][1])
        most_prefix = max(range(len(requests)), key=lambda i: requests[i][0])
        return {
            f"requests[{most_new}].new": {"requests": tuple((p, 1) for p, _ in requests)},
            f"requests[{most_prefix}].prefix": {"requests": tuple((0, n) for _, n in requests)},
            "padding": {"padding": 0},
            "block_sizes": {"block_sizes": tuple(BLOCK_SIZE_MAX for _ in self.block_sizes)},
            "dcp": {"dcp_sizes": (1,)},
        }


check_cost = memory.scenario_check(_Shape.of)
"""The estimate of a run of a scenario at some DCP sizes; a ``ScenarioError`` naming the
file, the key that drives the size, the estimate and the budget if it is over the budget
(``None``: no budget known, nothing refused)."""
