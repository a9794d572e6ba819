"""The project's kernels under test: the correct fused kernel and its known-bad variants.

A variant is the project's kernel with a few edits of its source (``SourceEdit``): each
names the file of the kernel's Triton code and the function it changes, the text it
replaces (which occurs exactly once there) and the text that replaces it.
``variant_build`` applies them to copies of the files and compiles those as modules of
their own, so a variant differs from the correct kernel by exactly its edits, and the
shipped kernel holds the arithmetic only. An edit that no longer applies (the kernel
changed under it) is an error naming the variant, the file and the function, not a
variant that silently equals the kernel.

Adding a mutant: a :class:`KernelVariant` named ``mutant/<slug>`` with its edits, in
``MUTANTS``; the registry and ``selftest`` pick it up.

``MUTANTS`` is the catalog ``dcpcheck selftest`` proves the harness catches: the two
historical DCP regressions (``regress/...``) and plausible mistakes of the same kernel
(``mutant/...``), each a small, realistic slip that a reviewer could miss.

This module imports no Triton code: the kernel module a variant edits is imported only by
the registry's loaders (``kernels``), after the backend is fixed.
"""

from __future__ import annotations

from dataclasses import dataclass

KERNEL = "kernel.py"
INDEX_CACHE = "index_cache.py"
NVFP4 = "nvfp4_ds_mla.py"
EDITABLE_FILES = (KERNEL, INDEX_CACHE, NVFP4)
"""The files of the kernel's Triton code an edit may change (``MODULE`` below)."""

MODULE = "<module>"
"""An edit's ``function`` when it changes the file's top level (a definition added)."""


@dataclass(frozen=True)
class SourceEdit:
    """``old``, which occurs exactly once in ``function`` of ``file`` (``MODULE``: in the
    file), replaced by ``new``."""

    file: str
    function: str
    old: str
    new: str


@dataclass(frozen=True)
class KernelVariant:
    """One build of the project's kernel: a registry name, what it is, and the edits of
    the kernel's source that make it (none for the correct kernel). ``gpu_sized`` marks a
    mutant only a GPU-sized cache can show (``selftest``)."""

    name: str
    description: str
    edits: tuple[SourceEdit, ...] = ()
    gpu_sized: bool = False


def _edit(function: str, old: str, new: str, file: str = KERNEL) -> SourceEdit:
    return SourceEdit(file, function, old, new)


DEFAULT_VARIANT = KernelVariant(
    "default",
    "the project's fused norm + RoPE + cache-write Triton kernel (docs/fused-norm-rope.md)",
)

_Q_STORE = "    _store_rows(q_out_ptr, q_out_stride, tokens, live, q, Q_DIM, BLOCK_Q)"
_KV_STORES = (
    "    _store_rows(kv_out_ptr, kv_out_stride, tokens, live, kv, KV_DIM, BLOCK_KV)\n"
    "    _store_rows(kpe_out_ptr, kpe_out_stride, tokens, live, kpe, ROPE_DIM, BLOCK_ROPE)"
)
_MLA_STORED = "    stored = owned\n    return entry, stored"
_MLA_WRITE = (
    "        _write_mla_entries(mla_cache_ptr, entry, stored, kv, kpe, mla_scale, KV_DIM, "
    "ROPE_DIM,\n"
    "                           BLOCK_KV, BLOCK_ROPE, BLOCK_T, CACHE_LAYOUT, DS_MLA_POW2)"
)
_DS_MLA_SCALES = "        scales = _ds_mla_tile_scales(amax, DS_MLA_POW2)"
_TOPK_FILL = (
    "        _topk_fill_task(topk_ptr, topk_stride, tokens, live, TOPK, BLOCK_TOPK, BLOCK_T)"
)
_KV_CALL_END = "                 BLOCK_ROPE, BLOCK_T, CACHE_LAYOUT, DS_MLA_POW2, HAS_SLOTS)"
_INSIDE_CACHE = '''@triton.jit
def _inside_cache(entry, cache_block_size, block_stride, entry_stride, mla_num_blocks):
    """Whether each byte offset starts an entry inside the MLA cache: a mutant that
    addresses wrongly is kept inside the storage (the real bug would scribble over other
    memory or fault; the mutant leaves the owned entry unwritten, which the harness
    reports, and the process survives to report it)."""
    end = (mla_num_blocks - 1).to(tl.int64) * block_stride + cache_block_size * entry_stride
    return (entry >= 0) & (entry < end)


@triton.jit
def _mla_entry('''
_WITH_INSIDE_CACHE = _edit(MODULE, "@triton.jit\ndef _mla_entry(", _INSIDE_CACHE)

REGRESSIONS: tuple[KernelVariant, ...] = (
    KernelVariant(
        "regress/pre-50005",
        "Q RMSNorm skipped for tokens without a local slot (vLLM before PR 50005)",
        # The early-out on a missing local slot also covered the Q RMSNorm, so q_out rows
        # of tokens owned by another rank stay unwritten.
        (
            _edit(
                "_q_task",
                _Q_STORE,
                "    rows = live\n"
                "    if HAS_SLOTS:\n"
                "        _, rows = _local_slots(slot_ptr, tokens, live)\n"
                "    _store_rows(q_out_ptr, q_out_stride, tokens, rows, q, Q_DIM, BLOCK_Q)",
            ),
        ),
    ),
    KernelVariant(
        "regress/pre-54908",
        "kv_out / kpe_out skipped for tokens without a local slot, cache write correctly "
        "skipped (vLLM before PR 54908)",
        # kv_out and kpe_out were produced only alongside the cache write.
        (
            _edit(
                "_kv_task",
                _KV_STORES,
                "    rows = live\n"
                "    if HAS_SLOTS:\n"
                "        rows = owned\n" + _KV_STORES.replace("tokens, live,", "tokens, rows,"),
            ),
        ),
    ),
)
"""The two DCP bugs that shipped (docs/dcp-contract.md)."""

MUTANTS: tuple[KernelVariant, ...] = (
    *REGRESSIONS,
    KernelVariant(
        "mutant/foreign-rows-write-cache",
        "ownership test missing from the MLA cache store: rows with slot -1 write entry 0",
        # Every row stores an entry; a row with slot -1 (foreign or padding) lands on
        # entry 0, where _paged_entry parks unowned rows.
        (_edit("_mla_entry", _MLA_STORED, "    stored = live\n    return entry, stored"),),
    ),
    KernelVariant(
        "mutant/negative-slot-wraps",
        "slot -1 wraps around to the MLA cache's last entry (torch-style negative index)",
        (
            _edit(
                "_mla_entry",
                _MLA_STORED,
                "    wrapped = tl.where(slots < 0, slots + mla_num_blocks.to(tl.int64) * "
                "cache_block_size,\n"
                "                       slots)\n"
                "    entry = _paged_entry(wrapped, live, cache_block_size, block_stride, "
                "entry_stride)\n"
                "    stored = live\n"
                "    return entry, stored",
            ),
        ),
    ),
    KernelVariant(
        "mutant/nvfp4-nibbles-swapped",
        "nvfp4_ds_mla: the even NoPE element packed in the high nibble, not the low one",
        (
            _edit(
                "write_nvfp4_ds_mla_entries",
                "    packed = low | high << 4",
                "    packed = high | low << 4",
                NVFP4,
            ),
        ),
    ),
    KernelVariant(
        "mutant/nvfp4-scale-unpermuted",
        "nvfp4_ds_mla: tile s's scale at byte s, not 8*(s & 3) + (s >> 2)",
        # The layout a reader that does not permute expects.
        (
            _edit(
                "write_nvfp4_ds_mla_entries",
                "    positions = 8 * (tile_ids & 3) + (tile_ids >> 2)",
                "    positions = tile_ids",
                NVFP4,
            ),
        ),
    ),
    KernelVariant(
        "mutant/nvfp4-scale-rounded-up",
        "nvfp4_ds_mla: e4m3 tile scales rounded up instead of to nearest",
        # A ceil where the contract says round-to-nearest: larger scales, coarser codes.
        (
            _edit(
                "write_nvfp4_ds_mla_entries",
                "    scale_codes = fp8_e4m3_codes(ratio)\n",
                "    scale_codes = fp8_e4m3_codes(ratio)\n"
                "    scale_codes = scale_codes + (fp8_e4m3_values(scale_codes) < ratio)"
                ".to(scale_codes.dtype)\n",
                NVFP4,
            ),
        ),
    ),
    KernelVariant(
        "mutant/index-shuffle-tile-transposed",
        "shuffled indexer layout: each 16-token x 16-byte tile written transposed",
        # Byte c of token t at c * 16 + t within the tile instead of t * 16 + c.
        (
            _edit(
                "store_index_entries",
                "        within = token_in_tile * SHUFFLE_TILE + byte_in_tile",
                "        within = byte_in_tile * SHUFFLE_TILE + token_in_tile",
                INDEX_CACHE,
            ),
        ),
    ),
    KernelVariant(
        "mutant/index-mx-scale-one-byte",
        "MX-packed indexer scale: the exponent in one byte of the word, not all four",
        # A word a reader taking any other byte of it decodes as scale 2^-127. ("Bytes in
        # the wrong order" has no observable form: the four bytes are equal.)
        (
            _edit(
                "store_index_entries",
                "        word = exponent * UE8M0_REPLICATED",
                "        word = exponent",
                INDEX_CACHE,
            ),
        ),
    ),
    KernelVariant(
        "mutant/block-offset-off-by-one",
        "in-block offset one too far (slot % block_size + 1) in the MLA cache address",
        # Each token lands on the entry after its own (the next block's first at a
        # block's end).
        (_edit("_mla_entry", _MLA_STORED, "    entry += entry_stride\n" + _MLA_STORED),),
    ),
    KernelVariant(
        "mutant/block-offset-swapped",
        "block index and in-block offset swapped in the MLA cache address",
        (
            _WITH_INSIDE_CACHE,
            _edit(
                "_mla_entry",
                _MLA_STORED,
                "    parked = tl.where(owned, slots, 0)\n"
                "    entry = ((parked % cache_block_size) * block_stride\n"
                "             + (parked // cache_block_size) * entry_stride)\n"
                "    stored = owned & _inside_cache(entry, cache_block_size, block_stride, "
                "entry_stride,\n"
                "                                   mla_num_blocks)\n"
                "    return entry, stored",
            ),
        ),
    ),
    KernelVariant(
        "mutant/kpe-rope-neox",
        "k_pe RoPE paired NeoX-style (i, i + R/2) instead of interleaved (2i, 2i+1)",
        (
            _edit(
                "_kv_task",
                "_rope_pairing(lanes, ROPE_DIM, False)",
                "_rope_pairing(lanes, ROPE_DIM, True)",
            ),
        ),
    ),
    KernelVariant(
        "mutant/indexer-rope-flipped",
        "indexer RoPE style flipped (NeoX for interleaved models and back)",
        (
            _edit(
                "_indexer_k_task",
                "_rope_pairing(lanes, ROPE_DIM, NEOX)",
                "_rope_pairing(lanes, ROPE_DIM, True != NEOX)",
            ),
        ),
    ),
    KernelVariant(
        "mutant/eps-outside-rsqrt",
        "RMSNorm computes rsqrt(mean(x^2)) + eps instead of rsqrt(mean(x^2) + eps)",
        # Identical to the eye until mean(x^2) is comparable to eps (an all-zero row gives
        # 0 * inf = NaN instead of 0).
        (
            _edit(
                "_rms_norm",
                "    inv_rms = tl.math.div_rn(1.0, tl.sqrt_rn(mean_square + eps))",
                "    inv_rms = tl.math.div_rn(1.0, tl.sqrt_rn(mean_square)) + eps",
            ),
        ),
    ),
    KernelVariant(
        "mutant/norm-in-bf16",
        "RMSNorm intermediates rounded to the activation dtype instead of kept in fp32",
        # Each intermediate (squares, their mean, rsqrt, the normalized row) rounded to the
        # dtype of the output the norm feeds, as if never upcast.
        (
            _edit(
                "_rms_norm",
                "def _rms_norm(x, weight_ptr, eps, DIM: tl.constexpr, BLOCK: tl.constexpr):",
                "def _rms_norm(x, weight_ptr, eps, DIM: tl.constexpr, BLOCK: tl.constexpr,\n"
                "              ACT_DTYPE: tl.constexpr):",
            ),
            _edit(
                "_rms_norm",
                "    mean_square = tl.math.div_rn(tl.sum(x * x, axis=1), DIM)\n"
                "    inv_rms = tl.math.div_rn(1.0, tl.sqrt_rn(mean_square + eps))\n"
                "    normalized = x * inv_rms[:, None]",
                "    square = (x * x).to(ACT_DTYPE).to(tl.float32)\n"
                "    mean_square = tl.math.div_rn(tl.sum(square, axis=1), DIM)"
                ".to(ACT_DTYPE).to(tl.float32)\n"
                "    inv_rms = tl.math.div_rn(1.0, tl.sqrt_rn(mean_square + eps))\n"
                "    inv_rms = inv_rms.to(ACT_DTYPE).to(tl.float32)\n"
                "    normalized = (x * inv_rms[:, None]).to(ACT_DTYPE).to(tl.float32)",
            ),
            _edit(
                "_q_task",
                "_rms_norm(x, q_weight_ptr, eps, Q_DIM, BLOCK_Q)",
                "_rms_norm(x, q_weight_ptr, eps, Q_DIM, BLOCK_Q, q_out_ptr.dtype.element_ty)",
            ),
            _edit(
                "_kv_task",
                "_rms_norm(x, kv_weight_ptr, eps, KV_DIM, BLOCK_KV)",
                "_rms_norm(x, kv_weight_ptr, eps, KV_DIM, BLOCK_KV, kv_out_ptr.dtype.element_ty)",
            ),
        ),
    ),
    KernelVariant(
        "mutant/token-index-as-position",
        "RoPE turned by the token's row index instead of positions[t]",
        # Right only for a fresh prefill that starts at position 0.
        (
            _edit(
                "_rope_positions",
                "    positions = tl.load(positions_ptr + tokens, mask=live, other=-1)",
                "    positions = tl.where(live, tokens, -1)",
            ),
        ),
    ),
    KernelVariant(
        "mutant/ds-mla-row-scale",
        "fp8_ds_mla scale over the whole 512-wide row instead of per 128-wide tile",
        (
            _edit(
                "_write_mla_entries",
                _DS_MLA_SCALES,
                "        amax = tl.broadcast_to(tl.max(amax, axis=1)[:, None], "
                "(BLOCK_T, DS_MLA_NUM_TILES))\n" + _DS_MLA_SCALES,
            ),
        ),
    ),
    KernelVariant(
        "mutant/ue8m0-round-down",
        "indexer UE8M0 scale rounded down instead of up, so large values saturate",
        # 2^floor(log2(amax / 448)): half the scale, so the row's largest values saturate.
        (
            _edit(
                "_indexer_k_task",
                "        scale = ue8m0_scale(amax)",
                "        ratio = tl.math.div_rn(tl.maximum(amax, 1e-4), 448.0)\n"
                "        bits = ratio.to(tl.int32, bitcast=True) & 0x7F800000\n"
                "        scale = bits.to(tl.float32, bitcast=True)",
            ),
        ),
    ),
    KernelVariant(
        "mutant/ue8m0-floor-only-zero",
        "indexer UE8M0 amax floored at 1e-4 only when it is 0, not below 1e-4 too",
        # `amax if amax > 0 else 1e-4` for max(amax, 1e-4): right for an all-zero row, a
        # smaller scale (and larger codes) for a row whose amax is non-zero but below 1e-4.
        (
            _edit(
                "_indexer_k_task",
                "        scale = ue8m0_scale(amax)",
                "        floored = tl.where(amax > 0, amax, 1e-4)\n"
                "        scale = power_of_two_at_or_above(tl.math.div_rn(floored, 448.0))",
            ),
        ),
    ),
    KernelVariant(
        "mutant/ds-mla-pow2-floor-only-zero",
        "fp8_ds_mla pow2 tile-scale ratio floored at 1e-4 only for an all-zero tile",
        # The same slip in the pow2 rule: a tile whose amax / 448 is below 1e-4 but not 0
        # gets a power of two below 2^-13.
        (
            _edit(
                "_ds_mla_tile_scales",
                "power_of_two_at_or_above(tl.maximum(ratio, POW2_RATIO_FLOOR))",
                "power_of_two_at_or_above(tl.where(amax > 0, ratio, POW2_RATIO_FLOOR))",
            ),
        ),
    ),
    KernelVariant(
        "mutant/nvfp4-floor-only-zero",
        "nvfp4_ds_mla tile scale floored at 2^-9 only for an all-zero tile",
        # A tile whose amax / 6 is below 2^-10 but not 0 rounds to the e4m3 scale 0, and
        # its values divided by it saturate.
        (
            _edit(
                "write_nvfp4_ds_mla_entries",
                "    ratio = tl.maximum(tl.math.div_rn(amax, NVFP4_E2M1_MAX), NVFP4_RATIO_FLOOR)",
                "    ratio = tl.where(amax > 0, tl.math.div_rn(amax, NVFP4_E2M1_MAX), "
                "NVFP4_RATIO_FLOOR)",
                NVFP4,
            ),
        ),
    ),
    KernelVariant(
        "mutant/topk-fill-skipped",
        "top-k buffer not filled with -1 on indexer layers",
        (
            _edit(
                "_fused_norm_rope_kernel",
                "    elif task == TASK_TOPK_FILL:\n" + _TOPK_FILL,
                "    elif task == TASK_TOPK_FILL:\n        pass",
            ),
        ),
    ),
    KernelVariant(
        "mutant/topk-fill-on-shared-layer",
        "top-k buffer filled with -1 on shared (no-indexer) layers too",
        # The fill keyed on the wrong flag: a shared layer's grid has no top-k sub-task,
        # so the KV programs fill the buffer instead.
        (
            _edit(
                "_fused_norm_rope_kernel",
                _KV_CALL_END,
                _KV_CALL_END + "\n        if FIRST_TASK == TASK_KV:\n    " + _TOPK_FILL,
            ),
        ),
    ),
    KernelVariant(
        "mutant/indexer-uses-mla-slots",
        "indexer cache written through the MLA slot mapping instead of its own",
        # The same thing while both are sharded alike, wrong when the indexer is
        # replicated. In bounds: the MLA cache never has more entries than the indexer's.
        (
            _edit(
                "_indexer_k_task",
                "_local_slots(index_slot_ptr, tokens, live)",
                "_local_slots(slot_ptr, tokens, live)",
            ),
        ),
    ),
    KernelVariant(
        "mutant/previous-entry-overwritten",
        "each owned entry also stored one slot back, overwriting a cached prefix entry",
        # A store window that starts one slot early: for a request's first new token, an
        # already cached prefix entry.
        (
            _edit(
                "_kv_task",
                _MLA_WRITE,
                _MLA_WRITE + "\n"
                "        behind = owned & (slots >= 1)\n"
                "        previous = _paged_entry(slots - 1, behind, cache_block_size, "
                "mla_block_stride,\n"
                "                                mla_entry_stride)\n"
                "        _write_mla_entries(mla_cache_ptr, previous, behind, kv, kpe, mla_scale, "
                "KV_DIM,\n"
                "                           ROPE_DIM, BLOCK_KV, BLOCK_ROPE, BLOCK_T, "
                "CACHE_LAYOUT,\n"
                "                           DS_MLA_POW2)",
            ),
        ),
    ),
    KernelVariant(
        "mutant/ds-mla-scale-pow2-when-amax",
        "fp8_ds_mla tile scales rounded up to a power of two where the case demands amax/448",
        # vLLM 0.31's rule where the case demands 0.30's: the encoding of the other
        # release, as a kernel that hard-codes one rule writes it. Right under pow2.
        (
            _edit(
                "_write_mla_entries", _DS_MLA_SCALES, _DS_MLA_SCALES.replace("DS_MLA_POW2", "True")
            ),
        ),
    ),
    KernelVariant(
        "mutant/ds-mla-scale-amax-when-pow2",
        "fp8_ds_mla tile scales amax/448 where the case demands a power of two (vLLM 0.31+)",
        # The reverse slip. Right under amax.
        (
            _edit(
                "_write_mla_entries", _DS_MLA_SCALES, _DS_MLA_SCALES.replace("DS_MLA_POW2", "False")
            ),
        ),
    ),
    KernelVariant(
        "mutant/address-32bit",
        "MLA cache addresses in 32 bits: slot * entry_bytes wraps past 2^31 (3.3M slots)",
        # What int32 arithmetic yields, written out in 64 bits (a compiler may assume a
        # signed int32 product never overflows): ((x + 2^31) & (2^32 - 1)) - 2^31. Only a
        # GPU-sized cache shows it.
        (
            _WITH_INSIDE_CACHE,
            _edit(
                "_mla_entry",
                _MLA_STORED,
                "    entry = ((entry + 2147483648) & 4294967295) - 2147483648\n"
                "    stored = owned & _inside_cache(entry, cache_block_size, block_stride, "
                "entry_stride,\n"
                "                                   mla_num_blocks)\n"
                "    return entry, stored",
            ),
        ),
        gpu_sized=True,
    ),
)
"""The catalog ``dcpcheck selftest`` runs (``dcpcheck list mutants``): every variant that
must fail the contract, the historical regressions first."""

VARIANTS: tuple[KernelVariant, ...] = (DEFAULT_VARIANT, *MUTANTS)
"""Every build of the project's kernel; the registry serves each under its name."""
