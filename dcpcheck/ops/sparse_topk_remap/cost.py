"""The memory a run of a sparse-topk-remap scenario holds at its peak, estimated before
anything is allocated and checked against the budget every op's estimate is
(``dcpcheck.cases.memory``): top-k 4,096 over 1,024 requests of 16 rows at DCP 64 is
within the op's limits and ends, run, in an allocator's traceback.

A scenario's cases run one DCP size after another (``op_cases.run_scenario``), so the peak
is the largest case's. A case holds its inputs (every row's picks, the block table, each
row's request: one set, every rank's inputs share it), every rank's copy of them taken
before the launch (``checks.snapshot``, for the guard check), every rank's poisoned,
guarded outputs, and the larger of two transients: the picks drawn as Python lists of
ints before they become a tensor (``case.build_case``), or the checks (a rank's entries
and the oracle's as int64 with the oracle's own temporaries, and the ``partition``
check's sets of each row's picks and of the positions read). A scenario of the
end-to-end check (``read_write``) runs one case of the fused op it names, which is that
op's estimate (``dcpcheck.ops.fused_norm_rope.cost``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dcpcheck.cases import memory
from dcpcheck.cases.scenario_files import NamedBatch, batch_rows, where_of
from dcpcheck.ops.fused_norm_rope import cost as fused_cost
from dcpcheck.ops.fused_norm_rope.scenario import SCENARIOS as FUSED_SCENARIOS
from dcpcheck.ops.fused_norm_rope.scenario import load_scenario as load_fused_scenario
from dcpcheck.ops.sparse_topk_remap.case import GUARD_ROWS, ReadWriteBatch, RemapBatch

INT32_BYTES = 4
"""Picks, block tables, requests, outputs and counts are int32."""

PY_LIST_BYTES_PER_INT = 36
"""Bytes a Python int held in a list takes: the list's pointer and the int object (28
bytes for any int past CPython's small-int cache)."""

PY_SET_BYTES_PER_INT = 92
"""Bytes a Python int held in a set takes: the int object (28) and its share of the set's
hash table (slots of 16 bytes, up to four per entry once a small set has grown)."""

CHECK_INT64_COPIES = 6
"""int64 ``[rows, topk]`` tensors a rank's checks hold at once: its entries and the
oracle's, the oracle's temporaries (the picks' blocks, offsets and owners), the
comparison."""


@dataclass(frozen=True)
class _Shape:
    """The numbers of a scenario that size its run, free to be changed one at a time
    (``memory.driving_key``) without the scenario's own checks."""

    requests: tuple[tuple[int, int], ...]  # (context, rows)
    padding: int
    topk: int
    block_size: int
    dcp_sizes: tuple[int, ...]

    @classmethod
    def of(cls, batch: RemapBatch, dcp_sizes: Sequence[int]) -> _Shape:
        return cls(batch.requests, batch.padding, batch.topk, batch.block_size, tuple(dcp_sizes))

    @property
    def rows(self) -> int:
        return batch_rows(self.requests, self.padding)

    @property
    def table_entries(self) -> int:
        """Block ids of the table: a row per request, as wide as DCP1 needs."""
        longest = max(context for context, _ in self.requests)
        return len(self.requests) * -(-longest // self.block_size)

    def case(self, dcp_size: int) -> memory.Peak:
        """What the case at ``dcp_size`` holds at its peak (module docstring)."""
        picks = self.rows * self.topk
        inputs = (picks + self.table_entries + self.rows) * INT32_BYTES
        outputs = dcp_size * (self.rows + GUARD_ROWS) * (self.topk + 1) * INT32_BYTES
        drawing = (picks + self.table_entries) * (PY_LIST_BYTES_PER_INT + INT32_BYTES)
        checking = picks * (CHECK_INT64_COPIES * 8 + 2 * PY_SET_BYTES_PER_INT)
        return memory.Peak(
            {
                "the inputs": inputs,
                "every rank's copy of the inputs": dcp_size * inputs,
                "every rank's outputs": outputs,
                "working memory (the picks drawn, the checks)": max(drawing, checking),
            }
        )

    def cheapest(self) -> dict[str, dict[str, object]]:
        """Each scenario key that may drive the size, with the fields at its cheapest value:
        the rows or the contexts of the requests (named by the request with the most),
        ``topk``, ``padding`` or ``dcp``."""
        requests = self.requests
        most_rows = max(range(len(requests)), key=lambda i: requests[i][1])
        longest = max(range(len(requests)), key=lambda i: requests[i][0])
        return {
            f"requests[{most_rows}].rows": {"requests": tuple((c, 1) for c, _ in requests)},
            f"requests[{longest}].context": {"requests": tuple((r, r) for _, r in requests)},
            "topk": {"topk": 1},
            "padding": {"padding": 0},
            "dcp": {"dcp_sizes": (1,)},
        }


def _write_side(batch: ReadWriteBatch, dcp_sizes: Sequence[int]) -> memory.Peak:
    """The fused op's case the end-to-end check runs, at the largest size, as that op
    estimates it."""
    written = load_fused_scenario(FUSED_SCENARIOS / f"{batch.write_side}.toml")
    held = fused_cost.estimate_peak_bytes(written, (max(dcp_sizes),)).total
    return memory.Peak({"the fused op's case that writes (its own estimate)": held})


def check_cost(scenario: NamedBatch, dcp_sizes: Sequence[int], budget: int | None) -> memory.Peak:
    """The estimate of a run of ``scenario`` at ``dcp_sizes``; a ``ScenarioError`` naming
    the file, the key that drives the size, the estimate and the budget if it is over
    ``budget`` bytes (``None``: no budget known, nothing refused)."""
    batch = scenario.batch
    if isinstance(batch, ReadWriteBatch):
        where = where_of(scenario.source, scenario.name)
        peak = _write_side(batch, dcp_sizes)
        return memory.checked(peak, dcp_sizes, budget, where, lambda: "write_side")
    return _check_requests(scenario, dcp_sizes, budget)


_check_requests = memory.scenario_check(_Shape.of)
