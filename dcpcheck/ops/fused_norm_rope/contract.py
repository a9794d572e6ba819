"""The contract of the fused MLA norm + RoPE + cache-write op, in one place.

Everything a kernel reads, everything it writes, and the byte layout of every cache entry
is defined here (docs/fused-norm-rope.md). The harness, the adapters and the project's own kernel
all speak in these types; the oracle in ``reference/`` is written from the same math but
imports nothing from this package.

Kernel protocol
---------------
A kernel under test is any callable ``kernel(inputs, outputs, caches) -> None`` that

* reads only ``inputs`` (and must not modify them),
* writes ``outputs`` (allocated and NaN-poisoned by the harness) for **every** token,
  whatever its slot,
* writes ``caches`` only at entries whose slot on this rank is ``>= 0``.

Caches are always handed over as ``uint8`` byte tensors, whatever the layout, so that
"every other byte is unchanged" can be checked bytewise; a kernel views them in the dtype
it needs (``cache.view(torch.bfloat16)``). A block's entries are contiguous, but blocks may
lie apart (``stride(0) > block_size * entry``, as a block-outermost layout hands a layer its
cache; ``FusedOpInputs.block_gap`` says by how much), so a kernel addresses block ``b`` at
``b * cache.stride(0)``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

import torch

FP8_E4M3_MAX = 448.0
"""Largest finite float8_e4m3fn value; every fp8 scale divides amax by it."""

DS_MLA_NOPE_DIM = 512
"""fp8_ds_mla stores exactly 512 NoPE values (DeepSeek-V3.2 / GLM-5.x kv_lora_rank)."""

DS_MLA_TILE = 128
"""fp8_ds_mla quantizes the NoPE part in 4 tiles of 128 values, one fp32 scale each."""

DS_MLA_ROPE_DIM = 64
"""fp8_ds_mla keeps the 64 RoPE values in bf16."""

DS_MLA_ENTRY_BYTES = DS_MLA_NOPE_DIM + 4 * (DS_MLA_NOPE_DIM // DS_MLA_TILE) + 2 * DS_MLA_ROPE_DIM
"""656 = 512 fp8 NoPE bytes + 4 fp32 tile scales (16 bytes) + 64 bf16 RoPE values (128 bytes)."""

DS_MLA_SCALES_OFFSET = DS_MLA_NOPE_DIM
"""Byte 512 of a ds_mla entry: the 4 fp32 tile scales follow the 512 fp8 NoPE bytes."""

DS_MLA_ROPE_OFFSET = DS_MLA_SCALES_OFFSET + 4 * (DS_MLA_NOPE_DIM // DS_MLA_TILE)
"""Byte 528 of a ds_mla entry: the 64 bf16 RoPE values follow the scales, to the entry's end."""

E2M1_MAX = 6.0
"""Largest e2m1 (fp4) magnitude: nvfp4_ds_mla values saturate to +-6."""

NVFP4_DS_MLA_TILE = 16
"""nvfp4_ds_mla quantizes the 512 NoPE values in 32 tiles of 16, one e4m3 scale each
(vLLM 0.33.0's ``fused_norm_rope``)."""

NVFP4_DS_MLA_NUM_TILES = DS_MLA_NOPE_DIM // NVFP4_DS_MLA_TILE
"""32 NoPE tiles, so 32 scale bytes."""

NVFP4_DS_MLA_ROPE_OFFSET = DS_MLA_NOPE_DIM // 2
"""Byte 256 of an nvfp4_ds_mla entry: two e2m1 NoPE values per byte fill bytes [0, 256)
(element ``2j`` in the low nibble of byte ``j``), the 64 unscaled e4m3 RoPE bytes follow."""

NVFP4_DS_MLA_SCALES_OFFSET = NVFP4_DS_MLA_ROPE_OFFSET + DS_MLA_ROPE_DIM
"""Byte 320 of an nvfp4_ds_mla entry: the 32 e4m3 tile scales follow the RoPE bytes."""

NVFP4_DS_MLA_ENTRY_BYTES = NVFP4_DS_MLA_SCALES_OFFSET + NVFP4_DS_MLA_NUM_TILES
"""352 = 256 e2m1 NoPE bytes + 64 e4m3 RoPE bytes + 32 e4m3 scale bytes."""

NVFP4_SCALE_FLOOR = 2.0**-9
"""An nvfp4_ds_mla tile scale is ``e4m3(max(amax / 6, 2^-9))``, rounded to nearest; the
floor is the smallest e4m3 subnormal, so an all-zero tile stores byte 0x01."""


def nvfp4_scale_position(tile: int) -> int:
    """Byte (within the 32 scale bytes) holding tile ``tile``'s scale: ``8*(s & 3) + (s >> 2)``."""
    return 8 * (tile & 3) + (tile >> 2)


INDEX_SCALE_BYTES = 4
"""Each indexer cache row carries one fp32 (UE8M0-valued) scale."""

INDEX_SHUFFLE_TILE = 16
"""The shuffled indexer layout (vLLM 0.31.0 on, ``indexer_cache_shuffled``) stores a block's
fp8 values as ``[B/16, I/16, 16 tokens, 16 bytes]``: each 16-token x 16-byte tile is one
contiguous 256-byte run, so block size and index dim must be multiples of 16."""


class IndexScale(enum.Enum):
    """How an indexer row's power-of-two scale is stored in its 4 scale bytes."""

    FP32 = "fp32"
    """Its little-endian fp32 bytes (every release; the default)."""

    MX = "mx"
    """MX-packed: its UE8M0 exponent byte (the fp32's biased exponent) in all four bytes
    (vLLM 0.33.0, where the indexer's MQA-logits reader takes MX scales)."""


@dataclass(frozen=True)
class IndexFormat:
    """How indexer cache entries are laid out: the value tiling and the scale format. The
    bytes per token are the same in every format (``index_entry_bytes``); only where each
    byte goes and what the scale bytes hold differ."""

    shuffled: bool = False
    scale: IndexScale = IndexScale.FP32

    @property
    def name(self) -> str:
        """``plain``/``shuffled``, then ``+mx`` for MX-packed scales."""
        return ("shuffled" if self.shuffled else "plain") + (
            "+mx" if self.scale is IndexScale.MX else ""
        )


UE8M0_AMAX_FLOOR = 1e-4
"""Indexer rows quantize with scale 2^ceil(log2(max(amax, 1e-4) / 448)); the floor keeps
all-zero rows finite."""

DS_MLA_POW2_RATIO_FLOOR = 1e-4
"""The ``pow2`` fp8_ds_mla tile scale is 2^ceil(log2(max(amax * (1/448), 1e-4))): unlike the
indexer's, the floor applies to the ratio, so an all-zero tile's scale is 2^-13."""


class CacheLayout(enum.Enum):
    """How one MLA cache entry (a token's ``[kv | kpe]``) is stored."""

    AUTO = "auto"  # kv_out | kpe_out in the activation dtype, KV + R elements
    FP8 = "fp8"  # fp8_e4m3(kv / s) | fp8_e4m3(kpe / s), one per-tensor scale s
    FP8_DS_MLA = "fp8_ds_mla"  # DS_MLA_ENTRY_BYTES, see above
    NVFP4_DS_MLA = "nvfp4_ds_mla"  # NVFP4_DS_MLA_ENTRY_BYTES, see above


class DsMlaScale(enum.Enum):
    """How an ``fp8_ds_mla`` entry scales its four 128-value NoPE tiles (docs/fused-norm-rope.md).

    vLLM changed the rule between releases, and a cache written by one rule is wrong by
    the other (the stored scale differs, and so does every fp8 byte of the tile), so it is
    a named choice of each case: a scenario's ``ds_mla_scale`` key, the ``--ds-mla-scale``
    option, or a kernel's own declaration (a ``ds_mla_scale`` attribute on the callable,
    which release adapters set); ``runner.effective_ds_mla_scale`` says which wins. Other
    layouts ignore it. The oracle names the same rules by these values.
    """

    AMAX = "amax"
    """``max(amax * (1/448), FLT_MIN)``: the smallest scale that fits the tile, stored in
    fp32 (vLLM up to 0.30.0; the default where nothing names a rule)."""

    POW2 = "pow2"
    """``2^ceil(log2(max(amax * (1/448), 1e-4)))``: a power of two, so decoding multiplies
    exactly (vLLM 0.31.0 on)."""


@dataclass(frozen=True)
class ModelPreset:
    """Published MLA shapes of one model (or a small stand-in for fast CPU runs)."""

    name: str
    q_lora_rank: int
    kv_lora_rank: int
    rope_dim: int
    index_head_dim: int
    index_rope_interleaved: bool  # GLM-5.x interleaved, DeepSeek-V3.2 NeoX split-half
    max_position: int
    topk: int  # width of the indexer's top-k buffer
    rope_base: float = 10000.0
    eps: float = 1e-6


PRESETS: dict[str, ModelPreset] = {
    p.name: p
    for p in (
        # DeepSeek-V3.2: q_lora 1536, kv_lora 512, rope 64, index head 128, NeoX indexer RoPE.
        ModelPreset("deepseek-v3.2", 1536, 512, 64, 128, False, 163840, 2048),
        # GLM-5.x: q_lora 2048, kv_lora 512, rope 64, index head 128, interleaved indexer RoPE.
        ModelPreset("glm-5", 2048, 512, 64, 128, True, 202752, 2048),
        # Small stand-ins (the golden vectors' shape): kv_lora stays 512 so fp8_ds_mla applies.
        ModelPreset("small-neox", 256, 512, 64, 128, False, 4096, 16),
        ModelPreset("small-interleaved", 256, 512, 64, 128, True, 4096, 16),
    )
}

SMALL_PRESETS = ("small-neox", "small-interleaved")
"""Presets fast enough for the CPU interpreter (the real ones need a GPU)."""


def mla_entry_bytes(layout: CacheLayout, kv_dim: int, rope_dim: int, act_dtype: torch.dtype) -> int:
    """Bytes of one MLA cache entry in ``layout``."""
    if layout is CacheLayout.AUTO:
        return (kv_dim + rope_dim) * act_dtype.itemsize
    if layout is CacheLayout.FP8:
        return kv_dim + rope_dim
    if (kv_dim, rope_dim) != (DS_MLA_NOPE_DIM, DS_MLA_ROPE_DIM):
        raise ValueError(
            f"{layout.value} needs kv_lora_rank {DS_MLA_NOPE_DIM} and rope_dim "
            f"{DS_MLA_ROPE_DIM}, got {kv_dim} and {rope_dim}"
        )
    if layout is CacheLayout.NVFP4_DS_MLA:
        return NVFP4_DS_MLA_ENTRY_BYTES
    return DS_MLA_ENTRY_BYTES


def index_entry_bytes(index_dim: int) -> int:
    """Bytes one token occupies in the indexer cache: ``index_dim`` fp8 values + one fp32 scale.

    Within a block of ``B`` tokens the values come first (``B * index_dim`` bytes, token-major,
    or tiled in the shuffled ``IndexFormat``), then the ``B`` scales; the cache tensor is
    ``[num_blocks, B, index_dim + 4]`` bytes.
    """
    return index_dim + INDEX_SCALE_BYTES


@dataclass
class FusedOpInputs:
    """What a kernel reads. Shapes: ``T`` tokens, ``Q``/``KV``/``R``/``I`` preset widths."""

    q_c: torch.Tensor  # [T, Q] activation dtype
    q_weight: torch.Tensor  # [Q]
    kv_c: torch.Tensor  # [T, KV]
    kv_weight: torch.Tensor  # [KV]
    k_pe: torch.Tensor  # [T, R]
    positions: torch.Tensor  # [T] int64
    cos_sin: torch.Tensor  # [max_pos, R] fp32, row p = [cos(p f_0..f_{R/2-1}) | sin(...)]
    eps: float
    block_size: int
    cache_layout: CacheLayout
    mla_scale: float | None  # per-tensor scale of the fp8 layout, None otherwise
    slot_mapping: torch.Tensor | None  # [T] int64, -1 = not on this rank; None = profiling call
    index_k: torch.Tensor | None = None  # [T, I]; None on shared (no-indexer) layers
    index_weight: torch.Tensor | None = None  # [I] fp32
    index_bias: torch.Tensor | None = None  # [I] fp32
    index_rope_interleaved: bool = False
    index_slot_mapping: torch.Tensor | None = None  # [T] int64, the indexer's own mapping
    ds_mla_scale: DsMlaScale = DsMlaScale.AMAX  # fp8_ds_mla tile-scale rule the case demands
    index_format: IndexFormat = IndexFormat()  # the indexer cache's tiling and scale bytes
    block_gap: int = 0  # bytes between one block and the next of each cache (module docstring)

    @property
    def num_tokens(self) -> int:
        return self.q_c.shape[0]

    @property
    def has_indexer(self) -> bool:
        return self.index_k is not None


@dataclass
class FusedOpOutputs:
    """What a kernel writes for every token. Allocated and poisoned by the harness."""

    q_out: torch.Tensor  # [T, Q] activation dtype
    kv_out: torch.Tensor  # [T, KV]
    kpe_out: torch.Tensor  # [T, R]
    topk_indices: torch.Tensor  # [T, topk] int32; filled with -1 on indexer layers only
    index_k_out: torch.Tensor | None = None  # [T, I]; None on shared layers


@dataclass
class FusedOpCaches:
    """The paged caches of one rank, as bytes (see module docstring)."""

    mla: torch.Tensor  # [num_blocks, block_size, mla_entry_bytes] uint8, blocks maybe apart
    index: torch.Tensor | None = None  # [num_blocks, block_size, index_entry_bytes] uint8


Kernel = Callable[[FusedOpInputs, FusedOpOutputs, FusedOpCaches], None]
"""The harness's kernel protocol (module docstring)."""
