"""The outputs check's flag as one Triton kernel: how many elements of every rank's rows
break their tolerance, read straight from the guarded output storages.

Why a kernel: ``tolerances.out_of_tolerance`` is about fifteen elementwise passes in torch
(the bits widened to int64, ordered, subtracted, NaN-masked; with ``row_relative`` the
rows again in fp32 and their maxima), each over a gathered copy of the rows and of the
oracle's rows repeated per rank. At 65,536 tokens that took 10.4 ms of the H200's time
per case for 0.3 ms of kernel under test (``benchmarks/harness_overhead.py``). Here each
element is read once, as its bits, and only a count leaves the device.

The predicate is ``out_of_tolerance``'s, element for element: the distance in steps of
the stored format between the two bit patterns (sign-magnitude mapped to ordered
integers), NaN on either side out of tolerance; with ``row_relative``, an element
within that fraction of its oracle row's largest magnitude passes, unless the row holds
a NaN (torch's ``amax`` propagates it, so no element of that row is near). ``tests/
test_tolerance_kernel.py`` holds the two equal on every kind of disagreement, through the
interpreter and on the GPU. The detailed check, which words each finding, stays in torch
(``comparison.element_violations``): it runs only when this count is not zero.

Used on CUDA tensors only (``fused_checks``): under the CPU interpreter a launch costs
milliseconds per program, more than the torch form it replaces there.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dcpcheck.ops.fused_norm_rope.tolerances import Tolerance, integer_view

_KIND = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2}
"""``FORMAT`` of the kernel for each output dtype: how a bit pattern (the kernel reads
int16 and int32 views) becomes a value and which patterns are NaN."""

BLOCK_TOKENS = 32
CHUNK = 128
"""A program judges ``BLOCK_TOKENS`` rows, ``CHUNK`` columns at a time (a 4,096-element
tile). Neither depends on the shapes, and no argument is specialized on
(``NOT_SPECIALIZED``; whether the tolerance is row-relative is a runtime branch), so a
run compiles one binary per output format, whatever the presets and fields: each binary
costs a cold run its compile (ahead, with the kernel's: ``compile_ahead``) and every run
its load."""


@triton.jit
def _values(bits, FORMAT: tl.constexpr):
    """(fp32 value, is NaN, ordered integer) of int16/int32 bit patterns."""
    if FORMAT == 2:
        wide = bits.to(tl.int64)  # the difference of two ordered int32 needs 33 bits
        magnitude = wide & 0x7FFFFFFF
        nan = magnitude > 0x7F800000
        value = bits.to(tl.float32, bitcast=True)
    else:
        wide = bits.to(tl.int32)
        magnitude = wide & 0x7FFF
        if FORMAT == 0:
            nan = magnitude > 0x7F80
            value = (wide << 16).to(tl.float32, bitcast=True)  # bf16 is fp32's top half
        else:
            nan = magnitude > 0x7C00
            value = bits.to(tl.float16, bitcast=True).to(tl.float32)
    ordered = tl.where(wide < 0, -magnitude, magnitude)
    return value, nan, ordered


NOT_SPECIALIZED = (
    "actual_ptr",
    "expected_ptr",
    "tokens_ptr",
    "count_ptr",
    "n_tokens",
    "width",
    "actual_rank_stride",
    "actual_row_stride",
    "expected_row_stride",
    "max_steps",
    "row_relative",
    "relative",
)
"""Every argument but the constexprs: Triton would otherwise compile a binary per 16-byte
alignment of each pointer and per divisibility of each integer (an output of odd width
starts its rows unaligned), while the tiles do not depend on either."""


@triton.jit(do_not_specialize=NOT_SPECIALIZED)
def _count_out_of_tolerance(
    actual_ptr,
    expected_ptr,
    tokens_ptr,
    count_ptr,
    n_tokens,
    width,
    actual_rank_stride,
    actual_row_stride,
    expected_row_stride,
    max_steps,
    row_relative,
    relative,
    FORMAT: tl.constexpr,
    BLOCK_TOKENS: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """Program (i, r): rows ``tokens[i * BLOCK_TOKENS:][:BLOCK_TOKENS]`` of rank ``r``;
    adds its count of out-of-tolerance elements to ``count_ptr`` when not zero."""
    picks = tl.program_id(0) * BLOCK_TOKENS + tl.arange(0, BLOCK_TOKENS)
    picked = picks < n_tokens
    token = tl.load(tokens_ptr + picks, mask=picked, other=0).to(tl.int64)
    actual_row = tl.program_id(1).to(tl.int64) * actual_rank_stride + token * actual_row_stride
    expected_row = token * expected_row_stride
    scale = tl.zeros((BLOCK_TOKENS,), dtype=tl.float32)
    row_has_nan = tl.zeros((BLOCK_TOKENS,), dtype=tl.int1)
    if relative:  # each oracle row's largest magnitude first, and whether it holds a NaN
        for start in range(0, width, CHUNK):
            columns = start + tl.arange(0, CHUNK)
            inside = picked[:, None] & (columns < width)[None, :]
            bits = tl.load(expected_ptr + expected_row[:, None] + columns[None, :], inside, 0)
            value, nan, _ = _values(bits, FORMAT)
            scale = tl.maximum(scale, tl.max(tl.where(inside, tl.abs(value), 0.0), axis=1))
            row_has_nan = row_has_nan | (tl.max((nan & inside).to(tl.int32), axis=1) > 0)
    found = 0
    for start in range(0, width, CHUNK):
        columns = start + tl.arange(0, CHUNK)
        inside = picked[:, None] & (columns < width)[None, :]
        a_bits = tl.load(actual_ptr + actual_row[:, None] + columns[None, :], inside, 0)
        e_bits = tl.load(expected_ptr + expected_row[:, None] + columns[None, :], inside, 0)
        a_value, a_nan, a_ordered = _values(a_bits, FORMAT)
        e_value, e_nan, e_ordered = _values(e_bits, FORMAT)
        bad = a_nan | e_nan | (tl.abs(a_ordered - e_ordered) > max_steps)
        if relative:
            near = tl.abs(a_value - e_value) <= row_relative * scale[:, None]
            bad = bad & ~(near & ~row_has_nan[:, None])
        found += tl.sum((bad & inside).to(tl.int32))
    if found > 0:
        tl.atomic_add(count_ptr, found)


def count_out_of_tolerance(
    storages: torch.Tensor, expected: torch.Tensor, tokens: torch.Tensor, tolerance: Tolerance
) -> torch.Tensor:
    """How many elements of ``storages[r, tokens[i]]`` break ``tolerance`` against
    ``expected[tokens[i]]``, over every rank ``r`` and token ``i``: an int32 count on the
    device (0-d), not copied to the host.

    ``storages`` ``[R, T, W]`` are every rank's rows (a strided view is fine as long as a
    row is contiguous), ``expected`` ``[T, W]`` the oracle's, ``tokens`` the row indices."""
    ranks, _, width = storages.shape
    if storages.dtype != expected.dtype or storages.dtype not in _KIND:
        raise TypeError(f"count_out_of_tolerance: {storages.dtype} against {expected.dtype}")
    if storages.stride(2) != 1 or expected.stride(1) != 1:
        raise ValueError("count_out_of_tolerance: rows must be contiguous")
    count = torch.zeros((), dtype=torch.int32, device=storages.device)
    tokens = tokens.to(storages.device)
    if not tokens.numel() or not ranks or not width:
        return count
    grid = (triton.cdiv(tokens.numel(), BLOCK_TOKENS), ranks)
    _count_out_of_tolerance[grid](
        integer_view(storages),
        integer_view(expected),
        tokens,
        count,
        tokens.numel(),
        width,
        storages.stride(0),
        storages.stride(1),
        expected.stride(0),
        tolerance.max_steps,
        tolerance.row_relative,
        int(bool(tolerance.row_relative)),
        FORMAT=_KIND[storages.dtype],
        BLOCK_TOKENS=BLOCK_TOKENS,
        CHUNK=CHUNK,
    )
    return count
