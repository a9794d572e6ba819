"""The paged K/V cache write of non-MLA attention, from its definition
(docs/reshape-and-cache-flash.md): the oracle of the reshape-and-cache-flash op.

Every token ``t`` of a step has a key and a value (``[tokens, kv_heads, head_size]``) and
a slot (``slot_mapping[t]``); a slot ``s >= 0`` names the entry at offset ``s % block_size``
of block ``s // block_size``, and the token's key and value, encoded, go there. A negative
slot is no entry: a padding row, or under DCP a token another rank stores (its rank's slot
mapping marks it ``-1``), and nothing is written for it. Nothing else of the cache changes.

The encoding is the cache's ``kv_cache_dtype``: ``auto`` stores the elements as they are
(the cache has the key's dtype); ``fp8`` stores float8_e4m3fn bytes of ``key / k_scale``
and ``value / v_scale`` (fp32 quotients of per-tensor fp32 scales), rounded to nearest even
and saturated to +-448 as the GPU's conversion does.

A cache is one storage tensor per layer, as vLLM's attention backends allocate it, seen
through the views their callers hand the write (``LAYOUTS``):

* ``nhd``: ``[blocks, 2, block_size, kv_heads, head_size]``; K and V are ``unbind(1)``
  (the Triton attention backend's);
* ``hnd``: ``[blocks, kv_heads, block_size, 2 * head_size]``, K the first half of the last
  axis and V the second, seen as ``[blocks, block_size, kv_heads, head_size]`` by
  ``transpose(1, 2)`` (heads not contiguous: their stride is ``block_size * 2 * head_size``);
* ``head-major``: ``[2, blocks, kv_heads * head_size * block_size]``; K seen as
  ``[blocks, kv_heads, head_size // x, block_size, x]`` and V as ``[blocks, kv_heads,
  head_size, block_size]`` (ROCm's paged-attention layout; ``x`` elements are 16 bytes).

Written with tensor indexing over all written tokens at once, so it shares nothing with a
kernel's per-token program.
"""

from __future__ import annotations

import torch

from reference.quant import fp8_e4m3_bytes

NO_SLOT = -1
"""The slot of a token a rank does not store, or of a padding row."""

KV_CACHE_DTYPES = ("auto", "fp8")
"""``auto``: the elements as they are; ``fp8``: float8_e4m3fn of the scaled values."""

LAYOUTS = ("nhd", "hnd", "head-major")
"""The cache layouts of the module docstring."""

PACK_BYTES = 16
"""The head-major layout packs ``x = 16 / element size`` elements of a key together."""


def storage_dtype(kv_cache_dtype: str, dtype: torch.dtype) -> torch.dtype:
    """The element type a cache of ``kv_cache_dtype`` is allocated with for keys of
    ``dtype``: the keys' own for ``auto``, bytes for ``fp8`` (vLLM allocates uint8)."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype {kv_cache_dtype!r} is none of {KV_CACHE_DTYPES}")
    return dtype if kv_cache_dtype == "auto" else torch.uint8


def pack(element_size: int) -> int:
    """``x``: the elements of a key the head-major layout keeps together."""
    return PACK_BYTES // element_size


def storage_shape(
    layout: str, blocks: int, block_size: int, kv_heads: int, head_size: int
) -> tuple[int, ...]:
    """The shape of one layer's cache storage in ``layout`` (module docstring)."""
    if layout == "nhd":
        return (blocks, 2, block_size, kv_heads, head_size)
    if layout == "hnd":
        return (blocks, kv_heads, block_size, 2 * head_size)
    if layout == "head-major":
        return (2, blocks, kv_heads * head_size * block_size)
    raise ValueError(f"layout {layout!r} is none of {LAYOUTS}")


def kv_views(
    storage: torch.Tensor,
    layout: str,
    kv_heads: int,
    head_size: int,
    element_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of ``storage`` as the layout's caller hands them to the write (module
    docstring): views, so writing them writes the storage. ``element_size``: the cache's,
    where ``storage`` holds something else laid out as the cache (element addresses)."""
    if layout == "nhd":
        key, value = storage.unbind(1)
        return key, value
    if layout == "hnd":
        seen = storage.transpose(1, 2)
        return seen[..., :head_size], seen[..., head_size:]
    if layout == "head-major":
        blocks = storage.shape[1]
        block_size = storage.shape[2] // (kv_heads * head_size)
        x = pack(element_size or storage.element_size())
        key = storage[0].view(blocks, kv_heads, head_size // x, block_size, x)
        value = storage[1].view(blocks, kv_heads, head_size, block_size)
        return key, value
    raise ValueError(f"layout {layout!r} is none of {LAYOUTS}")


def entries(cache: torch.Tensor, layout: str, kind: str) -> torch.Tensor:
    """A view of the ``kind`` (``key`` or ``value``) cache ``cache`` (as :func:`kv_views`
    gives it) indexed ``[block, offset]`` -> that slot's ``[kv_heads, head_size]`` entry
    (for the head-major key, ``[kv_heads, head_size // x, x]``)."""
    if layout in ("nhd", "hnd"):
        return cache
    if kind == "key":
        return cache.permute(0, 3, 1, 2, 4)
    return cache.permute(0, 3, 1, 2)


def encode(values: torch.Tensor, kv_cache_dtype: str, scale: torch.Tensor) -> torch.Tensor:
    """The stored form of ``values`` (module docstring): themselves, or fp8 bytes of
    ``values / scale`` in fp32."""
    if kv_cache_dtype == "auto":
        return values
    return fp8_e4m3_bytes(values.float() / scale.float())


def write(
    storage: torch.Tensor,
    layout: str,
    key: torch.Tensor,
    value: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_cache_dtype: str,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
) -> torch.Tensor:
    """A copy of ``storage`` after the write of every token with a slot (module
    docstring). ``key`` and ``value`` are ``[tokens, kv_heads, head_size]``; slots must
    be distinct (no step writes one entry twice)."""
    tokens, kv_heads, head_size = key.shape
    written = storage.cpu().clone()
    slots = slot_mapping.cpu().to(torch.int64)[:tokens]
    mine = (slots >= 0).nonzero().flatten()
    key_cache, value_cache = kv_views(written, layout, kv_heads, head_size)
    block_size = _block_size(key_cache, layout)
    blocks, offsets = slots[mine] // block_size, slots[mine] % block_size
    k = encode(key.cpu()[mine], kv_cache_dtype, k_scale.cpu())
    v = encode(value.cpu()[mine], kv_cache_dtype, v_scale.cpu())
    k_entries = entries(key_cache, layout, "key")
    entries(value_cache, layout, "value")[blocks, offsets] = v
    k_entries[blocks, offsets] = k.reshape((len(mine), *k_entries.shape[2:]))
    return written


def _block_size(key_cache: torch.Tensor, layout: str) -> int:
    return key_cache.shape[3] if layout == "head-major" else key_cache.shape[1]
