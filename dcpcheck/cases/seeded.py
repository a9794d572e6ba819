"""Seeded Gaussian values drawn on the device, with the same bits on every device.

A case's activations must be identical on the CPU and on a GPU: a failure found on the
H200 is replayed on a laptop, and the two runs must feed the kernel the same numbers.
``torch.randn`` gives that only on the CPU generator, and drawing a prefill batch there
and copying it over cost more than everything the GPU then does with it (65,536 tokens
of DeepSeek-V3.2 are 150 million values). So values are computed, not drawn:

* a counter per element, offset by a key derived from ``(seed, stream)``, goes through a
  32-bit integer hash (C. Wellons' "lowbias32" constants). Integer arithmetic wraps the
  same way on every device, so the hash is bit-identical everywhere;
* the top 16 bits of the hash pick one of 65,536 equiprobable quantiles of the standard
  normal distribution, tabulated once in float64 on the CPU and rounded to fp32.

The values are a 16-bit quantization of a Gaussian, truncated at about 4.2 standard
deviations: plenty for bf16 activations (8 significant bits), and every row of a batch is
distinct (the hash is a bijection of the counter).

On a CUDA device the draw is one Triton kernel (``seeded_kernel``) doing the same int32
arithmetic; elsewhere it is torch's, which the tests compare it with word for word.
"""

from __future__ import annotations

from functools import cache

import torch

QUANTILES = 1 << 16
"""Equiprobable normal quantiles in the lookup table (16 bits of each hash)."""

HASH_MULTIPLIERS = (0x7FEB352D, 0x846CA68B - (1 << 32))
"""lowbias32's two multipliers, as int32 (the second one's bit pattern, sign and all)."""


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 on an int32 tensor: xor-shift, multiply, xor-shift, multiply, xor-shift.

    Shifts are logical (masked after torch's arithmetic shift) and products wrap modulo
    2^32, as the hash is defined on unsigned 32-bit words."""
    x = x ^ ((x >> 16) & 0xFFFF)
    x = x * HASH_MULTIPLIERS[0]
    x = x ^ ((x >> 15) & 0x1FFFF)
    x = x * HASH_MULTIPLIERS[1]
    return x ^ ((x >> 16) & 0xFFFF)


def _as_int32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def _hash32_int(x: int) -> int:
    """``_hash32`` of one unsigned 32-bit word, in Python integers: the keys are a few
    words per draw, and small tensor ops cost more than the arithmetic."""
    x ^= x >> 16
    x = (x * HASH_MULTIPLIERS[0]) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * (HASH_MULTIPLIERS[1] & 0xFFFFFFFF)) & 0xFFFFFFFF
    return x ^ (x >> 16)


def _key(seed: int, stream: int) -> int:
    """A 32-bit key for ``(seed, stream)``; seeds of any size fold in 32 bits at a time."""
    if seed < 0:
        raise ValueError(f"seeded: seeds are >= 0, got {seed}")
    words = [stream]
    while True:
        words.append(seed & 0xFFFFFFFF)
        seed >>= 32
        if not seed:
            break
    key = 0
    for word in words:
        key = _hash32_int((key ^ word) & 0xFFFFFFFF)
    return _as_int32(key)


@cache
def _quantiles(device: torch.device) -> torch.Tensor:
    probabilities = (torch.arange(QUANTILES, dtype=torch.float64) + 0.5) / QUANTILES
    return torch.special.ndtri(probabilities).to(torch.float32).to(device)


def normal(seed: int, stream: int, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """fp32 standard-normal values of ``shape`` for ``(seed, stream)``, on ``device``.

    Different streams of one seed are independent draws (one per tensor of a case)."""
    count = 1
    for size in shape:
        count *= size
    if count >= 1 << 31:
        raise ValueError(f"seeded.normal: {count} values exceed the 32-bit counter")
    return draw(_key(seed, stream), count, device).reshape(shape)


def draw(key: int, count: int, device: torch.device) -> torch.Tensor:
    """``count`` values for the int32 ``key``: value ``i`` is the quantile picked by the
    top 16 bits of ``_hash32(i + key)``. On a CUDA device one Triton kernel
    (``seeded_kernel``), elsewhere torch (:func:`draw_by_torch`): the same bits."""
    if device.type == "cuda":
        from dcpcheck.cases.seeded_kernel import normal_values

        return normal_values(key, count, _quantiles(device), HASH_MULTIPLIERS)
    return draw_by_torch(key, count, device)


def draw_by_torch(key: int, count: int, device: torch.device) -> torch.Tensor:
    """:func:`draw` in torch operations, on any device."""
    counter = torch.arange(count, dtype=torch.int32, device=device)
    bits = _hash32(counter + key)
    index = (bits >> 16) & 0xFFFF
    return _quantiles(device)[index.long()]
