"""The project's kernels under test: the correct fused kernel and its known-bad variants.

Every kernel here is the *same* Triton kernel (``kernel``)
compiled with a different ``MUTATION`` constexpr, so a variant differs from the correct
kernel by exactly the control flow it reproduces and by nothing else.

Adding a mutant is a few-line change:

1. add a member to :class:`Mutation` (the integer becomes the kernel's ``MUTATION``),
2. add a ``tl.constexpr`` alias for it and the ``if MUTATION == ...`` branch in
   ``kernel.py`` (or, for launch-level bugs, a check in its host wrapper),
3. add a :class:`KernelVariant` named ``mutant/<slug>`` to ``MUTANTS`` below; the registry
   and ``selftest`` pick it up.

``MUTANTS`` is the catalog ``dcpcheck selftest`` proves the harness catches: the two
historical DCP regressions (``regress/...``) and plausible mistakes of the same kernel
(``mutant/...``), each a small, realistic slip that a reviewer could miss. With
``MUTATION == NONE`` every mutant branch is compiled out, so the correct kernel is the
same code, at the same speed, as without the catalog.

This module imports no Triton code: the kernel module that compiles a variant is imported
only by the registry's loaders (``kernels``), after the backend is fixed.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Mutation(enum.IntEnum):
    """A deliberate deviation from the DCP contract, compiled in as the ``MUTATION`` constexpr."""

    NONE = 0
    Q_NORM_SKIPPED_WITHOUT_LOCAL_SLOT = 1
    """vLLM before PR 50005: the early-out on a missing local slot also covered the Q
    RMSNorm, so ``q_out`` rows of tokens owned by another rank stay unwritten."""
    KV_OUTPUTS_SKIPPED_WITHOUT_LOCAL_SLOT = 2
    """vLLM before PR 54908: ``kv_out`` and ``kpe_out`` were produced only alongside the
    cache write, so tokens without a local slot get no KV/k_pe outputs (their cache write
    is, correctly, skipped too)."""
    FOREIGN_ROWS_WRITE_CACHE = 3
    """The ownership test is missing from the MLA cache store: every row stores an entry,
    and a row with slot -1 (foreign or padding) lands on entry 0, where the entry helper
    parks unowned rows."""
    NEGATIVE_SLOT_WRAPS = 4
    """Slot -1 indexes like a Python/torch index, wrapping around to the cache's last
    entry, which foreign and padding rows then overwrite."""
    BLOCK_OFFSET_OFF_BY_ONE = 5
    """The in-block offset is one too far (``slot % B + 1``): each token lands on the
    entry after its own (the next block's first entry at a block's end)."""
    BLOCK_AND_OFFSET_SWAPPED = 6
    """Block index and in-block offset swapped in the MLA cache address."""
    KPE_ROPE_NEOX = 7
    """k_pe rotated NeoX-style (planes ``(i, i + R/2)``) instead of interleaved
    (``(2i, 2i+1)``)."""
    INDEXER_ROPE_STYLE_FLIPPED = 8
    """The indexer's RoPE style flipped: NeoX where the model is interleaved, and back."""
    EPS_OUTSIDE_RSQRT = 9
    """RMSNorm computes ``rsqrt(mean(x^2)) + eps`` instead of ``rsqrt(mean(x^2) + eps)``:
    identical to the eye until ``mean(x^2)`` is comparable to eps (an all-zero row gives
    ``0 * inf = NaN`` instead of 0)."""
    NORM_IN_ACTIVATION_DTYPE = 10
    """RMSNorm done in bf16/fp16 instead of fp32: each intermediate (squares, their
    mean, rsqrt, the normalized row) rounded to the activation dtype."""
    TOKEN_INDEX_AS_POSITION = 11
    """RoPE (k_pe and indexer) turned by the token's row index instead of
    ``positions[t]``: right only for a fresh prefill that starts at position 0."""
    DS_MLA_ROW_SCALE = 12
    """fp8_ds_mla scale computed over the whole 512-wide row instead of per 128-wide tile."""
    UE8M0_ROUNDED_DOWN = 13
    """The indexer's UE8M0 scale rounded down (``2^floor(log2(amax / 448))``): half the
    scale, so the row's largest values saturate at 448."""
    TOPK_FILL_SKIPPED = 14
    """The top-k buffer is not filled with -1 on indexer layers."""
    TOPK_FILL_ON_SHARED_LAYER = 15
    """The top-k fill also runs on shared (no-indexer) layers, whose buffer belongs to
    another layer."""
    INDEXER_USES_MLA_SLOTS = 16
    """The indexer cache is written through the MLA slot mapping instead of its own: the
    same thing while both are sharded alike, wrong when the indexer is replicated."""
    PREVIOUS_ENTRY_OVERWRITTEN = 17
    """Each owned token's entry is also stored one slot back (a store window starting at
    ``slot - 1``), overwriting the entry before it: for a request's first new token, an
    already cached prefix entry."""
    ADDRESS_ARITHMETIC_32BIT = 18
    """MLA cache addresses computed in 32 bits: ``slot * entry_bytes`` wraps past 2^31
    (3.3M fp8_ds_mla slots), so high slots are never written where they belong. Only a
    GPU-sized cache shows it."""
    DS_MLA_SCALE_POW2_WHEN_AMAX = 19
    """fp8_ds_mla tile scales rounded up to a power of two (vLLM 0.31's rule) when the case
    demands ``max(amax/448, FLT_MIN)`` (``DsMlaScale.AMAX``): the encoding of the other
    release, as a kernel that hard-codes one rule writes it. Right under ``pow2``."""
    DS_MLA_SCALE_AMAX_WHEN_POW2 = 20
    """fp8_ds_mla tile scales ``max(amax/448, FLT_MIN)`` (vLLM 0.30's rule) when the case
    demands the power of two (``DsMlaScale.POW2``): the reverse slip. Right under
    ``amax``."""
    NVFP4_NIBBLES_SWAPPED = 21
    """nvfp4_ds_mla NoPE pairs packed the other way: the even element in the high nibble."""
    NVFP4_SCALE_UNPERMUTED = 22
    """nvfp4_ds_mla tile scale ``s`` stored at scale byte ``s`` instead of
    ``8*(s & 3) + (s >> 2)``: the layout a reader that does not permute expects."""
    NVFP4_SCALE_ROUNDED_UP = 23
    """nvfp4_ds_mla tile scales rounded up to the next e4m3 value instead of to nearest
    (a ceil where the contract says round-to-nearest): larger scales, coarser codes."""
    INDEX_SHUFFLE_TILE_TRANSPOSED = 24
    """Shuffled indexer layout with each 16 x 16 tile transposed: byte ``c`` of token ``t``
    at ``c * 16 + t`` within the tile instead of ``t * 16 + c``."""
    INDEX_MX_SCALE_ONE_BYTE = 25
    """MX-packed indexer scale written as the bare exponent byte (``e``, not ``e`` in all
    four bytes): a word a reader taking any other byte of it decodes as scale 2^-127.
    (The issue's "bytes in the wrong order" has no observable form: the four bytes are
    equal, so every order of them is the same word.)"""


@dataclass(frozen=True)
class KernelVariant:
    """One build of the project's kernel: a registry name and the mutation compiled in."""

    name: str
    description: str
    mutation: Mutation = Mutation.NONE


DEFAULT_VARIANT = KernelVariant(
    "default",
    "the project's fused norm + RoPE + cache-write Triton kernel (docs/fused-norm-rope.md)",
)

REGRESSIONS: tuple[KernelVariant, ...] = (
    KernelVariant(
        "regress/pre-50005",
        "Q RMSNorm skipped for tokens without a local slot (vLLM before PR 50005)",
        Mutation.Q_NORM_SKIPPED_WITHOUT_LOCAL_SLOT,
    ),
    KernelVariant(
        "regress/pre-54908",
        "kv_out / kpe_out skipped for tokens without a local slot, cache write correctly "
        "skipped (vLLM before PR 54908)",
        Mutation.KV_OUTPUTS_SKIPPED_WITHOUT_LOCAL_SLOT,
    ),
)
"""The two DCP bugs that shipped (docs/dcp-contract.md)."""

MUTANTS: tuple[KernelVariant, ...] = (
    *REGRESSIONS,
    KernelVariant(
        "mutant/foreign-rows-write-cache",
        "ownership test missing from the MLA cache store: rows with slot -1 write entry 0",
        Mutation.FOREIGN_ROWS_WRITE_CACHE,
    ),
    KernelVariant(
        "mutant/negative-slot-wraps",
        "slot -1 wraps around to the MLA cache's last entry (torch-style negative index)",
        Mutation.NEGATIVE_SLOT_WRAPS,
    ),
    KernelVariant(
        "mutant/nvfp4-nibbles-swapped",
        "nvfp4_ds_mla: the even NoPE element packed in the high nibble, not the low one",
        Mutation.NVFP4_NIBBLES_SWAPPED,
    ),
    KernelVariant(
        "mutant/nvfp4-scale-unpermuted",
        "nvfp4_ds_mla: tile s's scale at byte s, not 8*(s & 3) + (s >> 2)",
        Mutation.NVFP4_SCALE_UNPERMUTED,
    ),
    KernelVariant(
        "mutant/nvfp4-scale-rounded-up",
        "nvfp4_ds_mla: e4m3 tile scales rounded up instead of to nearest",
        Mutation.NVFP4_SCALE_ROUNDED_UP,
    ),
    KernelVariant(
        "mutant/index-shuffle-tile-transposed",
        "shuffled indexer layout: each 16-token x 16-byte tile written transposed",
        Mutation.INDEX_SHUFFLE_TILE_TRANSPOSED,
    ),
    KernelVariant(
        "mutant/index-mx-scale-one-byte",
        "MX-packed indexer scale: the exponent in one byte of the word, not all four",
        Mutation.INDEX_MX_SCALE_ONE_BYTE,
    ),
    KernelVariant(
        "mutant/block-offset-off-by-one",
        "in-block offset one too far (slot % block_size + 1) in the MLA cache address",
        Mutation.BLOCK_OFFSET_OFF_BY_ONE,
    ),
    KernelVariant(
        "mutant/block-offset-swapped",
        "block index and in-block offset swapped in the MLA cache address",
        Mutation.BLOCK_AND_OFFSET_SWAPPED,
    ),
    KernelVariant(
        "mutant/kpe-rope-neox",
        "k_pe RoPE paired NeoX-style (i, i + R/2) instead of interleaved (2i, 2i+1)",
        Mutation.KPE_ROPE_NEOX,
    ),
    KernelVariant(
        "mutant/indexer-rope-flipped",
        "indexer RoPE style flipped (NeoX for interleaved models and back)",
        Mutation.INDEXER_ROPE_STYLE_FLIPPED,
    ),
    KernelVariant(
        "mutant/eps-outside-rsqrt",
        "RMSNorm computes rsqrt(mean(x^2)) + eps instead of rsqrt(mean(x^2) + eps)",
        Mutation.EPS_OUTSIDE_RSQRT,
    ),
    KernelVariant(
        "mutant/norm-in-bf16",
        "RMSNorm intermediates rounded to the activation dtype instead of kept in fp32",
        Mutation.NORM_IN_ACTIVATION_DTYPE,
    ),
    KernelVariant(
        "mutant/token-index-as-position",
        "RoPE turned by the token's row index instead of positions[t]",
        Mutation.TOKEN_INDEX_AS_POSITION,
    ),
    KernelVariant(
        "mutant/ds-mla-row-scale",
        "fp8_ds_mla scale over the whole 512-wide row instead of per 128-wide tile",
        Mutation.DS_MLA_ROW_SCALE,
    ),
    KernelVariant(
        "mutant/ue8m0-round-down",
        "indexer UE8M0 scale rounded down instead of up, so large values saturate",
        Mutation.UE8M0_ROUNDED_DOWN,
    ),
    KernelVariant(
        "mutant/topk-fill-skipped",
        "top-k buffer not filled with -1 on indexer layers",
        Mutation.TOPK_FILL_SKIPPED,
    ),
    KernelVariant(
        "mutant/topk-fill-on-shared-layer",
        "top-k buffer filled with -1 on shared (no-indexer) layers too",
        Mutation.TOPK_FILL_ON_SHARED_LAYER,
    ),
    KernelVariant(
        "mutant/indexer-uses-mla-slots",
        "indexer cache written through the MLA slot mapping instead of its own",
        Mutation.INDEXER_USES_MLA_SLOTS,
    ),
    KernelVariant(
        "mutant/previous-entry-overwritten",
        "each owned entry also stored one slot back, overwriting a cached prefix entry",
        Mutation.PREVIOUS_ENTRY_OVERWRITTEN,
    ),
    KernelVariant(
        "mutant/ds-mla-scale-pow2-when-amax",
        "fp8_ds_mla tile scales rounded up to a power of two where the case demands amax/448",
        Mutation.DS_MLA_SCALE_POW2_WHEN_AMAX,
    ),
    KernelVariant(
        "mutant/ds-mla-scale-amax-when-pow2",
        "fp8_ds_mla tile scales amax/448 where the case demands a power of two (vLLM 0.31+)",
        Mutation.DS_MLA_SCALE_AMAX_WHEN_POW2,
    ),
    KernelVariant(
        "mutant/address-32bit",
        "MLA cache addresses in 32 bits: slot * entry_bytes wraps past 2^31 (3.3M slots)",
        Mutation.ADDRESS_ARITHMETIC_32BIT,
    ),
)
"""The catalog ``dcpcheck selftest`` runs (``dcpcheck list mutants``): every variant that
must fail the contract, the historical regressions first."""

VARIANTS: tuple[KernelVariant, ...] = (DEFAULT_VARIANT, *MUTANTS)
"""Every build of the project's kernel; the registry serves each under its name."""
