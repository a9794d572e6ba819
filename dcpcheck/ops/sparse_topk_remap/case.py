"""One case of the sparse-topk-remap op: a batch of query rows with their top-k picks at one
DCP size, every rank's inputs, and every rank's launch into guarded outputs.

A batch is requests (a context length and a number of query rows), then padding rows. Row
``j`` of a request of ``rows`` rows sees the first ``context - rows + 1 + j`` positions (a
speculative decode's rows are causal), and picks up to ``topk - unused`` of them at random;
``duplicates`` of those picks are replaced by copies of other picks of the row; the rest
of the row is ``-1``, and the row is shuffled, so unused picks lie between used ones.
Padding rows (a CUDA graph's) pick nothing and point at the first request's table row.

The block table gives every request distinct block ids, shuffled by the seed, as wide as
one rank storing the whole context needs (DCP1): so a slot read from the wrong column or
the wrong request is another block's, never the right one by chance. Every rank gets the
same table, as the write side's oracle (``reference.slot_mapping``) uses it. Where
``gap_rows`` is set, other layers' pages sit between the cache's consecutive blocks, so
the flat row view the attention reads has its blocks ``block_size + gap_rows`` rows apart
(``contract``: ``block_stride_rows``).

A prefill batch (``prefill``) is a chunk of prefill requests under prefill context
parallelism and DCP, whose picks map into the gathered workspace (``contract``): each
request's shard in every rank's part of the workspace is as long as the largest rank's
share of its context (the rank-local length of rank 0, which positions are dealt to first),
the requests' starts follow one another from 0, and ``earlier_entries`` requests of an
earlier chunk come first in the starts (their own, from 0 too), so the rows' request ids
index past them. Its block table is as wide as the rank's share of the longest context
needs, and ``past_table`` picks of every row lie past it (the first at the first position
past it), which must come back ``-1``. Its first ``decode_requests`` requests are decode
requests of a mixed batch (vLLM puts a batch's decodes first), converted in the same call:
their rows' request ids are ``-1``, they hold no shard of the workspace, and they pick
nothing past the table.

Each rank's outputs are views into larger buffers: rows past the last are a guard band,
and the buffers start as :data:`POISON`, so an entry never written and a write past the
end are both seen (``checks``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

import torch

from dcpcheck.cases.scenario_files import batch_rows, requests_in_words
from dcpcheck.ops.sparse_topk_remap.contract import (
    DECODE_ROW,
    NO_SLOT,
    PrefillWorkspace,
    RemapInputs,
    RemapKernel,
)
from reference.slot_mapping import local_seq_lens

POISON = -7_777_777
"""Every output entry before a launch: no kernel writes it, as entries are ``>= -1``."""

GUARD_ROWS = 2
"""Rows after the last in every output buffer, which no launch may write."""


@dataclass(frozen=True)
class RemapBatch:
    """What a case of the op is drawn from (module docstring)."""

    requests: tuple[tuple[int, int], ...]  # (context length, query rows)
    topk: int
    block_size: int = 64
    interleave: int = 1
    compact: bool = False
    count_valid: bool = False
    unused: int = 0  # picks of every row left -1 beyond what a short context leaves
    duplicates: int = 0  # picks of every row that repeat another of its picks
    padding: int = 0
    seed: int = 0
    prefill: bool = False  # a prefill chunk over the gathered workspace (module docstring)
    past_table: int = 0  # picks of every row past the block table (prefill)
    earlier_entries: int = 0  # requests of an earlier chunk before the chunk's (prefill)
    decode_requests: int = 0  # the first requests decode ones, beside the chunk's (prefill)
    gap_rows: int = 0  # rows of other layers' pages between consecutive blocks of the cache

    @property
    def num_rows(self) -> int:
        return batch_rows(self.requests, self.padding)

    @property
    def summary(self) -> str:
        """The batch in a few words, as a shrunk failure is reported."""
        packed = "compacted" if self.compact else "in place"
        chunk = "a prefill chunk over the gathered workspace: " if self.prefill else ""
        if self.decode_requests:
            chunk = f"{chunk}{self.decode_requests} decode request(s) first, "
        gap = f", {self.gap_rows} rows between blocks" if self.gap_rows else ""
        return (
            f"{chunk}{requests_in_words(self.requests, self.num_rows)}, "
            f"top-{self.topk} {packed}, block size {self.block_size}{gap}, "
            f"interleave {self.interleave}"
        )


@dataclass(frozen=True)
class ReadWriteBatch:
    """A case of the end-to-end check (``read_write``): the fused op's scenario that
    writes, and how the rows read."""

    write_side: str  # a scenario of the fused op in ``scenarios/fused-norm-rope/``, by name
    topk: int
    compact: bool = False
    count_valid: bool = False
    seed: int = 0

    @property
    def summary(self) -> str:
        packed = "packed" if self.compact else "in place"
        return f"the picks of {self.write_side}'s tokens, top-{self.topk} {packed}"


@dataclass(frozen=True)
class RemapCase:
    """Every rank's inputs at one DCP size, and what each launch left (``launch_all``)."""

    batch: RemapBatch
    dcp_size: int
    ranks: tuple[RemapInputs, ...]
    outs: tuple[torch.Tensor, ...] = ()  # per rank: [rows + GUARD_ROWS, topk]
    counts: tuple[torch.Tensor, ...] = ()  # per rank: [rows + GUARD_ROWS], if asked

    @property
    def num_rows(self) -> int:
        return self.batch.num_rows

    def out(self, rank: int) -> torch.Tensor:
        """Rank ``rank``'s entries as the kernel left them (no guard rows), on the CPU."""
        return self.outs[rank][: self.num_rows].cpu()

    def valid_counts(self, rank: int) -> torch.Tensor:
        """Rank ``rank``'s valid counts as the kernel left them (no guard rows)."""
        return self.counts[rank][: self.num_rows].cpu()


def _picks(
    batch: RemapBatch, shuffle: random.Random, capacity: int = 0
) -> tuple[list[int], list[list[int]]]:
    """Every row's request and picks (module docstring); ``capacity``: the first position
    past the block table, where a prefill batch's ``past_table`` picks start."""
    requests, picks = [], []
    used = batch.topk - batch.unused - batch.past_table
    for index, (context, rows) in enumerate(batch.requests):
        for row in range(rows):
            seen = context - rows + 1 + row
            chosen = shuffle.sample(range(seen), min(seen, used))
            for copy in range(min(batch.duplicates, len(chosen) - 1)):
                chosen[copy] = chosen[-1 - copy]
            past = batch.past_table if index >= batch.decode_requests else 0
            chosen += [capacity + shuffle.randrange(64) * (k > 0) for k in range(past)]
            chosen += [NO_SLOT] * (batch.topk - len(chosen))
            shuffle.shuffle(chosen)
            requests.append(index)
            picks.append(chosen)
    requests += [0] * batch.padding
    picks += [[NO_SLOT] * batch.topk for _ in range(batch.padding)]
    return requests, picks


def _block_table(batch: RemapBatch, shuffle: random.Random, dcp_size: int) -> torch.Tensor:
    """Distinct shuffled block ids, a row per request, as wide as DCP1 needs (a prefill
    batch's: as the rank's share of the longest context needs)."""
    longest = max(context for context, _ in batch.requests)
    width = -(-longest // (batch.block_size * (dcp_size if batch.prefill else 1)))
    ids = list(range(len(batch.requests) * width))
    shuffle.shuffle(ids)
    return torch.tensor(ids, dtype=torch.int32).view(len(batch.requests), width)


def _workspace(
    batch: RemapBatch, requests: list[int], dcp_size: int, shuffle: random.Random, device
) -> PrefillWorkspace:
    """The gathered workspace's starts and rank stride for a prefill batch (module
    docstring)."""
    decodes = batch.decode_requests
    prefills = batch.requests[decodes:]
    contexts = torch.tensor([context for context, _ in prefills], dtype=torch.int32)
    shards = local_seq_lens(contexts, dcp_size, 0, batch.interleave).tolist()
    earlier = [shuffle.randrange(1, 100) for _ in range(batch.earlier_entries)]
    starts = [sum(earlier[:e]) for e in range(len(earlier))]
    starts += [sum(shards[:e]) for e in range(len(shards))]
    entries = [DECODE_ROW if r < decodes else batch.earlier_entries + r - decodes for r in requests]
    return PrefillWorkspace(
        request_ids=torch.tensor(entries, dtype=torch.int32, device=device),
        starts=torch.tensor(starts, dtype=torch.int32, device=device),
        rank_stride=sum(shards),
    )


def build_case(batch: RemapBatch, dcp_size: int, device: torch.device) -> RemapCase:
    """Every rank's inputs for ``batch`` at ``dcp_size`` (not launched yet)."""
    shuffle = random.Random(batch.seed)
    table = _block_table(batch, shuffle, dcp_size)
    capacity = table.shape[1] * batch.block_size * dcp_size
    requests, picks = _picks(batch, shuffle, capacity)
    workspace = _workspace(batch, requests, dcp_size, shuffle, device) if batch.prefill else None
    shared = RemapInputs(
        req_id=torch.tensor(requests, dtype=torch.int32, device=device),
        block_table=table.to(device),
        token_indices=torch.tensor(picks, dtype=torch.int32, device=device).view(-1, batch.topk),
        block_size=batch.block_size,
        dcp_size=dcp_size,
        dcp_rank=0,
        interleave=batch.interleave,
        compact=batch.compact,
        count_valid=batch.count_valid,
        workspace=workspace,
        block_stride_rows=batch.block_size + batch.gap_rows if batch.gap_rows else None,
    )
    ranks = tuple(replace(shared, dcp_rank=rank) for rank in range(dcp_size))
    return RemapCase(batch, dcp_size, ranks)


def launch_all(kernel: RemapKernel, case: RemapCase) -> RemapCase:
    """Launch ``kernel`` on every rank, each into its own poisoned, guarded buffers."""
    outs, counts = [], []
    rows, topk = case.num_rows, case.batch.topk
    for inputs in case.ranks:
        device = inputs.token_indices.device
        out = torch.full((rows + GUARD_ROWS, topk), POISON, dtype=torch.int32, device=device)
        count = torch.full((rows + GUARD_ROWS,), POISON, dtype=torch.int32, device=device)
        kernel(inputs, out[:rows], count[:rows] if inputs.count_valid else None)
        outs.append(out)
        counts.append(count)
    return replace(case, outs=tuple(outs), counts=tuple(counts))
