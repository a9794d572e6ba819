"""The lse-combine op's contract, each check a small function over every rank's merge of
one case that returns a ``CheckResult``:

* ``merged_out``: on every row that every rank holds part of, each rank's heads of the
  merged output are the whole context's attention (``reference.lse_combine``);
* ``empty_shards``: the same on the rows that some rank holds none of: what that rank's
  empty shard holds (``case.EMPTY_SHARDS``) changes nothing;
* ``merged_lse``: asked for it (``return_lse``), each rank returns its heads of the whole
  context's LSE, in the base the caller declared;
* ``chain`` (``chain.py``): the same merge of partials a real decode attention produced
  over each rank's paged shard is the whole context's attention;
* ``paths_agree`` and ``masks_agree`` (``paths.py``): a release's all-gather and
  all-to-all merges agree, on full rows and on rows with an empty shard.

Padding rows are not judged: nothing reads them.

Tolerances. Each element of the merged output is ``sum_r w_r * p_r`` over the ranks'
partials ``p_r`` with weights ``w_r`` that sum to 1, so no term and no partial sum is
larger than ``partial_max``, the largest ``|p_r|`` of that element. A merge rounds each
partial once to the dtype (the producer) and each corrected partial once more, then adds
``N`` of them in the dtype (a ring's ``N - 1`` roundings and the last): at most ``N + 2``
half-steps of ``eps(dtype) * partial_max``, which the bound doubles. The weights
``exp(lse_r - lse)`` come from fp32 LSEs: each carries a relative error of about
``eps(fp32) * |lse|``, and the fp32 arithmetic of the correction a few ``eps(fp32)``
more, which is ``8 * eps(fp32) * (lse_max + N)`` of ``partial_max``. So an element may be
off by ``partial_max * ((N + 2) * eps(dtype) + 8 * eps(fp32) * (lse_max + N))``, and by
the dtype's smallest normal number where that is less. A merge that carries the LSEs in a
narrower dtype than fp32 pays for it beyond this bound, which is the point: the bound is
what the dtypes of the output and of an fp32 LSE allow. The merged LSE is off by at most
``8 * eps(fp32) * (lse_max + N)``.
"""

from __future__ import annotations

import torch

from dcpcheck.cases import op_checks
from dcpcheck.cases.verdicts import CheckResult, Finding
from dcpcheck.ops.lse_combine.case import DTYPES, CombineCase
from dcpcheck.ops.lse_combine.contract import Merged

CHECKS = ("merged_out", "empty_shards", "merged_lse", "chain", "paths_agree", "masks_agree")
"""The checks of this module, in the order reports list them."""

FP32_EPS = torch.finfo(torch.float32).eps


def output_tolerance(case: CombineCase) -> torch.Tensor:
    """Each element's bound on the merged output, ``[B, H, D]`` fp64 (module docstring)."""
    info = torch.finfo(DTYPES[case.batch.dtype])
    n = case.dcp_size
    relative = (n + 2) * info.eps + 8 * FP32_EPS * (case.lse_max + n)
    return (case.partial_max * relative[:, None, None]).clamp(min=info.tiny)


def lse_tolerance(case: CombineCase) -> torch.Tensor:
    """Each element's bound on the merged LSE, ``[B, H]`` fp64 (module docstring)."""
    bound = 8 * FP32_EPS * (case.lse_max + case.dcp_size)
    return bound[:, None].expand(-1, case.batch.heads)


def _shape_finding(field: str, rank: int, got: torch.Tensor, want: tuple[int, ...]) -> Finding:
    return Finding(field, rank, f"shape {tuple(got.shape)} where {want} was expected")


def compared(
    case: CombineCase,
    field: str,
    rank: int,
    got: torch.Tensor,
    want: torch.Tensor,
    bound: torch.Tensor,
    rows: torch.Tensor,
) -> Finding | None:
    """A finding over the ``rows`` of ``got`` off ``want`` by more than ``bound`` (one per
    element; a NaN or an infinity on either side always is), or None. Its ownership says
    whether some rank holds none of the first bad row's positions."""
    got = got.detach().to("cpu", torch.float64)
    error = (got - want).abs()
    error = torch.where(~torch.isfinite(got) | ~torch.isfinite(want), torch.inf, error)
    error = error.reshape(error.shape[0], -1)
    bound = bound.reshape(bound.shape[0], -1)
    excess = error / bound
    bad_rows = (excess > 1).any(dim=1) & rows
    if not bad_rows.any():
        return None
    first = int(bad_rows.nonzero()[0])
    worst = float(excess[bad_rows].max())
    column = int(excess[first].argmax())
    value = float(got.reshape(got.shape[0], -1)[first, column])
    expected = float(want.reshape(want.shape[0], -1)[first, column])
    return Finding(
        field,
        rank,
        f"row {first}, element {column}: {value:.6g} where {expected:.6g} "
        f"(bound {float(bound[first, column]):.3g})",
        token=first,
        ownership="a rank holds none of it" if case.empty_rank[first] else "every rank holds some",
        max_error="NaN or inf" if worst == float("inf") else f"{worst:.3g}x the bound",
        count=int(bad_rows.sum()),
        tokens=tuple(int(r) for r in bad_rows.nonzero().flatten()),
    )


def outputs(
    case: CombineCase,
    merged: list[Merged],
    rows: torch.Tensor,
    check: str,
    bound: torch.Tensor | None = None,
) -> CheckResult:
    """``check`` over each rank's heads of the merged output on ``rows``: its shape, then
    its values against the oracle within ``bound`` (``output_tolerance`` by default)."""
    bound = output_tolerance(case) if bound is None else bound
    share = case.heads_per_rank
    want_shape = (case.batch.num_rows, share, case.batch.head_dim)
    findings = []
    for rank, result in enumerate(merged):
        if tuple(result.out.shape) != want_shape:
            findings.append(_shape_finding("out", rank, result.out, want_shape))
            continue
        heads = slice(rank * share, (rank + 1) * share)
        want = case.expected_out[:, heads]
        found = compared(case, "out", rank, result.out, want, bound[:, heads], rows)
        if found is not None:
            findings.append(found)
    return CheckResult(check, tuple(findings))


def merged_out(case: CombineCase, merged: list[Merged]) -> CheckResult:
    """``merged_out`` (module docstring)."""
    return outputs(case, merged, case.real & ~case.empty_rank, "merged_out")


def empty_shards(case: CombineCase, merged: list[Merged]) -> CheckResult:
    """``empty_shards`` (module docstring); skipped when no row has an empty shard."""
    rows = case.real & case.empty_rank
    if not rows.any():
        return CheckResult("empty_shards", skipped="every rank holds part of every row")
    return outputs(case, merged, rows, "empty_shards")


def merged_lse(case: CombineCase, merged: list[Merged]) -> CheckResult:
    """``merged_lse`` (module docstring); skipped when the case does not ask for it."""
    if not case.batch.return_lse:
        return CheckResult("merged_lse", skipped="the caller does not ask for the LSE")
    share = case.heads_per_rank
    want_shape = (case.batch.num_rows, share)
    findings = []
    for rank, result in enumerate(merged):
        if result.lse is None:
            findings.append(Finding("lse", rank, "no LSE returned, though return_lse was set"))
            continue
        if tuple(result.lse.shape) != want_shape:
            findings.append(_shape_finding("lse", rank, result.lse, want_shape))
            continue
        heads = slice(rank * share, (rank + 1) * share)
        bound = lse_tolerance(case)[:, heads]
        found = compared(
            case, "lse", rank, result.lse, case.expected_lse[:, heads], bound, case.real
        )
        if found is not None:
            findings.append(found)
    return CheckResult("merged_lse", tuple(findings))


def judge(case: CombineCase, merged: list[Merged]) -> list[CheckResult]:
    """The checks of the op on one case's merges of the oracle's partials, in ``CHECKS``
    order (the chain's, which launches more, is ``chain.chain``)."""
    return [merged_out(case, merged), empty_shards(case, merged), merged_lse(case, merged)]


def skipped(reason: str) -> tuple[CheckResult, ...]:
    """Every check of the op skipped with ``reason``."""
    return op_checks.skipped(CHECKS, reason)
