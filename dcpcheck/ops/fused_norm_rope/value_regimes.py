"""How a scenario's value regime (``Scenario.values``) reshapes its activations: the rows
and weights ``case.make_activations`` draws for ``zero-rows``, ``fp8-saturating``,
``exact-ties`` and ``below-floor`` (its docstring says what each regime exercises).
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


BELOW_FLOOR_STRIDE = ZERO_ROW_STRIDE
"""``below-floor`` regime: rows 0, 2, 4, ... of ``q_c``, ``kv_c`` and ``index_k`` are tiny
(``below_floor_rows``), the rows between them normal: a one-token batch is all tiny, a longer
one mixes tiles at their scale's floor with ordinary ones."""

BELOW_FLOOR_UNIT = 2.0**-23
"""Every lane of a ``below-floor`` row is ``+-m * 2^-23`` with ``m`` in ``BELOW_FLOOR_RANGE``:
in fp16, whose subnormal step is 2^-24, that is 1 to 6 steps, so no lane rounds to zero; in
bf16 a normal number. The mean square, at most ``(3 * 2^-23)^2 ~ 1.3e-13``, is far below the
presets' ``eps = 1e-6``, so each norm scales the row by about ``1 / sqrt(eps) = 1000`` instead
of normalizing it to RMS 1: the row stays tiny after its norm.

Bounds, from the seeded draws' truncation at 4.2 sigma (weights within ``1 +- 0.42``,
indexer biases within ``+-0.42``, before the regime's gains):

* a ``kv_out`` value is at most ``3 * 2^-23 * 1000 * 1.42 ~ 5.1e-4``, so every NoPE tile,
  non-zero in every lane, has ``amax * (1/448) < 1.2e-6``, below the fp8_ds_mla ``pow2``
  floor 1e-4 and below 2^-14, where an unfloored power of two would already differ from the
  floored 2^-13; and ``amax / 6 < 8.5e-5``, below the nvfp4_ds_mla floor 2^-9 and below
  2^-10, where an unfloored e4m3 scale rounds to 0;
* an ``index_k`` value is at most ``6 * 2^-23 * 1000`` (LayerNorm centers the row) times
  the indexer weight (``BELOW_FLOOR_INDEX_WEIGHT_GAIN``), plus the bias
  (``BELOW_FLOOR_INDEX_BIAS_GAIN``), times ``sqrt(2)`` for RoPE: ``< 3.2e-5``, below the
  UE8M0 amax floor 1e-4 and below ``448 * 2^-23 ~ 5.3e-5``, where an unfloored
  ``2^ceil(log2(amax / 448))`` would already differ from the floored 2^-22.

The fp8_ds_mla ``amax`` rule's floor, FLT_MIN, is out of reach of any activation: it takes an
amax below ``448 * FLT_MIN ~ 5.3e-36``, a subnormal fp32 ratio (fp16 cannot hold such a
row at all, and a GPU may flush subnormals to zero). Under that rule these tiles keep their
own tiny scales, ``amax / 448``. The per-tensor ``fp8`` layout has no floor: its scale is an
input, not drawn from the values."""

BELOW_FLOOR_RANGE = (0.5, 3.0)
"""The magnitudes ``m`` of a ``below-floor`` row's lanes, in units of ``BELOW_FLOOR_UNIT``:
the seeded value's own magnitude, clamped into this range (its sign kept)."""

BELOW_FLOOR_INDEX_WEIGHT_GAIN = 2.0**-6
"""``below-floor``: the indexer's LayerNorm weight is multiplied by this, so a tiny row's
``index_k`` lands below ``448 * 2^-23`` (``BELOW_FLOOR_UNIT``). A normal row's largest value
is then still ~0.05, far above the UE8M0 floor 1e-4. The MLA weights are left as drawn: a
tiny row's ``kv_out`` (at most ~5.1e-4) is already 20x below the lower of the fp8_ds_mla and
nvfp4_ds_mla floors, an amax of ``6 * 2^-9 ~ 0.012``."""

BELOW_FLOOR_INDEX_BIAS_GAIN = 2.0**-16
"""``below-floor``: the indexer's LayerNorm bias is multiplied by this (at most ~6e-6), so
it neither lifts a tiny row over the floor nor vanishes from it."""


def zero_rows(x: torch.Tensor) -> torch.Tensor:
    x[::ZERO_ROW_STRIDE] = 0
    return x


def below_floor_rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` with every ``BELOW_FLOOR_STRIDE``-th row replaced by its tiny counterpart: each
    lane's sign, its magnitude clamped to ``BELOW_FLOOR_RANGE``, times ``BELOW_FLOOR_UNIT``
    (exact: a power of two), rounded once to ``x``'s dtype. Elementwise from the seeded values,
    so the same bits on every device."""
    rows = x[::BELOW_FLOOR_STRIDE].float()
    magnitude = rows.abs().clamp(*BELOW_FLOOR_RANGE) * BELOW_FLOOR_UNIT
    x[::BELOW_FLOOR_STRIDE] = torch.where(rows < 0, -magnitude, magnitude).to(x.dtype)
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
