"""Paged cache addressing: where a token's entry lives, and writing/reading it.

A slot is ``block * block_size + offset``. Slots ``< 0`` mean "no entry on this rank"
(another rank owns the token under DCP, or the row is padding), and a write skips them.
Writers return a new tensor and never modify their input, so a test can keep the cache
it started from and compare bytewise.

The indexer cache has two value layouts (plain, token-major; and shuffled into 16 x 16
tiles, vLLM 0.31+) and two scale formats (fp32, MX-packed UE8M0 bytes): each is a
keyword of :func:`write_index_cache` and :func:`read_index_cache`, named, never guessed.
"""

from __future__ import annotations

import torch

from reference.cache_layouts import (
    INDEX_SCALE_BYTES,
    INDEX_SCALE_FP32,
    decode_index_scales,
    encode_index_scales,
)

INDEX_SHUFFLE_TILE = 16
"""The shuffled indexer layout stores a block's values as [B/16, I/16, 16 tokens, 16 bytes]
(docs/fused-norm-rope.md): 16-token x 16-byte tiles, each contiguous (256 bytes)."""


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


def _value_offsets_in_block(
    offset: torch.Tensor, lanes: torch.Tensor, index_dim: int, shuffled: bool
) -> torch.Tensor:
    """Byte offset, within a block's ``block_size * index_dim`` value bytes, of lane ``c`` of
    the token at block offset ``t``: ``[T, I]`` from ``offset`` ``[T, 1]`` and ``lanes``
    ``[I]``.

    Plain: token-major, ``t * I + c``. Shuffled: ``[B/16, I/16, 16, 16]``, so a 16-token x
    16-byte tile is one contiguous 256-byte run (what a reader loading 16 tokens' 16 bytes
    at a time wants): ``(t // 16) * 16 * I + (c // 16) * 256 + (t % 16) * 16 + c % 16``.
    """
    if not shuffled:
        return offset * index_dim + lanes
    tile = INDEX_SHUFFLE_TILE
    return (
        (offset // tile) * tile * index_dim
        + (lanes // tile) * tile * tile
        + (offset % tile) * tile
        + lanes % tile
    )


def _check_shuffle(block_size: int, index_dim: int, shuffled: bool) -> None:
    if shuffled and (block_size % INDEX_SHUFFLE_TILE or index_dim % INDEX_SHUFFLE_TILE):
        raise ValueError(
            f"the shuffled indexer layout needs block size and index dim that are multiples "
            f"of {INDEX_SHUFFLE_TILE}, got block size {block_size} and index dim {index_dim}"
        )


def _index_byte_offsets(
    slots: torch.Tensor, block_size: int, index_dim: int, shuffled: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Byte offsets, in the flattened indexer cache, of each slot's ``index_dim`` fp8 values
    ``[T, I]`` and of its 4 scale bytes ``[T, 4]``.

    A block is ``block_size * (index_dim + 4)`` bytes: first the fp8 values of all its
    tokens (token-major, or in 16 x 16 tiles when ``shuffled``: see
    :func:`_value_offsets_in_block`), then their scales (token ``o`` at
    ``block_size * index_dim + 4 * o``, in either value layout). Values and scales of one
    token are *not* adjacent, although the tensor's shape ``[num_blocks, B, I + 4]``
    suggests they are.
    """
    _check_shuffle(block_size, index_dim, shuffled)
    block_bytes = block_size * (index_dim + INDEX_SCALE_BYTES)
    block_start = (slots // block_size) * block_bytes
    offset = slots % block_size
    value_lanes = torch.arange(index_dim, device=slots.device)
    values = block_start[:, None] + _value_offsets_in_block(
        offset[:, None], value_lanes, index_dim, shuffled
    )
    scale_start = block_start + block_size * index_dim + offset * INDEX_SCALE_BYTES
    scale_lanes = torch.arange(INDEX_SCALE_BYTES, device=slots.device)
    return values, scale_start[:, None] + scale_lanes


def _check_index_cache(cache: torch.Tensor, index_dim: int) -> None:
    _check_cache(cache)
    if cache.shape[2] != index_dim + INDEX_SCALE_BYTES:
        raise ValueError(
            f"indexer cache rows are {cache.shape[2]} bytes, expected "
            f"{index_dim} values + {INDEX_SCALE_BYTES} scale bytes"
        )


def write_index_cache(
    cache: torch.Tensor,
    slots: torch.Tensor,
    values: torch.Tensor,
    scales: torch.Tensor,
    *,
    shuffled: bool = False,
    scale_format: str = INDEX_SCALE_FP32,
) -> torch.Tensor:
    """A copy of the indexer cache ``[num_blocks, B, I + 4]`` with each token's fp8
    ``values[t]`` (``[T, I]`` uint8) and fp32 ``scales[t]`` written at ``slots[t] >= 0`` in
    the per-block packing of :func:`_index_byte_offsets`; every other byte unchanged.

    ``shuffled`` picks the 16 x 16-tiled value layout (block size and ``I`` multiples of
    16, ``ValueError`` otherwise); ``scale_format`` stores each scale as fp32 (``"fp32"``)
    or as its UE8M0 byte replicated over the 4 bytes (``"mx"``, see
    :func:`reference.cache_layouts.encode_index_scales`).
    """
    index_dim = values.shape[-1]
    _check_index_cache(cache, index_dim)
    num_tokens = slots.shape[0]
    if values.dtype != torch.uint8 or values.shape != (num_tokens, index_dim):
        raise ValueError(f"values {values.dtype} {tuple(values.shape)} are not uint8 fp8 rows")
    if scales.shape != (num_tokens,):
        raise ValueError(f"scales {tuple(scales.shape)} do not match {num_tokens} slots")
    owned, owned_slots = _owned(slots, cache)
    scale_bytes = encode_index_scales(scales[owned], scale_format)
    value_offsets, scale_offsets = _index_byte_offsets(
        owned_slots, cache.shape[1], index_dim, shuffled
    )
    written = cache.clone(memory_format=torch.contiguous_format)
    flat = written.view(-1)
    flat[value_offsets] = values[owned]
    flat[scale_offsets] = scale_bytes
    return written


def read_index_cache(
    cache: torch.Tensor,
    slots: torch.Tensor,
    index_dim: int,
    *,
    shuffled: bool = False,
    scale_format: str = INDEX_SCALE_FP32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The fp8 ``values`` ``[T, I]`` uint8 and fp32 ``scales`` ``[T]`` stored at ``slots``
    (all ``>= 0``), in the value layout and scale format named as for
    :func:`write_index_cache`. A malformed ``"mx"`` word reads as a NaN scale."""
    _check_index_cache(cache, index_dim)
    value_offsets, scale_offsets = _index_byte_offsets(
        _read_slots(slots, cache), cache.shape[1], index_dim, shuffled
    )
    flat = cache.reshape(-1)
    return flat[value_offsets], decode_index_scales(flat[scale_offsets], scale_format)
