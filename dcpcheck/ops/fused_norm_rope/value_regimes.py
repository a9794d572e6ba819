"""How a scenario's value regime (``Scenario.values``) reshapes its activations: the rows
and weights ``case.make_activations`` draws for ``zero-rows``, ``fp8-saturating`` and
``exact-ties`` (its docstring says what each regime exercises).
"""

from __future__ import annotations

import torch

ZERO_ROW_STRIDE = 2
"""``zero-rows`` regime: rows 0, 2, 4, ... of ``q_c``, ``kv_c`` and ``index_k`` are all zero, so a
one-token batch is all zeros and a longer one mixes zero rows with normal ones."""

FP8_SATURATION_GAIN = 1024.0
"""``fp8-saturating`` regime: ``kv_weight`` and ``k_pe`` are multiplied by this. A normalized
kv row has RMS ~1 before the weight, so its largest value over 512 Gaussian lanes is ~3x the
gain, and the largest of a ``k_pe`` row (64 lanes, RoPE keeps each pair's norm) is ~2x: every
row ends far beyond ``448 * s`` for a per-tensor fp8 scale ``s <= 1``, where fp8 saturates.
The worst case, ``sqrt(512) * 1.45 * 1024 ~ 34000``, stays below fp16's 65504, so the bf16 /
fp16 outputs stay finite."""

TIE_LARGE, TIE_SMALL = 12.0, 4.0
"""``exact-ties`` rows hold +-12 on 3/8 of their lanes and +-4 on the rest, half of each sign:
``mean(x) = 0`` and ``mean(x^2) = (3 * 144 + 5 * 16) / 8 = 64`` exactly in fp32 whatever the
summation order (all partial sums are integers below 2^24), for any width divisible by 16
(every preset). ``64 + eps`` rounds back to 64 (eps = 1e-6 is below half an fp32 ulp of 64), so
``rsqrt = 1/8`` and the normalized row is exactly +-1.5 and +-0.5."""

TIE_K_PE_MAX = 8
"""``exact-ties``: ``k_pe`` holds integers in [-8, 8], exact in every dtype (RoPE itself, with
its cos/sin, is not exact, so the rotated outputs carry no forced ties)."""


def zero_rows(x: torch.Tensor) -> torch.Tensor:
    x[::ZERO_ROW_STRIDE] = 0
    return x


def tie_rows(tokens: int, width: int, gen: torch.Generator) -> torch.Tensor:
    """``[tokens, width]`` rows of +-TIE_LARGE / +-TIE_SMALL, each lane order shuffled."""
    large = 3 * width // 8
    small = width - large
    pattern = torch.tensor(
        [TIE_LARGE] * (large // 2)
        + [-TIE_LARGE] * (large - large // 2)
        + [TIE_SMALL] * (small // 2)
        + [-TIE_SMALL] * (small - small // 2)
    )
    order = torch.argsort(torch.rand(tokens, width, generator=gen), dim=1)
    return pattern[order]


def tie_weight(width: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """Weights ``1 + m * 2^-F`` (``F`` fraction bits of ``dtype``, ``m`` odd, ``3m < 2^F``).

    ``1.5 * w = 3 (2^F + m) / 2^(F+1)`` lies in [1.5, 2), where the dtype's step is ``2^-F``,
    and has exactly one bit below that step, set: the exact fp32 product sits halfway between
    two representable values. Round-to-nearest-even picks the even one, truncation the lower.
    """
    step = torch.finfo(dtype).eps  # 2^-F
    largest_odd = int(1 / step - 1) // 3
    largest_odd -= 1 - largest_odd % 2
    m = torch.randint(0, (largest_odd + 1) // 2, (width,), generator=gen) * 2 + 1
    return 1.0 + m.double() * step
