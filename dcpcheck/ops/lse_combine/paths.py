"""A merge's two paths judged against each other: a release that has both the all-gather
merge (``cp_lse_ag_out_rs``) and the all-to-all one (``dcp_a2a_lse_reduce``) lets its
backend pick either by a flag, so the same partials must merge to the same output
whichever runs. Each path is judged against the oracle on its own (``checks``); these
checks judge the pair, in one run of either:

* ``paths_agree``: on every row that every rank holds part of, each rank's heads of the
  two paths' outputs (and LSEs, when asked for) agree;
* ``masks_agree``: the same on the rows some rank holds none of, when the caller passes
  the lengths: each path masks an empty shard with its own code (the all-to-all fuses the
  mask into its pack kernel from 0.33.0; the all-gather masks the LSEs eagerly), and the
  two masks must leave the same rows with the same weights.

A kernel names its other path as ``counterpart`` (``vllm.VllmMerge``); one without it
(the project's merge has one path) has these checks skipped with that reason.

Tolerance: each path is within ``checks.output_tolerance`` (or ``checks.lse_tolerance``)
of the oracle, so the two are within twice it of each other. An element both paths leave
as the same non-number (NaN, or an infinity of one sign) agrees: whether that is right is
the other checks' to say.
"""

from __future__ import annotations

import torch

from dcpcheck.cases.verdicts import CheckResult, Finding
from dcpcheck.ops import op_cases
from dcpcheck.ops.lse_combine import checks
from dcpcheck.ops.lse_combine.case import CombineCase
from dcpcheck.ops.lse_combine.contract import CombineKernel, Merged

PATH_CHECKS = ("paths_agree", "masks_agree")
"""The checks of this module, in the order reports list them."""

ONE_PATH = "the kernel has one merge path"


def _pair(mine: torch.Tensor, theirs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Both as fp64 on the CPU, with the elements both leave as the same non-number set
    to 0 in both (module docstring)."""
    a = mine.detach().to("cpu", torch.float64)
    b = theirs.detach().to("cpu", torch.float64)
    same = ~torch.isfinite(a) & ((a == b) | (torch.isnan(a) & torch.isnan(b)))
    return a.masked_fill(same, 0.0), b.masked_fill(same, 0.0)


def _agreement(
    case: CombineCase,
    mine: list[Merged],
    theirs: list[Merged],
    rows: torch.Tensor,
    check: str,
) -> CheckResult:
    """``check`` over ``rows``: each rank's output and LSE of one path against the
    other's, within twice the oracle's bounds."""
    findings = []
    share = case.heads_per_rank
    for rank, (a, b) in enumerate(zip(mine, theirs, strict=True)):
        heads = slice(rank * share, (rank + 1) * share)
        pairs = [("out", a.out, b.out, 2 * checks.output_tolerance(case)[:, heads])]
        if case.batch.return_lse and a.lse is not None and b.lse is not None:
            pairs.append(("lse", a.lse, b.lse, 2 * checks.lse_tolerance(case)[:, heads]))
        for field, got, want, bound in pairs:
            if got.shape != want.shape:
                findings.append(
                    Finding(
                        field,
                        rank,
                        f"shape {tuple(got.shape)} where the other path's is {tuple(want.shape)}",
                    )
                )
                continue
            got, want = _pair(got, want)
            found = checks.compared(case, field, rank, got, want, bound, rows)
            if found is not None:
                findings.append(found)
    return CheckResult(check, tuple(findings))


def judge_paths(
    kernel: CombineKernel,
    case: CombineCase,
    merged: list[Merged],
    launch,
) -> list[CheckResult]:
    """``PATH_CHECKS`` of ``kernel`` on ``case``: its ``merged`` against its counterpart's
    merge of the same partials, run by ``launch`` (module docstring)."""
    other = getattr(kernel, "counterpart", None)
    if other is None:
        return [CheckResult(check, skipped=ONE_PATH) for check in PATH_CHECKS]
    reason = op_cases.not_applicable(other, [(case.batch, case.dcp_size)])
    if reason is not None:
        return [CheckResult(check, skipped=f"the other path: {reason}") for check in PATH_CHECKS]
    theirs = launch(op_cases.raising(other), case)
    full = _agreement(case, merged, theirs, case.real & ~case.empty_rank, "paths_agree")
    empty_rows = case.real & case.empty_rank
    if not case.batch.masked:
        masks = CheckResult("masks_agree", skipped="the caller passes no lengths to mask by")
    elif not empty_rows.any():
        masks = CheckResult("masks_agree", skipped="every rank holds part of every row")
    else:
        masks = _agreement(case, merged, theirs, empty_rows, "masks_agree")
    return [full, masks]
