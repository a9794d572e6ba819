"""One case of the reshape-and-cache-flash op: a step's tokens at one DCP size, every rank's
inputs, and every rank's launch into a poisoned cache.

A batch is requests (a cached prefix and the new tokens the step writes, at positions
``prefix .. prefix + new - 1``), then padding rows (a CUDA graph's: slot ``-1`` on every
rank). Each rank's slot mapping is the write side's oracle's (``reference.slot_mapping``,
one sharded cache group), over a block table that gives every request distinct block ids,
shuffled by the seed, as wide as one rank storing the whole context needs; every rank gets
the same table, as the write side uses it. The cache holds every block id of the table and
``GUARD_BLOCKS`` more that no table names.

Keys and values are seeded normals, split from one packed ``[tokens, 2, kv_heads,
head_size]`` buffer (so rows are strided, as a split of the model's projection is); for an
``fp8`` cache they are drawn within the scales' range. Every byte of every rank's cache
storage starts as :data:`POISON_BYTE`, so an entry never written and a write anywhere it
should not be are both seen (``checks``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

import torch

from dcpcheck.cases.scenario_files import batch_rows
from dcpcheck.ops.reshape_and_cache_flash.contract import CacheWriteInputs, CacheWriteKernel
from reference import reshape_and_cache_flash as oracle
from reference import slot_mapping as write_side

POISON_BYTE = 0xFF
"""Every byte of a cache before a launch: a NaN in fp16, bf16, fp32 and e4m3, which no
drawn key or value encodes to."""

GUARD_BLOCKS = 2
"""Blocks of every cache that no block table names, which no launch may write."""

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
"""The key and value dtypes a batch may name."""

FP8_RANGE = 400.0
"""Drawn fp8 values stay within this many scales of zero: inside e4m3's 448."""


@dataclass(frozen=True)
class CacheWriteBatch:
    """What a case of the op is drawn from (module docstring)."""

    requests: tuple[tuple[int, int], ...]  # (cached prefix, new tokens)
    kv_heads: int = 2
    head_size: int = 64
    dtype: str = "bfloat16"
    kv_cache_dtype: str = "auto"
    k_scale: float = 1.0
    v_scale: float = 1.0
    layout: str = "nhd"
    block_size: int = 16
    interleave: int = 1
    padding: int = 0
    seed: int = 0

    @property
    def num_tokens(self) -> int:
        return batch_rows(self.requests, self.padding)

    @property
    def table_width(self) -> int:
        longest = max((prefix + new for prefix, new in self.requests), default=1)
        return -(-longest // self.block_size)

    @property
    def num_blocks(self) -> int:
        return len(self.requests) * self.table_width + GUARD_BLOCKS

    @property
    def summary(self) -> str:
        """The batch in a few words, as a shrunk failure is reported."""
        asked = ", ".join(f"{prefix}+{new}" for prefix, new in self.requests) or "none"
        return (
            f"{len(self.requests)} request(s) (prefix+new: {asked}), {self.padding} padding "
            f"row(s), {self.kv_heads}x{self.head_size} {self.dtype} into a "
            f"{self.kv_cache_dtype} {self.layout} cache, block size {self.block_size}, "
            f"interleave {self.interleave}"
        )


@dataclass(frozen=True)
class CacheWriteCase:
    """Every rank's inputs at one DCP size, and each rank's cache storage as its launch
    left it (``launch_all``)."""

    batch: CacheWriteBatch
    dcp_size: int
    ranks: tuple[CacheWriteInputs, ...]
    positions: torch.Tensor  # each token's position in its request, -1 for padding
    requests: torch.Tensor  # each token's request, -1 for padding
    block_table: torch.Tensor
    storages: tuple[torch.Tensor, ...] = ()


def _block_table(batch: CacheWriteBatch, shuffle: random.Random) -> torch.Tensor:
    """Distinct shuffled block ids, a row per request, as wide as DCP1 needs."""
    width = batch.table_width
    ids = list(range(len(batch.requests) * width))
    shuffle.shuffle(ids)
    return torch.tensor(ids, dtype=torch.int32).view(len(batch.requests), width)


def rank_slots(
    batch: CacheWriteBatch, table: torch.Tensor, dcp_size: int, rank: int
) -> torch.Tensor:
    """Rank ``rank``'s slot of every token (int64), the write side's oracle's."""
    news = [new for _, new in batch.requests]
    starts = torch.tensor([0, *news], dtype=torch.int32).cumsum(0).to(torch.int32)
    positions = [prefix + j for prefix, new in batch.requests for j in range(new)]
    positions += [0] * batch.padding
    if not batch.requests:
        return torch.full((batch.num_tokens,), oracle.NO_SLOT, dtype=torch.int64)
    [slots] = write_side.slot_mappings(
        starts,
        torch.tensor(positions, dtype=torch.int64),
        torch.arange(len(batch.requests), dtype=torch.int32),
        table[None],
        [batch.block_size],
        [True],
        dcp_size,
        rank,
        batch.interleave,
        batch.num_tokens,
    )
    return slots


def _values(batch: CacheWriteBatch) -> torch.Tensor:
    """The packed keys and values, ``[tokens, 2, kv_heads, head_size]`` (module docstring)."""
    generator = torch.Generator().manual_seed(batch.seed)
    shape = (batch.num_tokens, 2, batch.kv_heads, batch.head_size)
    drawn = torch.randn(shape, generator=generator, dtype=torch.float32)
    if batch.kv_cache_dtype == "fp8":
        scales = torch.tensor([batch.k_scale, batch.v_scale]).view(1, 2, 1, 1)
        drawn = (drawn * 60).clamp(-FP8_RANGE, FP8_RANGE) * scales
    return drawn.to(DTYPES[batch.dtype])


def build_case(batch: CacheWriteBatch, dcp_size: int, device: torch.device) -> CacheWriteCase:
    """Every rank's inputs for ``batch`` at ``dcp_size`` (not launched yet)."""
    shuffle = random.Random(batch.seed)
    table = _block_table(batch, shuffle)
    packed = _values(batch).to(device)
    scales = [
        torch.tensor(s, dtype=torch.float32, device=device) for s in (batch.k_scale, batch.v_scale)
    ]
    ranks = tuple(
        CacheWriteInputs(
            key=packed[:, 0],
            value=packed[:, 1],
            slot_mapping=rank_slots(batch, table, dcp_size, rank).to(device),
            kv_cache_dtype=batch.kv_cache_dtype,
            k_scale=scales[0],
            v_scale=scales[1],
            layout=batch.layout,
            dcp_size=dcp_size,
            dcp_rank=rank,
        )
        for rank in range(dcp_size)
    )
    positions = [prefix + j for prefix, new in batch.requests for j in range(new)]
    requests = [i for i, (_, new) in enumerate(batch.requests) for _ in range(new)]
    pad = [-1] * batch.padding
    return CacheWriteCase(
        batch,
        dcp_size,
        ranks,
        torch.tensor(positions + pad, dtype=torch.int64),
        torch.tensor(requests + pad, dtype=torch.int64),
        table,
    )


def empty_storage(batch: CacheWriteBatch, device: torch.device) -> torch.Tensor:
    """One rank's cache storage, every byte :data:`POISON_BYTE`."""
    shape = oracle.storage_shape(
        batch.layout, batch.num_blocks, batch.block_size, batch.kv_heads, batch.head_size
    )
    dtype = oracle.storage_dtype(batch.kv_cache_dtype, DTYPES[batch.dtype])
    storage = torch.empty(shape, dtype=dtype, device=device)
    storage.view(torch.uint8).fill_(POISON_BYTE)
    return storage


def handed_views(
    storage: torch.Tensor, batch: CacheWriteBatch
) -> tuple[torch.Tensor, torch.Tensor]:
    """The caches a caller hands the write: the layout's views, fp8 ones as float8_e4m3fn."""
    key_cache, value_cache = oracle.kv_views(storage, batch.layout, batch.kv_heads, batch.head_size)
    if batch.kv_cache_dtype == "fp8":
        return key_cache.view(torch.float8_e4m3fn), value_cache.view(torch.float8_e4m3fn)
    return key_cache, value_cache


def launch_all(kernel: CacheWriteKernel, case: CacheWriteCase) -> CacheWriteCase:
    """Launch ``kernel`` on every rank, each into its own poisoned cache."""
    storages = []
    for inputs in case.ranks:
        storage = empty_storage(case.batch, inputs.key.device)
        kernel(inputs, *handed_views(storage, case.batch))
        storages.append(storage)
    return replace(case, storages=tuple(storages))
