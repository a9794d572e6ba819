"""One case of the slot-mapping op: a batch at one DCP size, every rank's inputs, and
every rank's launch into a guarded output.

A batch is requests (tokens already cached, tokens of this step), some of which may own
no blocks, then padding rows; it is laid out for several cache groups at once, each with
its own block size and block table and sharded or replicated. Block tables hold distinct
block ids, shuffled by the case's seed, so a slot read from the wrong table row or column
is another slot, never the right one by chance.

Each rank's output is a view into a larger buffer: the rows past ``max_num_tokens`` are a
guard band, and the whole buffer starts as :data:`POISON`, so a row never written and a
write past the end are both seen (``checks``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from dcpcheck.cases.scenario_files import batch_rows
from dcpcheck.ops.slot_mapping.contract import SlotMappingInputs, SlotMappingKernel

POISON = -7_777_777
"""Every output slot before a launch: no kernel writes it, as slots are ``>= -1``."""

GUARD_ROWS = 16
"""Rows after ``max_num_tokens`` in every output buffer, which no launch may write."""

PADDING_POSITION = 1
"""The position of padding rows (any position must be harmless there)."""


@dataclass(frozen=True)
class SlotMappingBatch:
    """What a case of the op is drawn from (module docstring)."""

    requests: tuple[tuple[int, int], ...]  # (tokens cached before this step, new tokens)
    block_sizes: tuple[int, ...]  # per cache group
    sharded: tuple[bool, ...]  # per cache group
    interleave: int = 1
    padding: int = 0
    without_blocks: tuple[int, ...] = ()  # requests that own no blocks
    seed: int = 0
    kernel_block_sizes: tuple[int, ...] = ()  # per cache group; () for the block sizes

    @property
    def num_rows(self) -> int:
        return batch_rows(self.requests, self.padding)

    @property
    def summary(self) -> str:
        """The batch in a few words, as a shrunk failure is reported."""
        return (
            f"{len(self.requests)} request(s), {self.num_rows} row(s), "
            f"{len(self.block_sizes)} group(s)"
        )


@dataclass(frozen=True)
class SlotMappingCase:
    """Every rank's inputs at one DCP size, and what each launch left (``launch_all``)."""

    batch: SlotMappingBatch
    dcp_size: int
    ranks: tuple[SlotMappingInputs, ...]
    buffers: tuple[torch.Tensor, ...] = ()  # per rank: [groups, rows + GUARD_ROWS]

    @property
    def max_num_tokens(self) -> int:
        return self.batch.num_rows

    def outputs(self, rank: int) -> torch.Tensor:
        """Rank ``rank``'s mapping as the kernel left it (no guard rows)."""
        return self.buffers[rank][:, : self.max_num_tokens]


def _block_tables(batch: SlotMappingBatch) -> torch.Tensor:
    """Per group a table of distinct shuffled block ids, as wide as the longest request
    needs at the group's block size on one rank (what DCP1 and a replicated group use; a
    sharded group under DCP reads fewer columns), padded to one width."""
    shuffle = random.Random(batch.seed)
    longest = max(cached + new for cached, new in batch.requests)
    width = max(-(-longest // size) for size in batch.block_sizes)
    tables = []
    for _ in batch.block_sizes:
        ids = list(range(len(batch.requests) * width))
        shuffle.shuffle(ids)
        tables.append(torch.tensor(ids, dtype=torch.int32).view(len(batch.requests), width))
    return torch.stack(tables)


def build_case(batch: SlotMappingBatch, dcp_size: int, device: torch.device) -> SlotMappingCase:
    """Every rank's inputs for ``batch`` at ``dcp_size`` (not launched yet)."""
    starts = [0]
    for _, new in batch.requests:
        starts.append(starts[-1] + new)
    positions = [cached + i for cached, new in batch.requests for i in range(new)]
    positions += [PADDING_POSITION] * batch.padding
    rows = [-1 if i in batch.without_blocks else i for i in range(len(batch.requests))]
    shared = SlotMappingInputs(
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        positions=torch.tensor(positions, dtype=torch.int64, device=device),
        idx_mapping=torch.tensor(rows, dtype=torch.int32, device=device),
        block_tables=_block_tables(batch).to(device),
        block_sizes=batch.block_sizes,
        sharded=batch.sharded,
        dcp_size=dcp_size,
        dcp_rank=0,
        interleave=batch.interleave,
        kernel_block_sizes=batch.kernel_block_sizes,
    )
    ranks = tuple(replace(shared, dcp_rank=rank) for rank in range(dcp_size))
    return SlotMappingCase(batch, dcp_size, ranks)


def launch_all(kernel: SlotMappingKernel, case: SlotMappingCase) -> SlotMappingCase:
    """Launch ``kernel`` on every rank, each into its own poisoned, guarded buffer."""
    buffers = []
    for inputs in case.ranks:
        groups = len(inputs.block_sizes)
        device = inputs.positions.device
        buffer = torch.full((groups, case.max_num_tokens + GUARD_ROWS), POISON, device=device)
        kernel(inputs, buffer[:, : case.max_num_tokens])
        buffers.append(buffer)
    return replace(case, buffers=tuple(buffers))


def owned_rows(case: SlotMappingCase) -> Sequence[bool]:
    """Per batch row: whether it is a real row of a request that owns blocks."""
    owned = []
    for index, (_, new) in enumerate(case.batch.requests):
        owned += [index not in case.batch.without_blocks] * new
    return owned + [False] * case.batch.padding
