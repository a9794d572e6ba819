"""The nvfp4_ds_mla cache entry (``contract.NVFP4_DS_MLA_ENTRY_BYTES``), as the project's
Triton kernel (``kernel``) writes it.

Layout (vLLM 0.33.0): bytes [0, 256) hold the 512 NoPE values as e2m1, two per
byte with the even element in the low nibble; [256, 320) the 64 RoPE values as unscaled
e4m3; [320, 352) the 32 e4m3 tile scales, one per 16 NoPE values, tile ``s`` at byte
``8*(s & 3) + (s >> 2)``. A tile's scale is ``e4m3(max(amax / 6, 2^-9))`` rounded to
nearest even, ``amax / 6`` a correctly rounded division (docs/fused-norm-rope.md's formula, the
oracle's default ``"div"`` rule); the tile is divided by the scale as stored.

Everything here is integer and comparison arithmetic (``fp8_codes``): the H200 has no fp4
conversion instruction, and Triton's interpreter no trustworthy fp8 one, so the e2m1
codes, their packing and the e4m3 scales equal the oracle's bit for bit on either backend,
given the same fp32 values (a tile's amax is exact whatever the reduction order).
"""

from __future__ import annotations

import triton
import triton.language as tl

from dcpcheck.ops.fused_norm_rope import contract
from dcpcheck.ops.fused_norm_rope.contract import (
    E2M1_MAX,
    NVFP4_DS_MLA_NUM_TILES,
    NVFP4_DS_MLA_TILE,
    NVFP4_SCALE_FLOOR,
)
from dcpcheck.ops.fused_norm_rope.fp8_codes import e2m1_codes, fp8_e4m3_codes, fp8_e4m3_values

NVFP4_NUM_TILES = tl.constexpr(NVFP4_DS_MLA_NUM_TILES)
NVFP4_TILE_WIDTH = tl.constexpr(NVFP4_DS_MLA_TILE)
NVFP4_NOPE_BYTES = tl.constexpr(contract.NVFP4_DS_MLA_ROPE_OFFSET)
"""Two e2m1 NoPE values per byte: bytes [0, 256) of an nvfp4_ds_mla entry."""
NVFP4_ROPE_OFFSET = tl.constexpr(contract.NVFP4_DS_MLA_ROPE_OFFSET)
NVFP4_SCALES_OFFSET = tl.constexpr(contract.NVFP4_DS_MLA_SCALES_OFFSET)
NVFP4_E2M1_MAX = tl.constexpr(E2M1_MAX)
NVFP4_RATIO_FLOOR = tl.constexpr(NVFP4_SCALE_FLOOR)
"""Floor of ``amax / 6`` before the nvfp4_ds_mla scale is rounded to e4m3 (2^-9)."""


@triton.jit
def write_nvfp4_ds_mla_entries(
    entry_ptr, owned, kv, kpe, rope_lanes, rope_mask, BLOCK_T: tl.constexpr
):
    """nvfp4_ds_mla entries (``contract.NVFP4_DS_MLA_ENTRY_BYTES``): 32 tiles of 16 NoPE
    values as e2m1 pairs, the 64 RoPE values as unscaled e4m3, the 32 e4m3 tile scales at
    their permuted bytes (KV_DIM == BLOCK_KV == 512, ROPE_DIM == 64 here)."""
    tiles = tl.reshape(kv, (BLOCK_T, NVFP4_NUM_TILES, NVFP4_TILE_WIDTH))
    # Tile scale e4m3(max(amax / 6, 2^-9)), rounded to nearest even like every e4m3 here;
    # the values are divided by the scale as stored, decoded back from its byte.
    amax = tl.max(tl.abs(tiles), axis=2)
    ratio = tl.maximum(tl.math.div_rn(amax, NVFP4_E2M1_MAX), NVFP4_RATIO_FLOOR)
    scale_codes = fp8_e4m3_codes(ratio)
    scales = fp8_e4m3_values(scale_codes)
    codes = e2m1_codes(tl.math.div_rn(tiles, scales[:, :, None]))
    # Two codes per byte: element 2j in the low nibble of byte j, 2j + 1 in the high one.
    low, high = tl.split(tl.reshape(codes, (BLOCK_T, NVFP4_NOPE_BYTES, 2)))
    packed = low | high << 4
    byte_lanes = tl.arange(0, NVFP4_NOPE_BYTES)
    tl.store(entry_ptr[:, None] + byte_lanes[None, :], packed.to(tl.uint8), mask=owned[:, None])
    kpe_codes = fp8_e4m3_codes(kpe)
    tl.store(
        entry_ptr[:, None] + NVFP4_ROPE_OFFSET + rope_lanes[None, :],
        kpe_codes.to(tl.uint8),
        mask=rope_mask,
    )
    # Tile s's scale sits at scale byte 8*(s & 3) + (s >> 2) (contract.nvfp4_scale_position).
    tile_ids = tl.arange(0, NVFP4_NUM_TILES)
    positions = 8 * (tile_ids & 3) + (tile_ids >> 2)
    tl.store(
        entry_ptr[:, None] + NVFP4_SCALES_OFFSET + positions[None, :],
        scale_codes.to(tl.uint8),
        mask=owned[:, None],
    )
