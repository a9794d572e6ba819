"""How the checks compare values: bitwise, or within a tolerance counted in steps of the
stored format (ulps of bf16/fp16/fp32, steps of fp8 e4m3 and of e2m1), row by row.

One place for it because every check compares rows: outputs against the oracle, cache
entry parts in their own formats (``cache_entries.EntryPart``), ranks against the DCP1
run, inputs against their snapshots; the kernel's own tests use the same functions, so a
tolerance means the same thing there as in a run.
"""

from __future__ import annotations

import torch

import reference
from dcpcheck.ops.fused_norm_rope import tolerances
from dcpcheck.ops.fused_norm_rope.cache_entries import EntryPart
from dcpcheck.ops.fused_norm_rope.contract import (
    E2M1_MAX,
    NVFP4_DS_MLA_NUM_TILES,
    NVFP4_SCALE_FLOOR,
    nvfp4_scale_position,
)


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
    actual: torch.Tensor,
    expected: torch.Tensor,
    tolerance: tolerances.Tolerance,
    slack: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(bad rows, worst steps per row among the out-of-tolerance elements), on the host.

    ``actual``/``expected`` are float rows ``[K, W]``, or fp8 byte rows when the
    tolerance is counted in fp8 steps (uint8); for those, ``slack`` ``[K, W]`` adds
    per-element steps to the tolerance (``nvfp4_scale_slack``)."""
    if not actual.numel() or _all_identical(actual, expected):  # the usual verdict, cheaply
        rows = actual.shape[0]
        return torch.zeros(rows, dtype=torch.bool), torch.zeros(rows, dtype=torch.int64)
    return _by_row(*element_violations(actual, expected, tolerance, slack))


def _by_row(bad: torch.Tensor, steps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Element verdicts ``[K, W]`` as (bad rows, worst bad steps per row), on the host."""
    worst = torch.where(bad, steps, torch.zeros_like(steps)).amax(dim=1)
    return bad.any(dim=1).cpu(), worst.cpu()


def element_violations(
    actual: torch.Tensor,
    expected: torch.Tensor,
    tolerance: tolerances.Tolerance,
    slack: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out-of-tolerance elements, steps per element), on the device: the judgement of
    ``row_violations`` element by element, before any row is reduced or copied to the
    host (``fused_checks`` reduces it over every rank at once). Rows are independent, so
    rows stacked from several ranks are judged exactly as one by one."""
    if actual.dtype == torch.uint8:
        steps = tolerances.fp8_step_distance(actual, expected)
        allowed = tolerance.max_steps if slack is None else tolerance.max_steps + slack
        return steps > allowed, steps
    steps = tolerances.ulp_distance(actual, expected)
    return tolerances.out_of_tolerance(actual, expected, tolerance), steps


def nvfp4_scale_slack(kv_fp32: torch.Tensor) -> torch.Tensor:
    """Per stored scale byte of nvfp4_ds_mla entries ``[K, 32]`` (in the permuted byte
    order), 1 where the oracle's tile ratio ``max(amax / 6, 2^-9)`` of ``kv_fp32``
    ``[K, 512]`` lies within ``NVFP4_NEAR_MIDPOINT`` of an e4m3 rounding midpoint, so the
    kernel's few-ulp different amax may round the other way; 0 elsewhere."""
    tiles = kv_fp32.float().reshape(kv_fp32.shape[0], NVFP4_DS_MLA_NUM_TILES, -1)
    ratio = torch.clamp((tiles.abs().amax(dim=2) / E2M1_MAX), min=NVFP4_SCALE_FLOOR)
    code = reference.fp8_e4m3_bytes(ratio).long()
    value = reference.fp8_e4m3_values(code.to(torch.uint8))
    neighbours = [(code + d).clamp(0, 0x7E).to(torch.uint8) for d in (-1, 1)]
    near = torch.zeros_like(ratio, dtype=torch.bool)
    for other in neighbours:
        midpoint = (value + reference.fp8_e4m3_values(other)) / 2
        near |= (ratio - midpoint).abs() <= tolerances.NVFP4_NEAR_MIDPOINT * ratio
    slack = torch.zeros_like(code)
    positions = [nvfp4_scale_position(s) for s in range(NVFP4_DS_MLA_NUM_TILES)]
    slack[:, positions] = near.long()
    return slack


def _part_views(
    actual: torch.Tensor, expected: torch.Tensor, part: EntryPart
) -> tuple[torch.Tensor, torch.Tensor]:
    """The part's columns of byte rows ``[K, E]``, viewed in its stored format (e2m1
    pairs stay bytes: ``tolerances.e2m1_step_distance`` reads their nibbles)."""
    a = actual[:, part.start : part.stop].contiguous()
    e = expected[:, part.start : part.stop].contiguous()
    if part.dtype not in (torch.uint8, torch.float4_e2m1fn_x2):
        a, e = a.view(part.dtype), e.view(part.dtype)
    return a, e


def part_violations(
    actual: torch.Tensor,
    expected: torch.Tensor,
    part: EntryPart,
    slack: torch.Tensor | None = None,
):
    """``row_violations`` of one part of byte rows [K, E], viewed in the part's format
    (``slack``: per-element extra steps, fp8 parts only)."""
    a, e = _part_views(actual, expected, part)
    if part.dtype == torch.float4_e2m1fn_x2:  # e2m1 pairs: steps per value, no NaN
        if not a.numel() or torch.equal(a, e):
            rows = a.shape[0]
            return torch.zeros(rows, dtype=torch.bool), torch.zeros(rows, dtype=torch.int64)
        return _by_row(*part_element_violations(actual, expected, part))
    return row_violations(a, e, part.tolerance, slack)


def part_element_violations(
    actual: torch.Tensor,
    expected: torch.Tensor,
    part: EntryPart,
    slack: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``element_violations`` of one part of byte rows [K, E], on the device."""
    a, e = _part_views(actual, expected, part)
    if part.dtype == torch.float4_e2m1fn_x2:
        steps = tolerances.e2m1_step_distance(a, e)
        return steps > part.tolerance.max_steps, steps
    return element_violations(a, e, part.tolerance, slack)
