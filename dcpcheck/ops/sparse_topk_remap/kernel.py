"""The project's kernel of the op, in Triton: one program per query row.

A program walks its row's picks ``BLOCK_K`` at a time. A pick ``p`` is dealt to its rank
as the write side deals positions, in runs of ``INTERLEAVE`` round-robin over the ranks;
on its own rank it sits at local index ``(p // (DCP_SIZE * INTERLEAVE)) * INTERLEAVE + p %
INTERLEAVE``, in the block-table column ``local // BLOCK_SIZE`` at offset ``local %
BLOCK_SIZE``, so at row ``block * BLOCK_STRIDE_ROWS + offset`` of the cache's flat row
view (``contract``: consecutive blocks ``BLOCK_STRIDE_ROWS`` rows apart). The table is
read only for the picks the rank stores (and only inside the table's width), so another
rank's pick costs no load. Not compacted, each entry is stored in its pick's column;
compacted, the tile's slots are packed after the ones the earlier tiles packed (an
exclusive prefix sum of the kept lanes, carried from tile to tile: one program owns the
row, so no atomics and the order is the picks' own), and a last pass writes ``-1`` over
the rest of the row. The count is the number of slots the row got.

A prefill row of a call with a prefill workspace (``WORKSPACE``, the row's request id
``>= 0``) keeps every pick the table can hold, whichever rank owns it, at row ``owner *
rank_stride + start + local`` of the workspace, ``start`` being the row's request's first
row (``contract``); the table is not read. A decode row of such a call (request id ``-1``,
a mixed batch's) is converted as without a workspace.

The definition it computes is ``reference.sparse_topk_remap.rank_slots``.

Import this module only once ``dcpcheck.backend.current_backend()`` has chosen between
compiling and Triton's interpreter: Triton decides that when a kernel is defined.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dcpcheck.ops.sparse_topk_remap.contract import NO_SLOT, RemapInputs

BLOCK_K = 256
"""Picks a program handles per step: DeepSeek's indexer picks 2048, so eight steps."""


@triton.jit(do_not_specialize=["table_row_stride", "table_width", "rank_stride", "dcp_rank"])
def _remap_kernel(
    req_id_ptr,
    table_ptr,
    table_row_stride,
    table_width,
    picks_ptr,
    picks_row_stride,
    out_ptr,
    out_row_stride,
    counts_ptr,
    request_ids_ptr,
    starts_ptr,
    rank_stride,
    topk,
    dcp_rank,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_STRIDE_ROWS: tl.constexpr,
    DCP_SIZE: tl.constexpr,
    INTERLEAVE: tl.constexpr,
    COMPACT: tl.constexpr,
    COUNT: tl.constexpr,
    WORKSPACE: tl.constexpr,
    BLOCK: tl.constexpr,
    NONE: tl.constexpr,
):
    row = tl.program_id(0)
    entry = tl.full((), -1, tl.int32)  # the row's request in the workspace, -1: a decode row
    if WORKSPACE:
        entry = tl.load(request_ids_ptr + row)
    prefill = entry >= 0
    # the row's request's first row in each rank's part of the workspace
    first_row = tl.load(starts_ptr + entry, mask=prefill, other=0).to(tl.int64)
    request = tl.load(req_id_ptr + row).to(tl.int64)
    table_row = table_ptr + request * table_row_stride
    picks_row = picks_ptr + row.to(tl.int64) * picks_row_stride
    out_row = out_ptr + row.to(tl.int64) * out_row_stride
    packed = 0
    for start in range(0, topk, BLOCK):
        columns = start + tl.arange(0, BLOCK)
        inside = columns < topk
        pick = tl.load(picks_row + columns, mask=inside, other=NONE)
        owner = (pick // INTERLEAVE) % DCP_SIZE
        local = (pick // (DCP_SIZE * INTERLEAVE)) * INTERLEAVE + pick % INTERLEAVE
        column = local // BLOCK_SIZE
        # a prefill row keeps every rank's picks, a decode row the rank's own
        kept = inside & (pick >= 0) & (column < table_width) & (prefill | (owner == dcp_rank))
        block = tl.load(table_row + column, mask=kept & ~prefill, other=0)
        gathered = owner * rank_stride + first_row + local
        slot = tl.where(prefill, gathered, block * BLOCK_STRIDE_ROWS + local % BLOCK_SIZE)
        slot = tl.where(kept, slot, NONE)
        ones = kept.to(tl.int32)
        if COMPACT:
            place = packed + tl.cumsum(ones, 0) - ones
            tl.store(out_row + place, slot, mask=kept)
        else:
            tl.store(out_row + columns, slot, mask=inside)
        packed += tl.sum(ones, 0)
    if COMPACT:
        for start in range(0, topk, BLOCK):
            columns = start + tl.arange(0, BLOCK)
            tl.store(out_row + columns, NONE, mask=(columns >= packed) & (columns < topk))
    if COUNT:
        tl.store(counts_ptr + row, packed)


def remap(inputs: RemapInputs, out: torch.Tensor, valid_counts: torch.Tensor | None) -> None:
    """Launch the kernel on one rank (module docstring): writes ``out`` and, when given,
    ``valid_counts``."""
    rows, topk = inputs.token_indices.shape
    if rows == 0:
        return
    table = inputs.block_table
    workspace = inputs.workspace
    # The kernel takes the rank, the block table's width and strides unspecialized
    # (``do_not_specialize``): Triton would compile a binary for a value of 1, one for a multiple of
    # 16 and one for any other, which differ in alignment hints only, so a DCP4 case would compile
    # three where one serves every rank.
    _remap_kernel[(rows,)](
        inputs.req_id,
        table,
        table.stride(0),
        table.shape[1],
        inputs.token_indices,
        inputs.token_indices.stride(0),
        out,
        out.stride(0),
        valid_counts if valid_counts is not None else out,  # not read without COUNT
        workspace.request_ids if workspace else inputs.req_id,  # not read without WORKSPACE
        workspace.starts if workspace else inputs.req_id,
        workspace.rank_stride if workspace else 0,
        topk,
        inputs.dcp_rank,
        BLOCK_SIZE=inputs.block_size,
        BLOCK_STRIDE_ROWS=inputs.stride_rows,
        DCP_SIZE=inputs.dcp_size,
        INTERLEAVE=inputs.interleave,
        COMPACT=inputs.compact,
        COUNT=valid_counts is not None,
        WORKSPACE=workspace is not None,
        BLOCK=min(BLOCK_K, triton.next_power_of_2(topk)),
        NONE=NO_SLOT,
    )
