"""Wrong kernels of the op, each the project's with one bug a sparse backend under DCP has
had or could have, for the checks to be shown catching (``checks``). Each wraps the kernel
from outside (what it is asked, or what it leaves), so the kernel a reader studies holds
no code that is not the kernel."""

from __future__ import annotations

from dataclasses import replace

import torch

from dcpcheck.ops.sparse_topk_remap.contract import NO_SLOT, RemapInputs
from dcpcheck.ops.sparse_topk_remap.kernel import BLOCK_K, remap


def dcp_ignored(inputs: RemapInputs, out: torch.Tensor, counts: torch.Tensor | None) -> None:
    """The converter that does not know DCP, called under DCP: every rank reads every pick
    at the slot one rank storing the whole context would have put it."""
    remap(replace(inputs, dcp_size=1, dcp_rank=0), out, counts)


def interleave_ignored(inputs: RemapInputs, out: torch.Tensor, counts: torch.Tensor | None) -> None:
    """Picks dealt to the ranks one at a time whatever the interleave the writes used."""
    remap(replace(inputs, interleave=1), out, counts)


def rank_shifted(inputs: RemapInputs, out: torch.Tensor, counts: torch.Tensor | None) -> None:
    """Each rank keeps the next rank's picks: still a partition, the wrong one."""
    remap(replace(inputs, dcp_rank=(inputs.dcp_rank + 1) % inputs.dcp_size), out, counts)


def compaction_one_late(
    inputs: RemapInputs, out: torch.Tensor, counts: torch.Tensor | None
) -> None:
    """Packed rows start one entry late: a ``-1`` first, and a full row's last slot lost."""
    remap(inputs, out, counts)
    if inputs.compact:
        out[:, 1:] = out[:, :-1].clone()
        out[:, 0] = NO_SLOT


def last_tile_dropped(inputs: RemapInputs, out: torch.Tensor, counts: torch.Tensor | None) -> None:
    """A top-k wider than one tile loses its last tile: those picks never converted (a
    grid of ``k // BLOCK_K - 1`` tiles, or a loop that stops one short)."""
    topk = inputs.topk
    if topk <= BLOCK_K:
        remap(inputs, out, counts)
        return
    kept = (topk - 1) // BLOCK_K * BLOCK_K
    remap(replace(inputs, token_indices=inputs.token_indices[:, :kept]), out[:, :kept], counts)


def unused_read_as_token_zero(
    inputs: RemapInputs, out: torch.Tensor, counts: torch.Tensor | None
) -> None:
    """A pick of ``-1`` converted as position 0 (a mask that tests ``p != -1`` after a
    clamp): the rank that stores the request's first token reads it for every unused pick."""
    picks = inputs.token_indices.clamp(min=0)
    remap(replace(inputs, token_indices=picks), out, counts)


def counts_of_the_row(inputs: RemapInputs, out: torch.Tensor, counts: torch.Tensor | None) -> None:
    """The count of every pick of the row that is not ``-1``, on every rank, not of the
    rank's own slots (the count taken before the ranks' filter)."""
    remap(inputs, out, counts)
    if counts is not None:
        counts.copy_((inputs.token_indices >= 0).sum(dim=1).to(torch.int32))


def block_stride_ignored(
    inputs: RemapInputs, out: torch.Tensor, counts: torch.Tensor | None
) -> None:
    """Slots numbered in blocks of ``block_size`` rows whatever the flat view's block
    stride: where other layers' pages sit between the cache's blocks, every slot past the
    first block lands in a page that is not this cache's."""
    remap(replace(inputs, block_stride_rows=None), out, counts)


def _with_workspace(inputs: RemapInputs, **changed: object) -> RemapInputs:
    """``inputs`` with its prefill workspace changed as ``changed`` says (none: as is)."""
    if inputs.workspace is None:
        return inputs
    return replace(inputs, workspace=replace(inputs.workspace, **changed))


def workspace_rank_ignored(
    inputs: RemapInputs, out: torch.Tensor, counts: torch.Tensor | None
) -> None:
    """A prefill chunk's picks read as if the workspace held one rank's shard: every
    owner's token at its local index past the request's start, the ranks' parts on top of
    one another (the rank stride left 0, as a caller that passes none leaves it)."""
    remap(_with_workspace(inputs, rank_stride=0), out, counts)


def workspace_start_of_the_next_request(
    inputs: RemapInputs, out: torch.Tensor, counts: torch.Tensor | None
) -> None:
    """Each prefill row reads from the next request's start (the starts indexed one entry
    late, the last request's read from its own): the first requests' picks land in the
    next requests' rows."""
    workspace = inputs.workspace
    if workspace is None:
        remap(inputs, out, counts)
        return
    last = workspace.starts.shape[0] - 1
    ids = (workspace.request_ids + 1).clamp(max=last)
    remap(_with_workspace(inputs, request_ids=ids), out, counts)


def workspace_own_picks_only(
    inputs: RemapInputs, out: torch.Tensor, counts: torch.Tensor | None
) -> None:
    """The decode filter applied to a prefill chunk: each rank keeps only the picks it
    stores, though its gathered workspace holds every rank's (the other ranks' picks are
    never attended)."""
    if inputs.workspace is None:
        remap(inputs, out, counts)
        return
    picks = inputs.token_indices
    owner = (picks // inputs.interleave) % inputs.dcp_size
    own = torch.where(owner == inputs.dcp_rank, picks, NO_SLOT)
    remap(replace(inputs, token_indices=own), out, counts)


def workspace_past_the_table(
    inputs: RemapInputs, out: torch.Tensor, counts: torch.Tensor | None
) -> None:
    """A prefill chunk's picks past the block table kept (the table's width unchecked, as
    the workspace path reads no block): they name rows past the request's shard."""
    if inputs.workspace is None:
        remap(inputs, out, counts)
        return
    table = inputs.block_table
    wider = torch.cat([table, table], dim=1)
    remap(replace(inputs, block_table=wider), out, counts)


def decode_rows_taken_for_prefill(
    inputs: RemapInputs, out: torch.Tensor, counts: torch.Tensor | None
) -> None:
    """A mixed batch's decode rows (request id ``-1``) converted as prefill rows of the
    first request (the id's sign never tested): their picks name rows of the gathered
    workspace, not the rank's cache slots."""
    workspace = inputs.workspace
    if workspace is None:
        remap(inputs, out, counts)
        return
    remap(_with_workspace(inputs, request_ids=workspace.request_ids.clamp(min=0)), out, counts)


WORKSPACE_MUTANTS = (
    workspace_rank_ignored,
    workspace_start_of_the_next_request,
    workspace_own_picks_only,
    workspace_past_the_table,
    decode_rows_taken_for_prefill,
)
"""The mutants that differ from the project's kernel only on a prefill chunk over the
gathered workspace."""

STRIDE_MUTANTS = (block_stride_ignored,)
"""The mutants that differ from the project's kernel only where other layers' pages sit
between the cache's blocks."""

MUTANTS = (
    dcp_ignored,
    interleave_ignored,
    rank_shifted,
    compaction_one_late,
    last_tile_dropped,
    unused_read_as_token_zero,
    counts_of_the_row,
    *STRIDE_MUTANTS,
    *WORKSPACE_MUTANTS,
)
