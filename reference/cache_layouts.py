"""Byte encodings of one token's cache entries (DESIGN §2), from fp32 values.

Every encoder starts from the fp32 results of the op (``fp8(kv_fp32 / s)``, never
``fp8(bf16(kv) / s)``), and returns ``uint8`` rows, because the harness compares caches
bytewise whatever their layout. Multi-byte fields are laid out as ``Tensor.view(uint8)``
lays them out (little-endian on every machine we run on), which is how a kernel writing
through a typed view of the same bytes stores them.

Cache layouts are named by strings (``"auto"``, ``"fp8"``, ``"fp8_ds_mla"``): the oracle
imports nothing from ``dcpcheck``, so it cannot use the contract's enum.
"""

from __future__ import annotations

import torch

from reference.quant import (
    ds_mla_tile_scale,
    fp8_e4m3_bytes,
    fp8_e4m3_values,
    ue8m0_scale,
)

LAYOUT_AUTO = "auto"
"""``[kv | kpe]`` in the activation dtype (bf16/fp16), ``(KV + R) * itemsize`` bytes."""

LAYOUT_FP8 = "fp8"
"""``fp8(kv / s) | fp8(kpe / s)`` with one per-tensor scale ``s``, ``KV + R`` bytes."""

LAYOUT_FP8_DS_MLA = "fp8_ds_mla"
"""DeepSeek's 656-byte entry: tiled fp8 NoPE, the tile scales, bf16 RoPE."""

MLA_LAYOUTS = (LAYOUT_AUTO, LAYOUT_FP8, LAYOUT_FP8_DS_MLA)

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


def _as_bytes(x: torch.Tensor) -> torch.Tensor:
    """The bytes of each row of ``x`` ``[T, N]``: ``[T, N * itemsize]`` uint8."""
    return x.contiguous().view(torch.uint8)


def _check_scale(layout: str, scale: float | None) -> None:
    if layout not in MLA_LAYOUTS:
        raise ValueError(f"unknown MLA cache layout {layout!r} (expected one of {MLA_LAYOUTS})")
    if layout == LAYOUT_FP8 and scale is None:
        raise ValueError("the fp8 layout needs its per-tensor scale")
    if layout != LAYOUT_FP8 and scale is not None:
        raise ValueError(f"the {layout} layout takes no per-tensor scale, got {scale}")


def _entry_bytes(layout: str, kv_dim: int, rope_dim: int, act_dtype: torch.dtype) -> int:
    if layout == LAYOUT_AUTO:
        return (kv_dim + rope_dim) * act_dtype.itemsize
    if layout == LAYOUT_FP8:
        return kv_dim + rope_dim
    return DS_MLA_ENTRY_BYTES


def _check_ds_mla_dims(kv_dim: int, rope_dim: int) -> None:
    if (kv_dim, rope_dim) != (DS_MLA_NOPE_DIM, DS_MLA_ROPE_DIM):
        raise ValueError(
            f"fp8_ds_mla needs kv dim {DS_MLA_NOPE_DIM} and rope dim {DS_MLA_ROPE_DIM}, "
            f"got {kv_dim} and {rope_dim}"
        )


def encode_mla_entries(
    kv: torch.Tensor,
    kpe: torch.Tensor,
    layout: str,
    act_dtype: torch.dtype,
    scale: float | None,
) -> torch.Tensor:
    """Encode fp32 ``kv`` ``[T, KV]`` and ``kpe`` ``[T, R]`` as MLA cache entries
    ``[T, entry_bytes]`` uint8 in ``layout``.

    ``act_dtype`` is the storage dtype of the ``auto`` layout; ``scale`` is the per-tensor
    scale of the ``fp8`` layout and must be ``None`` for the other two.
    """
    _check_scale(layout, scale)
    kv32, kpe32 = kv.float(), kpe.float()
    if layout == LAYOUT_AUTO:
        return torch.cat([_as_bytes(kv32.to(act_dtype)), _as_bytes(kpe32.to(act_dtype))], dim=-1)
    if layout == LAYOUT_FP8:
        return torch.cat([fp8_e4m3_bytes(kv32 / scale), fp8_e4m3_bytes(kpe32 / scale)], dim=-1)
    _check_ds_mla_dims(kv32.shape[-1], kpe32.shape[-1])
    tiles = kv32.reshape(-1, DS_MLA_NUM_TILES, DS_MLA_TILE)
    tile_scales = ds_mla_tile_scale(tiles.abs().amax(dim=-1))
    nope = fp8_e4m3_bytes(tiles / tile_scales.unsqueeze(-1)).reshape(-1, DS_MLA_NOPE_DIM)
    rope = _as_bytes(kpe32.to(torch.bfloat16))
    return torch.cat([nope, _as_bytes(tile_scales), rope], dim=-1)


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
    if layout == LAYOUT_FP8_DS_MLA:
        _check_ds_mla_dims(kv_dim, rope_dim)
    expected_bytes = _entry_bytes(layout, kv_dim, rope_dim, act_dtype)
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
    nope = fp8_e4m3_values(entries[:, :DS_MLA_SCALES_OFFSET])
    tile_scales = entries[:, DS_MLA_SCALES_OFFSET:DS_MLA_ROPE_OFFSET].contiguous()
    tile_scales = tile_scales.view(torch.float32)
    kv = (nope.reshape(-1, DS_MLA_NUM_TILES, DS_MLA_TILE) * tile_scales.unsqueeze(-1)).reshape(
        -1, DS_MLA_NOPE_DIM
    )
    kpe = entries[:, DS_MLA_ROPE_OFFSET:DS_MLA_ENTRY_BYTES].contiguous().view(torch.bfloat16)
    return kv, kpe.float()


def encode_index_entries(index_k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Encode fp32 indexer keys ``[T, I]`` as ``(values [T, I] uint8 fp8, scales [T] fp32)``.

    Each row has its own power-of-two (UE8M0) scale from its amax, so ``|x / scale| <= 448``
    and decoding multiplies by an exact power of two.
    """
    index32 = index_k.float()
    scales = ue8m0_scale(index32.abs().amax(dim=-1))
    return fp8_e4m3_bytes(index32 / scales.unsqueeze(-1)), scales


def decode_index_entries(values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Decode indexer entries back to fp32 ``[T, I]``: ``fp8 value * row scale``."""
    return fp8_e4m3_values(values) * scales.float().unsqueeze(-1)
