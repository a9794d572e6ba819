"""Per-rank slot mappings and rank-local sequence lengths under DCP, from their definition
(docs/dcp-contract.md, "Ownership"): the oracle of the slot-mapping op.

A batch holds requests one after the other: request ``i`` owns rows
``query_start_loc[i] .. query_start_loc[i + 1]``; rows from ``query_start_loc[-1]`` to
``max_num_tokens`` are padding. ``idx_mapping[i]`` is the block-table row of request ``i``,
``-1`` for a request that owns no blocks (its rows are padding too). A cache group has its
own block table and block size, and is either **sharded** across the DCP ranks (a token's
slot on its owner, ``-1`` elsewhere) or **replicated** (every rank stores every token at
its global slot). Every slot a row does not get is ``-1``.

Written with integer tensor arithmetic, one vector expression per step of the definition,
so it shares nothing with a kernel's loop over requests.
"""

from __future__ import annotations

import torch

NO_SLOT = -1
"""The slot of a row with no cache entry on a rank: another rank's token, or padding."""


def _rows_of_requests(query_start_loc: torch.Tensor, num_rows: int) -> torch.Tensor:
    """The request of every batch row (``-1`` for rows past the last request): the first
    request whose end lies past the row, where that request starts at or before it.
    ``query_start_loc`` never decreases, so no other request can hold the row."""
    starts = query_start_loc[:-1].to(torch.int64)
    ends = query_start_loc[1:].to(torch.int64)
    rows = torch.arange(num_rows, dtype=torch.int64)
    request = torch.searchsorted(ends, rows, right=True)
    past_last = request >= len(ends)
    start = torch.cat([starts, rows.new_tensor([num_rows])])[request]  # past the last: none
    return torch.where(past_last | (start > rows), -1, request)


def owner_of(positions: torch.Tensor, dcp_size: int, interleave: int) -> torch.Tensor:
    """The rank that stores each position of a sharded group: positions are dealt to the
    ranks round-robin in runs of ``interleave``. (Within a virtual block of
    ``block_size * dcp_size`` positions the same holds, as the block size is a multiple of
    the interleave.)"""
    return (positions // interleave) % dcp_size


def slot_mappings(
    query_start_loc: torch.Tensor,
    positions: torch.Tensor,
    idx_mapping: torch.Tensor,
    block_tables: torch.Tensor,
    block_sizes: list[int],
    sharded: list[bool],
    dcp_size: int,
    dcp_rank: int,
    interleave: int,
    max_num_tokens: int,
) -> torch.Tensor:
    """Rank ``dcp_rank``'s slot of every row for every cache group, ``[groups,
    max_num_tokens]`` int64 (module docstring). ``block_tables`` is ``[groups, rows,
    max_blocks]``; a group's table columns past what its block size needs are unused."""
    request = _rows_of_requests(query_start_loc.cpu(), max_num_tokens)
    rows = idx_mapping.cpu().to(torch.int64)
    real = request >= 0
    table_row = torch.where(real, rows[request.clamp(min=0)], -1)
    real &= table_row >= 0
    pos = positions.cpu().to(torch.int64)[:max_num_tokens]
    pos = torch.where(real, pos, 0)
    tables = block_tables.cpu().to(torch.int64)
    out = torch.full((len(block_sizes), max_num_tokens), NO_SLOT, dtype=torch.int64)
    for group, (block, shard) in enumerate(zip(block_sizes, sharded, strict=True)):
        if shard and dcp_size > 1:
            virtual = block * dcp_size
            v_block, v_off = pos // virtual, pos % virtual
            mine = owner_of(v_off, dcp_size, interleave) == dcp_rank
            local = (v_off // (dcp_size * interleave)) * interleave + v_off % interleave
            block_index, offset = v_block, local
        else:
            mine = torch.ones_like(real)
            block_index, offset = pos // block, pos % block
        keep = real & mine
        number = tables[group, table_row.clamp(min=0), block_index.clamp(min=0)]
        out[group] = torch.where(keep, number * block + offset, NO_SLOT)
    return out


def local_seq_lens(
    seq_lens: torch.Tensor, dcp_size: int, dcp_rank: int, interleave: int
) -> torch.Tensor:
    """How many of each sequence's positions ``0 .. len - 1`` rank ``dcp_rank`` stores in a
    sharded group (int32), counted: the owner of every position below the longest length
    (:func:`owner_of`), and for each sequence the number of its positions that are this
    rank's. Summed over the ranks, the sequence's length."""
    lengths = seq_lens.cpu().to(torch.int64)
    longest = int(lengths.max()) if lengths.numel() else 0
    mine = (owner_of(torch.arange(longest), dcp_size, interleave) == dcp_rank).to(torch.int64)
    below = torch.cat([torch.zeros(1, dtype=torch.int64), mine.cumsum(0)])  # owned in [0, n)
    return below[lengths.clamp(min=0)].to(torch.int32)
