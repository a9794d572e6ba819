"""The outputs check's Triton flag (``tolerance_kernel``) counts exactly the
elements ``tolerances.out_of_tolerance`` marks: on every kind of disagreement, every
output format, both tolerance kinds, ranks laid side by side with guard rows, and a
subset of the rows. Through the interpreter here, compiled on a GPU (the ``device``
fixture)."""

from __future__ import annotations

import pytest
import torch

from dcpcheck.ops.fused_norm_rope import tolerances
from dcpcheck.ops.fused_norm_rope.tolerance_kernel import count_out_of_tolerance

INT_VIEW = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}

NAN = {torch.bfloat16: 0x7FC0, torch.float16: 0x7E00, torch.float32: 0x7FC00000}
INF = {torch.bfloat16: 0x7F80, torch.float16: 0x7C00, torch.float32: 0x7F800000}

GUARD = 2


def _disagreements(expected: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """``expected`` with about half its elements moved: 1, 2 or 5 steps either way, sign
    flipped, a NaN, an infinity, a zero of the other sign, or many steps off but within
    a relative hair of the row's largest magnitude; and one NaN that is a single step
    from its oracle value, and one infinity a step from an oracle NaN, so only a NaN-ness
    makes them bad."""
    bits = expected.view(INT_VIEW[expected.dtype]).clone()
    kind = torch.randint(0, 14, bits.shape, generator=generator)
    nan, inf = NAN[expected.dtype], INF[expected.dtype]
    sign = -(1 << (8 * expected.element_size() - 1))
    for code, steps in ((0, 1), (1, -1), (2, 2), (3, -2), (4, 5)):
        bits = torch.where(kind == code, bits + steps, bits)
    bits = torch.where(kind == 5, bits ^ sign, bits)
    bits = torch.where(kind == 6, torch.full_like(bits, nan), bits)
    bits = torch.where(kind == 7, torch.full_like(bits, inf), bits)
    bits = torch.where(kind == 8, torch.full_like(bits, sign), bits)  # -0.0
    bits[3, 1] = inf + 1  # a NaN one step past the oracle's infinity (``_rows``)
    bits[5, 4] = inf  # and the other way round
    actual = bits.view(expected.dtype)
    scale = expected.float().abs().amax(dim=-1, keepdim=True)
    nudged = (expected.float() + scale * 2.0**-21).to(expected.dtype)  # within 2^-20
    return torch.where(kind == 9, nudged, actual)


def _rows(dtype: torch.dtype, tokens: int, width: int, generator: torch.Generator):
    """Oracle rows with cancellations (tiny elements beside large ones), zeros of both
    signs, an infinity and rows holding a NaN (one of them a step from infinity)."""
    expected = torch.randn(tokens, width, generator=generator)
    expected[:, ::7] *= 1e-6  # near zero: many ulps of them are a hair of the row
    expected[1, 3] = 0.0
    expected[2, 5] = -0.0
    expected[3, 1] = float("inf")
    expected[4, 2] = float("nan")
    expected = expected.to(dtype)
    expected.view(INT_VIEW[dtype])[5, 4] = INF[dtype] + 1
    return expected


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize(
    "tolerance", [tolerances.OUTPUT, tolerances.ROTATED_OUTPUT], ids=["ulps", "row_relative"]
)
@pytest.mark.parametrize("width", [64, 200])
def test_the_kernel_counts_what_out_of_tolerance_marks(dtype, tolerance, width, device):
    generator = torch.Generator().manual_seed(width)
    tokens, ranks = 37, 3
    expected = _rows(dtype, tokens, width, generator)
    storage = torch.full((ranks, tokens + 2 * GUARD, width), float("nan"), dtype=dtype)
    for rank in range(ranks):
        storage[rank, GUARD : GUARD + tokens] = _disagreements(expected, generator)
    picked = torch.tensor([0, 1, 2, 3, 4, 5, 9, 17, 36, 20, 33], dtype=torch.int64)

    want = sum(
        int(
            tolerances.out_of_tolerance(
                storage[rank, GUARD + picked], expected[picked], tolerance
            ).sum()
        )
        for rank in range(ranks)
    )
    got = count_out_of_tolerance(
        storage.to(device)[:, GUARD:], expected.to(device), picked, tolerance
    )
    assert 0 < want < ranks * picked.numel() * width  # some of each verdict
    assert int(got) == want


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rows_that_agree_count_nothing(dtype, device):
    """A correct kernel's rows, one step off at most: zero, so the flag stays clear."""
    generator = torch.Generator().manual_seed(1)
    expected = torch.randn(70, 1536, generator=generator).to(dtype)
    bits = expected.view(INT_VIEW[dtype])
    step = torch.randint(-1, 2, bits.shape, generator=generator).to(bits.dtype)
    actual = (bits + step).view(dtype).unsqueeze(0)
    tokens = torch.arange(70)
    got = count_out_of_tolerance(actual.to(device), expected.to(device), tokens, tolerances.OUTPUT)
    assert int(got) == 0
    actual.view(INT_VIEW[dtype])[0, 69, 1535] += 2  # the last element of the last row
    got = count_out_of_tolerance(actual.to(device), expected.to(device), tokens, tolerances.OUTPUT)
    assert int(got) == 1


def test_mismatched_formats_are_refused(device):
    rows = torch.zeros(1, 4, 8, dtype=torch.bfloat16, device=device)
    with pytest.raises(TypeError, match=r"bfloat16 against torch\.float16"):
        count_out_of_tolerance(rows, rows[0].half(), torch.arange(4), tolerances.OUTPUT)
