"""Paged cache addressing: where a token's entry lives, and writing/reading it.

A slot is ``block * block_size + offset``. Slots ``< 0`` mean "no entry on this rank"
(another rank owns the token under DCP, or the row is padding), and a write skips them.
Writers return a new tensor and never modify their input, so a test can keep the cache
it started from and compare bytewise.
"""

from __future__ import annotations

import torch

INDEX_SCALE_BYTES = 4
"""Each indexer cache row carries one fp32 scale."""


def _check_cache(cache: torch.Tensor) -> None:
    if cache.dtype != torch.uint8 or cache.dim() != 3:
        raise ValueError(
            f"a paged cache is uint8 [num_blocks, block_size, entry_bytes], "
            f"got {cache.dtype} {tuple(cache.shape)}"
        )


def _check_addressable(slots: torch.Tensor, cache: torch.Tensor) -> None:
    capacity = cache.shape[0] * cache.shape[1]
    if slots.numel() and int(slots.max()) >= capacity:
        raise ValueError(f"slot {int(slots.max())} is beyond the cache's {capacity} slots")


def _owned(slots: torch.Tensor, cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The mask of tokens with an entry on this rank (``slot >= 0``) and their slots.

    No two tokens may write one slot: the result would depend on write order, which no
    contract fixes.
    """
    owned = slots >= 0
    owned_slots = slots[owned].long()
    _check_addressable(owned_slots, cache)
    if owned_slots.unique().numel() != owned_slots.numel():
        raise ValueError("two tokens write the same slot")
    return owned, owned_slots


def _read_slots(slots: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
    if slots.numel() and int(slots.min()) < 0:
        raise ValueError("cannot read a negative slot: the token has no entry on this rank")
    _check_addressable(slots, cache)
    return slots.long()


def write_mla_cache(
    cache: torch.Tensor, slots: torch.Tensor, entries: torch.Tensor
) -> torch.Tensor:
    """A copy of ``cache`` ``[num_blocks, B, E]`` with ``entries[t]`` (``[T, E]`` uint8)
    written at ``slots[t]`` for every ``slots[t] >= 0``; every other byte unchanged."""
    _check_cache(cache)
    if entries.dtype != torch.uint8 or entries.shape != (slots.shape[0], cache.shape[2]):
        raise ValueError(
            f"entries {entries.dtype} {tuple(entries.shape)} are not uint8 rows for "
            f"{slots.shape[0]} slots of {cache.shape[2]} bytes"
        )
    owned, owned_slots = _owned(slots, cache)
    written = cache.clone(memory_format=torch.contiguous_format)
    # [num_blocks, B, E] is contiguous, so slot block * B + offset is row `slot` of this view.
    written.view(-1, cache.shape[2])[owned_slots] = entries[owned]
    return written


def read_mla_cache(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """The entries ``[T, E]`` uint8 stored at ``slots`` (all ``>= 0``)."""
    _check_cache(cache)
    return cache.reshape(-1, cache.shape[2])[_read_slots(slots, cache)]


def _index_byte_offsets(
    slots: torch.Tensor, block_size: int, index_dim: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Byte offsets, in the flattened indexer cache, of each slot's ``index_dim`` fp8 values
    ``[T, I]`` and of its 4 scale bytes ``[T, 4]``.

    A block is ``block_size * (index_dim + 4)`` bytes: first the fp8 values of all its
    tokens, token-major (token ``o`` at ``o * index_dim``), then their fp32 scales (token
    ``o`` at ``block_size * index_dim + 4 * o``). Values and scales of one token are *not*
    adjacent, although the tensor's shape ``[num_blocks, B, I + 4]`` suggests they are.
    """
    block_bytes = block_size * (index_dim + INDEX_SCALE_BYTES)
    block_start = (slots // block_size) * block_bytes
    offset = slots % block_size
    values_start = block_start + offset * index_dim
    scale_start = block_start + block_size * index_dim + offset * INDEX_SCALE_BYTES
    value_lanes = torch.arange(index_dim, device=slots.device)
    scale_lanes = torch.arange(INDEX_SCALE_BYTES, device=slots.device)
    return values_start[:, None] + value_lanes, scale_start[:, None] + scale_lanes


def _check_index_cache(cache: torch.Tensor, index_dim: int) -> None:
    _check_cache(cache)
    if cache.shape[2] != index_dim + INDEX_SCALE_BYTES:
        raise ValueError(
            f"indexer cache rows are {cache.shape[2]} bytes, expected "
            f"{index_dim} values + {INDEX_SCALE_BYTES} scale bytes"
        )


def write_index_cache(
    cache: torch.Tensor, slots: torch.Tensor, values: torch.Tensor, scales: torch.Tensor
) -> torch.Tensor:
    """A copy of the indexer cache ``[num_blocks, B, I + 4]`` with each token's fp8
    ``values[t]`` (``[T, I]`` uint8) and fp32 ``scales[t]`` written at ``slots[t] >= 0`` in
    the per-block packing of :func:`_index_byte_offsets`; every other byte unchanged."""
    index_dim = values.shape[-1]
    _check_index_cache(cache, index_dim)
    num_tokens = slots.shape[0]
    if values.dtype != torch.uint8 or values.shape != (num_tokens, index_dim):
        raise ValueError(f"values {values.dtype} {tuple(values.shape)} are not uint8 fp8 rows")
    if scales.shape != (num_tokens,):
        raise ValueError(f"scales {tuple(scales.shape)} do not match {num_tokens} slots")
    owned, owned_slots = _owned(slots, cache)
    value_bytes, scale_bytes = _index_byte_offsets(owned_slots, cache.shape[1], index_dim)
    written = cache.clone(memory_format=torch.contiguous_format)
    flat = written.view(-1)
    flat[value_bytes] = values[owned]
    flat[scale_bytes] = (
        scales[owned].float().contiguous().view(torch.uint8).reshape(-1, INDEX_SCALE_BYTES)
    )
    return written


def read_index_cache(
    cache: torch.Tensor, slots: torch.Tensor, index_dim: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The fp8 ``values`` ``[T, I]`` uint8 and fp32 ``scales`` ``[T]`` stored at ``slots``
    (all ``>= 0``)."""
    _check_index_cache(cache, index_dim)
    value_bytes, scale_bytes = _index_byte_offsets(
        _read_slots(slots, cache), cache.shape[1], index_dim
    )
    flat = cache.reshape(-1)
    return flat[value_bytes], flat[scale_bytes].view(torch.float32).reshape(-1)
