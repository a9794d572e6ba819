"""What dcpcheck prints: the results table, findings, search and stream summaries.

Only this module and the command line print; everything else returns structured results.
Findings and replay commands print one line each (soft wrap) so they can be grepped and
pasted.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from dcpcheck.cases.verdicts import (
    OWNERSHIP_SHAPES,
    CaseResult,
    SelftestReport,
    Status,
    format_finding,
    ownership_totals,
)
from dcpcheck.e2e.token_streams import StreamComparison
from dcpcheck.ops.session_cases import SearchAsked, SearchDone
from dcpcheck.output import report

NON_TTY_WIDTH = 160
"""Width of tables when stdout is a file or a CI log (rich would assume 80 columns and
truncate kernel and scenario names)."""

out = Console(highlight=False, width=None if sys.stdout.isatty() else NON_TTY_WIDTH)
"""Results go to stdout; findings and replay commands print one line each (soft wrap)
so they can be grepped and pasted."""
err = Console(stderr=True, highlight=False)

FINDINGS_SHOWN = 6
"""Findings printed per failing case; the JSON and JUnit reports hold every one."""

VERDICTS = {
    "pass": "[green]pass[/]",
    "fail": "[bold red]FAIL[/]",
    "error": "[red]ERROR[/]",
    "crash": "[bold red]CRASH[/]",
    "timeout": "[bold red]TIMEOUT[/]",
    "nondeterministic": "[bold magenta]NONDETERMINISTIC[/]",
    "not_applicable": "[yellow]N/A[/]",
}
"""How each ``CaseResult.status`` reads in the table and the finding lines."""


def print_results(
    results: list[CaseResult], saved: Mapping[tuple[str, int], Path] | None = None
) -> None:
    """A table of scenario x DCP size with the checks that failed, then one line per
    finding (or the error, crash or timeout) and a replay command per failing case, where
    it was saved (``saved``, by scenario and DCP size), then the summary line."""
    saved = saved or {}
    table = Table(title="dcpcheck")
    for column in ("case", "result", "checks", "s"):
        table.add_column(column, justify="right" if column == "s" else "left")
    for r in results:
        if r.status == "not_applicable":
            detail = "not applicable here: see below"
        elif r.status in report.UNCHECKED_STATUSES:
            detail = {
                "error": "kernel raised: see below",
                "crash": "worker died: see below",
                "timeout": "no result in time: see below",
            }[r.status]
        else:
            ran = [c for c in r.checks if c.skipped is None]
            failed = [c.check for c in r.failed_checks]
            detail = (
                "failed: " + ", ".join(failed)
                if failed
                else f"{len(ran)} passed, {len(r.checks) - len(ran)} not applicable"
            )
        table.add_row(
            escape(f"{r.scenario}[dcp{r.dcp_size}]"), VERDICTS[r.status], detail, f"{r.seconds:.1f}"
        )
    out.print(table)
    for r in results:
        label = escape(f"{r.scenario}[dcp{r.dcp_size}]")
        if r.status in (*report.UNCHECKED_STATUSES, "nondeterministic", "not_applicable"):
            out.print(f"{VERDICTS[r.status]} {label}: {escape(r.error or '')}", soft_wrap=True)
        findings = [(c.check, f) for c in r.failed_checks for f in c.findings]
        for check, f in findings[:FINDINGS_SHOWN]:
            line = escape(format_finding(check, f))
            out.print(f"[red]FAIL[/] {label} {line}", soft_wrap=True)
        if len(findings) > FINDINGS_SHOWN:
            out.print(f"  ... and {len(findings) - FINDINGS_SHOWN} more finding(s) (all in --json)")
        if r.failed:
            out.print(f"  replay: {escape(r.replay)}", soft_wrap=True)
        if (r.scenario, r.dcp_size) in saved:
            out.print(f"  saved: {escape(str(saved[(r.scenario, r.dcp_size)]))}", soft_wrap=True)
    s = report.summarize(results)
    colour = "red" if any(r.failed for r in results) else "green"
    if colour == "green" and s["pass"] != s["cases"]:
        colour = "yellow"  # nothing failed, some cases could not run here
    faults = "".join(
        f", {s[status]} {noun}"
        for status, noun in (
            ("crash", "crash(es)"),
            ("timeout", "timeout(s)"),
            ("nondeterministic", "nondeterministic"),
            ("not_applicable", "not applicable"),
        )
        if s[status]
    )
    out.print(
        f"[{colour}]{s['cases']} case(s): {s['pass']} passed, {s['fail']} failed, "
        f"{s['error']} error(s){faults}[/]"
    )


def print_search(result: SearchDone, config: SearchAsked) -> None:
    """One line for a passing search; for a failure, the shrunk scenario, where it was
    saved, and its replay's findings (through ``print_results``)."""
    what = f"profile {config.profile_name}, seed {config.seed_used}"
    if result.passed:
        out.print(
            f"[green]property: {result.examples_run} example(s) passed[/] "
            f"({result.scenarios_run} scenarios; {what})"
        )
        return
    # A flaky failure cannot be shrunk: it passed when Hypothesis replayed it.
    shrunk_or_not = (
        "not shrunk (it passed when replayed):" if "flaky" in result.failed_checks else "shrunk to"
    )
    verdict = (
        "NONDETERMINISTIC" if {"deterministic", "flaky"} & set(result.failed_checks) else "FAIL"
    )
    out.print(
        f"[bold red]property: {verdict}[/] ({what}): first failure at example "
        f"{result.examples_to_first_failure}, {shrunk_or_not} {result.shrunk_summary}; "
        f"failed: {', '.join(result.failed_checks)}",
        soft_wrap=True,
    )
    out.print(f"  saved: {escape(str(result.saved_path))}", soft_wrap=True)
    out.print(f"  replay: {escape(result.replay_command)}", soft_wrap=True)
    print_results(result.replay)
    if not any(r.failed for r in result.replay):
        out.print(
            "[red]the saved scenario passed when run again: the kernel is not deterministic[/]"
        )


def print_stats(
    named: list[CaseResult], named_seconds: float, searched: SearchDone | None
) -> None:
    """Throughput and the ownership shapes the run covered (``CaseResult.ownership``)."""

    def shapes(counts: dict[str, int]) -> str:
        return ", ".join(f"{counts.get(shape, 0)} {shape}" for shape in OWNERSHIP_SHAPES)

    if named:
        totals = ownership_totals(named)
        rate = len(named) / named_seconds if named_seconds > 0 else 0.0
        out.print(
            f"stats: scenarios: {len(named)} case(s) in {named_seconds:.1f} s "
            f"({rate:.2f} cases/s); rank launches: {shapes(totals)}",
            soft_wrap=True,
        )
    if searched is not None:
        out.print(
            f"stats: property: {searched.examples_run} example(s), {searched.scenarios_run} "
            f"scenarios, in {searched.seconds:.1f} s ({searched.examples_per_second:.2f} "
            f"examples/s, {searched.scenarios_per_second:.2f} scenarios/s); rank launches: "
            f"{shapes(searched.ownership)}",
            soft_wrap=True,
        )


def print_streams(comparison: StreamComparison) -> None:
    """Digests per DCP size and rank (whole stream, then per request), and the verdict."""
    c = comparison.config
    out.print(
        f"model: {c.preset}, {c.layers} layers, cache {c.cache_layout}, "
        f"{c.prompts} requests, {c.steps} steps, seed {c.seed}",
        soft_wrap=True,
    )
    table = Table(title="token streams (SHA256)")
    for column in ("DCP", "rank", "stream", "per request"):
        table.add_column(column)
    baseline = comparison.digests[0].stream
    for d in comparison.digests:
        mark = "" if d.stream == baseline else "[bold red] (differs)[/]"
        table.add_row(
            str(d.dcp_size),
            str(d.rank),
            f"{d.stream[:16]}{mark}",
            " ".join(r[:8] for r in d.requests),
        )
    out.print(table)
    if comparison.identical:
        out.print(
            f"[green]identical streams[/] (narrowest DCP1 top-2 logit margin "
            f"{comparison.min_baseline_margin:.3g}; every DCP1 margin at least "
            f"{comparison.min_baseline_clearance:.3g}x its rounding bound)"
        )
    else:
        out.print(
            f"[bold red]streams differ[/]: first divergence at "
            f"{escape(comparison.first_divergence.describe())}",
            soft_wrap=True,
        )


_STATUS_STYLES = {
    Status.CAUGHT: "[green]caught[/]",
    Status.MISSED: "[bold red]MISSED[/]",
    Status.SKIPPED: "[yellow]skipped[/]",
    Status.PASSED: "[green]passed[/]",
    Status.FAILED: "[bold red]FAILED[/]",
}


def _blank(value: object | None) -> str:
    return "" if value is None else escape(str(value))


def selftest_table(report: SelftestReport, op: str | None = None) -> Table:
    """The report as a rich table: one row per kernel, the correct kernel first, then a
    caption with the verdict. Skip and miss reasons go in the last column; ``op`` names
    the op in the title."""
    of = f" of {op}" if op is not None else ""
    table = Table(title=f"dcpcheck selftest{of} ({report.profile}, {report.backend})")
    for column in ("kernel", "result", "caught by", "case", "examples", "shrunk", "s", "note"):
        table.add_column(column, justify="right" if column in ("examples", "s") else "left")
    for row in report.rows:
        caught_by = row.check if row.field is None else f"{row.check}: {row.field}"
        shrunk = (
            ""
            if row.shrunk_requests is None
            else f"{row.shrunk_requests} req / {row.shrunk_tokens} tok"
        )
        table.add_row(
            escape(row.kernel),
            _STATUS_STYLES[row.status],
            _blank(caught_by),
            _blank(row.case),
            _blank(row.examples),
            shrunk,
            f"{row.seconds:.1f}",
            _blank(row.reason),
        )
    verdict = "[green]PASS[/]" if report.passed else "[bold red]FAIL[/]"
    table.caption = (
        f"{verdict}: {report.count(Status.CAUGHT)} of {len(report.mutants)} mutants caught, "
        f"{report.count(Status.MISSED)} missed, {report.count(Status.SKIPPED)} skipped; "
        f"correct kernel {report.default.status.value}; {report.seconds:.1f} s"
    )
    return table
