"""The sparse-topk-remap op's protocol: ``kernel(inputs, out, valid_counts) -> None``, called
once on every rank of a DCP group, each with its own rank.

A sparse MLA backend's indexer picks, for every query row, ``k`` tokens of the row's
request by their position in it (``-1`` for an unused pick); before attending, each rank
turns the picks into the local cache slots it stores them at. A rank's inputs:

* ``req_id`` (int32, ``[rows]``): each row's row of the block table;
* ``block_table`` (int32, ``[requests, max blocks]``): the rank's block table, as the
  write side used it (``reference.slot_mapping``): under DCP a block holds
  ``block_size`` of the rank's tokens out of ``block_size * dcp_size`` positions;
* ``token_indices`` (int32, ``[rows, k]``): the picks; a pick may repeat within a row;
* ``block_size``, ``dcp_size``, ``dcp_rank``, ``interleave``: the cache's layout (the
  interleave divides the block size);
* ``block_stride_rows``: rows between the first rows of consecutive blocks in the flat row
  view of the cache the attention reads (None: the block size). It exceeds the block size
  where other layers' pages sit between this cache's blocks; the rows between are never
  an entry;
* ``compact``: whether the rank's slots are to be packed to the front of each row;
* ``count_valid``: whether the caller hands a ``valid_counts`` buffer to fill.

The kernel writes ``out`` (int32, ``[rows, k]``, owned by the caller):

* not compacted, column by column: ``out[t, j]`` is the local slot of pick
  ``token_indices[t, j]`` when this rank stores it, else ``-1``; a slot is the token's row
  of the flat view, ``block * block_stride_rows + offset`` for the token's block and its
  offset in it;
* compacted: the row's slots in its first columns, in any order, and ``-1`` after them.

and, when the caller passes it, ``valid_counts`` (int32, ``[rows]``): how many of the
row's entries are slots (not ``-1``).

Picks past the request's length are not part of the contract (an indexer does not emit
them); the cases draw none. What every entry must be is ``reference.sparse_topk_remap``,
whose slots are the write side's.

**A prefill chunk over a gathered workspace** (``workspace``: prefill context parallelism
with DCP). Every rank holds the chunk's context gathered from all ranks, rank-major, so a
pick is not a cache slot but a row of that workspace, the same on every rank:
``owner * rank_stride + starts[request_ids[t]] + local``, ``local`` being the pick's local
index on its owner (``reference.sparse_topk_remap.workspace_rows``). A row whose request
id is ``-1`` (:data:`DECODE_ROW`) is a decode row of a mixed batch converted in the same
call: its picks are the rank's slots, as without a workspace
(``reference.sparse_topk_remap.prefill_call_entries``). A pick of a prefill row whose local
block lies past the block table's width is
``-1`` (the table's width is all the kernel knows of the request's extent: picks past the
request's length but inside the table are not part of the contract, as above).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

NO_SLOT = -1
"""An entry that names no slot: a pick of ``-1``, another rank's token, the packed tail."""

DECODE_ROW = -1
"""A row's request id in a call with a prefill workspace when it is a decode row."""


@dataclass(frozen=True)
class PrefillWorkspace:
    """Where a prefill chunk's picks lie in the gathered workspace (module docstring)."""

    request_ids: torch.Tensor  # int32 [rows]: each row's request, an index into starts
    # (DECODE_ROW: a decode row)
    starts: torch.Tensor  # int32 [requests]: each request's first row in every rank's shard
    rank_stride: int  # rows of one rank's shard: rank r's starts at r * rank_stride


@dataclass(frozen=True)
class RemapInputs:
    """One rank's inputs of the op (module docstring)."""

    req_id: torch.Tensor
    block_table: torch.Tensor
    token_indices: torch.Tensor
    block_size: int
    dcp_size: int
    dcp_rank: int
    interleave: int
    compact: bool
    count_valid: bool = False
    workspace: PrefillWorkspace | None = None
    block_stride_rows: int | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.dcp_rank < self.dcp_size:
            raise ValueError(f"dcp_rank {self.dcp_rank} outside 0..{self.dcp_size - 1}")
        if self.block_size % self.interleave:
            raise ValueError(
                f"the block size {self.block_size} must be a multiple of the interleave "
                f"{self.interleave}"
            )
        if self.stride_rows < self.block_size:
            raise ValueError(
                f"the block stride {self.stride_rows} rows is less than the block size "
                f"{self.block_size}"
            )

    @property
    def stride_rows(self) -> int:
        """Rows between consecutive blocks in the flat view the entries index."""
        return self.block_size if self.block_stride_rows is None else self.block_stride_rows

    @property
    def topk(self) -> int:
        return self.token_indices.shape[1]


RemapKernel = Callable[[RemapInputs, torch.Tensor, torch.Tensor | None], None]
"""``kernel(inputs, out, valid_counts)``: writes every entry of ``out`` and, when it is not
None, of ``valid_counts``."""
