"""Host-side checks of one launch of the fused kernel against the contract.

A Triton kernel trusts every pointer and stride it is given: a cache one entry too small,
an fp32 activation or a slot past the last block turns into silent garbage or an illegal
memory access, far from its cause. So the wrapper checks every buffer here first and
raises a ``ValueError`` whose one-line message names the buffer and says what is wrong
("kv_out: expected shape (17, 512), got (17, 256)").

The checks also settle the contract's open ends for this kernel:

* ``slot_mapping is None`` is a profiling call: no cache is written (and none is needed).
* An indexer layer with a slot mapping needs its own ``index_slot_mapping`` and
  ``caches.index`` (as the oracle's ``expected_caches`` does): the indexer cache may be
  sharded differently from the MLA cache, so the MLA mapping is no stand-in.
* On a shared layer (``index_k is None``) no indexer buffer is written or size-checked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch

from dcpcheck.ops.fused_norm_rope.contract import (
    DS_MLA_ROPE_DIM,
    CacheLayout,
    FusedOpCaches,
    FusedOpInputs,
    FusedOpOutputs,
    index_entry_bytes,
    mla_entry_bytes,
)

ACTIVATION_DTYPES = (torch.bfloat16, torch.float16)
"""Activation dtypes of the op; outputs and the ``auto`` cache are stored in the same one."""

INDEX_SCALE_ALIGN = 4
"""The indexer cache stores fp32 scales, written through an fp32 pointer: 4-byte aligned."""


@dataclass(frozen=True)
class LaunchShape:
    """The sizes of one checked launch, as the wrapper needs them."""

    num_tokens: int
    q_dim: int
    kv_dim: int
    rope_dim: int
    index_dim: int  # 0 on shared layers
    topk: int
    act_dtype: torch.dtype
    writes_mla_cache: bool
    writes_index_cache: bool


def _shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def _expect_shape(name: str, t: torch.Tensor, shape: tuple[int, ...]) -> None:
    if _shape(t) != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {_shape(t)}")


def _expect_dtype(name: str, t: torch.Tensor, *dtypes: torch.dtype) -> None:
    if t.dtype not in dtypes:
        wanted = " or ".join(str(d) for d in dtypes)
        raise ValueError(f"{name}: expected dtype {wanted}, got {t.dtype}")


def _expect_rows(name: str, t: torch.Tensor, num_tokens: int, dtype: torch.dtype) -> int:
    """A ``[T, D]`` row tensor of ``dtype`` whose last dimension is contiguous; returns ``D``.

    Row strides are free (a slice of a wider projection output is fine): the kernel reads
    them from the tensor.
    """
    if t.dim() != 2 or t.shape[0] != num_tokens:
        raise ValueError(f"{name}: expected shape ({num_tokens}, D), got {_shape(t)}")
    _expect_dtype(name, t, dtype)
    if t.shape[1] > 1 and t.stride(1) != 1:
        raise ValueError(f"{name}: last dimension must be contiguous, got strides {t.stride()}")
    return t.shape[1]


def _expect_vector(name: str, t: torch.Tensor, length: int) -> None:
    _expect_shape(name, t, (length,))
    if not t.is_floating_point():
        raise ValueError(f"{name}: expected a floating-point dtype, got {t.dtype}")
    if length > 1 and t.stride(0) != 1:
        raise ValueError(f"{name}: must be contiguous, got stride {t.stride(0)}")


def _expect_slots(name: str, slots: torch.Tensor, num_tokens: int) -> None:
    """Shape, dtype and layout of a slot mapping; its values: ``_expect_in_range``."""
    _expect_shape(name, slots, (num_tokens,))
    _expect_dtype(name, slots, torch.int64)
    if num_tokens > 1 and slots.stride(0) != 1:
        raise ValueError(f"{name}: must be contiguous, got stride {slots.stride(0)}")


def _expect_paged_cache(
    name: str, cache: torch.Tensor, block_size: int, entry_bytes: int, align: int
) -> int:
    """A ``[num_blocks, block_size, entry_bytes]`` uint8 cache; returns its entry count."""
    if cache.dim() != 3 or _shape(cache)[1:] != (block_size, entry_bytes):
        raise ValueError(
            f"{name}: expected shape (num_blocks, {block_size}, {entry_bytes}), got {_shape(cache)}"
        )
    _expect_dtype(name, cache, torch.uint8)
    if cache.stride(2) != 1:
        raise ValueError(f"{name}: entry bytes must be contiguous, got strides {cache.stride()}")
    if cache.data_ptr() % align or cache.stride(0) % align or cache.stride(1) % align:
        raise ValueError(
            f"{name}: data pointer and strides must be {align}-byte aligned "
            f"(pointer % {align} = {cache.data_ptr() % align}, strides {cache.stride()})"
        )
    return cache.shape[0] * block_size


def _mla_alignment(layout: CacheLayout, act_dtype: torch.dtype) -> int:
    """The widest element the kernel stores through a typed pointer into an MLA entry."""
    if layout is CacheLayout.AUTO:
        return act_dtype.itemsize
    if layout is CacheLayout.FP8_DS_MLA:
        return 4  # fp32 tile scales
    return 1


def _expect_one_device(
    inputs: FusedOpInputs, outputs: FusedOpOutputs, caches: FusedOpCaches, device: torch.device
) -> None:
    """Every tensor of the launch lives on the backend's device (``cuda`` matches ``cuda:0``)."""
    for group, prefix in ((inputs, ""), (outputs, ""), (caches, "caches.")):
        for field in fields(group):
            tensor = getattr(group, field.name)
            if not isinstance(tensor, torch.Tensor):
                continue
            placed = tensor.device
            if placed.type != device.type or (
                device.index is not None and placed.index != device.index
            ):
                raise ValueError(f"{prefix}{field.name}: expected device {device}, got {placed}")


def _expect_in_range(
    inputs: FusedOpInputs,
    cos_sin_rows: int,
    mla_entries: int | None,
    index_entries: int | None,
) -> None:
    """Positions inside the RoPE table and slots inside their caches, or a ``ValueError``.

    These are the only checks that read tensor *values*, so they cost a device-to-host
    copy: all extremes travel in one (a sync per launch, not one per bound).
    """
    extremes = [inputs.positions.min(), inputs.positions.max()]
    if mla_entries is not None:
        extremes.append(inputs.slot_mapping.max())
    if index_entries is not None:
        extremes.append(inputs.index_slot_mapping.max())
    lowest, highest, *slot_max = torch.stack(extremes).tolist()
    if lowest < 0 or highest >= cos_sin_rows:
        raise ValueError(
            f"positions: range [{lowest}, {highest}] is outside the cos_sin table's "
            f"{cos_sin_rows} rows"
        )
    limits = [("slot_mapping", mla_entries), ("index_slot_mapping", index_entries)]
    checked = [(name, entries) for name, entries in limits if entries is not None]
    for (name, entries), largest in zip(checked, slot_max, strict=True):
        if largest >= entries:
            raise ValueError(f"{name}: slot {largest} is outside the cache's {entries} entries")


def check_launch(
    inputs: FusedOpInputs, outputs: FusedOpOutputs, caches: FusedOpCaches, device: torch.device
) -> LaunchShape:
    """Check every buffer of one launch; raise ``ValueError`` naming the first problem.

    ``device`` is the backend's device: every tensor must live there, because the kernel
    is launched on it (a CUDA tensor under the CPU interpreter, or the reverse, fails deep
    inside Triton otherwise).
    """
    _expect_one_device(inputs, outputs, caches, device)
    act_dtype = inputs.q_c.dtype
    _expect_dtype("q_c", inputs.q_c, *ACTIVATION_DTYPES)
    if inputs.q_c.dim() != 2:
        raise ValueError(f"q_c: expected shape (T, Q), got {_shape(inputs.q_c)}")
    num_tokens = inputs.q_c.shape[0]
    q_dim = _expect_rows("q_c", inputs.q_c, num_tokens, act_dtype)
    kv_dim = _expect_rows("kv_c", inputs.kv_c, num_tokens, act_dtype)
    rope_dim = _expect_rows("k_pe", inputs.k_pe, num_tokens, act_dtype)
    if rope_dim % 2:
        raise ValueError(f"k_pe: RoPE needs an even width, got {rope_dim}")
    _expect_vector("q_weight", inputs.q_weight, q_dim)
    _expect_vector("kv_weight", inputs.kv_weight, kv_dim)

    _expect_shape("positions", inputs.positions, (num_tokens,))
    _expect_dtype("positions", inputs.positions, torch.int64)
    if num_tokens > 1 and inputs.positions.stride(0) != 1:
        raise ValueError(f"positions: must be contiguous, got stride {inputs.positions.stride(0)}")
    cos_sin = inputs.cos_sin
    if cos_sin.dim() != 2 or cos_sin.shape[1] != rope_dim:
        raise ValueError(f"cos_sin: expected shape (max_pos, {rope_dim}), got {_shape(cos_sin)}")
    _expect_rows("cos_sin", cos_sin, cos_sin.shape[0], torch.float32)
    if not math.isfinite(inputs.eps) or inputs.eps < 0:
        raise ValueError(f"eps: expected a finite value >= 0, got {inputs.eps}")

    _expect_rows("q_out", outputs.q_out, num_tokens, act_dtype)
    _expect_shape("q_out", outputs.q_out, (num_tokens, q_dim))
    _expect_rows("kv_out", outputs.kv_out, num_tokens, act_dtype)
    _expect_shape("kv_out", outputs.kv_out, (num_tokens, kv_dim))
    _expect_rows("kpe_out", outputs.kpe_out, num_tokens, act_dtype)
    _expect_shape("kpe_out", outputs.kpe_out, (num_tokens, rope_dim))
    topk = _expect_rows("topk_indices", outputs.topk_indices, num_tokens, torch.int32)

    index_dim = 0
    if inputs.has_indexer:
        index_dim = _expect_rows("index_k", inputs.index_k, num_tokens, act_dtype)
        if index_dim < rope_dim:
            raise ValueError(
                f"index_k: RoPE rotates the first {rope_dim} lanes, but the head has {index_dim}"
            )
        for name in ("index_weight", "index_bias"):
            vector = getattr(inputs, name)
            if vector is None:
                raise ValueError(f"{name}: required on indexer layers (index_k is given)")
            _expect_vector(name, vector, index_dim)
        if outputs.index_k_out is None:
            raise ValueError("index_k_out: required on indexer layers (index_k is given)")
        _expect_rows("index_k_out", outputs.index_k_out, num_tokens, act_dtype)
        _expect_shape("index_k_out", outputs.index_k_out, (num_tokens, index_dim))

    layout = inputs.cache_layout
    if not isinstance(layout, CacheLayout):
        raise ValueError(f"cache_layout: expected a CacheLayout, got {layout!r}")
    if layout is CacheLayout.FP8:
        scale = inputs.mla_scale
        if scale is None or not math.isfinite(scale) or scale <= 0:
            raise ValueError(f"mla_scale: the fp8 layout needs a finite scale > 0, got {scale}")
    elif inputs.mla_scale is not None:
        raise ValueError(f"mla_scale: the {layout.value} layout takes none, got {inputs.mla_scale}")
    if layout in (CacheLayout.FP8_DS_MLA, CacheLayout.NVFP4_DS_MLA) and rope_dim != DS_MLA_ROPE_DIM:
        raise ValueError(f"k_pe: {layout.value} needs rope_dim {DS_MLA_ROPE_DIM}, got {rope_dim}")
    if inputs.block_size < 1:
        raise ValueError(f"block_size: expected >= 1, got {inputs.block_size}")

    entry_bytes = mla_entry_bytes(layout, kv_dim, rope_dim, act_dtype)
    mla_entries = _expect_paged_cache(
        "caches.mla", caches.mla, inputs.block_size, entry_bytes, _mla_alignment(layout, act_dtype)
    )
    writes_mla_cache = inputs.slot_mapping is not None
    if writes_mla_cache:
        _expect_slots("slot_mapping", inputs.slot_mapping, num_tokens)
    writes_index_cache = writes_mla_cache and inputs.has_indexer
    index_entries = None
    if writes_index_cache:
        if inputs.index_slot_mapping is None:
            raise ValueError(
                "index_slot_mapping: required on indexer layers when slot_mapping is given"
            )
        if caches.index is None:
            raise ValueError("caches.index: required on indexer layers when slot_mapping is given")
        index_entries = _expect_paged_cache(
            "caches.index",
            caches.index,
            inputs.block_size,
            index_entry_bytes(index_dim),
            INDEX_SCALE_ALIGN,
        )
        if caches.index.stride(1) != index_entry_bytes(index_dim):
            raise ValueError(
                f"caches.index: each block must be contiguous (values, then scales), "
                f"got strides {caches.index.stride()}"
            )
        _expect_slots("index_slot_mapping", inputs.index_slot_mapping, num_tokens)

    if num_tokens:
        _expect_in_range(
            inputs,
            cos_sin.shape[0],
            mla_entries if writes_mla_cache else None,
            index_entries,
        )
    return LaunchShape(
        num_tokens=num_tokens,
        q_dim=q_dim,
        kv_dim=kv_dim,
        rope_dim=rope_dim,
        index_dim=index_dim,
        topk=topk,
        act_dtype=act_dtype,
        writes_mla_cache=writes_mla_cache,
        writes_index_cache=writes_index_cache,
    )
