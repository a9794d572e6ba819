"""Determinism as a check: the same launch, run twice, must leave the same bytes.

Every other check compares a kernel's launch with something (the oracle, the DCP1 run,
the caches before the launch), and so assumes that one launch says what the kernel does.
A kernel that moves one ``q_out`` element by one ulp in one call of ten breaks that: its
DCP4 case then "differs bitwise from the DCP1 run", and its saved replay passes seven
times in ten, so the user concludes it is fixed. So the runner runs the DCP1 baseline of
every scenario twice, and a failing case and its baseline a few times more before
reporting it (``runner.CONFIRMING_RUNS``), and compares the launches here, byte for byte:
outputs with their guard rows, caches with their guard blocks. Two launches of one case
are built from the same seed (``case.build_case``), so a correct kernel leaves identical
bytes, NaNs and padding rows included; any difference is the kernel's, and the case is
reported ``nondeterministic`` with the fields and rows that moved (``runner.judge``), not
as a DCP finding.
"""

from __future__ import annotations

import torch

from dcpcheck.cases.verdicts import CheckResult, Finding
from dcpcheck.ops.fused_norm_rope.case import OUTPUT_GUARD_ROWS, Case
from dcpcheck.ops.fused_norm_rope.fused_checks import stacked
from dcpcheck.ops.fused_norm_rope.guarded_cache import GUARD_BLOCKS, GuardedCache

CHECK = "deterministic"
"""The check's name in results and reports."""


def _moved_rows(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """Indices of the rows (first dimension) whose bytes differ."""
    a = first.contiguous().view(torch.uint8).reshape(first.shape[0], -1)
    b = second.contiguous().view(torch.uint8).reshape(second.shape[0], -1)
    return torch.nonzero((a != b).any(dim=1)).flatten().cpu()


def _cache_moved(
    name: str, rank: int, label: str, first: GuardedCache, second: GuardedCache
) -> list[Finding]:
    """A cache's moved entries, located by slot (a guard block's slots are negative or past
    the cache's end)."""
    block_size = first.storage.shape[1]
    entries = first.storage.shape[0] * block_size
    moved = _moved_rows(first.storage.reshape(entries, -1), second.storage.reshape(entries, -1))
    if moved.numel() == 0:
        return []
    slot = int(moved[0]) - GUARD_BLOCKS * block_size
    return [
        Finding(
            name,
            rank,
            f"{moved.numel()} entr(y/ies) differ between two runs of {label} "
            f"(first at slot {slot})",
            count=moved.numel(),
        )
    ]


def _storages(case: Case) -> dict[str, list[torch.Tensor]]:
    """Every buffer a launch writes, guard rows and blocks included, by name, rank by rank."""
    buffers = {
        name: [r.output_guards[name].storage for r in case.ranks]
        for name in case.ranks[0].output_guards
    }
    buffers["mla_cache"] = [r.mla.storage for r in case.ranks]
    if case.ranks[0].index is not None:
        buffers["index_cache"] = [r.index.storage for r in case.ranks]
    return buffers


def _any_moved(first: Case, second: Case) -> bool:
    """Whether any byte differs between the two launches: each buffer compared over every
    rank at once (``fused_checks.stacked``), one verdict to the host."""
    again = _storages(second)
    moved = [
        (stacked(ranks).view(torch.uint8) != stacked(again[name]).view(torch.uint8)).any()
        for name, ranks in _storages(first).items()
    ]
    return bool(torch.stack(moved).any())


def launch_differences(first: Case, second: Case) -> list[Finding]:
    """Every output row and cache entry whose bytes differ between two launches of one
    case, per field and rank (rows as token indices; guard rows count)."""
    if not _any_moved(first, second):
        return []
    findings: list[Finding] = []
    for one, two in zip(first.ranks, second.ranks, strict=True):
        for name, output in one.output_guards.items():
            moved = _moved_rows(output.storage, two.output_guards[name].storage)
            if moved.numel() == 0:
                continue
            tokens = tuple(int(row) - OUTPUT_GUARD_ROWS for row in moved)
            findings.append(
                Finding(
                    name,
                    one.rank,
                    f"{len(tokens)} row(s) differ between two runs of {first.label}",
                    token=tokens[0],
                    count=len(tokens),
                    tokens=tokens,
                )
            )
        findings += _cache_moved("mla_cache", one.rank, first.label, one.mla, two.mla)
        if one.index is not None and two.index is not None:
            findings += _cache_moved("index_cache", one.rank, first.label, one.index, two.index)
    return findings


def check_deterministic(moved: list[Finding]) -> CheckResult:
    """The check: what moved between two runs of the DCP1 baseline and (when the case was
    run again because it failed) between two runs of the case itself."""
    return CheckResult(CHECK, tuple(moved))


def describe(moved: list[Finding]) -> str:
    """One line for a nondeterministic case: which fields moved, on which ranks."""
    where = ", ".join(
        dict.fromkeys(
            f"{f.field}" + (f" on rank {f.rank}" if f.rank is not None else "") for f in moved
        )
    )
    return (
        f"two runs of the same launch differ ({where}): the kernel is not deterministic, "
        "so this case's other findings may be that noise, not a DCP bug"
    )
