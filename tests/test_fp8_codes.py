"""The kernel's two fp8 e4m3 encoders (``dcpcheck.ops.fused_norm_rope.fp8_codes``) write the
same byte for every fp32 bit pattern: the integer encoding, which the interpreter runs, and
the GPU's conversion instruction, which the compiled kernel runs where the GPU has one
(sm_89+).

On a GPU the comparison is exhaustive: a kernel turns each program's indices into fp32 bit
patterns, encodes them both ways and counts the disagreements, keeping the smallest
disagreeing pattern for the message (2^32 patterns, about 2 s on the H200). The same
kernel with NaN given its sign on the integer side, as torch's cast does, must find
exactly the negative NaN patterns: the count is not vacuous.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from dcpcheck.ops.fused_norm_rope import fp8_codes
from dcpcheck.ops.fused_norm_rope.fp8_codes import (
    fp8_e4m3_codes_by_arithmetic,
    fp8_e4m3_codes_by_instruction,
)
from tests.conftest import requires_cuda

PATTERNS_PER_PROGRAM = 4096
PATTERNS_PER_LAUNCH = 1 << 30
NONE_FOUND = tl.constexpr(1 << 40)
NEGATIVE_NANS = (1 << 23) - 1
"""fp32 patterns with the sign set, every exponent bit set and a nonzero mantissa."""


@triton.jit
def _disagreements(count_ptr, first_ptr, base, NAN_KEEPS_SIGN: tl.constexpr,
                   BLOCK: tl.constexpr):
    patterns = base + tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    bits = patterns.to(tl.uint32).to(tl.int32, bitcast=True)
    x = bits.to(tl.float32, bitcast=True)
    by_arithmetic = fp8_e4m3_codes_by_arithmetic(x)
    if NAN_KEEPS_SIGN:
        by_arithmetic = tl.where(x != x, 0x7F | ((bits >> 24) & 0x80), by_arithmetic)
    differ = by_arithmetic != fp8_e4m3_codes_by_instruction(x)
    tl.atomic_add(count_ptr, tl.sum(differ.to(tl.int32)))
    tl.atomic_min(first_ptr, tl.min(tl.where(differ, patterns, NONE_FOUND)))


def disagreements(nan_keeps_sign: bool) -> tuple[int, int]:
    """(how many fp32 patterns the two encoders disagree on, the smallest of them)."""
    count = torch.zeros(1, dtype=torch.int32, device="cuda")
    first = torch.full((1,), NONE_FOUND.value, dtype=torch.int64, device="cuda")
    for base in range(0, 1 << 32, PATTERNS_PER_LAUNCH):
        _disagreements[(PATTERNS_PER_LAUNCH // PATTERNS_PER_PROGRAM,)](
            count, first, base, NAN_KEEPS_SIGN=nan_keeps_sign, BLOCK=PATTERNS_PER_PROGRAM
        )
    return int(count.item()), int(first.item())


def _needs_the_instruction():
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("this GPU has no fp8 e4m3 conversion (sm_89 and later)")


@requires_cuda
def test_instruction_and_integer_encoding_agree_on_every_fp32_pattern():
    _needs_the_instruction()
    count, first = disagreements(nan_keeps_sign=False)
    assert count == 0, f"{count} fp32 patterns encode differently, the first {first:#010x}"


@requires_cuda
def test_the_count_finds_a_nan_given_its_sign():
    _needs_the_instruction()
    assert disagreements(nan_keeps_sign=True) == (NEGATIVE_NANS, 0xFF800001)


def test_the_kernel_encodes_with_the_instruction_only_where_there_is_one(device):
    """The interpreter runs the integer encoding (its own cast is wrong,
    ``dcpcheck.interpreter.fp8``); a GPU with the instruction runs the instruction."""
    instruction = device.type == "cuda" and torch.cuda.get_device_capability() >= (8, 9)
    expected = fp8_e4m3_codes_by_instruction if instruction else fp8_e4m3_codes_by_arithmetic
    assert fp8_codes.fp8_e4m3_codes is expected
