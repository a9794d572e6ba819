"""The memory a run of a reshape-and-cache-flash scenario holds at its peak, estimated
before anything is allocated and checked against the budget every op's estimate is
(``dcpcheck.cases.memory``).

A scenario's cases run one DCP size after another (``op_cases.run_scenario``), so the peak
is the largest case's. A case holds its keys and values (one packed buffer every rank
shares), every rank's slot mapping and its copy of the inputs taken before the launch
(``checks.snapshot``), and every rank's cache storage: the whole table's blocks and the
guard blocks, on every rank, as a rank under DCP is handed a cache as large as DCP1's. The
checks hold, one rank at a time, the oracle's storage, a poisoned one to compare with, an
element-address map of the storage (int64) and a few boolean and integer views of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dcpcheck.cases import memory
from dcpcheck.cases.scenario_files import batch_rows
from dcpcheck.ops.reshape_and_cache_flash.case import DTYPES, GUARD_BLOCKS, CacheWriteBatch

INT64_BYTES = 8

CHECK_STORAGE_COPIES = 4
"""Storage-sized tensors of the cache's element size the checks hold at once: the oracle's,
the poisoned one, the rank's launched one as integers, and a comparison."""


@dataclass(frozen=True)
class _Shape:
    """The numbers of a scenario that size its run (``memory.driving_key``)."""

    requests: tuple[tuple[int, int], ...]
    padding: int
    kv_heads: int
    head_size: int
    element: int
    block_size: int
    dcp_sizes: tuple[int, ...]

    @classmethod
    def of(cls, batch: CacheWriteBatch, dcp_sizes: Sequence[int]) -> _Shape:
        element = 1 if batch.kv_cache_dtype == "fp8" else DTYPES[batch.dtype].itemsize
        return cls(
            batch.requests, batch.padding, batch.kv_heads, batch.head_size, element,
            batch.block_size, tuple(dcp_sizes),
        )  # fmt: skip

    def case(self, dcp_size: int) -> memory.Peak:
        """What the case at ``dcp_size`` holds at its peak (module docstring)."""
        tokens = batch_rows(self.requests, self.padding)
        longest = max((p + n for p, n in self.requests), default=1)
        blocks = len(self.requests) * -(-longest // self.block_size) + GUARD_BLOCKS
        entry = self.kv_heads * self.head_size
        storage = blocks * self.block_size * 2 * entry  # elements
        inputs = tokens * 2 * entry * self.element * 2 + tokens * INT64_BYTES
        return memory.Peak(
            {
                "the keys and values": inputs,
                "every rank's slot mapping and copy of the inputs": dcp_size * inputs,
                "every rank's cache": dcp_size * storage * self.element,
                "working memory (the checks)": storage
                * (CHECK_STORAGE_COPIES * self.element + 2 * INT64_BYTES + 1),
            }
        )

    def cheapest(self) -> dict[str, dict[str, object]]:
        """Each scenario key that may drive the size, with the fields at its cheapest value."""
        requests = self.requests or ((0, 1),)
        most = max(range(len(requests)), key=lambda i: sum(requests[i]))
        return {
            f"requests[{most}].prefix": {"requests": tuple((0, n) for _, n in self.requests)},
            f"requests[{most}].new": {"requests": tuple((p, 1) for p, _ in self.requests)},
            "kv_heads": {"kv_heads": 1},
            "head_size": {"head_size": 16},
            "padding": {"padding": 0},
            "dcp": {"dcp_sizes": (1,)},
        }


check_cost = memory.scenario_check(_Shape.of)
