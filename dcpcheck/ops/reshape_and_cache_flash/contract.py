"""The reshape-and-cache-flash op's protocol: ``kernel(inputs, key_cache, value_cache) ->
None``, called once on every rank of a DCP group, each with its own slot mapping.

The paged K/V cache write of non-MLA attention (vLLM's ``triton_reshape_and_cache_flash``):
every token of the step has a key and a value and, on this rank, a slot; the kernel writes
the token's key and value, encoded as the cache's ``kv_cache_dtype`` says, at that slot of
``key_cache`` and ``value_cache``, and skips a token whose slot is negative. Under DCP a
rank's slot mapping marks every token another rank stores ``-1`` (``reference.slot_mapping``),
so each rank writes exactly its own tokens. A rank's inputs:

* ``key``, ``value`` (``[tokens, kv_heads, head_size]``, fp16, bf16 or fp32; the head
  dimension contiguous, rows strided as a split of the model's packed projection);
* ``slot_mapping`` (int64, ``[tokens]``): the rank's slot of every token, ``-1`` for none;
* ``kv_cache_dtype``: ``auto`` (the cache holds the key's dtype) or ``fp8``;
* ``k_scale``, ``v_scale`` (fp32 scalars): an ``fp8`` cache stores ``key / k_scale`` and
  ``value / v_scale``;
* ``layout``: how the caches are laid out (``reference.reshape_and_cache_flash.LAYOUTS``).

The caches are the views the layout's caller hands the write (``kv_views``), and for an
``fp8`` cache viewed as float8_e4m3fn, as vLLM's callers view their uint8 allocation. What
every byte of both caches must be afterwards is ``reference.reshape_and_cache_flash.write``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from reference.reshape_and_cache_flash import KV_CACHE_DTYPES, LAYOUTS, NO_SLOT

__all__ = ["NO_SLOT", "CacheWriteInputs", "CacheWriteKernel"]


@dataclass(frozen=True)
class CacheWriteInputs:
    """One rank's inputs of the op (module docstring)."""

    key: torch.Tensor
    value: torch.Tensor
    slot_mapping: torch.Tensor
    kv_cache_dtype: str
    k_scale: torch.Tensor
    v_scale: torch.Tensor
    layout: str
    dcp_size: int = 1
    dcp_rank: int = 0

    def __post_init__(self) -> None:
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype {self.kv_cache_dtype!r} is none of {KV_CACHE_DTYPES}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout {self.layout!r} is none of {LAYOUTS}")

    @property
    def tokens(self) -> int:
        return self.key.shape[0]


CacheWriteKernel = Callable[[CacheWriteInputs, torch.Tensor, torch.Tensor], None]
"""``kernel(inputs, key_cache, value_cache)``: writes the rank's tokens' entries."""
