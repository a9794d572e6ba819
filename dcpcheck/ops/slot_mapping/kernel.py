"""The project's kernels of the op, in Triton.

The slot mappings: one program per (cache group, request), plus one per group for the
padding rows.

A request's program walks its rows ``BLOCK`` at a time: a sharded group under DCP splits
each position into its virtual block (``block_size * DCP_SIZE`` positions, one physical
block on every rank) and its offset there, deals the offset to a rank in runs of
``INTERLEAVE``, and keeps the row only on that rank, at the offset the rank stores it at;
a replicated group, or DCP1, keeps every row at its global slot. The block number is read
from the request's block-table row only for the rows kept (a request with no row, ``-1``,
reads nothing), so a foreign row costs no load. The last program of each group writes
``-1`` over every padding row, so a mapping never carries a slot from an earlier step.

The definition it computes is ``reference.slot_mapping.slot_mappings``.

The local sequence lengths: one program per ``BLOCK_REQUESTS`` requests. A length splits
into whole rounds of ``DCP_SIZE * INTERLEAVE`` positions, ``INTERLEAVE`` of each this
rank's, and a last partial round, of which the rank gets what reaches past its first
``dcp_rank * INTERLEAVE`` positions, at most ``INTERLEAVE``. Padded requests get 0, and
their input is never read. The definition is ``reference.slot_mapping.local_seq_lens``.

Import this module
only once ``dcpcheck.backend.current_backend()`` has chosen between compiling and Triton's
interpreter: Triton decides that when a kernel is defined.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dcpcheck.ops.slot_mapping.contract import PAD_SLOT, LocalSeqLensInputs, SlotMappingInputs

BLOCK_ROWS = 128
"""Rows a program handles per step: a decode request has one, a prefill chunk thousands."""

BLOCK_REQUESTS = 128
"""Requests a program of the local sequence lengths handles."""


@triton.jit(do_not_specialize=["table_group_stride", "num_requests", "max_num_tokens", "dcp_rank"])
def _slot_mapping_kernel(
    query_start_loc_ptr,
    positions_ptr,
    idx_mapping_ptr,
    block_tables_ptr,
    table_group_stride,
    table_row_stride,
    block_sizes_ptr,
    sharded_ptr,
    out_ptr,
    out_group_stride,
    num_requests,
    max_num_tokens,
    dcp_rank,
    DCP_SIZE: tl.constexpr,
    INTERLEAVE: tl.constexpr,
    PAD: tl.constexpr,
    BLOCK: tl.constexpr,
):
    group = tl.program_id(0)
    request = tl.program_id(1)
    out = out_ptr + group * out_group_stride
    steps = tl.arange(0, BLOCK)
    if request == num_requests:
        # The padding rows, after the last request's.
        first = tl.load(query_start_loc_ptr + num_requests)
        for start in range(first, max_num_tokens, BLOCK):
            rows = start + steps
            tl.store(out + rows, tl.full((BLOCK,), PAD, tl.int64), mask=rows < max_num_tokens)
    else:
        begin = tl.load(query_start_loc_ptr + request)
        end = tl.load(query_start_loc_ptr + request + 1)
        table_row = tl.load(idx_mapping_ptr + request).to(tl.int64)
        block_size = tl.load(block_sizes_ptr + group).to(tl.int64)
        sharded = tl.load(sharded_ptr + group) != 0
        table = block_tables_ptr + group * table_group_stride + table_row * table_row_stride
        for start in range(begin, end, BLOCK):
            rows = start + steps
            inside = rows < end
            position = tl.load(positions_ptr + rows, mask=inside, other=0).to(tl.int64)
            block_index = position // block_size
            offset = position % block_size
            kept = inside & (table_row >= 0)
            if DCP_SIZE > 1:
                virtual = block_size * DCP_SIZE
                in_virtual = position % virtual
                owner = (in_virtual // INTERLEAVE) % DCP_SIZE
                local = (in_virtual // (DCP_SIZE * INTERLEAVE)) * INTERLEAVE
                local += in_virtual % INTERLEAVE
                block_index = tl.where(sharded, position // virtual, block_index)
                offset = tl.where(sharded, local, offset)
                kept = kept & ((owner == dcp_rank) | (sharded == 0))
            number = tl.load(table + block_index, mask=kept, other=0).to(tl.int64)
            slot = tl.where(kept, number * block_size + offset, PAD)
            tl.store(out + rows, slot, mask=inside)


def compute_slot_mappings(inputs: SlotMappingInputs, slot_mappings: torch.Tensor) -> None:
    """The protocol's entry point (``contract.SlotMappingKernel``): every group's mapping
    of rank ``inputs.dcp_rank`` into ``slot_mappings`` (``[groups, max_num_tokens]``)."""
    groups, max_num_tokens = slot_mappings.shape
    device = slot_mappings.device
    block_sizes = torch.tensor(inputs.block_sizes, dtype=torch.int32, device=device)
    sharded = torch.tensor(inputs.sharded, dtype=torch.int32, device=device)
    tables = inputs.block_tables
    _slot_mapping_kernel[(groups, inputs.num_requests + 1)](
        inputs.query_start_loc,
        inputs.positions,
        inputs.idx_mapping,
        tables,
        tables.stride(0),
        tables.stride(1),
        block_sizes,
        sharded,
        slot_mappings,
        slot_mappings.stride(0),
        inputs.num_requests,
        max_num_tokens,
        inputs.dcp_rank,
        DCP_SIZE=inputs.dcp_size,
        INTERLEAVE=inputs.interleave,
        PAD=PAD_SLOT,
        BLOCK=BLOCK_ROWS,
    )


@triton.jit(do_not_specialize=["num_reqs", "max_num_reqs", "dcp_rank"])
def _local_seq_lens_kernel(
    seq_lens_ptr,
    out_ptr,
    num_reqs,
    max_num_reqs,
    dcp_rank,
    DCP_SIZE: tl.constexpr,
    INTERLEAVE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    requests = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    real = requests < num_reqs
    length = tl.load(seq_lens_ptr + requests, mask=real, other=0)
    whole = (length // (DCP_SIZE * INTERLEAVE)) * INTERLEAVE
    partial = length % (DCP_SIZE * INTERLEAVE) - dcp_rank * INTERLEAVE
    partial = tl.minimum(tl.maximum(partial, 0), INTERLEAVE)
    local = tl.where(real, whole + partial, 0)
    tl.store(out_ptr + requests, local, mask=requests < max_num_reqs)


def compute_local_seq_lens(inputs: LocalSeqLensInputs, local_seq_lens: torch.Tensor) -> None:
    """The protocol's entry point (``contract.LocalSeqLensKernel``): rank
    ``inputs.dcp_rank``'s length of every request into ``local_seq_lens``, 0 for padded
    requests."""
    max_num_reqs = local_seq_lens.shape[0]
    # Both kernels take the rank, the request and token counts and the table's group stride
    # unspecialized (``do_not_specialize``): Triton would compile a binary for a value of 1, one for
    # a multiple of 16 and one for any other, which differ in alignment hints only, so a DCP4 case
    # would compile three where one serves every rank.
    _local_seq_lens_kernel[(triton.cdiv(max_num_reqs, BLOCK_REQUESTS),)](
        inputs.seq_lens,
        local_seq_lens,
        inputs.num_reqs,
        max_num_reqs,
        inputs.dcp_rank,
        DCP_SIZE=inputs.dcp_size,
        INTERLEAVE=inputs.interleave,
        BLOCK=BLOCK_REQUESTS,
    )
