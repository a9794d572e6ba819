"""Finding the cache writes no token of a step owned: one scan of every byte of each
rank's guarded cache storage against its bytes before the launch.

Each changed entry that no owned slot explains becomes a ``StrayWrite``, located (a guard
band before or after the cache, a cached-prefix entry, an unowned slot) and attributed to
the token whose entry bytes it holds, where one is recognisable. Finding them is this
module; filing each under the check it breaks (``guard_bands``, ``prefix_intact``,
``padding_inert``, ``cache_foreign``, ``profiling_no_write``) and saying which encodings
name the tokens is ``checks.stray_write_checks`` and ``checks.TokenEncodings``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import reference
from dcpcheck.ops.fused_norm_rope.cache_entries import index_rows
from dcpcheck.ops.fused_norm_rope.case import Case, RankLaunch
from dcpcheck.ops.fused_norm_rope.contract import INDEX_SHUFFLE_TILE, IndexFormat
from dcpcheck.ops.fused_norm_rope.guarded_cache import GUARD_BLOCKS, GuardedCache

ATTRIBUTION_MIN_MATCH = 0.5
"""A stray cache entry is attributed to the token whose oracle encoding shares the most
bytes with it, if at least this fraction: random initial bytes match by chance ~1/256."""


GAP_WHERE = "guard: the gap after this entry's block"
"""``StrayWrite.where`` of changed bytes between two blocks (``Scenario.block_gap``), filed
under the last entry of the block they follow."""


@dataclass(frozen=True)
class StrayWrite:
    """A cache entry (or guard entry) that changed although no token of this step owns it."""

    cache: str  # "mla_cache" / "index_cache"
    rank: int
    slot: int  # entry index relative to the first addressable entry (negative: guard before)
    where: str  # "guard before" / "guard after" / GAP_WHERE / "prefix" / "unowned"
    token: int | None  # token whose oracle encoding it holds, if recognisable
    bytes_changed: int


def changed_bytes_per_entry(
    storage: torch.Tensor, initial: torch.Tensor, name: str, index_dim: int, fmt: IndexFormat
) -> torch.Tensor:
    """How many bytes of each entry (slot, guard entries included) differ from before.

    The MLA cache stores entries contiguously. The indexer packs a block as all its
    fp8 rows first, then all its scales (docs/fused-norm-rope.md), so an entry's bytes sit in two
    places; in the shuffled format a token's values are further cut into 16-byte pieces, one per
    16 x 16 tile (``contract.INDEX_SHUFFLE_TILE``). Counted as sums over reshaped
    comparisons: finding every changed byte and binning it by entry costs far more on a
    GPU (the bytes of one entry all hit one counter). ``storage`` and ``initial`` are
    ``[blocks, B, E]`` bytes, guard blocks included: one rank's, or every rank's blocks
    one after the other (``fused_checks``), as a block's entries never span two blocks.
    """
    changed = storage != initial
    blocks, block_size, row = changed.shape
    if name == "mla_cache":
        return changed.sum(dim=2).flatten()
    flat = changed.view(blocks, block_size * row)
    values_end = block_size * index_dim
    if fmt.shuffled:  # [blocks, B/16, I/16, 16 tokens, 16 bytes] -> per token
        tile = INDEX_SHUFFLE_TILE
        tiled = flat[:, :values_end].reshape(
            blocks, block_size // tile, index_dim // tile, tile, tile
        )
        values = tiled.sum(dim=(2, 4)).reshape(blocks, block_size)
    else:
        values = flat[:, :values_end].reshape(blocks, block_size, index_dim).sum(dim=2)
    scales = flat[:, values_end:].reshape(blocks, block_size, -1).sum(dim=2)
    return (values + scales).flatten()


def _stray_writes(
    case: Case,
    launch: RankLaunch,
    cache: GuardedCache,
    name: str,
    owned_slots: torch.Tensor | None,
    prefix_slots: torch.Tensor,
    read_entry,
    encodings: torch.Tensor | None,
) -> list[StrayWrite]:
    storage = cache.storage
    blocks, block_size, _ = storage.shape
    changed_per_entry = changed_bytes_per_entry(
        cache.storage,
        cache.initial,
        name,
        case.scenario.model.index_head_dim,
        case.scenario.index_format,
    )
    first_entry = GUARD_BLOCKS * block_size
    if owned_slots is not None:
        changed_per_entry[owned_slots[owned_slots >= 0] + first_entry] = 0
    stray = torch.nonzero(changed_per_entry).flatten().cpu()
    last_entry = blocks * block_size - first_entry
    prefix = set(prefix_slots[prefix_slots >= 0].tolist())
    writes = []
    for entry in stray[:64].tolist():  # bounded: a report needs the first few, not all
        slot = entry - first_entry
        if entry < first_entry:
            where = "guard before"
        elif entry >= last_entry:
            where = "guard after"
        elif slot in prefix:
            where = "prefix"
        else:
            where = "unowned"
        held = read_entry(storage, torch.tensor([entry], device=storage.device))[0]
        writes.append(
            StrayWrite(
                name,
                launch.rank,
                slot,
                where,
                _attribute(held, encodings),
                int(changed_per_entry[entry]),
            )
        )
    return writes + _gap_writes(launch, cache, name)


def _gap_writes(launch: RankLaunch, cache: GuardedCache, name: str) -> list[StrayWrite]:
    """The changed bytes between blocks, one ``StrayWrite`` per gap (the first 64)."""
    if not cache.gap.numel():
        return []
    changed = (cache.gap != cache.gap_initial).sum(dim=1)
    block_size = cache.storage.shape[1]
    return [
        StrayWrite(
            name,
            launch.rank,
            (block - GUARD_BLOCKS + 1) * block_size - 1,
            GAP_WHERE,
            None,
            int(changed[block]),
        )
        for block in torch.nonzero(changed).flatten()[:64].tolist()
    ]


def _attribute(entry: torch.Tensor, encodings: torch.Tensor | None) -> int | None:
    """The token whose encoding (``TokenEncodings``) this stray entry most resembles, if
    any does."""
    if encodings is None or not len(encodings):
        return None
    width = min(entry.numel(), encodings.shape[1])
    same = (encodings[:, :width] == entry[:width]).sum(dim=1)
    best = int(same.argmax())
    return best if int(same[best]) >= ATTRIBUTION_MIN_MATCH * width else None


def collect_stray_writes(
    case: Case, mla_encodings: torch.Tensor, index_encodings: torch.Tensor | None
) -> list[StrayWrite]:
    """Every changed entry that no token of this step owned, on every rank and cache;
    each attributed to the token whose entry bytes it holds: ``mla_encodings`` ``[T, E]``,
    ``index_encodings`` ``[T, I + 4]`` (``None`` on shared layers)."""
    index_dim = case.scenario.model.index_head_dim
    fmt = case.scenario.index_format
    writes = []
    for launch in case.ranks:
        writes += _stray_writes(
            case,
            launch,
            launch.mla,
            "mla_cache",
            launch.inputs.slot_mapping,
            launch.prefix_slots,
            reference.read_mla_cache,
            mla_encodings,
        )
        if launch.index is not None:
            writes += _stray_writes(
                case,
                launch,
                launch.index,
                "index_cache",
                launch.inputs.index_slot_mapping,
                launch.index_prefix_slots,
                lambda c, s: index_rows(c, s, index_dim, fmt),
                index_encodings,
            )
    return writes
