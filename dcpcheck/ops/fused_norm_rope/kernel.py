"""The project's fused MLA norm + RoPE + cache-write kernel (docs/fused-norm-rope.md), in Triton.

This module is the kernel's arithmetic only; its host side (the buffer checks, tile sizes,
grid and launch, and ``make_kernel``) is ``launcher``.

Grid
----
One launch covers the op on a 1-D grid (axes 1 and 2 stop at 65,535 programs; a prefill
batch is easily 65,536 tokens). With ``TASKS`` sub-tasks per launch, program ``p`` runs
sub-task ``FIRST_TASK + p % TASKS`` on the ``BLOCK_T`` tokens of block ``p // TASKS``:

====  =====================================================================================
0     indexer K: LayerNorm * w + b, RoPE over the first ``rope_dim`` lanes (interleaved or
      NeoX), fp8 with a UE8M0 row scale into the indexer cache (indexer slot mapping)
1     top-k fill: the row of ``topk_indices`` set to -1
2     KV: RMSNorm -> ``kv_out`` and the cache's NoPE part; k_pe: interleaved RoPE ->
      ``kpe_out`` and the cache's RoPE part
3     Q: RMSNorm -> ``q_out``
====  =====================================================================================

The sub-task varies fastest so that the programs a GPU holds at once mix the short,
latency-bound indexer rows, the store-only top-k fill and the KV rows; as the slow axis
the sub-tasks ran in phases, each using HBM badly in its own way (BENCHMARKS.md, "The
kernel's bandwidth"). A launch runs sub-tasks ``FIRST_TASK`` to ``LAST_TASK``; shared layers start
at 2. Q is last so a large launch can run it apart (``launcher.GPU_Q_APART_FROM_TOKENS``): a
binary has one register count, its widest path's, and Q's is the widest. A one-sub-task
launch resolves the dispatch at compile time; the same code runs on the same values.

``nvfp4_ds_mla`` writes nvfp4_ds_mla entries (no fp4 instruction). The
fp8_ds_mla tile scale follows the rule the case demands (``inputs.ds_mla_scale``,
``contract.DsMlaScale``), compiled in as the ``DS_MLA_POW2`` constexpr: ``amax * (1/448)``
floored at FLT_MIN, or that ratio floored at 1e-4 and rounded up to a power of two from its
fp32 bits (never a floating ``log2``, which is approximate on the GPU), so both rules
match the oracle bit for bit on the CPU and the GPU.

Every sub-task computes in fp32 and rounds once, on store. Outputs are written for every
token whatever its slot; only the cache writes look at the slot, and only where it is
``>= 0`` (the DCP contract: a token owned by another rank still needs its normalized
K and Q on this rank). Cache encodings start from the fp32 values.

Rounding
--------
The kernel is compiled without FMA contraction (``enable_fp_fusion=False``), so every
fp32 multiply and add rounds on its own, exactly as the oracle's torch ops do. Contracted,
``x1*cos - x2*sin`` keeps the unrounded product: where the two products nearly cancel,
it moved by up to 32 bf16 ulps from the oracle (k_pe, 65,536 tokens, H200). Reductions
(mean of squares, LayerNorm statistics, amax) still run in Triton's order, so those agree
with the oracle to a few fp32 ulps, not bitwise. Divisions and square roots are the
correctly rounded ``div_rn`` / ``sqrt_rn``, because the GPU's default ``/`` and ``rsqrt``
are approximate.

Addressing
----------
Row offsets and cache offsets are computed in 64-bit: the program id is widened to int64
before it is multiplied by ``BLOCK_T``, and slots are int64 loads. ``token * row_stride``
passes 2^31 at about a million tokens of a 2048-wide bf16 row, and ``slot * 656`` passes
it at 3.3 million cache slots, both within reach of real deployments; in 32-bit either
product would wrap to a negative offset and write far outside the buffer.

Caches arrive as ``uint8`` byte tensors (``contract``): the kernel addresses
every entry in bytes and casts the pointer to the element type it stores (fp32 scales,
bf16 RoPE values, activation-dtype ``auto`` entries).

Variants
--------
The selftest's mutants are edits of this file's source (``variants``: each names the
function it changes, the text it replaces and the text that replaces it), compiled as a
copy of the module of its own (``variant_build``). The file holds the kernel and nothing
else, but for a few parameters that serve an edit rather than the kernel: ``live`` and
``mla_num_blocks`` of ``_mla_entry`` (the tile's rows and the cache's extent, which an
addressing slip needs), ``slot_ptr`` and ``HAS_SLOTS`` of ``_q_task`` and ``slot_ptr`` of
``_indexer_k_task`` (the MLA slots, which the historical Q early-out and a slot-mapping
mix-up read).

Compiled variants
-----------------
A run compiles one binary per distinct tuple of constexprs it launches with, and each of
them must be one, because it picks code, not a value:

* ``Q_DIM``, ``KV_DIM``, ``ROPE_DIM``, ``INDEX_DIM``, ``TOPK`` and their ``BLOCK_*`` (the
  model preset): a row is one tile, ``tl.arange`` needs a power-of-two compile-time width,
  and the lane masks fold away where the width is already one;
* ``BLOCK_T`` (one token per program on a GPU; interpreter tiles);
* ``FIRST_TASK`` and ``LAST_TASK`` (indexer layer or shared; Q apart or not),
  ``CACHE_LAYOUT``, ``DS_MLA_POW2``, ``WRITES_INDEX_CACHE``, ``INDEX_SHUFFLED``,
  ``INDEX_SCALE_MX``, ``INDEX_ROPE_NEOX``: each sub-task set, entry format and RoPE pairing
  is different code, and a runtime switch would hold every format's registers live at
  once (the kernel is latency-bound on occupancy already);
* ``HAS_SLOTS`` (a profiling call writes no cache).

The runtime integers that vary from batch to batch (``num_tokens``, ``cache_block_size``,
``mla_num_blocks``) are not specialized on (``do_not_specialize``): Triton would otherwise
compile again for a value of 1 or a multiple of 16, which changes alignment hints but no
arithmetic, so a decode batch and a prefill batch of one layout share one binary (below
``launcher.GPU_Q_APART_FROM_TOKENS``). Strides are specialized: they follow the preset, a
constexpr anyway. Pointers are specialized on 16-byte alignment, as Triton does; the
harness starts every rank's slot mapping on a 16-byte boundary
(``case.ROW_ALIGNMENT_BYTES``), as production's separate allocations are, so the ranks of
a case share a binary. A run compiles its binaries on
threads before its cases (``compile_ahead``); BENCHMARKS.md counts them.

"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dcpcheck.ops.fused_norm_rope import contract
from dcpcheck.ops.fused_norm_rope.contract import (
    DS_MLA_NOPE_DIM,
    DS_MLA_POW2_RATIO_FLOOR,
    DS_MLA_TILE,
    FP8_E4M3_MAX,
    CacheLayout,
)
from dcpcheck.ops.fused_norm_rope.fp8_codes import (
    fp8_e4m3_codes,
    power_of_two_at_or_above,
    ue8m0_scale,
)
from dcpcheck.ops.fused_norm_rope.index_cache import store_index_entries
from dcpcheck.ops.fused_norm_rope.nvfp4_ds_mla import write_nvfp4_ds_mla_entries

TASK_INDEXER_K = tl.constexpr(0)
TASK_TOPK_FILL = tl.constexpr(1)
TASK_KV = tl.constexpr(2)
TASK_Q = tl.constexpr(3)
"""The sub-tasks (module docstring, "Grid"); the launcher picks the first and last."""

LAYOUT_CODES = {layout: code for code, layout in enumerate(CacheLayout)}
"""Each cache layout's ``CACHE_LAYOUT`` constexpr, as the launcher passes it."""
LAYOUT_AUTO = tl.constexpr(LAYOUT_CODES[CacheLayout.AUTO])
LAYOUT_FP8 = tl.constexpr(LAYOUT_CODES[CacheLayout.FP8])
LAYOUT_FP8_DS_MLA = tl.constexpr(LAYOUT_CODES[CacheLayout.FP8_DS_MLA])
LAYOUT_NVFP4_DS_MLA = tl.constexpr(LAYOUT_CODES[CacheLayout.NVFP4_DS_MLA])

DS_MLA_NUM_TILES = tl.constexpr(DS_MLA_NOPE_DIM // DS_MLA_TILE)
DS_MLA_TILE_WIDTH = tl.constexpr(DS_MLA_TILE)
DS_MLA_SCALES_OFFSET = tl.constexpr(contract.DS_MLA_SCALES_OFFSET)
DS_MLA_ROPE_OFFSET = tl.constexpr(contract.DS_MLA_ROPE_OFFSET)
INV_FP8_MAX = tl.constexpr(1.0 / FP8_E4M3_MAX)
"""ds_mla tile scales *multiply* amax by 1/448 rounded to fp32 (docs/fused-norm-rope.md); dividing
by 448 differs in the last bit for some amax."""
FLT_MIN = tl.constexpr(torch.finfo(torch.float32).tiny)
"""Floor of an ``amax``-rule ds_mla tile scale: an all-zero tile still gets a normal,
nonzero scale."""
POW2_RATIO_FLOOR = tl.constexpr(DS_MLA_POW2_RATIO_FLOOR)
"""Floor of the ratio a ``pow2``-rule ds_mla tile scale rounds up: an all-zero tile gets 2^-13."""


# ----------------------------------------------------------------------------------------
# Building blocks
# ----------------------------------------------------------------------------------------


@triton.jit
def _load_rows(ptr, row_stride, tokens, live, DIM: tl.constexpr, BLOCK: tl.constexpr):
    """Rows ``tokens`` of a ``[T, DIM]`` tensor as an fp32 ``[BLOCK_T, BLOCK]`` tile (0-padded)."""
    lanes = tl.arange(0, BLOCK)
    mask = live[:, None] & (lanes < DIM)[None, :]
    values = tl.load(ptr + tokens[:, None] * row_stride + lanes[None, :], mask=mask, other=0.0)
    return values.to(tl.float32)


@triton.jit
def _store_rows(ptr, row_stride, tokens, rows, values, DIM: tl.constexpr, BLOCK: tl.constexpr):
    """Round the fp32 tile ``values`` once to ``ptr``'s dtype and store the ``rows`` selected."""
    lanes = tl.arange(0, BLOCK)
    mask = rows[:, None] & (lanes < DIM)[None, :]
    offsets = tokens[:, None] * row_stride + lanes[None, :]
    tl.store(ptr + offsets, values.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _load_vector(ptr, DIM: tl.constexpr, BLOCK: tl.constexpr):
    lanes = tl.arange(0, BLOCK)
    return tl.load(ptr + lanes, mask=lanes < DIM, other=0.0).to(tl.float32)


@triton.jit
def _local_slots(slot_ptr, tokens, live):
    """This rank's slots of ``tokens`` (int64, -1 past the end) and which of them are owned."""
    slots = tl.load(slot_ptr + tokens, mask=live, other=-1)
    return slots, live & (slots >= 0)


@triton.jit
def _paged_entry(slots, owned, cache_block_size, block_stride, entry_stride):
    """Byte offset (int64) of each owned slot's entry: ``block * block_stride + offset *
    entry_stride``. Unowned rows get entry 0; every store through it is masked off."""
    slots = tl.where(owned, slots, 0)
    return (slots // cache_block_size) * block_stride + (slots % cache_block_size) * entry_stride


@triton.jit
def _mla_entry(slots, owned, live, cache_block_size, block_stride, entry_stride, mla_num_blocks):
    """Byte offsets of the MLA entries to store and which rows store one: the owned rows,
    at ``_paged_entry``."""
    entry = _paged_entry(slots, owned, cache_block_size, block_stride, entry_stride)
    stored = owned
    return entry, stored


@triton.jit
def _rope_positions(positions_ptr, tokens, live):
    """The position each token's RoPE turns by (-1 past the end)."""
    positions = tl.load(positions_ptr + tokens, mask=live, other=-1)
    return positions


@triton.jit
def _rms_norm(x, weight_ptr, eps, DIM: tl.constexpr, BLOCK: tl.constexpr):
    """``x * rsqrt(mean(x^2) + eps) * weight`` per row; rsqrt as a correctly rounded
    1/sqrt, because the GPU's ``rsqrt.approx`` is a few fp32 ulps off. The weight row is
    loaded after the reduction: held across it, it set the binary's registers per thread
    (Q at sm_90: 63 instead of 42 for deepseek-v3.2, 79 instead of 55 for glm-5), so
    occupancy."""
    mean_square = tl.math.div_rn(tl.sum(x * x, axis=1), DIM)
    inv_rms = tl.math.div_rn(1.0, tl.sqrt_rn(mean_square + eps))
    normalized = x * inv_rms[:, None]
    return normalized * _load_vector(weight_ptr, DIM, BLOCK)[None, :]


@triton.jit
def _layer_norm_stats(x, lane_ok, eps, DIM: tl.constexpr):
    """Per-row mean and ``rsqrt(biased variance + eps)`` of a 0-padded tile."""
    mean = tl.math.div_rn(tl.sum(x, axis=1), DIM)
    centered = tl.where(lane_ok[None, :], x - mean[:, None], 0.0)
    variance = tl.math.div_rn(tl.sum(centered * centered, axis=1), DIM)
    inv_std = tl.math.div_rn(1.0, tl.sqrt_rn(variance + eps))
    return mean, inv_std


@triton.jit
def _rope_pairing(lanes, ROPE_DIM: tl.constexpr, NEOX: tl.constexpr):
    """For each lane of a RoPE'd vector: the frequency it turns by, the other lane of its
    rotation plane, and whether it is the plane's first lane.

    Interleaved planes are lanes ``(2i, 2i+1)``; NeoX planes are ``(i, i + ROPE_DIM/2)``.
    """
    if NEOX:
        first = lanes < ROPE_DIM // 2
        freq = tl.where(first, lanes, lanes - ROPE_DIM // 2)
        partner = tl.where(first, lanes + ROPE_DIM // 2, lanes - ROPE_DIM // 2)
    else:
        first = (lanes % 2) == 0
        freq = lanes // 2
        partner = tl.where(first, lanes + 1, lanes - 1)
    return freq, partner, first


@triton.jit
def _rotate(
    x,
    x_partner,
    freq,
    first,
    rotated,
    positions,
    cos_sin_ptr,
    cos_sin_stride,
    ROPE_DIM: tl.constexpr,
):
    """RoPE of a tile whose plane partners are ``x_partner``: ``r1 = x1*cos - x2*sin``,
    ``r2 = x2*cos + x1*sin`` on the ``rotated`` lanes, ``x`` unchanged elsewhere.

    ``cos_sin`` row ``p`` is ``[cos(p f_0..) | sin(p f_0..)]``; ``positions`` are int64, so
    ``position * stride`` cannot wrap.
    """
    row = positions[:, None] * cos_sin_stride
    mask = rotated[None, :] & (positions >= 0)[:, None]
    cos = tl.load(cos_sin_ptr + row + freq[None, :], mask=mask, other=1.0)
    sin = tl.load(cos_sin_ptr + row + ROPE_DIM // 2 + freq[None, :], mask=mask, other=0.0)
    turned = tl.where(first[None, :], x * cos - x_partner * sin, x * cos + x_partner * sin)
    return tl.where(rotated[None, :], turned, x)


# ----------------------------------------------------------------------------------------
# Sub-tasks
# ----------------------------------------------------------------------------------------


@triton.jit
def _q_task(
    q_ptr,
    q_stride,
    q_weight_ptr,
    q_out_ptr,
    q_out_stride,
    slot_ptr,
    tokens,
    live,
    eps,
    Q_DIM: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    HAS_SLOTS: tl.constexpr,
):
    x = _load_rows(q_ptr, q_stride, tokens, live, Q_DIM, BLOCK_Q)
    q = _rms_norm(x, q_weight_ptr, eps, Q_DIM, BLOCK_Q)
    _store_rows(q_out_ptr, q_out_stride, tokens, live, q, Q_DIM, BLOCK_Q)


@triton.jit
def _ds_mla_tile_scales(amax, POW2: tl.constexpr):
    """fp8_ds_mla scales of tiles whose largest magnitudes are ``amax``: the ratio
    ``amax * (1/448)`` (a multiply by the fp32 reciprocal, as the oracle does), floored at
    FLT_MIN (``DsMlaScale.AMAX``), or floored at 1e-4 and rounded up to a power of two from
    its bits (``DsMlaScale.POW2``)."""
    ratio = amax * INV_FP8_MAX
    if POW2:
        scales = power_of_two_at_or_above(tl.maximum(ratio, POW2_RATIO_FLOOR))
    else:
        scales = tl.maximum(ratio, FLT_MIN)
    return scales


@triton.jit
def _write_mla_entries(
    cache_ptr,
    entry,
    owned,
    kv,
    kpe,
    mla_scale,
    KV_DIM: tl.constexpr,
    ROPE_DIM: tl.constexpr,
    BLOCK_KV: tl.constexpr,
    BLOCK_ROPE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    CACHE_LAYOUT: tl.constexpr,
    DS_MLA_POW2: tl.constexpr,
):
    """Encode fp32 ``kv``/``kpe`` tiles into the MLA cache entries at byte offsets ``entry``;
    ``DS_MLA_POW2`` picks the fp8_ds_mla tile-scale rule (module docstring)."""
    kv_lanes = tl.arange(0, BLOCK_KV)
    rope_lanes = tl.arange(0, BLOCK_ROPE)
    kv_mask = owned[:, None] & (kv_lanes < KV_DIM)[None, :]
    rope_mask = owned[:, None] & (rope_lanes < ROPE_DIM)[None, :]
    entry_ptr = cache_ptr + entry
    if CACHE_LAYOUT == LAYOUT_AUTO:
        # [kv | kpe] in the activation dtype, i.e. the outputs' rounding of the same fp32.
        act_ptr = entry_ptr.to(tl.pointer_type(kv.dtype))[:, None]
        tl.store(act_ptr + kv_lanes[None, :], kv, mask=kv_mask)
        tl.store(act_ptr + KV_DIM + rope_lanes[None, :], kpe, mask=rope_mask)
    elif CACHE_LAYOUT == LAYOUT_FP8:
        kv_codes = fp8_e4m3_codes(tl.math.div_rn(kv, mla_scale))
        kpe_codes = fp8_e4m3_codes(tl.math.div_rn(kpe, mla_scale))
        tl.store(entry_ptr[:, None] + kv_lanes[None, :], kv_codes.to(tl.uint8), mask=kv_mask)
        tl.store(
            entry_ptr[:, None] + KV_DIM + rope_lanes[None, :],
            kpe_codes.to(tl.uint8),
            mask=rope_mask,
        )
    elif CACHE_LAYOUT == LAYOUT_NVFP4_DS_MLA:
        write_nvfp4_ds_mla_entries(entry_ptr, owned, kv, kpe, rope_lanes, rope_mask, BLOCK_T)
    else:
        # fp8_ds_mla: 4 tiles of 128 NoPE values, each divided by its own scale, then the
        # 4 fp32 scales, then the RoPE part in bf16 (KV_DIM == BLOCK_KV == 512 here).
        tiles = tl.reshape(kv, (BLOCK_T, DS_MLA_NUM_TILES, DS_MLA_TILE_WIDTH))
        amax = tl.max(tl.abs(tiles), axis=2)
        scales = _ds_mla_tile_scales(amax, DS_MLA_POW2)
        codes = fp8_e4m3_codes(tl.math.div_rn(tiles, scales[:, :, None]))
        tile_ids = tl.arange(0, DS_MLA_NUM_TILES)
        tile_lanes = tl.arange(0, DS_MLA_TILE_WIDTH)
        nope_ptr = (
            entry_ptr[:, None, None]
            + tile_ids[None, :, None] * DS_MLA_TILE_WIDTH
            + tile_lanes[None, None, :]
        )
        tl.store(nope_ptr, codes.to(tl.uint8), mask=owned[:, None, None])
        scale_ptr = entry_ptr[:, None] + DS_MLA_SCALES_OFFSET + tile_ids[None, :] * 4
        tl.store(scale_ptr.to(tl.pointer_type(tl.float32)), scales, mask=owned[:, None])
        rope_ptr = (entry_ptr + DS_MLA_ROPE_OFFSET).to(tl.pointer_type(tl.bfloat16))
        tl.store(rope_ptr[:, None] + rope_lanes[None, :], kpe.to(tl.bfloat16), mask=rope_mask)


@triton.jit
def _kv_task(
    kv_ptr,
    kv_stride,
    kv_weight_ptr,
    kv_out_ptr,
    kv_out_stride,
    kpe_ptr,
    kpe_stride,
    kpe_out_ptr,
    kpe_out_stride,
    positions_ptr,
    cos_sin_ptr,
    cos_sin_stride,
    slot_ptr,
    mla_cache_ptr,
    mla_block_stride,
    mla_entry_stride,
    mla_num_blocks,
    cache_block_size,
    tokens,
    live,
    eps,
    mla_scale,
    KV_DIM: tl.constexpr,
    ROPE_DIM: tl.constexpr,
    BLOCK_KV: tl.constexpr,
    BLOCK_ROPE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    CACHE_LAYOUT: tl.constexpr,
    DS_MLA_POW2: tl.constexpr,
    HAS_SLOTS: tl.constexpr,
):
    # KV: RMSNorm of the latent.
    x = _load_rows(kv_ptr, kv_stride, tokens, live, KV_DIM, BLOCK_KV)
    kv = _rms_norm(x, kv_weight_ptr, eps, KV_DIM, BLOCK_KV)
    # k_pe: interleaved RoPE; each lane also loads the other lane of its plane.
    lanes = tl.arange(0, BLOCK_ROPE)
    freq, partner, first = _rope_pairing(lanes, ROPE_DIM, False)
    rotated = lanes < ROPE_DIM
    k = _load_rows(kpe_ptr, kpe_stride, tokens, live, ROPE_DIM, BLOCK_ROPE)
    k_partner = tl.load(
        kpe_ptr + tokens[:, None] * kpe_stride + partner[None, :],
        mask=live[:, None] & rotated[None, :],
        other=0.0,
    ).to(tl.float32)
    positions = _rope_positions(positions_ptr, tokens, live)
    kpe = _rotate(
        k, k_partner, freq, first, rotated, positions, cos_sin_ptr, cos_sin_stride, ROPE_DIM
    )

    if HAS_SLOTS:
        slots, owned = _local_slots(slot_ptr, tokens, live)
    _store_rows(kv_out_ptr, kv_out_stride, tokens, live, kv, KV_DIM, BLOCK_KV)
    _store_rows(kpe_out_ptr, kpe_out_stride, tokens, live, kpe, ROPE_DIM, BLOCK_ROPE)
    if HAS_SLOTS:
        entry, stored = _mla_entry(
            slots, owned, live, cache_block_size, mla_block_stride, mla_entry_stride, mla_num_blocks
        )
        if CACHE_LAYOUT == LAYOUT_AUTO:
            kv = kv.to(kv_out_ptr.dtype.element_ty)
            kpe = kpe.to(kv_out_ptr.dtype.element_ty)
        _write_mla_entries(
            mla_cache_ptr,
            entry,
            stored,
            kv,
            kpe,
            mla_scale,
            KV_DIM,
            ROPE_DIM,
            BLOCK_KV,
            BLOCK_ROPE,
            BLOCK_T,
            CACHE_LAYOUT,
            DS_MLA_POW2,
        )


@triton.jit
def _indexer_k_task(
    index_ptr,
    index_stride,
    index_weight_ptr,
    index_bias_ptr,
    index_out_ptr,
    index_out_stride,
    positions_ptr,
    cos_sin_ptr,
    cos_sin_stride,
    slot_ptr,
    index_slot_ptr,
    index_cache_ptr,
    index_block_stride,
    cache_block_size,
    tokens,
    live,
    eps,
    INDEX_DIM: tl.constexpr,
    ROPE_DIM: tl.constexpr,
    BLOCK_INDEX: tl.constexpr,
    NEOX: tl.constexpr,
    WRITES_INDEX_CACHE: tl.constexpr,
    INDEX_SHUFFLED: tl.constexpr,
    INDEX_SCALE_MX: tl.constexpr,
):
    lanes = tl.arange(0, BLOCK_INDEX)
    lane_ok = lanes < INDEX_DIM
    # LayerNorm * w + b over the whole head.
    x = _load_rows(index_ptr, index_stride, tokens, live, INDEX_DIM, BLOCK_INDEX)
    mean, inv_std = _layer_norm_stats(x, lane_ok, eps, INDEX_DIM)
    weight = _load_vector(index_weight_ptr, INDEX_DIM, BLOCK_INDEX)
    bias = _load_vector(index_bias_ptr, INDEX_DIM, BLOCK_INDEX)
    y = (x - mean[:, None]) * inv_std[:, None] * weight[None, :] + bias[None, :]
    # RoPE over the first ROPE_DIM lanes: normalize each lane's plane partner the same way.
    freq, partner, first = _rope_pairing(lanes, ROPE_DIM, NEOX)
    rotated = lanes < ROPE_DIM
    partner_mask = live[:, None] & rotated[None, :]
    x_partner = tl.load(
        index_ptr + tokens[:, None] * index_stride + partner[None, :], mask=partner_mask, other=0.0
    ).to(tl.float32)
    weight_partner = tl.load(index_weight_ptr + partner, mask=rotated, other=0.0)
    bias_partner = tl.load(index_bias_ptr + partner, mask=rotated, other=0.0)
    y_partner = (x_partner - mean[:, None]) * inv_std[:, None] * weight_partner[
        None, :
    ] + bias_partner[None, :]
    positions = _rope_positions(positions_ptr, tokens, live)
    k = _rotate(
        y, y_partner, freq, first, rotated, positions, cos_sin_ptr, cos_sin_stride, ROPE_DIM
    )
    _store_rows(index_out_ptr, index_out_stride, tokens, live, k, INDEX_DIM, BLOCK_INDEX)

    if WRITES_INDEX_CACHE:
        # fp8 with one power-of-two scale per row. Per block: block_size * INDEX_DIM value
        # bytes (token-major, or in 16 x 16 tiles when INDEX_SHUFFLED), then block_size
        # 4-byte scales (fp32, or the UE8M0 byte four times when INDEX_SCALE_MX).
        slots, owned = _local_slots(index_slot_ptr, tokens, live)
        amax = tl.max(tl.where(lane_ok[None, :], tl.abs(k), 0.0), axis=1)
        scale = ue8m0_scale(amax)
        codes = fp8_e4m3_codes(tl.math.div_rn(k, scale[:, None]))
        store_index_entries(
            index_cache_ptr,
            index_block_stride,
            cache_block_size,
            slots,
            owned,
            lanes,
            lane_ok,
            codes,
            scale,
            INDEX_DIM,
            INDEX_SHUFFLED,
            INDEX_SCALE_MX,
        )


@triton.jit
def _topk_fill_task(
    topk_ptr,
    topk_stride,
    tokens,
    live,
    TOPK: tl.constexpr,
    BLOCK_TOPK: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    fill = tl.full((BLOCK_T, BLOCK_TOPK), -1, tl.int32)
    _store_rows(topk_ptr, topk_stride, tokens, live, fill, TOPK, BLOCK_TOPK)


# ----------------------------------------------------------------------------------------
# The kernel
# ----------------------------------------------------------------------------------------


@triton.jit(do_not_specialize=["num_tokens", "cache_block_size", "mla_num_blocks"])
def _fused_norm_rope_kernel(
    q_ptr,
    q_stride,
    q_weight_ptr,
    q_out_ptr,
    q_out_stride,
    kv_ptr,
    kv_stride,
    kv_weight_ptr,
    kv_out_ptr,
    kv_out_stride,
    kpe_ptr,
    kpe_stride,
    kpe_out_ptr,
    kpe_out_stride,
    index_ptr,
    index_stride,
    index_weight_ptr,
    index_bias_ptr,
    index_out_ptr,
    index_out_stride,
    topk_ptr,
    topk_stride,
    positions_ptr,
    cos_sin_ptr,
    cos_sin_stride,
    slot_ptr,
    index_slot_ptr,
    mla_cache_ptr,
    mla_block_stride,
    mla_entry_stride,
    mla_num_blocks,
    index_cache_ptr,
    index_block_stride,
    num_tokens,
    cache_block_size,
    eps,
    mla_scale,
    Q_DIM: tl.constexpr,
    KV_DIM: tl.constexpr,
    ROPE_DIM: tl.constexpr,
    INDEX_DIM: tl.constexpr,
    TOPK: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_KV: tl.constexpr,
    BLOCK_ROPE: tl.constexpr,
    BLOCK_INDEX: tl.constexpr,
    BLOCK_TOPK: tl.constexpr,
    BLOCK_T: tl.constexpr,
    FIRST_TASK: tl.constexpr,
    LAST_TASK: tl.constexpr,
    CACHE_LAYOUT: tl.constexpr,
    DS_MLA_POW2: tl.constexpr,
    HAS_SLOTS: tl.constexpr,
    WRITES_INDEX_CACHE: tl.constexpr,
    INDEX_ROPE_NEOX: tl.constexpr,
    INDEX_SHUFFLED: tl.constexpr,
    INDEX_SCALE_MX: tl.constexpr,
):
    program = tl.program_id(0).to(tl.int64)  # int64 before any multiply; "Grid" in module doc
    tokens = (program // (LAST_TASK - FIRST_TASK + 1)) * BLOCK_T + tl.arange(0, BLOCK_T)
    live = tokens < num_tokens
    # A launch of one sub-task makes it a constexpr: the branches below resolve at compile time.
    task = (
        FIRST_TASK
        if FIRST_TASK == LAST_TASK
        else (program % (LAST_TASK - FIRST_TASK + 1)).to(tl.int32) + FIRST_TASK
    )
    if task == TASK_INDEXER_K:
        _indexer_k_task(
            index_ptr,
            index_stride,
            index_weight_ptr,
            index_bias_ptr,
            index_out_ptr,
            index_out_stride,
            positions_ptr,
            cos_sin_ptr,
            cos_sin_stride,
            slot_ptr,
            index_slot_ptr,
            index_cache_ptr,
            index_block_stride,
            cache_block_size,
            tokens,
            live,
            eps,
            INDEX_DIM,
            ROPE_DIM,
            BLOCK_INDEX,
            INDEX_ROPE_NEOX,
            WRITES_INDEX_CACHE,
            INDEX_SHUFFLED,
            INDEX_SCALE_MX,
        )
    elif task == TASK_TOPK_FILL:
        _topk_fill_task(topk_ptr, topk_stride, tokens, live, TOPK, BLOCK_TOPK, BLOCK_T)
    elif task == TASK_KV:
        _kv_task(
            kv_ptr,
            kv_stride,
            kv_weight_ptr,
            kv_out_ptr,
            kv_out_stride,
            kpe_ptr,
            kpe_stride,
            kpe_out_ptr,
            kpe_out_stride,
            positions_ptr,
            cos_sin_ptr,
            cos_sin_stride,
            slot_ptr,
            mla_cache_ptr,
            mla_block_stride,
            mla_entry_stride,
            mla_num_blocks,
            cache_block_size,
            tokens,
            live,
            eps,
            mla_scale,
            KV_DIM,
            ROPE_DIM,
            BLOCK_KV,
            BLOCK_ROPE,
            BLOCK_T,
            CACHE_LAYOUT,
            DS_MLA_POW2,
            HAS_SLOTS,
        )
    elif LAST_TASK == TASK_Q:  # compile-time: a launch that stops at KV holds no Q code
        _q_task(
            q_ptr,
            q_stride,
            q_weight_ptr,
            q_out_ptr,
            q_out_stride,
            slot_ptr,
            tokens,
            live,
            eps,
            Q_DIM,
            BLOCK_Q,
            HAS_SLOTS,
        )
