"""The indexer cache entry, as the project's Triton kernel (``kernel``)
stores it once the row is quantized: ``INDEX_DIM`` fp8 codes and one power-of-two scale per
token, in the case's ``contract.IndexFormat``.

A block of ``B`` tokens holds all its value bytes first, then its ``B`` 4-byte scales
(``contract.index_entry_bytes``). The values are token-major, or, in the shuffled format
(vLLM 0.31.0 on), ``[B/16, I/16, 16 tokens, 16 bytes]``: token ``t``'s byte ``c`` sits in
tile ``(t // 16, c // 16)`` at ``(t % 16) * 16 + c % 16``, so each tile is one contiguous
256-byte run. A scale is its fp32, or, MX-packed (vLLM 0.33.0), its UE8M0 byte (the
fp32's biased exponent: the scale is a power of two) in all four bytes.
"""

from __future__ import annotations

import triton
import triton.language as tl

from dcpcheck.ops.fused_norm_rope import contract

INDEX_SCALE_BYTES = tl.constexpr(contract.INDEX_SCALE_BYTES)
SHUFFLE_TILE = tl.constexpr(contract.INDEX_SHUFFLE_TILE)
"""The shuffled layout's tile: 16 tokens x 16 bytes, one contiguous run."""
UE8M0_REPLICATED = tl.constexpr(0x01010101)
"""An MX-packed scale is its UE8M0 byte in all four bytes: ``e * 0x01010101``."""


@triton.jit
def store_index_entries(
    index_cache_ptr,
    index_block_stride,
    cache_block_size,
    slots,
    owned,
    lanes,
    lane_ok,
    codes,
    scale,
    INDEX_DIM: tl.constexpr,
    SHUFFLED: tl.constexpr,
    SCALE_MX: tl.constexpr,
):
    """Store each owned token's fp8 ``codes`` ``[BLOCK_T, BLOCK_INDEX]`` and power-of-two
    ``scale`` ``[BLOCK_T]`` at its ``slots`` entry (module docstring)."""
    slots = tl.where(owned, slots, 0)
    block = index_cache_ptr + (slots // cache_block_size) * index_block_stride
    offset = slots % cache_block_size
    if SHUFFLED:
        token_in_tile = offset[:, None] % SHUFFLE_TILE
        byte_in_tile = lanes[None, :] % SHUFFLE_TILE
        within = token_in_tile * SHUFFLE_TILE + byte_in_tile
        tile_row = (offset[:, None] // SHUFFLE_TILE) * SHUFFLE_TILE * INDEX_DIM
        tile_column = (lanes[None, :] // SHUFFLE_TILE) * SHUFFLE_TILE * SHUFFLE_TILE
        value_ptr = block[:, None] + tile_row + tile_column + within
    else:
        value_ptr = block[:, None] + offset[:, None] * INDEX_DIM + lanes[None, :]
    tl.store(value_ptr, codes.to(tl.uint8), mask=owned[:, None] & lane_ok[None, :])
    scale_ptr = block + cache_block_size * INDEX_DIM + offset * INDEX_SCALE_BYTES
    if SCALE_MX:
        exponent = (scale.to(tl.int32, bitcast=True) >> 23) & 0xFF
        word = exponent * UE8M0_REPLICATED
        tl.store(scale_ptr.to(tl.pointer_type(tl.int32)), word, mask=owned)
    else:
        tl.store(scale_ptr.to(tl.pointer_type(tl.float32)), scale, mask=owned)
