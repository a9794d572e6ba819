"""The memory a run of an lse-combine scenario holds at its peak, estimated before anything
is allocated and checked against the budget every op's estimate is (``dcpcheck.cases.
memory``): a scenario within the op's limits (256 heads of 1,024 values, 1,024 requests of
131,072 tokens, DCP 64) can need terabytes, which a run finds out only as an allocator's
traceback.

A scenario's cases run one DCP size after another (``op_cases.run_scenario``), nothing of
one kept for the next, so the peak is the largest case's. What a case holds is what
``case.build_case`` returns (every rank's partials in the case's dtypes, the oracle's fp64
answer, each row's query, every request's keys and values), counted exactly
(tests/test_op_costs.py holds it to the tensors a built case holds), and the
largest of its transients: the fp64 partials ``build_case`` draws and rounds (every rank's,
with one request's fp64 keys and values and the oracle's logits over them), or the merge
of every rank (each rank's copy of its partials, what the simulated collectives exchange,
the merged rows) with the checks' fp64 comparisons beside it, and the chain's paged
caches of every rank's keys and values with their partials. The transients are counted
as if they coincided with the peak, so the estimate leans high.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dcpcheck.cases import memory
from dcpcheck.cases.scenario_files import batch_rows
from dcpcheck.ops.lse_combine.case import DTYPES, CombineBatch

FP64_BYTES = 8
"""The oracle's partials, answers and drawn values are fp64; row indices int64."""

INT32_BYTES = 4
"""Local lengths and query starts are int32."""

ROW_FLAGS = 2
"""Bytes a row of a case holds in bool flags (``empty_rank``, ``real``)."""

ROW_FP64_VALUES = 4
"""fp64 (or int64) values a row of a case holds besides its heads: ``lse_max``,
``row_request``, ``row_seen``, ``value_max``."""

DRAW_COPIES = 4
"""fp64 copies of one request's keys and values alive at once while ``build_case`` draws
them: each drawn, then rounded to the case's dtype and back."""

LOGIT_COPIES = 6
"""fp64 ``[heads, context]`` tensors the oracle's attention over one row holds at once:
the logits, their maximum's difference, the exponentials, the weights, and the rank's
share of each."""

MERGE_COPIES = 3
"""Copies of every rank's partial outputs a merge holds at once, each at least fp32: the
copy a rank is handed, what the simulated collectives gather, and the rescaled partials."""

CHECK_COPIES = 6
"""fp64 ``[rows, heads, head_dim]`` tensors the checks hold at once: the merged output
upcast, its difference from the oracle's, the tolerance and the masks' products."""

CHAIN_CACHE_COPIES = 2
"""Copies of every key and value the chain holds: every rank's paged latent cache, with
the shard it is filled from."""


@dataclass(frozen=True)
class _Shape:
    """The numbers of a scenario that size its run, free to be changed one at a time
    (``memory.driving_key``) without the scenario's own checks."""

    requests: tuple[tuple[int, int], ...]  # (context, queries)
    padding: int
    heads: int
    head_dim: int
    item: int  # bytes of a partial output's element
    lse_item: int  # bytes of a partial LSE
    dcp_sizes: tuple[int, ...]

    @classmethod
    def of(cls, batch: CombineBatch, dcp_sizes: Sequence[int]) -> _Shape:
        return cls(
            requests=batch.requests,
            padding=batch.padding,
            heads=batch.heads,
            head_dim=batch.head_dim,
            item=DTYPES[batch.dtype].itemsize,
            lse_item=DTYPES[batch.lse_dtype].itemsize,
            dcp_sizes=tuple(dcp_sizes),
        )

    @property
    def rows(self) -> int:
        return batch_rows(self.requests, self.padding)

    @property
    def elements(self) -> int:
        """Values of one rank's partial output: rows x heads x head_dim."""
        return self.rows * self.heads * self.head_dim

    @property
    def context(self) -> int:
        """Every request's keys, counted once."""
        return sum(context for context, _ in self.requests)

    def case(self, dcp_size: int) -> memory.Peak:
        """What the case at ``dcp_size`` holds at its peak (module docstring)."""
        rows, elements, lse_values = self.rows, self.elements, self.rows * self.heads
        longest = max(context for context, _ in self.requests)
        requests = len(self.requests)
        partials = dcp_size * (elements * self.item + lse_values * self.lse_item)
        partials += dcp_size * requests * INT32_BYTES
        oracle = elements * (2 * FP64_BYTES + self.item) + lse_values * FP64_BYTES
        oracle += rows * (ROW_FP64_VALUES * FP64_BYTES + ROW_FLAGS) + (requests + 1) * INT32_BYTES
        keys = 2 * self.context * self.head_dim * self.item
        drawing = (dcp_size * (elements + lse_values) + elements) * FP64_BYTES
        drawing += longest * (DRAW_COPIES * self.head_dim + LOGIT_COPIES * self.heads) * FP64_BYTES
        merging = MERGE_COPIES * dcp_size * elements * max(self.item, INT32_BYTES)
        merging += CHECK_COPIES * elements * FP64_BYTES
        chain = CHAIN_CACHE_COPIES * keys + dcp_size * elements * self.item + merging
        return memory.Peak(
            {
                "every rank's partials": partials,
                "the oracle's answer and the queries": oracle,
                "every request's keys and values": keys,
                "working memory (the partials drawn, the merge, the checks, the chain)": max(
                    drawing, merging, chain
                ),
            }
        )

    def cheapest(self) -> dict[str, dict[str, object]]:
        """Each scenario key that may drive the size, with the fields at its cheapest value:
        the contexts or the query rows of the requests (named by the request with the most),
        ``heads``, ``head_dim``, ``padding`` or ``dcp``."""
        requests = self.requests
        longest = max(range(len(requests)), key=lambda i: requests[i][0])
        most_rows = max(range(len(requests)), key=lambda i: requests[i][1])
        return {
            f"requests[{longest}].context": {"requests": tuple((q, q) for _, q in requests)},
            f"requests[{most_rows}].queries": {"requests": tuple((c, 1) for c, _ in requests)},
            "heads": {"heads": 1},
            "head_dim": {"head_dim": 1},
            "padding": {"padding": 0},
            "dcp": {"dcp_sizes": (1,)},
        }


check_cost = memory.scenario_check(_Shape.of)
"""The estimate of a run of a scenario at some DCP sizes; a ``ScenarioError`` naming the
file, the key that drives the size, the estimate and the budget if it is over the budget
(``None``: no budget known, nothing refused)."""
