"""A cache's entries as the checks read them: byte rows, their parts, and the entries each
rank owns in a step.

The contract's layouts (``contract``) say where each byte of an entry sits; the
checks need the same facts in the form they compare: an entry as one byte row ``[E]``
(``reference.read_mla_cache``; ``index_rows`` for the indexer, whose block keeps values and
scales apart), cut into parts that each have a stored format and a tolerance
(``mla_entry_parts``, ``index_entry_parts``). Every check that looks at entries (owned
entries, stray writes, shards reassembled) and the kernel's own tests read them through
here, so an entry is read and cut one way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

import reference
from dcpcheck.ops.fused_norm_rope import tolerances
from dcpcheck.ops.fused_norm_rope.case import Case, RankLaunch
from dcpcheck.ops.fused_norm_rope.contract import (
    DS_MLA_ENTRY_BYTES,
    DS_MLA_ROPE_OFFSET,
    DS_MLA_SCALES_OFFSET,
    INDEX_SCALE_BYTES,
    NVFP4_DS_MLA_ENTRY_BYTES,
    NVFP4_DS_MLA_ROPE_OFFSET,
    NVFP4_DS_MLA_SCALES_OFFSET,
    CacheLayout,
    IndexFormat,
    IndexScale,
)
from dcpcheck.ops.fused_norm_rope.guarded_cache import GuardedCache


@dataclass(frozen=True)
class EntryPart:
    """A byte range of a cache entry, the format stored there, and its tolerance."""

    name: str
    start: int
    stop: int
    dtype: torch.dtype  # torch.uint8 means fp8 e4m3 bytes; float4_e2m1fn_x2 e2m1 pairs
    tolerance: tolerances.Tolerance


def mla_entry_parts(layout: CacheLayout, kv_dim: int, rope_dim: int, act: torch.dtype):
    """The parts of one MLA cache entry (docs/fused-norm-rope.md, the table of cache entries)."""
    if layout is CacheLayout.AUTO:
        kv_end = kv_dim * act.itemsize
        return (
            EntryPart("kv", 0, kv_end, act, tolerances.MLA_AUTO_KV),
            EntryPart(
                "kpe", kv_end, kv_end + rope_dim * act.itemsize, act, tolerances.MLA_AUTO_KPE
            ),
        )
    if layout is CacheLayout.FP8:
        return (
            EntryPart("kv", 0, kv_dim, torch.uint8, tolerances.FP8_VALUE),
            EntryPart("kpe", kv_dim, kv_dim + rope_dim, torch.uint8, tolerances.FP8_VALUE),
        )
    if layout is CacheLayout.NVFP4_DS_MLA:
        # The scales are compared as stored (e4m3 bytes, permuted alike on both sides).
        return (
            EntryPart(
                "nope",
                0,
                NVFP4_DS_MLA_ROPE_OFFSET,
                torch.float4_e2m1fn_x2,
                tolerances.E2M1_VALUE,
            ),
            EntryPart(
                "rope",
                NVFP4_DS_MLA_ROPE_OFFSET,
                NVFP4_DS_MLA_SCALES_OFFSET,
                torch.uint8,
                tolerances.FP8_VALUE,
            ),
            EntryPart(
                "scales",
                NVFP4_DS_MLA_SCALES_OFFSET,
                NVFP4_DS_MLA_ENTRY_BYTES,
                torch.uint8,
                tolerances.NVFP4_SCALE,
            ),
        )
    return (
        EntryPart("nope", 0, DS_MLA_SCALES_OFFSET, torch.uint8, tolerances.FP8_VALUE),
        EntryPart(
            "scales",
            DS_MLA_SCALES_OFFSET,
            DS_MLA_ROPE_OFFSET,
            torch.float32,
            tolerances.DS_MLA_SCALE,
        ),
        EntryPart(
            "rope",
            DS_MLA_ROPE_OFFSET,
            DS_MLA_ENTRY_BYTES,
            torch.bfloat16,
            tolerances.BF16_ROPE_IN_CACHE,
        ),
    )


def index_entry_parts(index_dim: int):
    """Indexer rows as the checks see them: fp8 values then the fp32 UE8M0 scale."""
    return (
        EntryPart("values", 0, index_dim, torch.uint8, tolerances.FP8_VALUE),
        EntryPart(
            "scale",
            index_dim,
            index_dim + INDEX_SCALE_BYTES,
            torch.float32,
            tolerances.UE8M0_SCALE,
        ),
    )


def index_rows(
    cache: torch.Tensor,
    slots: torch.Tensor,
    index_dim: int,
    fmt: IndexFormat,
    decode_scales: bool = True,
) -> torch.Tensor:
    """The indexer entries at ``slots`` as byte rows ``[K, I + 4]``: the fp8 values, then the
    scale's fp32 bytes (the rows ``index_entry_parts`` cuts), whatever the cache's format:
    read through ``fmt``'s tiling, an MX word decoded to its fp32 value (NaN if its four
    bytes are not one exponent), so every format is compared with the oracle the same way.
    ``decode_scales=False`` keeps the 4 scale bytes as stored: what says whether a part
    was written at all (a decoded NaN hides which bytes were there)."""
    if not decode_scales:
        fmt = IndexFormat(fmt.shuffled, IndexScale.FP32)  # the bytes as they are
    values, scales = reference.read_index_cache(
        cache, slots, index_dim, shuffled=fmt.shuffled, scale_format=fmt.scale.value
    )
    scale_bytes = scales.contiguous().view(torch.uint8).view(-1, INDEX_SCALE_BYTES)
    return torch.cat([values, scale_bytes], dim=1)


def expected_index_rows(case: Case, tokens: torch.Tensor) -> torch.Tensor:
    """The oracle's indexer entries of ``tokens``, as ``index_rows`` reads a cache's."""
    values = case.expected.index_values[tokens]
    scales = case.expected.index_scales[tokens].contiguous().view(torch.uint8)
    return torch.cat([values, scales.view(-1, INDEX_SCALE_BYTES)], dim=1)


def _owned(slots: torch.Tensor | None) -> torch.Tensor:
    if slots is None:
        return torch.empty(0, dtype=torch.int64)
    return torch.nonzero(slots.cpu() >= 0).flatten()


@dataclass(frozen=True)
class OwnedEntries:
    """The entries one rank owns in one cache this step, and how to read them."""

    launch: RankLaunch
    field: str  # "mla_cache" / "index_cache"
    tokens: torch.Tensor  # [K] on the host: the token owning each entry
    slots: torch.Tensor  # [K] their slots, on the cache's device
    cache: GuardedCache
    read: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (cache, slots) -> [K, E] bytes
    read_stored: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # the same, undecoded
    parts: tuple[EntryPart, ...]

    def rows(self) -> torch.Tensor:
        """The entries as the kernel left them, in the form compared with the oracle."""
        return self.read(self.cache.view, self.slots)

    def stored_rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The entries' bytes as stored, after and before the launch (the seeded random
        fill), part for part where ``rows`` has them: whether a part was written."""
        return (
            self.read_stored(self.cache.view, self.slots),
            self.read_stored(self.cache.initial_view, self.slots),
        )


def owned_entries(case: Case) -> list[OwnedEntries]:
    """Every non-empty set of owned entries, rank by rank, the MLA cache before the index."""
    s, p = case.scenario, case.scenario.model
    mla_parts = mla_entry_parts(s.cache_layout, p.kv_lora_rank, p.rope_dim, s.torch_dtype)
    index_dim = p.index_head_dim

    def read_index(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        return index_rows(cache, slots, index_dim, s.index_format)

    def read_index_stored(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        return index_rows(cache, slots, index_dim, s.index_format, decode_scales=False)

    mla = reference.read_mla_cache
    found = []
    for launch in case.ranks:
        for field, cache, slot_mapping, read, read_stored in (
            ("mla_cache", launch.mla, launch.inputs.slot_mapping, mla, mla),
            (
                "index_cache",
                launch.index,
                launch.inputs.index_slot_mapping,
                read_index,
                read_index_stored,
            ),
        ):
            tokens = _owned(slot_mapping)
            if cache is None or not len(tokens):
                continue
            parts = mla_parts if field == "mla_cache" else index_entry_parts(index_dim)
            slots = slot_mapping[tokens.to(slot_mapping.device)].to(cache.storage.device)
            found.append(
                OwnedEntries(launch, field, tokens, slots, cache, read, read_stored, parts)
            )
    return found
