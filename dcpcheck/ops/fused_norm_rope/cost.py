"""The memory a scenario's run holds at its peak, estimated before anything is allocated.

``dcpcheck.cases.limits`` keeps every count of a scenario sane, but a scenario within them
can still need more memory than the machine has: a GLM-5.x prefill of 202,000 new tokens
holds tens of GiB, and finding that out by running it ends minutes later in a traceback or
an out-of-memory kill. :func:`check_cost` answers up front, from the scenario, the DCP
sizes it will run at and a memory budget (``dcpcheck.cases.memory``, which every op's
estimate is checked against), on one line naming the key that drives the size.

What is counted is what ``harness.runner.run_scenario`` keeps alive at once. The harness
sits above this package (tests/test_architecture.py), so the sizes it allocates are
restated here from ``harness.case``; tests/test_cost.py holds the estimate to the buffers
``build_case`` really allocates, and to the constants restated here.

* ``inputs``: the activations every rank reads, and the preset's cos/sin table;
* ``oracle``: the oracle's answer (outputs, fp32 values, cache encodings), kept for the
  checks;
* ``outputs``, ``caches``, ``mappings``: those of the DCP1 baseline and, beside it, of the
  largest other case (cases run one after another; the baseline stays alive for the
  cross-rank checks): every rank's poisoned outputs inside their guard rows, every rank's
  caches inside their guard blocks, each with its pristine copy, and the slot mappings;
* ``work``: the largest transient of the run: drawing the seeded values, the oracle's fp32
  pipeline, pre-writing a case's cached prefix, or a check comparing the widest field with
  the oracle's (off the bitwise-equal path, as on the CPU, where the interpreter's bf16
  rounding differs from the oracle's) or a rank's cache with its copy.

Every term is counted at the size it reaches, and the transients as if they coincided with
the peak, so the estimate leans high. Against the peak resident memory of whole runs on the
CPU (glm-5 and small presets, prefill-, prefix-, block- and DCP-heavy shapes, kernels that
write everything, nothing, or what the project's kernel writes under the interpreter) it
came out at 0.9x to 1.75x of the peak: high where the outputs match the oracle's bit for
bit, so the checks' comparisons stay on their cheap path (a correct kernel on a GPU), low
by the allocator's fragmentation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from dcpcheck.cases import memory
from dcpcheck.cases.dcp import DcpLayout, Request, blocks_needed
from dcpcheck.ops.fused_norm_rope.contract import ModelPreset, index_entry_bytes, mla_entry_bytes
from dcpcheck.ops.fused_norm_rope.scenario import Scenario

CACHE_GUARD_BLOCKS = 2
"""``guarded_cache.GUARD_BLOCKS``, restated: guard blocks on each side of every cache."""

OUTPUT_GUARD_ROWS = 2
"""``case.OUTPUT_GUARD_ROWS``, restated: guard rows on each side of every output."""

CACHE_COPIES = 2
"""Every cache storage is held twice: the one the kernel writes and its pristine copy
(``guarded_cache.GuardedCache.initial``), which the checks compare it with."""

SLOT_BYTES = 8
"""Slot mappings, positions and owners are int64."""

FP32_BYTES = 4
"""The oracle's pipeline, the cos/sin table and the prefix values are fp32."""

TOPK_BYTES = 4
"""The top-k output is int32."""

DRAW_BYTES_PER_VALUE = 24
"""Peak bytes per value while ``seeded.normal`` draws a tensor: its int32 counter and the
hash's int32 temporaries, the int64 index into the quantile table, the fp32 result."""

ORACLE_TEMPORARIES = 2
"""fp32 rows of the widest field the oracle holds besides its results while it normalizes
(``reference.norms.rms_norm``: the upcast input and the unweighted product)."""

COMPARE_BYTES_PER_VALUE = 72
"""Peak bytes per value while a check compares a field with the oracle's off the
bitwise-equal path (``harness.comparison.row_violations``): both sides' rows gathered, then
``tolerances.ulp_distance`` twice (int64 order-preserving maps of both sides, their
difference, its absolute value, NaN masks), the first result kept during the second.
Measured on the CPU: 53 for one comparison alone, up to 70 over a check's successive
fields, whose freed blocks the heap does not always reuse."""

PARTS = {
    "inputs": "the inputs",
    "oracle": "the oracle's answer",
    "outputs": "every rank's outputs",
    "caches": "every rank's caches",
    "mappings": "the slot mappings",
    "work": "working memory (values drawn, the oracle, the checks)",
}
"""What each part of a ``CostEstimate`` holds, as an error message names it."""


@dataclass(frozen=True)
class CostEstimate:
    """Bytes a run holds at its peak, by what holds them (module docstring)."""

    inputs: int
    oracle: int
    outputs: int
    caches: int
    mappings: int
    work: int

    @property
    def total(self) -> int:
        return sum(getattr(self, part.name) for part in dataclasses.fields(self))

    @property
    def peak(self) -> memory.Peak:
        """The estimate as every op's peak is said (``dcpcheck.cases.memory.Peak``)."""
        return memory.Peak({PARTS[f.name]: getattr(self, f.name) for f in dataclasses.fields(self)})

    def largest_part(self) -> str:
        """The name of the part that holds the most bytes."""
        return max(
            (part.name for part in dataclasses.fields(self)), key=lambda name: getattr(self, name)
        )


@dataclass(frozen=True)
class _Shape:
    """The numbers of a scenario that size its run, free to be changed one at a time
    (``_driving_key``) without the scenario's own checks."""

    model: ModelPreset
    act_bytes: int  # itemsize of the activation dtype
    mla_entry: int  # bytes of one MLA cache entry
    indexer: str
    block_size: int
    block_gap: int  # bytes between blocks (Scenario.block_gap)
    requests: tuple[Request, ...]
    padding: int
    dcp_sizes: tuple[int, ...]

    @classmethod
    def of(cls, scenario: Scenario, dcp_sizes: Sequence[int]) -> _Shape:
        model = scenario.model
        return cls(
            model=model,
            act_bytes=scenario.torch_dtype.itemsize,
            mla_entry=mla_entry_bytes(
                scenario.cache_layout, model.kv_lora_rank, model.rope_dim, scenario.torch_dtype
            ),
            indexer=scenario.indexer,
            block_size=scenario.block_size,
            block_gap=scenario.block_gap,
            requests=scenario.batch.requests,
            padding=scenario.batch.padding,
            dcp_sizes=tuple(dcp_sizes),
        )

    @property
    def rows(self) -> int:
        """Rows every rank's kernel sees: new tokens, then padding."""
        return sum(r.new for r in self.requests) + self.padding

    @property
    def prefix_tokens(self) -> int:
        return sum(r.prefix for r in self.requests)

    @property
    def index_dim(self) -> int:
        """Width of the indexer key on an indexer layer, 0 on a shared one."""
        return 0 if self.indexer == "none" else self.model.index_head_dim

    @property
    def token_width(self) -> int:
        """Values of one token's activations (and of its outputs but top-k)."""
        p = self.model
        return p.q_lora_rank + p.kv_lora_rank + p.rope_dim + self.index_dim

    @property
    def widest(self) -> int:
        """The widest row a check or the oracle works on at once."""
        return max(self.model.q_lora_rank, self.model.kv_lora_rank, self.index_dim)

    def blocks(self, dcp_size: int) -> int:
        """Blocks of each rank's cache: one per block-table entry of the batch, numbered
        from 0 in either block-table mode (``dcp.build_block_tables``)."""
        layout = DcpLayout(self.block_size, dcp_size)
        return sum(blocks_needed(r, layout) for r in self.requests)

    def rank_cache(self, dcp_size: int) -> int:
        """Bytes of one rank's cache storages at ``dcp_size``, guard blocks and the gaps
        between blocks included."""
        mla_block = self.block_size * self.mla_entry + self.block_gap
        mla = (self.blocks(dcp_size) + 2 * CACHE_GUARD_BLOCKS) * mla_block
        if self.indexer == "none":
            return mla
        # A replicated indexer stores every token on every rank, at its DCP1 slot.
        index_blocks = self.blocks(1 if self.indexer == "replicated" else dcp_size)
        index_block = self.block_size * index_entry_bytes(self.model.index_head_dim)
        return mla + (index_blocks + 2 * CACHE_GUARD_BLOCKS) * (index_block + self.block_gap)

    def case(self, dcp_size: int) -> tuple[int, int, int]:
        """(outputs, caches, mappings) of the case at ``dcp_size``, every rank's."""
        output_row = self.token_width * self.act_bytes + self.model.topk * TOPK_BYTES
        outputs = dcp_size * (self.rows + 2 * OUTPUT_GUARD_ROWS) * output_row
        caches = dcp_size * CACHE_COPIES * self.rank_cache(dcp_size)
        # Position, request and owner of each token, and per rank its slots and the copy
        # the kernel gets; a replicated indexer has a second set of slots.
        slot_sets = 2 if self.indexer == "replicated" else 1
        tokens = self.rows + self.prefix_tokens
        mappings = (3 + 2 * slot_sets * dcp_size) * tokens * SLOT_BYTES
        return outputs, caches, mappings


def _estimate(shape: _Shape) -> CostEstimate:
    p, act = shape.model, shape.act_bytes
    rows, widest = shape.rows, shape.widest
    fp32_width = shape.token_width - p.q_lora_rank  # kv, kpe, index_k kept in fp32
    index_entry = index_entry_bytes(p.index_head_dim) if shape.index_dim else 0
    inputs = rows * (shape.token_width * act + SLOT_BYTES)
    inputs += p.max_position * p.rope_dim * FP32_BYTES
    oracle = rows * (shape.token_width * act + fp32_width * FP32_BYTES)
    oracle += rows * (shape.mla_entry + index_entry)

    others = [n for n in shape.dcp_sizes if n != 1]
    largest = max(others, key=lambda n: sum(shape.case(n)), default=None)
    alive = [1] if largest is None else [1, largest]
    outputs, caches, mappings = (sum(parts) for parts in zip(*map(shape.case, alive), strict=True))

    # build_case draws the prefix values of all three keys, the indexer's even without one
    prefix_widths = (p.kv_lora_rank, p.rope_dim, p.index_head_dim)
    work = max(
        rows * widest * DRAW_BYTES_PER_VALUE,
        rows * (shape.token_width + ORACLE_TEMPORARIES * widest) * FP32_BYTES,
        shape.prefix_tokens
        * (sum(prefix_widths) * FP32_BYTES + max(prefix_widths) * DRAW_BYTES_PER_VALUE)
        + shape.rank_cache(1),  # the prefix entries written into a copy of the cache
        rows * widest * COMPARE_BYTES_PER_VALUE,
        # a stray-write check: a flag per byte of a rank's cache, and a count per entry
        # (int64, fewer bytes than the entry's); the DCP1 rank's cache is the largest
        2 * shape.rank_cache(1),
    )
    return CostEstimate(inputs, oracle, outputs, caches, mappings, work)


def estimate_peak_bytes(scenario: Scenario, dcp_sizes: Sequence[int]) -> CostEstimate:
    """What a run of ``scenario`` at ``dcp_sizes`` (its DCP1 baseline runs besides) holds
    at its peak, by part (module docstring)."""
    return _estimate(_Shape.of(scenario, dcp_sizes))


def _driving_key(shape: _Shape) -> str:
    """The scenario key whose smallest value would shrink the estimate the most: the new
    tokens or the cached prefix of the requests (named by the request with the most),
    ``padding``, ``dcp`` or ``block_size``; the earlier on a tie."""
    requests = shape.requests
    most_new = max(range(len(requests)), key=lambda i: requests[i].new)
    most_prefix = max(range(len(requests)), key=lambda i: requests[i].prefix)
    smallest = {
        f"requests[{most_new}].new": {"requests": tuple(Request(r.prefix, 1) for r in requests)},
        f"requests[{most_prefix}].prefix": {"requests": tuple(Request(0, r.new) for r in requests)},
        "padding": {"padding": 0},
        "dcp": {"dcp_sizes": (1,)},
        "block_size": {"block_size": 1},
    }
    return memory.driving_key(lambda changed: _estimate(changed).total, shape, smallest)


def check_cost(scenario: Scenario, dcp_sizes: Sequence[int], budget: int | None) -> memory.Peak:
    """The estimate's peak (``CostEstimate.peak``) of a run of ``scenario`` at
    ``dcp_sizes``; a ``ScenarioError`` if it is over ``budget`` bytes (``None``: no
    budget known, nothing refused).

    The one-line message names the scenario's file (else its name), the key that drives
    the size (``_driving_key``), the estimate and the budget.
    """
    shape = _Shape.of(scenario, dcp_sizes)
    estimate = _estimate(shape)
    part = estimate.largest_part()
    largest = (PARTS[part], getattr(estimate, part))
    problem = memory.refusal(estimate.total, largest, {1, *shape.dcp_sizes}, budget)
    if problem is not None:
        raise scenario.error(_driving_key(shape), problem)
    return estimate.peak
