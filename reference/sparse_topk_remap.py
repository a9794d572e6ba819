"""What each DCP rank must read for a sparse attention's top-k token ids: the oracle of the
sparse-topk-remap op.

A sparse MLA backend's indexer picks, for each query row, up to ``k`` tokens of the row's
request by their position ``p`` in the request (``-1`` for an unused pick). Under DCP the
token at ``p`` was written to one rank only, at the local slot the write side gave it, so
the read side must turn ``p`` into that slot on its owner and into nothing elsewhere.

The slot is defined once, by the write side: :func:`reference.slot_mapping.slot_mappings`
of a batch whose rows are the picked positions of one request, in a sharded cache group.
So this oracle holds no formula of its own for where a token lies; if the read side and
the write side disagreed, the read would be judged against what was written.
"""

from __future__ import annotations

import torch

from reference.slot_mapping import NO_SLOT, owner_of, slot_mappings


def rank_slots(
    req_id: torch.Tensor,
    block_table: torch.Tensor,
    token_indices: torch.Tensor,
    block_size: int,
    dcp_size: int,
    dcp_rank: int,
    interleave: int,
) -> torch.Tensor:
    """Rank ``dcp_rank``'s local slot of every pick, ``[rows, k]`` int64, ``-1`` for a pick
    of ``-1`` and for a token another rank stores (module docstring). ``req_id[t]`` is
    row ``t``'s row of ``block_table`` (``[requests, max blocks]``, the rank's own); the
    picks are ``token_indices`` (``[rows, k]``)."""
    picks = token_indices.cpu().to(torch.int64)
    rows, k = picks.shape
    table = block_table.cpu()
    out = torch.full((rows, k), NO_SLOT, dtype=torch.int64)
    starts = torch.tensor([0, k], dtype=torch.int32)
    for row in range(rows):
        written = slot_mappings(
            starts,
            picks[row].clamp(min=0),
            req_id[row : row + 1].cpu().to(torch.int32),
            table[None],
            [block_size],
            [True],
            dcp_size,
            dcp_rank,
            interleave,
            k,
        )[0]
        out[row] = torch.where(picks[row] >= 0, written, NO_SLOT)
    return out


def owners(token_indices: torch.Tensor, dcp_size: int, interleave: int) -> torch.Tensor:
    """The rank that stores each pick (``-1`` for a pick of ``-1``), ``[rows, k]`` int64."""
    picks = token_indices.cpu().to(torch.int64)
    return torch.where(picks >= 0, owner_of(picks.clamp(min=0), dcp_size, interleave), -1)
