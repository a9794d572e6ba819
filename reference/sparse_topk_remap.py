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

**The flat row view.** The attention may read the cache as one run of rows in which
consecutive blocks lie ``block_stride_rows`` rows apart (more than the block size where
other layers' pages sit between this cache's blocks). A slot of the write side's, ``block
* block_size + offset``, is then row ``block * block_stride_rows + offset`` of that view.

**A prefill chunk over a gathered workspace.** With prefill context parallelism and DCP
together, a prefill chunk attends the whole context, not one rank's shard: every rank
copies its own tokens of each request of the chunk out of its cache into a shard of
``rank_stride`` rows (request ``e``'s tokens from row ``starts[e]``, each at its local
index on that rank: the slot the write side gives it with the blocks numbered in order),
and the shards are gathered rank-major, rank ``r``'s from row ``r * rank_stride``. A pick
``p`` of a row of request ``e`` is then row ``owner * rank_stride + starts[e] + local``
of the gathered workspace, the same on every rank; ``-1`` for a pick of ``-1``, and for a
pick whose local block lies past the rank's block table (the table holds ``table_width``
blocks of ``block_size * dcp_size`` positions), a token no rank's cache can hold.

**A mixed batch.** A call with a prefill workspace may convert decode rows beside the
prefill rows (a request id of ``-1``): a decode row reads the rank's own cache, so its
picks are the rank's slots, as without a workspace.
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
    block_stride_rows: int | None = None,
) -> torch.Tensor:
    """Rank ``dcp_rank``'s local slot of every pick, ``[rows, k]`` int64, ``-1`` for a pick
    of ``-1`` and for a token another rank stores (module docstring). ``req_id[t]`` is
    row ``t``'s row of ``block_table`` (``[requests, max blocks]``, the rank's own); the
    picks are ``token_indices`` (``[rows, k]``); ``block_stride_rows`` (None: the block
    size) the rows between consecutive blocks of the flat view the slots index."""
    picks = token_indices.cpu().to(torch.int64)
    rows, k = picks.shape
    # One write-side batch: row t is request t, its k picks its positions.
    written = slot_mappings(
        torch.arange(rows + 1, dtype=torch.int32) * k,
        picks.clamp(min=0).flatten(),
        req_id.cpu().to(torch.int32),
        block_table.cpu()[None],
        [block_size],
        [True],
        dcp_size,
        dcp_rank,
        interleave,
        rows * k,
    )[0].view(rows, k)
    out = torch.where(picks >= 0, written, NO_SLOT)
    if block_stride_rows is None:
        return out
    flat = out // block_size * block_stride_rows + out % block_size
    return torch.where(out >= 0, flat, NO_SLOT)


def owners(token_indices: torch.Tensor, dcp_size: int, interleave: int) -> torch.Tensor:
    """The rank that stores each pick (``-1`` for a pick of ``-1``), ``[rows, k]`` int64."""
    picks = token_indices.cpu().to(torch.int64)
    return torch.where(picks >= 0, owner_of(picks.clamp(min=0), dcp_size, interleave), -1)


def workspace_rows(
    request_ids: torch.Tensor,
    starts: torch.Tensor,
    token_indices: torch.Tensor,
    rank_stride: int,
    table_width: int,
    block_size: int,
    dcp_size: int,
    interleave: int,
) -> torch.Tensor:
    """The row of the gathered prefill workspace that holds every pick (module docstring),
    ``[rows, k]`` int64, ``-1`` for a pick of ``-1`` and for one past the block table.
    ``request_ids[t]`` is row ``t``'s request, the index of its start in ``starts``; the
    picks are ``token_indices`` (``[rows, k]``)."""
    picks = token_indices.cpu().to(torch.int64)
    rows = picks.shape[0]
    held = (picks >= 0) & (picks < table_width * block_size * dcp_size)
    picks = torch.where(held, picks, NO_SLOT).to(torch.int32)
    start = starts.cpu().to(torch.int64)[request_ids.cpu().to(torch.int64)][:, None]
    numbered = torch.arange(table_width, dtype=torch.int32)[None]  # block j at rows j * size
    first = torch.zeros(rows, dtype=torch.int32)
    out = torch.full(picks.shape, NO_SLOT, dtype=torch.int64)
    for rank in range(dcp_size):
        local = rank_slots(first, numbered, picks, block_size, dcp_size, rank, interleave)
        out = torch.where(local >= 0, rank * rank_stride + start + local, out)
    return out


def prefill_call_entries(
    req_id: torch.Tensor,
    block_table: torch.Tensor,
    request_ids: torch.Tensor,
    starts: torch.Tensor,
    token_indices: torch.Tensor,
    rank_stride: int,
    block_size: int,
    dcp_size: int,
    dcp_rank: int,
    interleave: int,
    block_stride_rows: int | None = None,
) -> torch.Tensor:
    """Rank ``dcp_rank``'s entries of a call with a prefill workspace (module docstring),
    ``[rows, k]`` int64: a prefill row's (``request_ids[t] >= 0``) picks at their rows of
    the gathered workspace (:func:`workspace_rows`), a decode row's (``-1``) at the rank's
    own slots (:func:`rank_slots`, through ``block_table``'s row ``req_id[t]``, in the flat
    view of ``block_stride_rows``)."""
    picks = token_indices.cpu()
    prefill = request_ids.cpu() >= 0
    decode = ~prefill
    out = torch.full(picks.shape, NO_SLOT, dtype=torch.int64)
    out[prefill] = workspace_rows(
        request_ids.cpu()[prefill], starts, picks[prefill], rank_stride, block_table.shape[1],
        block_size, dcp_size, interleave,
    )  # fmt: skip
    out[decode] = rank_slots(
        req_id.cpu()[decode], block_table, picks[decode], block_size, dcp_size, dcp_rank,
        interleave, block_stride_rows,
    )  # fmt: skip
    return out
