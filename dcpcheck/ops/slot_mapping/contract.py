"""The slot-mapping op's protocols: the slot mappings, ``kernel(inputs, slot_mappings) ->
None``, and the rank-local sequence lengths, ``kernel(inputs, local_seq_lens) -> None``; a
kernel of the op (:class:`Routines`) is one of each, either of which may be absent, or
a release's every routine of a kind (:class:`EachRoutine`).

The slot mappings.

The kernel writes ``slot_mappings`` (``[groups, max_num_tokens]`` int64, owned by the
caller) and reads ``inputs``, which it must leave as they are. The batch layout is the one
vLLM's model runners build on the device, as one set of tensors per step:

* ``query_start_loc`` (int32, ``[requests + 1]``): request ``i`` owns rows
  ``query_start_loc[i] .. query_start_loc[i + 1]``; the rows after the last request, up to
  ``max_num_tokens``, are padding (CUDA graphs run a fixed number of rows);
* ``positions`` (int64, ``[max_num_tokens]``): each row's position in its sequence;
* ``idx_mapping`` (int32, ``[requests]``): each request's row in the block tables, ``-1``
  for a request that owns no blocks (its rows are padding);
* ``block_tables`` (int32, ``[groups, table rows, max blocks]``): one table per cache
  group, each group with its own ``block_sizes`` entry and ``sharded`` flag (a replicated
  group stores every token on every rank, at its global slot);
* ``kernel_block_sizes``: per group, the block size the attention kernel addresses the
  cache in, which divides the group's block size; it may be smaller than the interleave
  (vLLM runs an interleave of 32 over attention kernels of 16-token blocks), so one rank's
  run of ``interleave`` tokens may span several kernel blocks. A kernel that takes it
  addresses the table in kernel blocks, cache block ``b`` being kernel blocks
  ``b * k .. b * k + k - 1`` (``k`` = block size / kernel block size, as vLLM's runners
  expand their tables); the slots are the same either way, a cache block being the same
  bytes as its kernel blocks, so a kernel may also ignore it.

What every slot must be is ``reference.slot_mapping.slot_mappings``.

The local sequence lengths. Under DCP a rank's attention reads only the positions it
stores, so each request's length on a rank is what decode attention is told
(``reference.slot_mapping.local_seq_lens``). The kernel reads ``seq_lens`` (int32,
``[max_num_reqs]``: the requests' lengths, then the padded requests of a CUDA graph, whose
entries it must not trust) and writes ``local_seq_lens`` (int32, ``[max_num_reqs]``): each
request's local length, and 0 for every padded request, so a graph replay attends nothing
there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

PAD_SLOT = -1
"""The slot of a row with no cache entry on this rank (another rank's token, padding)."""


@dataclass(frozen=True)
class SlotMappingInputs:
    """One rank's inputs of the slot-mapping op (module docstring)."""

    query_start_loc: torch.Tensor
    positions: torch.Tensor
    idx_mapping: torch.Tensor
    block_tables: torch.Tensor
    block_sizes: tuple[int, ...]
    sharded: tuple[bool, ...]
    dcp_size: int
    dcp_rank: int
    interleave: int
    kernel_block_sizes: tuple[int, ...] = ()  # per group; () for the block sizes themselves

    def __post_init__(self) -> None:
        check_kernel_block_sizes(self.block_sizes, self.kernel_blocks)
        groups = self.block_tables.shape[0]
        if not len(self.block_sizes) == len(self.sharded) == groups:
            raise ValueError(
                f"{groups} block tables but {len(self.block_sizes)} block sizes and "
                f"{len(self.sharded)} sharded flags"
            )
        if not 0 <= self.dcp_rank < self.dcp_size:
            raise ValueError(f"dcp_rank {self.dcp_rank} outside 0..{self.dcp_size - 1}")
        if any(size % self.interleave for size in self.block_sizes):
            raise ValueError(
                f"every block size must be a multiple of the interleave {self.interleave}, "
                f"got {self.block_sizes}"
            )

    @property
    def num_requests(self) -> int:
        return self.idx_mapping.shape[0]

    @property
    def kernel_blocks(self) -> tuple[int, ...]:
        """Each group's kernel block size (its block size where none is given)."""
        return self.kernel_block_sizes or self.block_sizes


def check_kernel_block_sizes(
    block_sizes: tuple[int, ...], kernel_block_sizes: tuple[int, ...]
) -> None:
    """``ValueError`` unless there is one kernel block size per group, each dividing its
    group's block size (module docstring)."""
    if len(kernel_block_sizes) != len(block_sizes) or any(
        size % kernel for size, kernel in zip(block_sizes, kernel_block_sizes, strict=False)
    ):
        raise ValueError(
            f"kernel block sizes {kernel_block_sizes} must divide the block sizes "
            f"{block_sizes}, one per group"
        )


SlotMappingKernel = Callable[[SlotMappingInputs, torch.Tensor], None]
"""``kernel(inputs, slot_mappings)``: writes every row of every group of ``slot_mappings``."""


@dataclass(frozen=True)
class LocalSeqLensInputs:
    """One rank's inputs of the local sequence lengths (module docstring)."""

    seq_lens: torch.Tensor
    num_reqs: int
    dcp_size: int
    dcp_rank: int
    interleave: int

    @property
    def max_num_reqs(self) -> int:
        return self.seq_lens.shape[0]


LocalSeqLensKernel = Callable[[LocalSeqLensInputs, torch.Tensor], None]
"""``kernel(inputs, local_seq_lens)``: writes every entry of ``local_seq_lens``."""


@dataclass(frozen=True)
class EachRoutine:
    """Every routine of one kind that a release has, each by the name a spec gives it
    alone (``vllm==X:NAME``): from 0.12.0 a release ships the slot mappings twice, in its
    V1 runner's ``BlockTable`` and in its GPU model runner's kernel, and from 0.17.0 the
    local lengths twice, in that runner's kernel and in the attention backends' function.
    Which runner a deployment runs is its choice, so a spec that names no routine is
    judged on each of them, every case, and a finding names the routine it is of."""

    routines: tuple[tuple[str, Callable[..., None]], ...]


@dataclass(frozen=True)
class Routines:
    """A kernel of the op: the routine computing the slot mappings and the one computing
    the local sequence lengths, or a release's every routine of a kind (``EachRoutine``).
    Either may be absent (a release has only one, a spec names one); its checks are then
    reported skipped with ``absent``'s reason, never passed."""

    slot_mappings: SlotMappingKernel | EachRoutine | None
    local_seq_lens: LocalSeqLensKernel | EachRoutine | None
    absent: str = ""
