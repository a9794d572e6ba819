"""Wrong kernels of the op, each the project's with one bug a cache write under DCP has had
or could have, for the checks to be shown catching (``checks``). Each wraps the kernel
from outside (what it is asked, or what it writes), so the kernel a reader studies holds
no code that is not the kernel."""

from __future__ import annotations

from dataclasses import replace

import torch

from dcpcheck.ops.reshape_and_cache_flash.contract import CacheWriteInputs
from dcpcheck.ops.reshape_and_cache_flash.kernel import write


def negative_slot_as_zero(
    inputs: CacheWriteInputs, key_cache: torch.Tensor, value_cache: torch.Tensor
) -> None:
    """A negative slot clamped to 0 instead of skipped: every foreign or padding token is
    written over slot 0."""
    write(replace(inputs, slot_mapping=inputs.slot_mapping.clamp(min=0)), key_cache, value_cache)


def negative_slot_wraps(
    inputs: CacheWriteInputs, key_cache: torch.Tensor, value_cache: torch.Tensor
) -> None:
    """A negative slot taken modulo the cache's slots (an unsigned or ``%`` index): every
    foreign or padding token is written into the cache's last slot."""
    blocks = key_cache.shape[0]
    block_size = key_cache.shape[3] if key_cache.dim() == 5 else key_cache.shape[1]
    slots = inputs.slot_mapping % (blocks * block_size)
    write(replace(inputs, slot_mapping=slots), key_cache, value_cache)


def scale_multiplied(
    inputs: CacheWriteInputs, key_cache: torch.Tensor, value_cache: torch.Tensor
) -> None:
    """An fp8 cache's values multiplied by their scales instead of divided."""
    write(
        replace(inputs, k_scale=1 / inputs.k_scale, v_scale=1 / inputs.v_scale),
        key_cache,
        value_cache,
    )


def value_scaled_by_k_scale(
    inputs: CacheWriteInputs, key_cache: torch.Tensor, value_cache: torch.Tensor
) -> None:
    """An fp8 cache's values divided by the key's scale."""
    write(replace(inputs, v_scale=inputs.k_scale), key_cache, value_cache)


def last_head_dropped(
    inputs: CacheWriteInputs, key_cache: torch.Tensor, value_cache: torch.Tensor
) -> None:
    """The tile stops one head short (a width of ``(kv_heads - 1) * head_size``): the last
    KV head of every token never written."""
    heads = inputs.key.shape[1]
    if heads == 1:
        return
    shorter = replace(inputs, key=inputs.key[:, : heads - 1], value=inputs.value[:, : heads - 1])
    write(shorter, key_cache, value_cache)


def heads_assumed_contiguous(
    inputs: CacheWriteInputs, key_cache: torch.Tensor, value_cache: torch.Tensor
) -> None:
    """Heads addressed ``head_size`` apart, whatever the cache's head stride: right for a
    cache whose heads are contiguous, wrong for the ``hnd`` layout's."""
    if key_cache.dim() == 5:
        write(inputs, key_cache, value_cache)
        return
    head_size = inputs.key.shape[2]

    def contiguous_heads(cache: torch.Tensor) -> torch.Tensor:
        s = cache.stride()
        return cache.as_strided(cache.shape, (s[0], s[1], head_size, s[3]))

    write(inputs, contiguous_heads(key_cache), contiguous_heads(value_cache))


MUTANTS = (
    negative_slot_as_zero,
    negative_slot_wraps,
    scale_multiplied,
    value_scaled_by_k_scale,
    last_head_dropped,
    heads_assumed_contiguous,
)
