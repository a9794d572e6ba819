"""fp8 e4m3 encoding and the two scale rules of the caches (docs/fused-norm-rope.md).

Out-of-range values: every fp8 encoding here clamps ``x`` to ``[-448, 448]`` before the
cast, i.e. it saturates. That is what production kernels do (they clamp before
converting), and it makes the oracle independent of torch's own cast, whose overflow
behaviour is a version/device detail (older torch gives NaN, torch 2.13 on the CPU
saturates). NaN inputs stay NaN. In practice saturation only matters for the per-tensor
``fp8`` layout, whose scale is chosen by the user: the golden vectors' ``fp8`` case
(scale 0.3) has no value beyond ``448 * 0.3`` and so does not exercise it, and the
ds_mla and UE8M0 scales are chosen so that ``|x / s| <= 448`` up to rounding.

fp8_ds_mla tile-scale rules
---------------------------
vLLM changed how an fp8_ds_mla cache scales its NoPE tiles between releases, and a cache
written by one rule is wrong by the other (the stored scale differs, and so does every fp8
byte of the tile), so the rule is a named choice, never a silent default. The oracle
names the rules by strings (it imports nothing from ``dcpcheck``, whose ``DsMlaScale``
enum has the same values):

* ``"amax"`` (:data:`DS_MLA_SCALE_AMAX`), vLLM up to 0.30.0 and the op document's default:
  ``max(amax * (1/448), FLT_MIN)``, the smallest scale that fits the tile.
* ``"pow2"`` (:data:`DS_MLA_SCALE_POW2`), vLLM 0.31.0 on: the power of two
  ``2^ceil(log2(max(amax * (1/448), 1e-4)))``, so decoding multiplies by an exact power
  of two; the floor is applied to the ratio (an all-zero tile gets ``2^-13``).
"""

from __future__ import annotations

import torch

FP8_E4M3_MAX = 448.0
"""Largest finite float8_e4m3fn value (S.1111.110 = 1.75 * 2^8)."""

UE8M0_AMAX_FLOOR = 1e-4
"""UE8M0 scales use max(amax, 1e-4), so an all-zero row gets a finite scale (2^-22)."""

FLT_MIN = torch.finfo(torch.float32).tiny
"""Smallest normal fp32; the floor of an fp8_ds_mla tile scale (an all-zero tile)."""

DS_MLA_SCALE_AMAX = "amax"
"""fp8_ds_mla tile scale ``max(amax * (1/448), FLT_MIN)``: vLLM up to 0.30.0, and the op document's
default where nothing names a rule."""

DS_MLA_SCALE_POW2 = "pow2"
"""fp8_ds_mla tile scale ``2^ceil(log2(max(amax * (1/448), 1e-4)))``: vLLM 0.31.0 on."""

DS_MLA_SCALE_RULES = (DS_MLA_SCALE_AMAX, DS_MLA_SCALE_POW2)
"""Every fp8_ds_mla tile-scale rule the oracle knows, by name (module docstring)."""

DS_MLA_POW2_RATIO_FLOOR = 1e-4
"""The ``pow2`` rule floors ``amax * (1/448)`` (not amax itself, unlike the indexer's UE8M0
scale) at 1e-4, so an all-zero tile gets ``2^ceil(log2(1e-4)) = 2^-13``."""

_INV_FP8_E4M3_MAX = torch.tensor(1.0 / FP8_E4M3_MAX, dtype=torch.float32)
"""1/448 rounded to fp32: ds_mla scales *multiply* amax by this constant, they do not
divide by 448; the two differ in the last fp32 bit for some amax."""


def fp8_e4m3_bytes(x: torch.Tensor) -> torch.Tensor:
    """The uint8 bytes of ``x`` encoded as float8_e4m3fn, rounded to nearest even and
    saturated to +-448 (see the module docstring). ``x`` is upcast to fp32 first."""
    saturated = x.float().clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX)
    return saturated.to(torch.float8_e4m3fn).view(torch.uint8)


def fp8_e4m3_values(encoded: torch.Tensor) -> torch.Tensor:
    """The fp32 values of uint8 bytes holding float8_e4m3fn numbers (exact)."""
    if encoded.dtype != torch.uint8:
        raise TypeError(f"expected uint8 fp8 bytes, got {encoded.dtype}")
    return encoded.view(torch.float8_e4m3fn).float()


def ue8m0_scale(amax: torch.Tensor) -> torch.Tensor:
    """The indexer's power-of-two scale ``2^ceil(log2(max(amax, 1e-4) / 448))``, fp32.

    ``max(amax, 1e-4) / 448`` is computed in fp32; its ceil-log2 is then taken exactly
    from the binary exponent (``frexp``) rather than with a floating ``log2``, because fp32
    ``log2`` of a value just above a power of two can round down onto the integer, which
    would give a scale one octave too small and push ``amax / scale`` past 448.
    """
    ratio = amax.float().clamp_min(UE8M0_AMAX_FLOOR) / FP8_E4M3_MAX
    return _power_of_two_at_or_above(ratio)


def _power_of_two_at_or_above(ratio: torch.Tensor) -> torch.Tensor:
    """``2^ceil(log2(ratio))`` of positive fp32 ``ratio``, exactly: the ceil-log2 is read
    from the binary exponent (``frexp``), never from a floating ``log2`` (see
    :func:`ue8m0_scale`). Non-finite ratios pass through unchanged."""
    mantissa, exponent = torch.frexp(ratio)  # ratio = mantissa * 2^exponent, mantissa in [0.5, 1)
    ceil_log2 = torch.where(mantissa == 0.5, exponent - 1, exponent)
    scale = torch.ldexp(torch.ones_like(ratio), ceil_log2.float())
    return torch.where(ratio.isfinite(), scale, ratio)


def check_ds_mla_scale_rule(rule: str) -> None:
    """Reject a tile-scale rule name the oracle does not know (``ValueError``)."""
    if rule not in DS_MLA_SCALE_RULES:
        raise ValueError(
            f"unknown fp8_ds_mla tile-scale rule {rule!r} (expected one of {DS_MLA_SCALE_RULES})"
        )


def ds_mla_tile_scale(amax: torch.Tensor, rule: str = DS_MLA_SCALE_AMAX) -> torch.Tensor:
    """The fp8_ds_mla scale of tiles whose largest magnitude is ``amax``, fp32, by ``rule``.

    ``"amax"``: ``max(amax * (1/448), FLT_MIN)``; the floor keeps an all-zero tile's scale
    normal and nonzero, so decoding never divides by zero. ``"pow2"``: the power of two at
    or above ``max(amax * (1/448), 1e-4)``. Both multiply by 1/448 rounded to fp32, as the
    kernels do, so a ratio that lands exactly on a power of two (amax 448 gives 1.0) keeps
    it under ``"pow2"``, and one a bit above it doubles. The default is the op document's.
    """
    check_ds_mla_scale_rule(rule)
    ratio = amax.float() * _INV_FP8_E4M3_MAX.to(amax.device)
    if rule == DS_MLA_SCALE_POW2:
        return _power_of_two_at_or_above(ratio.clamp_min(DS_MLA_POW2_RATIO_FLOOR))
    return ratio.clamp_min(FLT_MIN)


# --- nvfp4_ds_mla: e2m1 values and e4m3 tile scales ---------------------------------------

E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
"""The eight e2m1 (fp4) magnitudes, indexed by the 3-bit code ``exponent(2) | mantissa(1)``:
exponent bias 1, code 1 is the subnormal 0.5 (OCP MX spec's FP4 E2M1). Bit 3 is the sign."""

E2M1_MAX = E2M1_MAGNITUDES[-1]
"""6.0 = 1.5 * 2^2, the largest e2m1 magnitude (code 7); larger inputs saturate to it."""

E2M1_SIGN = 0x8
"""Bit 3 of an e2m1 code is the sign."""

NVFP4_SCALE_FLOOR = 2.0**-9
"""nvfp4_ds_mla floors ``amax / 6`` at 2^-9, the smallest e4m3 subnormal (2^-6 * 2^-3), so an
all-zero tile gets a nonzero stored scale (byte 0x01) and decoding never divides by zero."""

NVFP4_SCALE_DIV = "div"
"""nvfp4_ds_mla tile scale ``e4m3(max(fp32(amax / 6), 2^-9))``: docs/fused-norm-rope.md's formula,
the oracle's default (see :func:`nvfp4_tile_scale`)."""

NVFP4_SCALE_MUL = "mul"
"""nvfp4_ds_mla tile scale ``e4m3(max(fp32(amax * fp32(1/6)), 2^-9))``: how vLLM 0.33.0's
kernel computes it, read from its source."""

NVFP4_SCALE_RULES = (NVFP4_SCALE_DIV, NVFP4_SCALE_MUL)
"""Every nvfp4_ds_mla tile-scale rule the oracle knows, by name."""

_INV_E2M1_MAX = torch.tensor(1.0 / E2M1_MAX, dtype=torch.float32)
"""1/6 rounded to fp32 (about 2^-25 relative above 1/6), for the ``"mul"`` rule."""


def e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """The 4-bit e2m1 codes (``uint8`` in 0..15) of ``x``: round to nearest, ties to even,
    saturating to +-6; the sign bit is kept, so small negatives give -0 (code 8).

    Why this rounding: ``cvt.rn.satfinite.e2m1x2.f32`` (the instruction the GPU kernels use)
    rounds to nearest even and saturates finite and infinite inputs to the largest
    magnitude, and IEEE rounding keeps the sign of a result that rounds to zero. "Even"
    means mantissa bit 0, i.e. an even code: 0, 1, 2 and 4 win ties, so 0.25 -> 0,
    0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4 and 5 -> 4.

    The magnitude code is the number of rounding boundaries (midpoints between neighbouring
    magnitudes) that ``|x|`` passes; a midpoint whose lower neighbour has an even code is
    only passed strictly above it, one whose lower neighbour is odd already at it. e2m1 has
    no NaN: a NaN input (only from NaN activations, outside the contract) passes no
    boundary and encodes as a zero with its sign bit, which this oracle does not promise
    matches any kernel.
    """
    magnitude = x.float().abs()
    code = torch.zeros(x.shape, dtype=torch.uint8, device=x.device)
    for lower_code in range(len(E2M1_MAGNITUDES) - 1):
        low, high = E2M1_MAGNITUDES[lower_code], E2M1_MAGNITUDES[lower_code + 1]
        midpoint = (low + high) / 2  # exact: all magnitudes and midpoints are dyadic
        passed = magnitude > midpoint if lower_code % 2 == 0 else magnitude >= midpoint
        code += passed.to(torch.uint8)
    return code | (torch.signbit(x.float()).to(torch.uint8) * E2M1_SIGN)


def e2m1_values(codes: torch.Tensor) -> torch.Tensor:
    """The fp32 values of 4-bit e2m1 codes (``uint8`` in 0..15), exactly; code 8 is -0."""
    if codes.dtype != torch.uint8:
        raise TypeError(f"expected uint8 e2m1 codes, got {codes.dtype}")
    if codes.numel() and int(codes.max()) > 0xF:
        raise ValueError("e2m1 codes are 4 bits (0..15)")
    table = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32, device=codes.device)
    magnitude = table[(codes & 0x7).long()]
    return torch.where((codes & E2M1_SIGN) != 0, -magnitude, magnitude)


def check_nvfp4_scale_rule(rule: str) -> None:
    """Reject an nvfp4_ds_mla tile-scale rule name the oracle does not know (``ValueError``)."""
    if rule not in NVFP4_SCALE_RULES:
        raise ValueError(
            f"unknown nvfp4_ds_mla tile-scale rule {rule!r} (expected one of {NVFP4_SCALE_RULES})"
        )


def nvfp4_tile_scale(amax: torch.Tensor, rule: str = NVFP4_SCALE_DIV) -> torch.Tensor:
    """The nvfp4_ds_mla scale of 16-value tiles whose largest magnitude is ``amax``, as
    stored: ``e4m3(max(amax / 6, 2^-9))``, rounded to nearest even and saturated to 448
    like every fp8 encoding here, returned as its exact fp32 value (the tile's values are
    divided by this, the scale as stored, not by the unrounded ratio).

    ``rule`` says how ``amax / 6`` is formed in fp32: ``"div"`` (default) divides, as
    docs/fused-norm-rope.md writes it; ``"mul"`` multiplies by fp32(1/6), as vLLM 0.33.0 does. The
    two fp32 ratios differ by at most one ulp, and the stored scales only where that ulp
    straddles an e4m3 rounding midpoint: amax = 7.125 - 2^-21 gives 1.125 by ``"div"``
    and 1.25 by ``"mul"`` (the product rounds onto the midpoint 1.1875, a tie that goes to
    the even 1.25). docs/fused-norm-rope.md is the contract, so it is the default; ``"mul"`` exists
    so that vLLM's kernel can be judged without a false alarm on such tiles.
    """
    check_nvfp4_scale_rule(rule)
    amax32 = amax.float()
    if rule == NVFP4_SCALE_MUL:
        ratio = amax32 * _INV_E2M1_MAX.to(amax32.device)
    else:
        ratio = amax32 / E2M1_MAX
    return fp8_e4m3_values(fp8_e4m3_bytes(ratio.clamp_min(NVFP4_SCALE_FLOOR)))


# --- MX-packed indexer scales: UE8M0 exponent bytes ----------------------------------------

UE8M0_BIAS = 127
"""A UE8M0 byte ``e`` stands for ``2^(e - 127)``: fp32's exponent bias, so the byte of a
normal fp32 power of two is its biased exponent field (bits 23..30)."""

UE8M0_NAN = 0xFF
"""The UE8M0 byte reserved for NaN (OCP MX spec); non-finite scales encode to it."""


def ue8m0_exponent_bytes(scales: torch.Tensor) -> torch.Tensor:
    """The UE8M0 byte (``uint8``) of each fp32 power-of-two scale: its biased exponent.

    The indexer's scales are exact, normal powers of two (:func:`ue8m0_scale`, at least
    2^-22), so the byte loses nothing. Anything else (zero, negative, subnormal, or with
    mantissa bits set) has no exact UE8M0 byte and is refused rather than truncated;
    non-finite scales (from non-finite keys, outside the contract) become the NaN byte.
    """
    bits = scales.float().contiguous().view(torch.int32)
    exponent = (bits >> 23) & 0xFF
    mantissa = bits & 0x7FFFFF
    finite = exponent != UE8M0_NAN
    exact = (bits >= 0) & (mantissa == 0) & (exponent >= 1)
    if bool((finite & ~exact).any()):
        bad = scales.float()[finite & ~exact][0].item()
        raise ValueError(f"scale {bad!r} is not a normal positive power of two (no UE8M0 byte)")
    return torch.where(finite, exponent, UE8M0_NAN).to(torch.uint8)


def ue8m0_exponent_values(exponent_bytes: torch.Tensor) -> torch.Tensor:
    """The fp32 power of two ``2^(e - 127)`` of each UE8M0 byte; NaN for byte 0xFF.

    Byte 0 stands for 2^-127, a subnormal fp32 (exact)."""
    if exponent_bytes.dtype != torch.uint8:
        raise TypeError(f"expected uint8 UE8M0 bytes, got {exponent_bytes.dtype}")
    exponent = exponent_bytes.float() - UE8M0_BIAS
    value = torch.ldexp(torch.ones_like(exponent), exponent)
    return torch.where(exponent_bytes == UE8M0_NAN, torch.nan, value)
