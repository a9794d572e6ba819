"""Byte encodings of one token's cache entries (docs/fused-norm-rope.md), from fp32 values.

Every encoder starts from the fp32 results of the op (``fp8(kv_fp32 / s)``, never
``fp8(bf16(kv) / s)``), and returns ``uint8`` rows, because the harness compares caches
bytewise whatever their layout. Multi-byte fields are laid out as ``Tensor.view(uint8)``
lays them out (little-endian on every machine we run on), which is how a kernel writing
through a typed view of the same bytes stores them.

Cache layouts are named by strings (``"auto"``, ``"fp8"``, ``"fp8_ds_mla"``,
``"nvfp4_ds_mla"``): the oracle imports nothing from ``dcpcheck``, so it cannot use the
contract's enum. So are the two fp8_ds_mla tile-scale rules (``"amax"``, ``"pow2"``:
``reference.quant`` says which vLLM releases write which), the two ways of forming the
nvfp4_ds_mla tile scale (``"div"``, ``"mul"``) and the two indexer scale formats
(``"fp32"``, ``"mx"``).
"""

from __future__ import annotations

import torch

from reference.quant import (
    DS_MLA_SCALE_AMAX,
    NVFP4_SCALE_DIV,
    check_ds_mla_scale_rule,
    check_nvfp4_scale_rule,
    ds_mla_tile_scale,
    e2m1_codes,
    e2m1_values,
    fp8_e4m3_bytes,
    fp8_e4m3_values,
    nvfp4_tile_scale,
    ue8m0_exponent_bytes,
    ue8m0_exponent_values,
    ue8m0_scale,
)

LAYOUT_AUTO = "auto"
"""``[kv | kpe]`` in the activation dtype (bf16/fp16), ``(KV + R) * itemsize`` bytes."""

LAYOUT_FP8 = "fp8"
"""``fp8(kv / s) | fp8(kpe / s)`` with one per-tensor scale ``s``, ``KV + R`` bytes."""

LAYOUT_FP8_DS_MLA = "fp8_ds_mla"
"""DeepSeek's 656-byte entry: tiled fp8 NoPE, the tile scales, bf16 RoPE."""

LAYOUT_NVFP4_DS_MLA = "nvfp4_ds_mla"
"""vLLM 0.33's 352-byte entry: e2m1 NoPE in 16-value tiles, unscaled e4m3 RoPE, e4m3 tile
scales in a permuted order."""

MLA_LAYOUTS = (LAYOUT_AUTO, LAYOUT_FP8, LAYOUT_FP8_DS_MLA, LAYOUT_NVFP4_DS_MLA)

DS_MLA_NOPE_DIM = 512
"""fp8_ds_mla stores exactly 512 NoPE values (kv_lora_rank of DeepSeek-V3.2 / GLM-5.x)."""

DS_MLA_TILE = 128
"""The NoPE part is quantized in tiles of 128 values, each with its own fp32 scale."""

DS_MLA_NUM_TILES = DS_MLA_NOPE_DIM // DS_MLA_TILE

DS_MLA_ROPE_DIM = 64
"""fp8_ds_mla keeps the 64 RoPE values in bf16 (RoPE is too sensitive for fp8)."""

DS_MLA_SCALES_OFFSET = DS_MLA_NOPE_DIM
"""Byte 512: the 4 fp32 tile scales follow the 512 fp8 NoPE bytes."""

DS_MLA_ROPE_OFFSET = DS_MLA_SCALES_OFFSET + 4 * DS_MLA_NUM_TILES
"""Byte 528: the bf16 RoPE values follow the 16 scale bytes."""

DS_MLA_ENTRY_BYTES = DS_MLA_ROPE_OFFSET + 2 * DS_MLA_ROPE_DIM
"""656 = 512 fp8 NoPE bytes + 16 scale bytes + 128 bf16 RoPE bytes."""

# nvfp4_ds_mla (docs/fused-norm-rope.md): same 512 NoPE + 64 RoPE values as fp8_ds_mla, so it
# reuses DS_MLA_NOPE_DIM and DS_MLA_ROPE_DIM.

NVFP4_DS_MLA_TILE = 16
"""nvfp4_ds_mla quantizes the NoPE values in tiles of 16 (tile ``s`` = values
``[16s, 16s + 16)``), each with its own e4m3 scale (docs/fused-norm-rope.md)."""

NVFP4_DS_MLA_NUM_TILES = DS_MLA_NOPE_DIM // NVFP4_DS_MLA_TILE
"""32 tiles of 16 NoPE values, so 32 one-byte scales."""

NVFP4_DS_MLA_ROPE_OFFSET = DS_MLA_NOPE_DIM // 2
"""Byte 256: two e2m1 NoPE values per byte fill bytes [0, 256), the RoPE bytes follow."""

NVFP4_DS_MLA_SCALES_OFFSET = NVFP4_DS_MLA_ROPE_OFFSET + DS_MLA_ROPE_DIM
"""Byte 320: the 64 one-byte e4m3 RoPE values fill [256, 320), the 32 tile scales follow."""

NVFP4_DS_MLA_ENTRY_BYTES = NVFP4_DS_MLA_SCALES_OFFSET + NVFP4_DS_MLA_NUM_TILES
"""352 = 256 e2m1 NoPE bytes + 64 e4m3 RoPE bytes + 32 e4m3 scale bytes
(docs/fused-norm-rope.md)."""

NVFP4_DS_MLA_SCALE_POSITIONS = tuple(
    8 * (tile & 3) + (tile >> 2) for tile in range(NVFP4_DS_MLA_NUM_TILES)
)
"""Byte, within the 32-byte scale region, of tile ``s``'s scale: ``8 * (s & 3) + (s >> 2)``
(docs/fused-norm-rope.md). It is a transpose of the 32 scales as a [8, 4] grid, ``s = 4 * (b & 7) +
(b >> 3)`` for byte ``b``: tiles 0, 4, 8, ... 28 fill bytes 0..7, tiles 1, 5, ... 29 bytes 8..15."""


def _as_bytes(x: torch.Tensor) -> torch.Tensor:
    """The bytes of each row of ``x`` ``[T, N]``: ``[T, N * itemsize]`` uint8."""
    return x.contiguous().view(torch.uint8)


def _check_layout(layout: str) -> None:
    if layout not in MLA_LAYOUTS:
        raise ValueError(f"unknown MLA cache layout {layout!r} (expected one of {MLA_LAYOUTS})")


def _check_scale(layout: str, scale: float | None) -> None:
    _check_layout(layout)
    if layout == LAYOUT_FP8 and scale is None:
        raise ValueError("the fp8 layout needs its per-tensor scale")
    if layout != LAYOUT_FP8 and scale is not None:
        raise ValueError(f"the {layout} layout takes no per-tensor scale, got {scale}")


def mla_entry_bytes(layout: str, kv_dim: int, rope_dim: int, act_dtype: torch.dtype) -> int:
    """Bytes of one MLA cache entry in ``layout``; the two ds_mla layouts need
    ``kv_dim`` 512 and ``rope_dim`` 64 (``ValueError`` otherwise)."""
    _check_layout(layout)
    if layout == LAYOUT_AUTO:
        return (kv_dim + rope_dim) * act_dtype.itemsize
    if layout == LAYOUT_FP8:
        return kv_dim + rope_dim
    _check_ds_mla_dims(layout, kv_dim, rope_dim)
    if layout == LAYOUT_NVFP4_DS_MLA:
        return NVFP4_DS_MLA_ENTRY_BYTES
    return DS_MLA_ENTRY_BYTES


def _check_ds_mla_dims(layout: str, kv_dim: int, rope_dim: int) -> None:
    if (kv_dim, rope_dim) != (DS_MLA_NOPE_DIM, DS_MLA_ROPE_DIM):
        raise ValueError(
            f"{layout} needs kv dim {DS_MLA_NOPE_DIM} and rope dim {DS_MLA_ROPE_DIM}, "
            f"got {kv_dim} and {rope_dim}"
        )


def _encode_fp8_ds_mla(kv32: torch.Tensor, kpe32: torch.Tensor, rule: str) -> torch.Tensor:
    """fp8_ds_mla entries: 4 tiles of 128 fp8 NoPE values, their fp32 scales, bf16 RoPE."""
    tiles = kv32.reshape(-1, DS_MLA_NUM_TILES, DS_MLA_TILE)
    tile_scales = ds_mla_tile_scale(tiles.abs().amax(dim=-1), rule)
    nope = fp8_e4m3_bytes(tiles / tile_scales.unsqueeze(-1)).reshape(-1, DS_MLA_NOPE_DIM)
    rope = _as_bytes(kpe32.to(torch.bfloat16))
    return torch.cat([nope, _as_bytes(tile_scales), rope], dim=-1)


def _decode_fp8_ds_mla(entries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    nope = fp8_e4m3_values(entries[:, :DS_MLA_SCALES_OFFSET])
    tile_scales = entries[:, DS_MLA_SCALES_OFFSET:DS_MLA_ROPE_OFFSET].contiguous()
    tile_scales = tile_scales.view(torch.float32)
    kv = (nope.reshape(-1, DS_MLA_NUM_TILES, DS_MLA_TILE) * tile_scales.unsqueeze(-1)).reshape(
        -1, DS_MLA_NOPE_DIM
    )
    kpe = entries[:, DS_MLA_ROPE_OFFSET:DS_MLA_ENTRY_BYTES].contiguous().view(torch.bfloat16)
    return kv, kpe.float()


def pack_e2m1_pairs(codes: torch.Tensor) -> torch.Tensor:
    """Pack 4-bit codes ``[..., 2N]`` two to a byte ``[..., N]``: element ``2j`` in the low
    nibble of byte ``j``, element ``2j + 1`` in the high nibble (docs/fused-norm-rope.md), which is
    the order a little-endian load of the packed bytes reads them back in."""
    pairs = codes.reshape(*codes.shape[:-1], codes.shape[-1] // 2, 2)  # also for no rows
    return pairs[..., 0] | (pairs[..., 1] << 4)


def unpack_e2m1_pairs(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`pack_e2m1_pairs`: bytes ``[..., N]`` to codes ``[..., 2N]``."""
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2)


def _scale_positions(device: torch.device) -> torch.Tensor:
    return torch.tensor(NVFP4_DS_MLA_SCALE_POSITIONS, dtype=torch.long, device=device)


def _encode_nvfp4_ds_mla(kv32: torch.Tensor, kpe32: torch.Tensor, rule: str) -> torch.Tensor:
    """nvfp4_ds_mla entries (docs/fused-norm-rope.md): e2m1 NoPE pairs, unscaled e4m3 RoPE, permuted
    e4m3 tile scales.

    Each tile is divided by its scale *as stored* (the e4m3-rounded value), so decoding
    ``code * stored scale`` inverts exactly what was rounded; dividing by the unrounded
    ratio would leave an error that the stored entry cannot account for.
    """
    tiles = kv32.reshape(-1, NVFP4_DS_MLA_NUM_TILES, NVFP4_DS_MLA_TILE)
    tile_scales = nvfp4_tile_scale(tiles.abs().amax(dim=-1), rule)  # [T, 32] fp32, e4m3 values
    codes = e2m1_codes(tiles / tile_scales.unsqueeze(-1)).reshape(-1, DS_MLA_NOPE_DIM)
    scale_bytes = torch.empty_like(tile_scales, dtype=torch.uint8)
    scale_bytes[:, _scale_positions(kv32.device)] = fp8_e4m3_bytes(tile_scales)
    return torch.cat([pack_e2m1_pairs(codes), fp8_e4m3_bytes(kpe32), scale_bytes], dim=-1)


def _decode_nvfp4_ds_mla(entries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    codes = unpack_e2m1_pairs(entries[:, :NVFP4_DS_MLA_ROPE_OFFSET])
    scale_region = entries[:, NVFP4_DS_MLA_SCALES_OFFSET:NVFP4_DS_MLA_ENTRY_BYTES]
    tile_scales = fp8_e4m3_values(scale_region[:, _scale_positions(entries.device)])
    tiles = e2m1_values(codes).reshape(-1, NVFP4_DS_MLA_NUM_TILES, NVFP4_DS_MLA_TILE)
    kv = (tiles * tile_scales.unsqueeze(-1)).reshape(-1, DS_MLA_NOPE_DIM)
    kpe = fp8_e4m3_values(entries[:, NVFP4_DS_MLA_ROPE_OFFSET:NVFP4_DS_MLA_SCALES_OFFSET])
    return kv, kpe


def encode_mla_entries(
    kv: torch.Tensor,
    kpe: torch.Tensor,
    layout: str,
    act_dtype: torch.dtype,
    scale: float | None,
    *,
    ds_mla_scale: str = DS_MLA_SCALE_AMAX,
    nvfp4_scale: str = NVFP4_SCALE_DIV,
) -> torch.Tensor:
    """Encode fp32 ``kv`` ``[T, KV]`` and ``kpe`` ``[T, R]`` as MLA cache entries
    ``[T, entry_bytes]`` uint8 in ``layout``.

    ``act_dtype`` is the storage dtype of the ``auto`` layout; ``scale`` is the per-tensor
    scale of the ``fp8`` layout and must be ``None`` for the others. ``ds_mla_scale``
    names the fp8_ds_mla tile-scale rule (``"amax"`` or ``"pow2"``) and ``nvfp4_scale``
    how the nvfp4_ds_mla tile scale forms ``amax / 6`` (``"div"`` or ``"mul"``; see
    ``reference.quant``); each must be a known name whatever the layout, and only its own
    layout uses it. Decoding needs no rule: the entry stores its scales.
    """
    _check_scale(layout, scale)
    check_ds_mla_scale_rule(ds_mla_scale)
    check_nvfp4_scale_rule(nvfp4_scale)
    kv32, kpe32 = kv.float(), kpe.float()
    if layout == LAYOUT_AUTO:
        return torch.cat([_as_bytes(kv32.to(act_dtype)), _as_bytes(kpe32.to(act_dtype))], dim=-1)
    if layout == LAYOUT_FP8:
        return torch.cat([fp8_e4m3_bytes(kv32 / scale), fp8_e4m3_bytes(kpe32 / scale)], dim=-1)
    _check_ds_mla_dims(layout, kv32.shape[-1], kpe32.shape[-1])
    if layout == LAYOUT_NVFP4_DS_MLA:
        return _encode_nvfp4_ds_mla(kv32, kpe32, nvfp4_scale)
    return _encode_fp8_ds_mla(kv32, kpe32, ds_mla_scale)


def decode_mla_entries(
    entries: torch.Tensor,
    layout: str,
    kv_dim: int,
    rope_dim: int,
    act_dtype: torch.dtype,
    scale: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode MLA cache entries ``[T, entry_bytes]`` uint8 back to fp32
    ``(kv [T, KV], kpe [T, R])``; the inverse of :func:`encode_mla_entries` up to the
    rounding of the encoding."""
    _check_scale(layout, scale)
    expected_bytes = mla_entry_bytes(layout, kv_dim, rope_dim, act_dtype)
    if entries.dtype != torch.uint8 or entries.shape[-1] != expected_bytes:
        raise ValueError(
            f"{layout} entries must be uint8 [T, {expected_bytes}], "
            f"got {entries.dtype} {tuple(entries.shape)}"
        )
    entries = entries.contiguous()
    if layout == LAYOUT_AUTO:
        values = entries.view(act_dtype).float()
        return values[:, :kv_dim], values[:, kv_dim:]
    if layout == LAYOUT_FP8:
        values = fp8_e4m3_values(entries) * scale
        return values[:, :kv_dim], values[:, kv_dim:]
    if layout == LAYOUT_NVFP4_DS_MLA:
        return _decode_nvfp4_ds_mla(entries)
    return _decode_fp8_ds_mla(entries)


# --- indexer entries -----------------------------------------------------------------------

INDEX_SCALE_FP32 = "fp32"
"""Each indexer row's power-of-two scale stored as its 4 little-endian fp32 bytes."""

INDEX_SCALE_MX = "mx"
"""MX-packed (vLLM 0.33.0): the scale's UE8M0 byte ``e`` (its fp32 biased exponent)
in all four bytes of the row's 32-bit word, which therefore equals ``e * 0x01010101``."""

INDEX_SCALE_FORMATS = (INDEX_SCALE_FP32, INDEX_SCALE_MX)
"""Every indexer scale format the oracle knows, by name."""

INDEX_SCALE_BYTES = 4
"""Each indexer cache row carries 4 scale bytes, whatever the scale format."""


def _check_index_scale_format(scale_format: str) -> None:
    if scale_format not in INDEX_SCALE_FORMATS:
        raise ValueError(
            f"unknown indexer scale format {scale_format!r} (expected one of {INDEX_SCALE_FORMATS})"
        )


def encode_index_entries(index_k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Encode fp32 indexer keys ``[T, I]`` as ``(values [T, I] uint8 fp8, scales [T] fp32)``.

    Each row has its own power-of-two (UE8M0) scale from its amax, so ``|x / scale| <= 448``
    and decoding multiplies by an exact power of two. The scale's *value* is the same in
    both scale formats; :func:`encode_index_scales` gives its stored bytes in either.
    """
    index32 = index_k.float()
    scales = ue8m0_scale(index32.abs().amax(dim=-1))
    return fp8_e4m3_bytes(index32 / scales.unsqueeze(-1)), scales


def decode_index_entries(values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Decode indexer entries back to fp32 ``[T, I]``: ``fp8 value * row scale``."""
    return fp8_e4m3_values(values) * scales.float().unsqueeze(-1)


def encode_index_scales(scales: torch.Tensor, scale_format: str = INDEX_SCALE_FP32) -> torch.Tensor:
    """The 4 stored bytes ``[T, 4]`` uint8 of each row's fp32 scale ``[T]`` in
    ``scale_format``: its little-endian fp32 bytes (``"fp32"``), or its UE8M0 byte four
    times (``"mx"``; the scale must be a normal positive power of two, as the indexer's
    always is, since UE8M0 stores nothing else)."""
    _check_index_scale_format(scale_format)
    if scale_format == INDEX_SCALE_MX:
        return ue8m0_exponent_bytes(scales).unsqueeze(-1).expand(-1, INDEX_SCALE_BYTES).clone()
    return scales.float().contiguous().view(torch.uint8).reshape(-1, INDEX_SCALE_BYTES)


def decode_index_scales(
    scale_bytes: torch.Tensor, scale_format: str = INDEX_SCALE_FP32
) -> torch.Tensor:
    """The fp32 scales ``[T]`` stored as ``[T, 4]`` uint8 in ``scale_format``.

    An ``"mx"`` word whose four bytes are not one exponent replicated decodes as NaN, so a
    check comparing it with the oracle fails, instead of trusting one byte and never
    looking at the other three.
    """
    _check_index_scale_format(scale_format)
    if scale_bytes.dtype != torch.uint8 or scale_bytes.shape[-1] != INDEX_SCALE_BYTES:
        raise ValueError(
            f"scale bytes must be uint8 [T, {INDEX_SCALE_BYTES}], "
            f"got {scale_bytes.dtype} {tuple(scale_bytes.shape)}"
        )
    if scale_format == INDEX_SCALE_FP32:
        return scale_bytes.contiguous().view(torch.float32).reshape(-1)
    replicated = (scale_bytes == scale_bytes[:, :1]).all(dim=-1)
    return torch.where(replicated, ue8m0_exponent_values(scale_bytes[:, 0]), torch.nan)
