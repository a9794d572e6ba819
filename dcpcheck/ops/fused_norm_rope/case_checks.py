"""Every contract check of one launched case (docs/dcp-contract.md), in the order results list them.

The runner judges a case with :func:`check_case`. It first asks ``fused_checks`` which
checks may fail at all - one pass over every rank, one copy to the host - and runs the
detailed form (``checks``, ``entry_checks``) of those alone; a passing case, nearly every
case, never walks its ranks one by one. The output guard rows are checked here too and
filed under the caches' ``guard_bands``: one check for every out-of-bounds write.
"""

from __future__ import annotations

from collections.abc import Callable

from dcpcheck.cases.verdicts import CheckResult, Finding
from dcpcheck.ops.fused_norm_rope import checks, entry_checks, fused_checks
from dcpcheck.ops.fused_norm_rope.case import Case


def output_guard_findings(case: Case) -> list[Finding]:
    """Writes into the guard rows around each output, and into the columns beside it
    (``case.GuardedOutput``), per rank."""
    findings = []
    for launch in case.ranks:
        for name, output in launch.output_guards.items():
            for w in output.guard_writes():
                where = {
                    "before": "before the output's start (guard rows",
                    "beside": "beside the output's columns in its rows (guard columns",
                    "after": "after the output's end (guard rows",
                }[w.side]
                findings.append(
                    Finding(
                        name,
                        launch.rank,
                        f"{w.bytes_changed} byte(s) written {where}; first at row {w.row})",
                        max_error=f"{w.bytes_changed} bytes",
                        count=w.bytes_changed,
                    )
                )
    return findings


def _with_output_guards(results: list[CheckResult], case: Case) -> list[CheckResult]:
    """``stray_write_checks``' results, its ``guard_bands`` (caches) extended by the
    output guards: one check for every out-of-bounds write, whatever buffer it hit."""
    outputs = tuple(output_guard_findings(case))
    return [
        CheckResult(r.check, r.findings + outputs) if r.check == "guard_bands" else r
        for r in results
    ]


def check_case(
    case: Case,
    baseline: Case,
    input_changes: list[Finding],
    oracle: bool = True,
    fused: bool = True,
) -> list[CheckResult]:
    """Every contract check of docs/dcp-contract.md on one launched case.

    ``oracle=False`` (``--oracle off``) judges the kernel against its own DCP1 run alone,
    for a kernel whose encoding no oracle variant knows: the checks that compare with the
    oracle are replaced by their oracle-free forms (``checks`` docstring), the
    rest are the same checks.

    ``fused`` (the default) first decides over every rank at once which checks may fail
    (``fused_checks.suspect_checks``) and runs the detailed form of only those; a check
    clear there has no finding, so its result is the detailed form's pass, built here.
    ``fused=False`` runs every detailed form (the tests compare the two).
    """
    suspect = fused_checks.suspect_checks(case, baseline, oracle) if fused else {}

    def clear(name: str) -> bool:
        return suspect.get(name) is False

    def result(
        name: str, detailed: Callable[[], CheckResult], without_oracle: str | None = None
    ) -> CheckResult:
        if clear(name):
            return CheckResult(name, without_oracle=None if oracle else without_oracle)
        return detailed()

    if clear(fused_checks.STRAY):
        strays = checks.stray_write_checks(case, writes=[])
    else:
        if oracle:
            encodings = checks.TokenEncodings.from_oracle(case)
        else:
            encodings = checks.TokenEncodings.from_dcp1_run(case, baseline)
        strays = _with_output_guards(checks.stray_write_checks(case, encodings), case)
    return [
        result(
            "outputs",
            lambda: checks.check_outputs(case) if oracle else checks.check_outputs_written(case),
            checks.OUTPUTS_WITHOUT_ORACLE,
        ),
        result("topk", lambda: checks.check_topk(case)),
        result(
            "cache_owned",
            lambda: (
                entry_checks.check_cache_owned(case)
                if oracle
                else entry_checks.check_cache_written(case)
            ),
            entry_checks.CACHE_OWNED_WITHOUT_ORACLE,
        ),
        *strays,
        checks.check_inputs_unmodified(input_changes),
        result("ranks_agree", lambda: checks.check_ranks_agree(case, baseline)),
        result("shards_reassemble", lambda: checks.check_shards_reassemble(case, baseline)),
    ]
