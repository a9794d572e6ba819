"""How the checks compare values: bitwise, or within a tolerance counted in steps of the
stored format (ulps of bf16/fp16/fp32, steps of fp8 e4m3 and of e2m1), row by row.

One place for it because every check compares rows: outputs against the oracle, cache
entry parts in their own formats (``cache_entries.EntryPart``), ranks against the DCP1
run, inputs against their snapshots; the kernel's own tests use the same functions, so a
tolerance means the same thing there as in a run.
"""

from __future__ import annotations

import torch

from dcpcheck.harness.cache_entries import EntryPart
from dcpcheck.spec import tolerances


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-row bitwise equality (NaN-safe: compares the bytes)."""
    a8 = a.contiguous().view(torch.uint8).view(a.shape[0], -1)
    b8 = b.contiguous().view(torch.uint8).view(b.shape[0], -1)
    return (a8 == b8).all(dim=1)


def _all_identical(actual: torch.Tensor, expected: torch.Tensor) -> bool:
    """Every row bitwise equal to the expected one, and no expected value a NaN (which
    the tolerances count as infinitely far even from itself)."""
    fp8 = actual.dtype == torch.uint8  # float8_e4m3fn bytes: NaN is 0x7F / 0xFF
    nan = (expected & 0x7F) == 0x7F if fp8 else expected.isnan()
    return bool((bits_equal(actual, expected) & ~nan.any(dim=1)).all())


def row_violations(
    actual: torch.Tensor, expected: torch.Tensor, tolerance: tolerances.Tolerance
) -> tuple[torch.Tensor, torch.Tensor]:
    """(bad rows, worst steps per row among the out-of-tolerance elements), on the host.

    ``actual``/``expected`` are float rows ``[K, W]``, or fp8 byte rows when the
    tolerance is counted in fp8 steps (uint8)."""
    if not actual.numel() or _all_identical(actual, expected):  # the usual verdict, cheaply
        rows = actual.shape[0]
        return torch.zeros(rows, dtype=torch.bool), torch.zeros(rows, dtype=torch.int64)
    if actual.dtype == torch.uint8:
        steps = tolerances.fp8_step_distance(actual, expected)
        bad = steps > tolerance.max_steps
    else:
        steps = tolerances.ulp_distance(actual, expected)
        bad = tolerances.out_of_tolerance(actual, expected, tolerance)
    worst = torch.where(bad, steps, torch.zeros_like(steps)).amax(dim=1)
    return bad.any(dim=1).cpu(), worst.cpu()


def part_violations(actual: torch.Tensor, expected: torch.Tensor, part: EntryPart):
    """``row_violations`` of one part of byte rows [K, E], viewed in the part's format."""
    a = actual[:, part.start : part.stop].contiguous()
    e = expected[:, part.start : part.stop].contiguous()
    if part.dtype == torch.float4_e2m1fn_x2:  # e2m1 pairs: steps per value, no NaN
        if not a.numel() or torch.equal(a, e):
            rows = a.shape[0]
            return torch.zeros(rows, dtype=torch.bool), torch.zeros(rows, dtype=torch.int64)
        steps = tolerances.e2m1_step_distance(a, e)
        bad = steps > part.tolerance.max_steps
        worst = torch.where(bad, steps, torch.zeros_like(steps)).amax(dim=1)
        return bad.any(dim=1).cpu(), worst.cpu()
    if part.dtype != torch.uint8:
        a, e = a.view(part.dtype), e.view(part.dtype)
    return row_violations(a, e, part.tolerance)
