"""The project's kernel of the op, in Triton: one program per token and tile of its
``kv_heads * head_size`` elements.

A program loads its token's slot; a negative slot masks every lane, so the program reads
and writes nothing (another rank's token, or padding). Otherwise each lane is one element
``(head, dim)`` of the key and of the value: it is loaded from the token's row, divided by
the tensor's scale in fp32 for an ``fp8`` cache, and stored at block ``slot //
BLOCK_SIZE``, offset ``slot % BLOCK_SIZE`` of each cache. Where an element lies is read
from the cache's strides, which covers every layout of
``reference.reshape_and_cache_flash.LAYOUTS``: an element's address is ``block * s_block +
offset * s_offset + head * s_head + (dim // X) * s_outer + (dim % X) * s_inner``, where the
head-major key splits the head dimension into packs of ``X`` and every other cache has
``X = head_size`` (``s_outer`` unused).

The definition it computes is ``reference.reshape_and_cache_flash.write``.

Import this module only once ``dcpcheck.backend.current_backend()`` has chosen between
compiling and Triton's interpreter: Triton decides that when a kernel is defined.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from dcpcheck.ops.reshape_and_cache_flash.contract import CacheWriteInputs

TILE_MAX = 2048
"""Elements a program handles at most: a token's whole entry for up to 16 heads of 128."""


@triton.jit
def _write_kernel(
    key_ptr,
    value_ptr,
    key_cache_ptr,
    value_cache_ptr,
    slots_ptr,
    k_scale_ptr,
    v_scale_ptr,
    key_row,
    value_row,
    k_block,
    k_offset,
    k_head,
    k_outer,
    k_inner,
    v_block,
    v_offset,
    v_head,
    v_outer,
    v_inner,
    HEAD_SIZE: tl.constexpr,
    WIDTH: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    KEY_X: tl.constexpr,
    VALUE_X: tl.constexpr,
    FP8: tl.constexpr,
    TILE: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + token).to(tl.int64)
    lanes = tl.program_id(1) * TILE + tl.arange(0, TILE)
    live = (lanes < WIDTH) & (slot >= 0)
    head = lanes // HEAD_SIZE
    dim = lanes % HEAD_SIZE
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    key = tl.load(key_ptr + token * key_row + lanes, mask=live, other=0.0)
    value = tl.load(value_ptr + token * value_row + lanes, mask=live, other=0.0)
    if FP8:
        key = key.to(tl.float32) / tl.load(k_scale_ptr)
        value = value.to(tl.float32) / tl.load(v_scale_ptr)
    k_at = block * k_block + offset * k_offset + head * k_head
    k_at += (dim // KEY_X) * k_outer + (dim % KEY_X) * k_inner
    v_at = block * v_block + offset * v_offset + head * v_head
    v_at += (dim // VALUE_X) * v_outer + (dim % VALUE_X) * v_inner
    tl.store(key_cache_ptr + k_at, key.to(key_cache_ptr.dtype.element_ty), mask=live)
    tl.store(value_cache_ptr + v_at, value.to(value_cache_ptr.dtype.element_ty), mask=live)


class Addressing(NamedTuple):
    """Where a cache's elements lie (module docstring): the strides of a block, an offset
    in it, a head, a pack of ``x`` elements of the head dimension and an element in it."""

    block: int
    offset: int
    head: int
    outer: int
    inner: int
    x: int


def addressing(cache: torch.Tensor, kind: str, head_major: bool, head_size: int) -> Addressing:
    """The addressing of a ``kind`` (``key``/``value``) cache as its caller hands it:
    ``[blocks, block_size, heads, head_size]`` views, or the head-major layout's
    ``[blocks, heads, head_size // x, block_size, x]`` key and ``[blocks, heads, head_size,
    block_size]`` value."""
    s = cache.stride()
    if not head_major:
        return Addressing(s[0], s[1], s[2], 0, s[3], head_size)
    if kind == "key":
        return Addressing(s[0], s[3], s[1], s[2], s[4], cache.shape[4])
    return Addressing(s[0], s[3], s[1], 0, s[2], head_size)


def write(inputs: CacheWriteInputs, key_cache: torch.Tensor, value_cache: torch.Tensor) -> None:
    """Launch the kernel on one rank (module docstring)."""
    tokens, heads, head_size = inputs.key.shape
    if tokens == 0:
        return
    head_major = key_cache.dim() == 5
    k = addressing(key_cache, "key", head_major, head_size)
    v = addressing(value_cache, "value", head_major, head_size)
    width = heads * head_size
    tile = min(TILE_MAX, triton.next_power_of_2(width))
    _write_kernel[(tokens, triton.cdiv(width, tile))](
        inputs.key,
        inputs.value,
        key_cache,
        value_cache,
        inputs.slot_mapping,
        inputs.k_scale,
        inputs.v_scale,
        inputs.key.stride(0),
        inputs.value.stride(0),
        *k[:5],
        *v[:5],
        HEAD_SIZE=head_size,
        WIDTH=width,
        BLOCK_SIZE=key_cache.shape[3] if head_major else key_cache.shape[1],
        KEY_X=k.x,
        VALUE_X=v.x,
        FP8=inputs.kv_cache_dtype == "fp8",
        TILE=tile,
    )
