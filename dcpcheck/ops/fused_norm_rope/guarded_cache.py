"""A paged cache as a case hands it to a kernel: its entries inside a storage of seeded
random bytes with guard blocks around it, and any bytes between its blocks.

The storage holds ``GUARD_BLOCKS`` guard blocks before and after the addressable blocks, so
an off-by-one block index lands in bytes the checks compare, even when it crashes nothing.
Its blocks lie ``Scenario.block_gap`` bytes apart, as a block-outermost layout's do (another
layer's pages between them): the kernel gets a view whose ``stride(0)`` says so, and a
kernel that addresses block ``b`` at ``b * block_size * entry`` writes into the wrong block
or into a gap, whose bytes are guard bytes too. Every rank's storage lies beside the
others' in one tensor, so ``fused_checks`` compares all ranks in one pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

GUARD_BLOCKS = 2
"""Guard blocks on each side of a cache: an off-by-one block index lands inside them."""


@dataclass
class GuardedCache:
    """A cache view inside a storage tensor with guard blocks around it, and the gap bytes
    that lie between its blocks (``Scenario.block_gap``; none when blocks are back to back).

    ``storage`` is ``[GUARD + num_blocks + GUARD, B, entry]`` uint8, its blocks
    ``B * entry + gap`` bytes apart; ``gap`` ``[GUARD + num_blocks + GUARD, gap]`` the bytes
    after each block. ``initial`` and ``gap_initial`` are their bytes before the launch."""

    storage: torch.Tensor
    initial: torch.Tensor
    gap: torch.Tensor
    gap_initial: torch.Tensor

    @property
    def view(self) -> torch.Tensor:
        return self.storage[GUARD_BLOCKS : self.storage.shape[0] - GUARD_BLOCKS]

    @property
    def initial_view(self) -> torch.Tensor:
        return self.initial[GUARD_BLOCKS : self.initial.shape[0] - GUARD_BLOCKS]


def guarded_caches(blocks: torch.Tensor, entries: torch.Tensor) -> list[GuardedCache]:
    """Each rank's ``GuardedCache``: ``blocks`` ``[ranks, GUARD + N + GUARD, block bytes +
    gap]`` are every rank's storage, ``entries`` ``[ranks, ..., B, entry]`` the view of their
    entries (``random_storages``). The initial bytes are one copy of all ranks' (so sliced
    the same way)."""
    gaps = blocks[..., entries.shape[2] * entries.shape[3] :]
    initial, gap_initial = entries.clone(), gaps.clone()
    return [
        GuardedCache(entries[rank], initial[rank], gaps[rank], gap_initial[rank])
        for rank in range(blocks.shape[0])
    ]


def random_storages(
    ranks: int, blocks: int, block_size: int, entry: int, gap: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every rank's cache storage, side by side: ``[ranks, GUARD + blocks + GUARD,
    block_size * entry + gap]`` seeded random bytes, and the view of their entries ``[ranks,
    GUARD + blocks + GUARD, block_size, entry]`` (blocks ``gap`` bytes apart). Drawn where
    ``gen`` lives (the device: a cache is the largest buffer of a case, and drawing it on
    the CPU and copying it over cost more than the kernel it surrounds). Unlike the
    activations, these bytes differ between a CPU and a GPU run of the same seed; no verdict
    depends on them, only on whether they changed. Drawn as 64-bit words, whose bytes are as
    uniform as single draws: 6x faster than a draw per byte on the CPU, where a case's
    caches are megabytes. One tensor for all ranks is one draw, and lets ``fused_checks``
    compare every rank's bytes in one pass; each rank still gets its own storage."""
    shape = (ranks, blocks + 2 * GUARD_BLOCKS, block_size * entry + gap)
    count = shape[0] * shape[1] * shape[2]
    words = torch.randint(
        -(2**63), 2**63 - 1, (-(-count // 8),), generator=gen, dtype=torch.int64,
        device=gen.device,
    )  # fmt: skip
    storage = words.view(torch.uint8)[:count].view(shape)
    storage = storage if count % 8 == 0 else storage.clone()  # its own memory, nothing past it
    return storage, storage[..., : block_size * entry].unflatten(-1, (block_size, entry))
