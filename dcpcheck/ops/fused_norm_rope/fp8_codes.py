"""fp8 e4m3 encoding and UE8M0 scales as integer arithmetic on fp32 bit patterns.

Why not always ``x.to(tl.float8e4nv)``: Triton's CPU interpreter (checked on triton 3.9)
converts fp32 to fp8 with its own bit-twiddling, which rounds ties away from zero, flushes
fp8 subnormals to zero, and drops the carry when rounding up crosses into a binade with an
odd exponent (1.99 encodes as 1.0, not 2.0: eight fp8 steps off). A few percent of random
values hit one of these, far beyond the one-step tolerance. The integer encoding below is
round-to-nearest-even with fp8 subnormals, saturating, every NaN to 0x7F: on the H200 it
writes the same byte as the GPU's ``cvt.rn.satfinite.e4m3x2.f32`` for all 2^32 fp32 bit
patterns (``tests/test_fp8_codes.py``), so the kernel's cache bytes do not depend on the
backend. Where the kernel is compiled for a GPU that has that instruction (sm_89 and
later), ``fp8_e4m3_codes`` is the instruction: the same bytes in fewer instructions (the
fp8_ds_mla cache encodes 576 values a token; at 65,536 tokens on the H200 the instruction
moved the kernel from 62% to 66-67% of HBM peak, ``benchmarks/kernel_bandwidth.py``). Elsewhere,
the interpreter included, it is the integer encoding.

The UE8M0 exponent is likewise taken from the bits (``ceil(log2(r))`` is the exponent
field, plus one when any mantissa bit is set): a floating ``log2`` is approximate on the
GPU and can round onto the integer just above a power of two, which would halve the scale
and push ``|x / scale|`` past 448.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from dcpcheck.ops.fused_norm_rope.contract import FP8_E4M3_MAX, UE8M0_AMAX_FLOOR

FP8_MAX = tl.constexpr(FP8_E4M3_MAX)
AMAX_FLOOR = tl.constexpr(UE8M0_AMAX_FLOOR)

FP32_MANTISSA_BITS = tl.constexpr(23)
FP32_EXPONENT_BIAS = tl.constexpr(127)
E4M3_MANTISSA_BITS = tl.constexpr(3)
E4M3_EXPONENT_BIAS = tl.constexpr(7)
E4M3_NAN_CODE = tl.constexpr(0x7F)

DROPPED_MANTISSA_BITS = tl.constexpr(FP32_MANTISSA_BITS.value - E4M3_MANTISSA_BITS.value)
"""fp32 -> e4m3 drops 20 mantissa bits."""

JUST_BELOW_HALF = tl.constexpr((1 << (DROPPED_MANTISSA_BITS.value - 1)) - 1)
"""0x7FFFF: added before dropping 20 bits, it rounds up from just above the halfway point;
the dropped part's odd/even bit decides the tie itself."""

REBIAS = tl.constexpr((FP32_EXPONENT_BIAS.value - E4M3_EXPONENT_BIAS.value) << 3)
"""Subtracting 120 << 3 from ``bits >> 20`` turns an fp32 exponent:mantissa into e4m3's."""

E4M3_MIN_NORMAL_BITS = tl.constexpr((FP32_EXPONENT_BIAS.value - 6) << FP32_MANTISSA_BITS.value)
"""fp32 bits of 2^-6, the smallest normal e4m3 value; below it e4m3 counts in 2^-9 steps."""

SUBNORMAL_SHIFT_BASE = tl.constexpr(FP32_MANTISSA_BITS.value - 9)
"""A value ``m * 2^(e - 23)`` (24-bit ``m``) is ``m >> (14 - e)`` steps of 2^-9."""

MAX_SUBNORMAL_SHIFT = tl.constexpr(25)
"""Shifting a 24-bit significand right by 25 or more rounds it to 0; capping the shift
keeps it inside an int32 (zero and tiny inputs would ask for up to 141)."""


@triton.jit
def fp8_e4m3_codes_by_arithmetic(x):
    """The float8_e4m3fn byte (as int32, 0..255) of fp32 ``x``: saturated to +-448 first,
    as production kernels clamp before the cast, then rounded to nearest even."""
    is_nan = x != x
    x = tl.minimum(tl.maximum(x, -FP8_MAX), FP8_MAX)
    bits = x.to(tl.int32, bitcast=True)
    sign = (bits >> 31) & 1
    magnitude = bits & 0x7FFFFFFF
    # Normal range: round the mantissa to 3 bits, nearest even; a carry out of the mantissa
    # moves into the exponent, which is exactly the next e4m3 value.
    odd = (magnitude >> DROPPED_MANTISSA_BITS) & 1
    normal = ((magnitude + JUST_BELOW_HALF + odd) >> DROPPED_MANTISSA_BITS) - REBIAS
    # Subnormal range: the value in units of 2^-9, rounded to nearest even (8 = 2^-6).
    exponent = (magnitude >> FP32_MANTISSA_BITS) - FP32_EXPONENT_BIAS
    significand = (magnitude & 0x7FFFFF) | 0x800000
    shift = tl.minimum(SUBNORMAL_SHIFT_BASE - exponent, MAX_SUBNORMAL_SHIFT)
    round_up = (1 << (shift - 1)) - 1 + ((significand >> shift) & 1)
    subnormal = (significand + round_up) >> shift
    code = tl.where(magnitude >= E4M3_MIN_NORMAL_BITS, normal, subnormal) | (sign << 7)
    return tl.where(is_nan, E4M3_NAN_CODE, code)


@triton.jit
def fp8_e4m3_codes_by_instruction(x):
    """The same bytes as :func:`fp8_e4m3_codes_by_arithmetic` (as int32), by the GPU's
    conversion (``cvt.rn.satfinite.e4m3x2.f32``, round to nearest even, saturating)."""
    return x.to(tl.float8e4nv).to(tl.uint8, bitcast=True).to(tl.int32)


def conversion_instruction_usable() -> bool:
    """Whether this module's kernels compile for a GPU with the e4m3 conversion: not under
    the interpreter (its cast is wrong, module docstring), and not on a CUDA device older
    than sm_89, where Triton has no ``float8e4nv``. Compiled with no device visible (only
    ``benchmarks/kernel_registers.py`` does that, for sm_90), it is. It asks of the
    instruction's function, not the encoding's, so that a mutation run on a GPU counts
    the encoding unreached (``dcpcheck.mutation.reach`` follows names)."""
    if not isinstance(fp8_e4m3_codes_by_instruction, JITFunction):  # the interpreter's
        return False
    return not torch.cuda.is_available() or torch.cuda.get_device_capability() >= (8, 9)


fp8_e4m3_codes = (
    fp8_e4m3_codes_by_instruction
    if conversion_instruction_usable()
    else fp8_e4m3_codes_by_arithmetic
)
"""The float8_e4m3fn byte (as int32, 0..255) of fp32 ``x``, saturating at +-448, rounded to
nearest even, NaN as 0x7F; by the instruction where it exists (module docstring)."""


@triton.jit
def power_of_two_at_or_above(ratio):
    """``2^ceil(log2(ratio))`` of positive, normal fp32 ``ratio``, exactly: the exponent
    field, plus one when any mantissa bit is set (module docstring). Shared by the indexer's
    UE8M0 scale and the fp8_ds_mla ``pow2`` tile scale, whose floors keep ``ratio`` normal."""
    bits = ratio.to(tl.int32, bitcast=True)
    exponent = bits >> FP32_MANTISSA_BITS  # ratio > 0: no sign bit
    exponent = tl.where((bits & 0x7FFFFF) != 0, exponent + 1, exponent)
    return (exponent << FP32_MANTISSA_BITS).to(tl.float32, bitcast=True)


@triton.jit
def ue8m0_scale(amax):
    """``2^ceil(log2(max(amax, 1e-4) / 448))`` in fp32, exactly (module docstring)."""
    return power_of_two_at_or_above(tl.math.div_rn(tl.maximum(amax, AMAX_FLOOR), FP8_MAX))


E4M3_SUBNORMAL_STEP = tl.constexpr(2.0**-9)
"""An e4m3 code with a zero exponent field is ``mantissa * 2^-9``."""


@triton.jit
def fp8_e4m3_values(codes):
    """The fp32 value of each float8_e4m3fn byte (int32, 0..255), exactly; the inverse of
    :func:`fp8_e4m3_codes` on finite codes. A normal code's exponent and mantissa move into
    fp32's fields (rebiased by 120), a subnormal one counts steps of 2^-9."""
    sign = (codes >> 7) & 1
    exponent = (codes >> E4M3_MANTISSA_BITS) & 0xF
    mantissa = codes & 0x7
    normal_bits = ((exponent << E4M3_MANTISSA_BITS) + REBIAS + mantissa) << DROPPED_MANTISSA_BITS
    magnitude = tl.where(exponent == 0, mantissa.to(tl.float32) * E4M3_SUBNORMAL_STEP,
                         normal_bits.to(tl.float32, bitcast=True))
    return tl.where(sign != 0, -magnitude, magnitude)


E2M1_SIGN_BIT = tl.constexpr(3)
"""Bit 3 of an e2m1 code is the sign (``reference.quant.E2M1_SIGN``)."""


@triton.jit
def e2m1_codes(x):
    """The 4-bit e2m1 (fp4) code (int32, 0..15) of fp32 ``x``, by comparisons: round to
    nearest, ties to the even code, saturating to +-6, the sign bit kept (so a small
    negative is -0, code 8), exactly as ``reference.quant.e2m1_codes`` and the GPU's
    ``cvt.rn.satfinite.e2m1x2.f32``, which this kernel does not use (the H200 lacks it).

    The magnitudes are 0, 0.5, 1, 1.5, 2, 3, 4, 6 (codes 0..7); the code is the number of
    midpoints ``|x|`` passes. A tie goes to the even code, so a midpoint above an even code
    (0.25, 1.25, 2.5, 5) is passed only strictly above it, one above an odd code (0.75,
    1.75, 3.5) already at it."""
    magnitude = tl.abs(x)
    code = ((magnitude > 0.25).to(tl.int32) + (magnitude >= 0.75).to(tl.int32)
            + (magnitude > 1.25).to(tl.int32) + (magnitude >= 1.75).to(tl.int32)
            + (magnitude > 2.5).to(tl.int32) + (magnitude >= 3.5).to(tl.int32)
            + (magnitude > 5.0).to(tl.int32))
    sign = (x.to(tl.int32, bitcast=True) >> 31) & 1
    return code | (sign << E2M1_SIGN_BIT)
