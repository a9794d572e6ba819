"""The fused MLA norm + RoPE + cache-write op of docs/fused-norm-rope.md, and the caches it leaves.

Per token, all in fp32: ``q = RMSNorm(q_c) * w_q``, ``kv = RMSNorm(kv_c) * w_kv``,
``kpe = interleaved RoPE(k_pe)`` at the token's position, and on indexer layers
``index_k = LayerNorm(index_k) * w + b`` with RoPE over its first ``rope_dim`` lanes. The
outputs are these fp32 results rounded once, with torch's round-to-nearest-even
``.to(dtype)``; the cache entries are encoded from the fp32 results, not from the rounded
outputs. Outputs never depend on slots: ownership only decides which cache entries a
kernel writes (:func:`expected_caches`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from reference.cache_layouts import INDEX_SCALE_FP32, encode_index_entries, encode_mla_entries
from reference.norms import layer_norm, rms_norm
from reference.paged_cache import write_index_cache, write_mla_cache
from reference.quant import DS_MLA_SCALE_AMAX, NVFP4_SCALE_DIV
from reference.rope import rope_interleaved, rope_neox


@dataclass(frozen=True)
class FusedReference:
    """What a correct kernel computes for a batch, whatever the slot mapping.

    Outputs are in the activation dtype of their input; the ``*_fp32`` fields are the
    unrounded values the cache encodings start from. Indexer fields are ``None`` on
    shared (no-indexer) layers.
    """

    q_out: torch.Tensor  # [T, Q] activation dtype
    kv_out: torch.Tensor  # [T, KV]
    kpe_out: torch.Tensor  # [T, R]
    index_k_out: torch.Tensor | None  # [T, I]
    kv_fp32: torch.Tensor  # [T, KV]
    kpe_fp32: torch.Tensor  # [T, R]
    index_k_fp32: torch.Tensor | None  # [T, I]
    mla_entries: torch.Tensor  # [T, entry_bytes] uint8, one MLA cache entry per token
    index_values: torch.Tensor | None  # [T, I] uint8 fp8
    index_scales: torch.Tensor | None  # [T] fp32 UE8M0


def _rope_planes(
    positions: torch.Tensor, cos_sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)`` ``[T, h]`` of each token's position, from the ``[cos | sin]`` table."""
    rows = cos_sin[positions.long()].float()
    half = cos_sin.shape[-1] // 2
    return rows[:, :half], rows[:, half:]


def _indexer_key(
    index_k: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    interleaved: bool,
) -> torch.Tensor:
    """LayerNorm of the indexer key, then RoPE over its first ``2h`` lanes; the remaining
    lanes pass through unchanged."""
    normed = layer_norm(index_k, weight, bias, eps)
    rope_dim = 2 * cos.shape[-1]
    rotate = rope_interleaved if interleaved else rope_neox
    return torch.cat([rotate(normed[:, :rope_dim], cos, sin), normed[:, rope_dim:]], dim=-1)


def fused_norm_rope(
    q_c: torch.Tensor,
    q_weight: torch.Tensor,
    kv_c: torch.Tensor,
    kv_weight: torch.Tensor,
    k_pe: torch.Tensor,
    positions: torch.Tensor,
    cos_sin: torch.Tensor,
    eps: float,
    *,
    cache_layout: str,
    mla_scale: float | None = None,
    ds_mla_scale: str = DS_MLA_SCALE_AMAX,
    nvfp4_scale: str = NVFP4_SCALE_DIV,
    index_k: torch.Tensor | None = None,
    index_weight: torch.Tensor | None = None,
    index_bias: torch.Tensor | None = None,
    index_rope_interleaved: bool = False,
) -> FusedReference:
    """The reference results of the fused op for every token (module docstring).

    ``cos_sin`` is the ``[max_pos, R]`` table of :func:`reference.rope.cos_sin_table`;
    ``k_pe`` must have its ``R`` lanes. One ``eps`` serves all three norms. ``mla_scale``
    is the ``fp8`` layout's per-tensor scale (``None`` for the others); ``ds_mla_scale``
    the ``fp8_ds_mla`` layout's tile-scale rule, ``"amax"`` or ``"pow2"``
    (``reference.quant``: vLLM changed it in 0.31.0), ignored by the others;
    ``nvfp4_scale`` how the ``nvfp4_ds_mla`` layout forms ``amax / 6``, ``"div"``
    (docs/fused-norm-rope.md) or ``"mul"`` (vLLM 0.33.0), likewise ignored by the others. Passing
    ``index_k`` (with its LayerNorm ``index_weight`` and ``index_bias``) makes this an
    indexer layer.
    """
    if k_pe.shape[-1] != cos_sin.shape[-1]:
        raise ValueError(
            f"k_pe has {k_pe.shape[-1]} lanes but the cos/sin table rotates {cos_sin.shape[-1]}"
        )
    cos, sin = _rope_planes(positions, cos_sin)
    q32 = rms_norm(q_c, q_weight, eps)
    kv32 = rms_norm(kv_c, kv_weight, eps)
    kpe32 = rope_interleaved(k_pe, cos, sin)
    mla_entries = encode_mla_entries(
        kv32,
        kpe32,
        cache_layout,
        kv_c.dtype,
        mla_scale,
        ds_mla_scale=ds_mla_scale,
        nvfp4_scale=nvfp4_scale,
    )

    index_k32 = index_k_out = index_values = index_scales = None
    if index_k is not None:
        if index_weight is None or index_bias is None:
            raise ValueError("an indexer layer needs index_weight and index_bias")
        index_k32 = _indexer_key(
            index_k, index_weight, index_bias, eps, cos, sin, index_rope_interleaved
        )
        index_k_out = index_k32.to(index_k.dtype)
        index_values, index_scales = encode_index_entries(index_k32)

    return FusedReference(
        q_out=q32.to(q_c.dtype),
        kv_out=kv32.to(kv_c.dtype),
        kpe_out=kpe32.to(k_pe.dtype),
        index_k_out=index_k_out,
        kv_fp32=kv32,
        kpe_fp32=kpe32,
        index_k_fp32=index_k32,
        mla_entries=mla_entries,
        index_values=index_values,
        index_scales=index_scales,
    )


def expected_caches(
    mla_cache: torch.Tensor,
    index_cache: torch.Tensor | None,
    slot_mapping: torch.Tensor | None,
    index_slot_mapping: torch.Tensor | None,
    ref: FusedReference,
    *,
    index_shuffled: bool = False,
    index_scale_format: str = INDEX_SCALE_FP32,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The caches a correct kernel leaves behind, starting from ``mla_cache`` and
    ``index_cache`` (uint8, unmodified; new tensors are returned).

    A profiling call (``slot_mapping`` is ``None``) writes nothing. Otherwise each token's
    MLA entry goes to its ``slot_mapping`` slot and its indexer entry to its
    ``index_slot_mapping`` slot, where the slot is ``>= 0``. The indexer cache is left as
    it was when the layer has no indexer; it is ``None`` when ``index_cache`` is.

    The entries are ``ref``'s, already encoded, so an fp8_ds_mla cache follows the
    tile-scale rule ``ref`` was computed with (``fused_norm_rope``'s ``ds_mla_scale``), and
    an nvfp4_ds_mla cache its ``nvfp4_scale``. The indexer entries are stored at write time,
    so their value layout (``index_shuffled``) and scale format (``index_scale_format``,
    ``"fp32"`` or ``"mx"``) are named here (``reference.paged_cache.write_index_cache``).
    """
    if slot_mapping is None:
        return mla_cache.clone(), None if index_cache is None else index_cache.clone()
    mla = write_mla_cache(mla_cache, slot_mapping, ref.mla_entries)
    if index_cache is None:
        return mla, None
    if ref.index_values is None or ref.index_scales is None:
        return mla, index_cache.clone()
    if index_slot_mapping is None:
        raise ValueError("an indexer layer with a slot mapping needs its index_slot_mapping")
    return mla, write_index_cache(
        index_cache,
        index_slot_mapping,
        ref.index_values,
        ref.index_scales,
        shuffled=index_shuffled,
        scale_format=index_scale_format,
    )
