"""``seeded.normal``'s draw as one Triton kernel, for CUDA devices.

Why: in torch the draw is about eighteen elementwise passes over int32 and int64 (the
counter, the hash's shifts, masks, xors and products, the table index), each a kernel
launch and a round trip through memory. A case draws eleven tensors: about 200 of the
1,500 device operations of a 4,096-token DCP4 case, and 7.9 ms of the H200's time at
65,536 tokens (``benchmarks/harness_overhead.py``). Here each value is hashed in
registers and stored once.

The arithmetic is ``seeded._hash32``'s, on int32 words that wrap the same way (Triton's
int32 products are the low 32 bits, as torch's): so the bits are the torch draw's,
which the CPU keeps (under the interpreter a kernel costs more than the torch passes).
``tests/test_seeded.py`` compares the two on every 32-bit word on the GPU, and on a
sample through the interpreter.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024


@triton.jit(do_not_specialize=["count", "key", "first_multiplier", "second_multiplier"])
def _normal_values(
    out_ptr, table_ptr, count, key, first_multiplier, second_multiplier, BLOCK: tl.constexpr
):
    """``out[i] = table[hash32(i + key) >> 16]`` for ``i < count`` (the multipliers are
    ``seeded.HASH_MULTIPLIERS``, as int32)."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = offsets.to(tl.int32) + key
    x = x ^ ((x >> 16) & 0xFFFF)
    x = x * first_multiplier
    x = x ^ ((x >> 15) & 0x1FFFF)
    x = x * second_multiplier
    x = x ^ ((x >> 16) & 0xFFFF)
    value = tl.load(table_ptr + ((x >> 16) & 0xFFFF))
    tl.store(out_ptr + offsets, value, mask=offsets < count)


def normal_values(
    key: int, count: int, table: torch.Tensor, multipliers: tuple[int, int]
) -> torch.Tensor:
    """``count`` fp32 values of ``table`` (the quantiles) for the int32 ``key``, drawn on
    ``table``'s device with the hash's two int32 ``multipliers``."""
    out = torch.empty(count, dtype=torch.float32, device=table.device)
    if count:
        grid = (triton.cdiv(count, BLOCK),)
        _normal_values[grid](out, table, count, key, *multipliers, BLOCK=BLOCK)
    return out
