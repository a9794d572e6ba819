"""fp8 e4m3 encoding and the two scale rules of the caches (DESIGN §2).

Out-of-range values: every fp8 encoding here clamps ``x`` to ``[-448, 448]`` before the
cast, i.e. it saturates. That is what production kernels do (they clamp before
converting), and it makes the oracle independent of torch's own cast, whose overflow
behaviour is a version/device detail (older torch gives NaN, torch 2.13 on the CPU
saturates). NaN inputs stay NaN. In practice saturation only matters for the per-tensor
``fp8`` layout, whose scale is chosen by the user: the golden vectors' ``fp8`` case
(scale 0.3) has no value beyond ``448 * 0.3`` and so does not exercise it, and the
ds_mla and UE8M0 scales are chosen so that ``|x / s| <= 448`` up to rounding.
"""

from __future__ import annotations

import torch

FP8_E4M3_MAX = 448.0
"""Largest finite float8_e4m3fn value (S.1111.110 = 1.75 * 2^8)."""

UE8M0_AMAX_FLOOR = 1e-4
"""UE8M0 scales use max(amax, 1e-4), so an all-zero row gets a finite scale (2^-22)."""

FLT_MIN = torch.finfo(torch.float32).tiny
"""Smallest normal fp32; the floor of an fp8_ds_mla tile scale (an all-zero tile)."""

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
    mantissa, exponent = torch.frexp(ratio)  # ratio = mantissa * 2^exponent, mantissa in [0.5, 1)
    ceil_log2 = torch.where(mantissa == 0.5, exponent - 1, exponent)
    scale = torch.ldexp(torch.ones_like(ratio), ceil_log2.float())
    return torch.where(ratio.isfinite(), scale, ratio)


def ds_mla_tile_scale(amax: torch.Tensor) -> torch.Tensor:
    """The fp8_ds_mla tile scale ``max(amax * (1/448), FLT_MIN)``, fp32.

    The floor keeps an all-zero tile's scale normal and nonzero, so decoding never
    divides by zero.
    """
    inv_max = _INV_FP8_E4M3_MAX.to(amax.device)
    return (amax.float() * inv_max).clamp_min(FLT_MIN)
