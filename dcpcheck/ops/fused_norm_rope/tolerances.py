"""How close a kernel's result must be to the oracle's, per field, and why.

Defined once here; the checks and the tests both use these. Distances are measured in
representable steps (ULPs) of the stored format rather than by rtol/atol, because the
op rounds an fp32 pipeline exactly once: a correct kernel can only land on the other
side of a rounding tie, never further.

Comparisons *between runs on one backend* (rank against rank, DCPn against DCP1, shard
reassembly) are bitwise and use no tolerance at all.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Tolerance:
    """Allowed distance of one field from the oracle, in steps of its stored format.

    ``row_relative``, where set, also accepts an element whose absolute difference is
    within that fraction of its row's largest magnitude (see ``ROTATED_OUTPUT``).
    """

    max_steps: int
    why: str
    row_relative: float = 0.0


def _ordered_int(bits: torch.Tensor, sign_bit: int) -> torch.Tensor:
    """Map IEEE sign-magnitude bit patterns to integers ordered like the values they encode,
    so that the difference of two mapped values is their distance in representable steps."""
    as_int = bits.to(torch.int64)
    magnitude = as_int & (sign_bit - 1)
    return torch.where(as_int & sign_bit != 0, -magnitude, magnitude)


_INTEGER_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def integer_view(x: torch.Tensor) -> torch.Tensor:
    """``x``'s bit patterns: ``x`` viewed as integers of its element's width (a view
    whatever its strides, since the width is the same)."""
    return x.view(_INTEGER_OF_WIDTH[x.element_size()])


def ulp_distance(actual: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """Elementwise distance in ULPs between two bf16/fp16/fp32 tensors of one dtype.

    NaN against anything (NaN included) counts as infinitely far: an unwritten, poisoned
    output must never pass.
    """
    if actual.dtype != expected.dtype:
        raise TypeError(f"dtype mismatch: {actual.dtype} vs {expected.dtype}")
    sign_bit = 1 << (8 * actual.element_size() - 1)
    a = _ordered_int(integer_view(actual), sign_bit)
    e = _ordered_int(integer_view(expected), sign_bit)
    dist = (a - e).abs()
    nan = actual.isnan() | expected.isnan()
    return torch.where(nan, torch.full_like(dist, torch.iinfo(torch.int64).max), dist)


def fp8_step_distance(actual: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """Elementwise distance in representable float8_e4m3fn steps between two uint8 byte
    tensors holding fp8 values. NaN encodings (0x7F / 0xFF) count as infinitely far."""
    a = _ordered_int(actual, 0x80)
    e = _ordered_int(expected, 0x80)
    dist = (a - e).abs()
    nan = ((actual & 0x7F) == 0x7F) | ((expected & 0x7F) == 0x7F)
    return torch.where(nan, torch.full_like(dist, torch.iinfo(torch.int64).max), dist)


def e2m1_step_distance(actual: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """Elementwise distance in representable e2m1 (fp4) steps between two uint8 byte
    tensors ``[rows, N]`` holding two e2m1 codes each (low nibble first); the result is
    ``[rows, 2N]``, one distance per value. e2m1 has no NaN; +0 and -0 are 0 steps apart."""

    def codes(packed: torch.Tensor) -> torch.Tensor:
        return torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2)

    return (_ordered_int(codes(actual), 0x8) - _ordered_int(codes(expected), 0x8)).abs()


def out_of_tolerance(
    actual: torch.Tensor, expected: torch.Tensor, tolerance: Tolerance
) -> torch.Tensor:
    """Elementwise: which values of a float tensor ``[rows, width]`` break ``tolerance``.

    NaN is always out of tolerance. Returns a bool tensor shaped like the inputs."""
    bad = ulp_distance(actual, expected) > tolerance.max_steps
    if tolerance.row_relative:
        want = expected.float()
        row_scale = want.abs().amax(dim=-1, keepdim=True)
        near = (actual.float() - want).abs() <= tolerance.row_relative * row_scale
        bad &= ~near  # NaN compares False, so it stays bad
    return bad


OUTPUT = Tolerance(
    1,
    "bf16/fp16 outputs: the fp32 pipeline is rounded once, so a kernel whose fp32 "
    "reductions run in another order can land one step across a rounding tie; and "
    "Triton's CPU interpreter truncates fp32->bf16 where the GPU rounds to nearest "
    "even (tests/vectors/README.md), which is again at most one step toward zero.",
)

FP8_VALUE = Tolerance(
    1,
    "fp8 cache values (per-tensor fp8, fp8_ds_mla NoPE, indexer): encoded from fp32, so "
    "the same one-tie argument applies; fp8's steps are coarse, so a different "
    "reduction order (or a one-ulp different ds_mla scale) moves a value by one step.",
)

DS_MLA_SCALE = Tolerance(
    8,
    "fp8_ds_mla tile scales are stored in fp32 = amax(kv_fp32) * (1/448), so they carry "
    "the fp32 error of the RMSNorm itself: a 512-term mean of squares summed in another "
    "order (~log2(512) half-ulps at worst) and a hardware rsqrt (2 ulp on NVIDIA's "
    "rsqrt.approx). The H200 golden vectors sit within 1 ulp, the CPU interpreter within "
    "3; 8 ulps (~5e-7 relative) bounds the error model. A wrong tile (row-wide amax) or "
    "a bf16-rounded input is off by 1e-3 relative or more, thousands of ulps. Under the "
    "pow2 rule (vLLM 0.31+) a scale is a power of two, equal to the oracle's unless amax "
    "sits within those few ulps of a power-of-two ratio; the other rule's scale is up to "
    "2x off, millions of ulps.",
)

NVFP4_SCALE = Tolerance(
    0,
    "nvfp4_ds_mla tile scales are stored in e4m3 = e4m3(max(amax(kv_fp32) / 6, 2^-9)), "
    "rounded to nearest: exact, except that amax carries the fp32 error of the RMSNorm (a "
    "few ulps, see DS_MLA_SCALE), which can move a ratio lying next to an e4m3 rounding "
    "midpoint across it. Only there is a scale one step off accepted "
    "(NVFP4_NEAR_MIDPOINT); the oracle's own 'div' and 'mul' rules differ only there "
    "too. A scale rounded up instead of to nearest is one step off in about half the "
    "tiles, nearly all far from a midpoint; a wrong tile or a dropped byte permutation is "
    "many steps off.",
)

NVFP4_NEAR_MIDPOINT = 2.0**-18
"""Relative distance from an e4m3 rounding midpoint within which the oracle's nvfp4 tile
ratio ``amax / 6`` lets a stored scale be one step off (``NVFP4_SCALE``): 32 fp32 ulps,
beyond the RMSNorm's few ulps and the division's half ulp. A uniformly placed ratio lies
that close to a midpoint (spaced 2^-3 apart, relatively) once in about 16,000 tiles."""

E2M1_VALUE = Tolerance(
    1,
    "nvfp4_ds_mla NoPE values are e2m1 codes of kv_fp32 / stored scale: the value's few "
    "fp32 ulps can cross an e2m1 midpoint, and a scale one e4m3 step off (NVFP4_SCALE, "
    "at most 12.5% relative) moves a quotient by less than e2m1's smallest relative "
    "spacing (4/3), so by at most one step. Counted per value, not per packed byte, so "
    "a swapped nibble order is many steps off.",
)

UE8M0_SCALE = Tolerance(
    0,
    "Indexer scales are powers of two (UE8M0): 2^ceil(log2(amax/448)). The exponent is "
    "exact arithmetic on an exact amax, so any difference is a bug.",
)

ROTATED_OUTPUT = Tolerance(
    1,
    "kpe_out and index_k_out end in a difference (RoPE's x1*cos - x2*sin; LayerNorm's "
    "centering and bias) that can cancel to nearly zero. There a few fp32 ulps of the "
    "row's magnitude - LayerNorm statistics summed in another order, or a kernel that "
    "fuses a product into an FMA - are many bf16 ulps of the tiny result (measured on an "
    "H200: up to 192 ulps on index_k_out, 32 on kpe_out with FMA). So an element also "
    "passes within 8 fp32 ulps (2^-20) of its row's largest magnitude. A wrong rotation, "
    "pairing or position moves values by O(row magnitude) and still fails.",
    row_relative=2.0**-20,
)

OUTPUT_TOLERANCES = {
    "q_out": OUTPUT,
    "kv_out": OUTPUT,
    "kpe_out": ROTATED_OUTPUT,
    "index_k_out": ROTATED_OUTPUT,
}
"""Per output field."""

BF16_ROPE_IN_CACHE = ROTATED_OUTPUT
"""fp8_ds_mla stores the RoPE part in bf16: same argument as kpe_out."""

MLA_AUTO_KV = OUTPUT
"""The `auto` cache stores kv in the activation dtype: same as kv_out."""

MLA_AUTO_KPE = ROTATED_OUTPUT
"""The `auto` cache stores kpe in the activation dtype: same as kpe_out."""
