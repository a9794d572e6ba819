"""The project's merge, its correction step in Triton: all-gather the LSEs, correct each
rank's partial by its weight, reduce-scatter the corrected partials by heads.

Each rank first gives the rows its shard holds nothing of an LSE of ``-inf`` (when the
caller passes the lengths, ``contract.CombineInputs``): an empty shard's LSE is whatever
its decode kernel left, 0 included, and only the lengths tell it apart from a real one.

Then one program per row, every head at once: it reads the row's ``N`` LSEs, turns every one that is
not a number or is ``+inf`` into ``-inf`` (no weight), takes their maximum ``m`` (0 when all
are ``-inf``, so an all-empty row stays ``-inf`` rather than NaN), and computes the merged
LSE ``m + log(sum exp(lse_r - m))`` in fp32, with ``exp2``/``log2`` for a base-2 LSE.
The rank's partial is scaled by ``exp(lse_own - lse)`` and set to 0 where that weight is
0, so an empty shard's NaN or garbage output never reaches the sum. The corrected partial
is rounded once to the output's dtype; the group's reduce-scatter sums the ranks'.

The definition it computes is ``reference.lse_combine.merge``.

Import this module only once ``dcpcheck.backend.current_backend()`` has chosen between
compiling and Triton's interpreter: Triton decides that when a kernel is defined.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dcpcheck.ops.lse_combine.contract import CombineInputs, Merged


@triton.jit(do_not_specialize=["out_head_stride", "lses_rank_stride", "rank"])
def _correct_kernel(
    out_ptr,
    corrected_ptr,
    lses_ptr,
    merged_lse_ptr,
    out_row_stride,
    out_head_stride,
    lses_rank_stride,
    lses_row_stride,
    rank,
    HEADS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    RANKS: tl.constexpr,
    BLOCK_RANKS: tl.constexpr,
    BASE_E: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    ranks = tl.arange(0, BLOCK_RANKS)[:, None]
    heads = tl.arange(0, BLOCK_H)
    lse_at = lses_ptr + row * lses_row_stride + heads
    lses = tl.load(
        lse_at[None, :] + ranks * lses_rank_stride,
        mask=(ranks < RANKS) & (heads[None, :] < HEADS),
        other=-float("inf"),
    ).to(tl.float32)
    lses = tl.where((lses != lses) | (lses == float("inf")), -float("inf"), lses)
    top = tl.max(lses, axis=0)
    top = tl.where(top == -float("inf"), 0.0, top)
    if BASE_E:
        total = tl.sum(tl.exp(lses - top[None, :]), axis=0)
    else:
        total = tl.sum(tl.exp2(lses - top[None, :]), axis=0)
    some = total > 0.0
    total = tl.where(some, total, 1.0)  # no log of 0: an all-empty row is -inf below
    if BASE_E:
        merged = tl.where(some, top + tl.log(total), -float("inf"))
    else:
        merged = tl.where(some, top + tl.log2(total), -float("inf"))
    tl.store(merged_lse_ptr + row * HEADS + heads, merged, mask=heads < HEADS)

    own = tl.load(lse_at + rank * lses_rank_stride, mask=heads < HEADS, other=0.0)
    own = own.to(tl.float32)
    own = tl.where((own != own) | (own == float("inf")) | ~some, -float("inf"), own)
    if BASE_E:
        weight = tl.exp(own - tl.where(some, merged, 0.0))
    else:
        weight = tl.exp2(own - tl.where(some, merged, 0.0))
    dims = tl.arange(0, BLOCK_D)[None, :]
    inside = (heads[:, None] < HEADS) & (dims < HEAD_DIM)
    at = row * out_row_stride + heads[:, None] * out_head_stride + dims
    partial = tl.load(out_ptr + at, mask=inside, other=0.0).to(tl.float32)
    corrected = tl.where(weight[:, None] == 0.0, 0.0, partial * weight[:, None])
    tl.store(
        corrected_ptr + (row * HEADS + heads[:, None]) * HEAD_DIM + dims,
        corrected.to(corrected_ptr.dtype.element_ty),
        mask=inside,
    )


def empty_rows(seq_lens: torch.Tensor, query_start_loc: torch.Tensor, rows: int) -> torch.Tensor:
    """The rows (``[rows]`` bool) of requests whose length on this rank is 0, and the
    padding rows past the last request."""
    index = torch.arange(rows, device=query_start_loc.device, dtype=query_start_loc.dtype)
    request = torch.searchsorted(query_start_loc[1:].contiguous(), index, right=True)
    inside = request < seq_lens.shape[0]
    lengths = seq_lens[request.clamp(max=max(seq_lens.shape[0] - 1, 0))]
    return ~inside | (lengths == 0)


def combine(inputs: CombineInputs) -> Merged:
    """One rank's merge (module docstring)."""
    out, lse, group = inputs.partial_out.contiguous(), inputs.partial_lse, inputs.group
    rows, heads, head_dim = out.shape
    lse = lse.to(torch.float32)
    if inputs.seq_lens is not None and inputs.query_start_loc is not None:
        empty = empty_rows(inputs.seq_lens, inputs.query_start_loc, rows)
        lse = lse.masked_fill(empty[:, None], -float("inf"))
    lses = group.all_gather(lse.contiguous(), dim=0).reshape(group.world_size, rows, heads)
    corrected = torch.empty((rows, heads, head_dim), dtype=out.dtype, device=out.device)
    merged_lse = torch.empty((rows, heads), dtype=torch.float32, device=out.device)
    if rows:
        # The kernel takes the rank, its partial output's head stride and the gathered LSEs'
        # rank stride unspecialized (``do_not_specialize``): Triton would compile a binary for
        # a value of 1, one for a multiple of 16 and one for any other, which differ in
        # alignment hints only, so a DCP4 case would compile three where one serves every rank.
        _correct_kernel[(rows,)](
            out,
            corrected,
            lses,
            merged_lse,
            out.stride(0),
            out.stride(1),
            lses.stride(0),
            lses.stride(1),
            group.rank_in_group,
            HEADS=heads,
            BLOCK_H=triton.next_power_of_2(heads),
            HEAD_DIM=head_dim,
            BLOCK_D=triton.next_power_of_2(head_dim),
            RANKS=group.world_size,
            BLOCK_RANKS=triton.next_power_of_2(group.world_size),
            BASE_E=inputs.base_e,
        )
    merged = group.reduce_scatter(corrected, dim=1)
    if not inputs.return_lse:
        return Merged(merged)
    share = inputs.heads_per_rank
    first = group.rank_in_group * share
    return Merged(merged, merged_lse[:, first : first + share].contiguous())
