"""Which rank owns which token's KV entry under Decode Context Parallelism (docs/dcp-contract.md).

DCP shards the paged KV cache of one attention layer across ``n`` ranks along the token
axis. Every rank runs a kernel over the whole batch, but with its own slot
mapping: a token whose entry lives on another rank gets slot ``-1`` there. This module
builds those per-rank mappings the way vLLM lays the cache out:

* A request's block table is shared by all ranks. One logical ("virtual") block covers
  ``B * n`` consecutive positions; physical block ``bt[k]`` on each rank holds that
  rank's ``B`` of them.
* Inside a virtual block, positions are dealt to ranks round-robin in runs of ``I``
  (the interleave): with ``I = 1`` token by token, with ``I = B`` a whole block each.

So for position ``p`` (``V = B * n``)::

    block_number = bt[p // V]
    v_off        = p % V
    owner(p)     = (v_off // I) % n
    local_off    = (v_off // (n * I)) * I + v_off % I
    slot_r(p)    = block_number * B + local_off  if owner(p) == r  else  -1

With ``n = 1`` this is the ordinary mapping ``bt[p // B] * B + p % B``. Everything here
is plain torch on the CPU; the runner moves the tensors to the kernel's device.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch

NO_SLOT = -1
"""Slot of a token that has no cache entry on a rank (foreign token or padding row)."""

PADDING_REQUEST = -1
"""``request_index`` of a CUDA-graph padding row."""

NO_OWNER = -1
"""``owner`` of a padding row: no rank stores it."""

PADDING_POSITION = 1
"""Position given to padding rows. Their outputs are unconstrained (docs/dcp-contract.md, item 5),
but their position must still index the RoPE table, and it is kept off 0 because RoPE at
position 0 is the identity: no row of a batch should sit where a skipped rotation is
invisible (docs/dcp-contract.md: positions stay away from 0)."""

OWNED = 0
FOREIGN = 1
PADDING = 2
OWNERSHIP_NAMES = ("owned", "foreign", "padding")
"""Codes returned by ``SlotMappings.ownership`` and their names for reports (index by code)."""


class DcpLayoutError(ValueError):
    """A DCP layout (or a block table for it) that cannot describe a cache.

    ``field`` names the offending parameter, so callers that read layouts from files can
    point at the key that set it.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class BatchError(ValueError):
    """A request or batch with counts that describe no tokens. ``field`` as above."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def _is_int(value: object) -> bool:
    # bool is a subclass of int; ``True`` is never a count.
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Request:
    """One request's share of a batch: ``prefix`` tokens already cached (vLLM's
    ``num_computed_tokens``, positions ``0..prefix-1``) and ``new`` tokens computed in this
    step (positions ``prefix..prefix+new-1``): 1 for decode, k for speculative decode,
    many for prefill."""

    prefix: int
    new: int

    def __post_init__(self) -> None:
        if not _is_int(self.prefix) or self.prefix < 0:
            raise BatchError("prefix", f"prefix must be an integer >= 0, got {self.prefix!r}")
        if not _is_int(self.new) or self.new < 1:
            raise BatchError("new", f"new must be an integer >= 1, got {self.new!r}")

    @property
    def length(self) -> int:
        """Tokens the request holds in the cache after this step."""
        return self.prefix + self.new


@dataclass(frozen=True)
class Batch:
    """The tokens of one forward step: each request's new tokens in order, then ``padding``
    CUDA-graph padding rows (slot ``-1`` on every rank)."""

    requests: tuple[Request, ...]
    padding: int = 0

    def __post_init__(self) -> None:
        if not _is_int(self.padding) or self.padding < 0:
            raise BatchError("padding", f"padding must be an integer >= 0, got {self.padding!r}")

    @property
    def num_real_tokens(self) -> int:
        return sum(r.new for r in self.requests)

    @property
    def num_tokens(self) -> int:
        """Rows the kernel sees, padding included."""
        return self.num_real_tokens + self.padding

    @property
    def num_prefix_tokens(self) -> int:
        return sum(r.prefix for r in self.requests)


@dataclass(frozen=True)
class DcpLayout:
    """How one attention layer's KV cache is sharded: ``block_size`` tokens per physical
    block on each rank, ``dcp_size`` ranks, runs of ``interleave`` consecutive positions
    per rank (``block_size % interleave == 0``, so a run never straddles a block)."""

    block_size: int
    dcp_size: int
    interleave: int = 1

    def __post_init__(self) -> None:
        for field, value in (
            ("block_size", self.block_size),
            ("dcp_size", self.dcp_size),
            ("interleave", self.interleave),
        ):
            if not _is_int(value) or value < 1:
                raise DcpLayoutError(field, f"{field} must be an integer >= 1, got {value!r}")
        if self.block_size % self.interleave != 0:
            raise DcpLayoutError(
                "interleave",
                f"interleave {self.interleave} does not divide block_size {self.block_size}",
            )

    @property
    def virtual_block(self) -> int:
        """Consecutive positions covered by one block-table entry across all ranks."""
        return self.block_size * self.dcp_size


BlockTables = tuple[tuple[int, ...], ...]
"""One tuple of physical block ids per request, shared by all ranks."""


def blocks_needed(request: Request, layout: DcpLayout) -> int:
    """Block-table entries a request needs: one per ``block_size * dcp_size`` positions."""
    return math.ceil(request.length / layout.virtual_block)


def build_block_tables(
    batch: Batch, block_size: int, dcp_size: int, shuffle_seed: int | None
) -> BlockTables:
    """Block tables for ``batch``, physical ids distinct across the whole batch.

    With ``shuffle_seed=None`` the ids run consecutively from 0 in request order (the
    identity table); otherwise they are a permutation of the same ids drawn from
    ``random.Random(shuffle_seed)``, so a kernel that assumes ``bt[k] == k`` is caught.
    """
    layout = DcpLayout(block_size, dcp_size)
    counts = [blocks_needed(r, layout) for r in batch.requests]
    ids = list(range(sum(counts)))
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(ids)
    tables = []
    start = 0
    for count in counts:
        tables.append(tuple(ids[start : start + count]))
        start += count
    return tuple(tables)


def num_blocks(block_tables: Sequence[Sequence[int]]) -> int:
    """Physical blocks each rank's cache must hold: the largest id in use, plus one."""
    return max((max(table) for table in block_tables if table), default=-1) + 1


@dataclass(frozen=True)
class SlotMappings:
    """The per-token view of one batch under one DCP layout (all tensors int64, CPU).

    ``T`` rows are the batch's tokens (real ones, then padding); ``P`` columns of the
    ``prefix_*`` tensors are the cached-prefix tokens of all requests (request order, then
    position order), so the harness can pre-write their entries and check that the kernel
    leaves them alone.
    """

    positions: torch.Tensor  # [T]; padding rows at PADDING_POSITION
    request_index: torch.Tensor  # [T]; PADDING_REQUEST for padding rows
    owner: torch.Tensor  # [T] owning rank; NO_OWNER for padding rows
    per_rank: torch.Tensor  # [n, T] row r is rank r's slot mapping; NO_SLOT = not stored here
    prefix_per_rank: torch.Tensor  # [n, P] slots of the cached-prefix tokens on each rank
    prefix_owner: torch.Tensor  # [P]
    prefix_positions: torch.Tensor  # [P]
    prefix_request_index: torch.Tensor  # [P]

    @property
    def dcp_size(self) -> int:
        return self.per_rank.shape[0]

    @property
    def num_tokens(self) -> int:
        return self.per_rank.shape[1]

    def ownership(self, rank: int) -> torch.Tensor:
        """``[T]`` codes OWNED / FOREIGN / PADDING of every row as seen from ``rank``."""
        if not 0 <= rank < self.dcp_size:
            raise IndexError(f"rank {rank} out of range for DCP size {self.dcp_size}")
        codes = torch.full_like(self.owner, FOREIGN)
        codes[self.owner == rank] = OWNED
        codes[self.request_index == PADDING_REQUEST] = PADDING
        return codes


def _check_block_tables(block_tables: BlockTables, batch: Batch, layout: DcpLayout) -> None:
    """Raise ``DcpLayoutError`` unless there is one table of integer ids >= 0 per request,
    each covering its request under ``layout``."""
    if len(block_tables) != len(batch.requests):
        raise DcpLayoutError(
            "block_tables",
            f"{len(block_tables)} block tables for {len(batch.requests)} requests",
        )
    for index, (request, table) in enumerate(zip(batch.requests, block_tables, strict=True)):
        needed = blocks_needed(request, layout)
        if len(table) < needed:
            raise DcpLayoutError(
                "block_tables",
                f"request {index} needs {needed} blocks ({request.length} tokens, "
                f"{layout.virtual_block} per block-table entry), its table has {len(table)}",
            )
        # Plain ints checked at C speed first: a drawn batch has thousands of blocks, and a
        # Python test per block was most of the property search's drawing time.
        integers = set(map(type, table)) <= {int} or all(map(_is_int, table))
        if not integers or (table and min(table) < 0):
            raise DcpLayoutError(
                "block_tables", f"request {index}: block ids must be integers >= 0, got {table}"
            )


def _table_matrix(block_tables: BlockTables) -> torch.Tensor:
    """Block tables as one ``[R, max_len]`` tensor (short rows padded with -1)."""
    width = max((len(t) for t in block_tables), default=0)
    padded = [list(table) + [-1] * (width - len(table)) for table in block_tables]
    return torch.tensor(padded, dtype=torch.int64).reshape(len(block_tables), width)


def _token_slots(
    positions: torch.Tensor, request_index: torch.Tensor, tables: torch.Tensor, layout: DcpLayout
) -> tuple[torch.Tensor, torch.Tensor]:
    """Owner and ``[n, len]`` per-rank slots of real tokens (the formula in the module
    docstring, vectorized)."""
    n, interleave = layout.dcp_size, layout.interleave
    block_number = tables[request_index, positions // layout.virtual_block]
    v_off = positions % layout.virtual_block
    owner = (v_off // interleave) % n
    local_off = (v_off // (n * interleave)) * interleave + v_off % interleave
    slot = block_number * layout.block_size + local_off
    ranks = torch.arange(n, dtype=torch.int64).unsqueeze(1)
    per_rank = torch.where(owner.unsqueeze(0) == ranks, slot.unsqueeze(0), NO_SLOT)
    return owner, per_rank


def _ranges(starts: list[int], lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Concatenated ``range(start, start + length)`` per request, and the request index of
    each element."""
    lengths_t = torch.tensor(lengths, dtype=torch.int64)
    ends = torch.cumsum(lengths_t, 0)  # row after each request's last
    first_row = ends - lengths_t  # row where each request begins
    rows = torch.arange(sum(lengths), dtype=torch.int64)
    # The request of a row is the number of requests ending at or before it
    # (``repeat_interleave`` says the same, ~100x slower on small CPU tensors).
    request_index = torch.searchsorted(ends, rows, right=True)
    starts_t = torch.tensor(starts, dtype=torch.int64)
    positions = rows - first_row[request_index] + starts_t[request_index]
    return positions, request_index


def slot_mappings(batch: Batch, layout: DcpLayout, block_tables: BlockTables) -> SlotMappings:
    """Every rank's slot mapping for ``batch`` (new tokens and cached prefixes), in tensors
    of the caller's own.

    The last two mappings computed are kept (``_computed_slot_mappings``) and handed out as
    copies: a scenario asks for its DCP1 mapping several times (its positions, its baseline
    and the baseline's rerun, a replicated indexer's in every case), and the work grows with
    the cached tokens, up to 65,536 in a property-search example. At 25,720 cached tokens
    on 2 CPU cores a mapping takes 1.4-2.1 ms to compute and 0.15-0.21 ms to check and
    copy.
    """
    _check_block_tables(block_tables, batch, layout)
    computed = _computed_slot_mappings(batch, layout, tuple(map(tuple, block_tables)))
    return SlotMappings(**{f.name: getattr(computed, f.name).clone() for f in fields(computed)})


@functools.lru_cache(maxsize=2)  # a case's DCP1 mapping and its own size's
def _computed_slot_mappings(
    batch: Batch, layout: DcpLayout, block_tables: BlockTables
) -> SlotMappings:
    """:func:`slot_mappings` of checked block tables; never handed out itself (shared)."""
    tables = _table_matrix(block_tables)
    requests = batch.requests

    positions, request_index = _ranges([r.prefix for r in requests], [r.new for r in requests])
    owner, per_rank = _token_slots(positions, request_index, tables, layout)
    pad = batch.padding
    positions = torch.cat([positions, torch.full((pad,), PADDING_POSITION, dtype=torch.int64)])
    request_index = torch.cat(
        [request_index, torch.full((pad,), PADDING_REQUEST, dtype=torch.int64)]
    )
    owner = torch.cat([owner, torch.full((pad,), NO_OWNER, dtype=torch.int64)])
    per_rank = torch.cat(
        [per_rank, torch.full((layout.dcp_size, pad), NO_SLOT, dtype=torch.int64)], dim=1
    )

    prefix_positions, prefix_request_index = _ranges(
        [0] * len(requests), [r.prefix for r in requests]
    )
    prefix_owner, prefix_per_rank = _token_slots(
        prefix_positions, prefix_request_index, tables, layout
    )
    return SlotMappings(
        positions=positions,
        request_index=request_index,
        owner=owner,
        per_rank=per_rank,
        prefix_per_rank=prefix_per_rank,
        prefix_owner=prefix_owner,
        prefix_positions=prefix_positions,
        prefix_request_index=prefix_request_index,
    )


def parse_dcp_sizes(text: str, max_size: int | None = None) -> tuple[int, ...]:
    """``"4"`` or ``"1,2,4,8"`` -> distinct DCP sizes in the order given, each >= 1 (and
    <= ``max_size``). Raises ``ValueError`` with a message for the caller's option name."""
    sizes = []
    for part in text.split(","):
        try:
            size = int(part)
        except ValueError:
            raise ValueError(f"{part.strip()!r} is not an integer (e.g. 1,2,4)") from None
        if size < 1:
            raise ValueError(f"DCP size must be >= 1, got {size}")
        if max_size is not None and size > max_size:
            raise ValueError(f"DCP size must be <= {max_size}, got {size}")
        sizes.append(size)
    return tuple(dict.fromkeys(sizes))
