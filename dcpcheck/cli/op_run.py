"""``dcpcheck run --op OP`` and ``dcpcheck repro`` of a scenario file of an op package
(``dcpcheck.ops``: every op but the fused one): the op's cases through the console, the
reports, the saved failures and the exit codes every run shares. The op is reached only
through its ``OpPackage``, so this module serves every op package alike.

The options it takes are those its registry record declares (``op_registry.Op``; for an
op package by default the named-scenario options of ``run``, the property search's
``--property-only``, ``--examples`` and ``--seed`` (the op's own search), and
``--launcher torchrun`` and ``--rank-timeout``, which an op with a real-rank mode takes:
each scenario's cases at the one DCP size given run with a process per rank
(``OpPackage.run_on_real_ranks``). The others (profiles, token streams, the oracle switch,
isolation, the sanitizer, the fused op's encodings) belong to the fused op's harness and
are refused with one line naming each as typed.

A run that breaks off (a device fault, or an error of dcpcheck's own) keeps what it judged:
the reports hold those cases and the record of what broke it off, marked partial, as the
fused op's runs do (``workflows.session``), and the command says so in one line (an
internal error's traceback first), exit 1.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from dcpcheck.cases.scenario_files import ScenarioError
from dcpcheck.cases.verdicts import CaseResult, RunConfig
from dcpcheck.cli import options, preflight
from dcpcheck.cli.common import (
    InputError,
    Interrupted,
    KernelFailed,
    KernelLoadFailure,
    broken_off,
    device_for_checks,
    kept_reports,
    kernel_errors,
    open_backend,
    parse_dcp_sizes,
    refuse_options,
    require_judged,
    stop_reason,
    warn,
)
from dcpcheck.exit_codes import EXIT_FAIL, EXIT_OK
from dcpcheck.ops import OpPackage, package
from dcpcheck.output.console import err, out, print_results
from dcpcheck.output.report import ReportNotWritten, write_reports
from dcpcheck.workflows.session import broken_off_by, kernel_load_record

SEARCH_EXAMPLES = 100
"""Examples of the op's property search when ``--property-only`` names no count."""


def refuse_other_options(ctx: click.Context, op: str, allowed: set[str]) -> None:
    """Exit 2 naming every option given on the command line that ``op`` does not take."""
    refuse_options(ctx, allowed, f"--op {op} does not take")


def _kernel(op: OpPackage, name: str) -> tuple[Any, tuple]:
    """The kernel ``name`` names, and the files its code comes from (for the reports)."""
    with kernel_errors():
        return op.kernel(name), op.judged_files(name)


def _warn_unsaved(home: Path, exc: OSError) -> None:
    warn(f"cannot save failing cases under {home}: {exc.strerror} (see --home)")


@dataclass(frozen=True)
class Search:
    """The property search a run asked for: examples, Hypothesis's seed."""

    examples: int
    seed: int | None


def _search(op: OpPackage, kernel, kernel_name, search, dcp_sizes, device, home: Path | None):
    """The op's property search; the shrunk failure's case (saved, then replayed from its
    file, so the report names the file) or None; one line on the console either way."""
    outcome = op.search(kernel, kernel_name, search.examples, device, dcp_sizes, search.seed)
    if outcome.passed:
        judged = outcome.examples_run - outcome.not_applicable
        unasked = f", {outcome.not_applicable} not applicable" if outcome.not_applicable else ""
        out.print(f"property: pass ({judged} examples judged{unasked})")
        return None
    path = None
    if home is not None:
        try:
            path = op.save_search(outcome, kernel_name, home)
        except OSError as exc:
            _warn_unsaved(home, exc)
    shrunk = outcome.failure if path is None else op.load_scenario(path)
    [result] = op.run_scenario(kernel, kernel_name, shrunk, shrunk.dcp_sizes, device)
    out.print(
        f"property: FAIL at example {outcome.first_failure}, shrunk to "
        f"{shrunk.batch.summary}, DCP {shrunk.dcp_sizes[0]}"
        + (f"\n  saved: {path}" if path is not None else ""),
        soft_wrap=True,
    )
    return result


@dataclass(frozen=True)
class RealRanks:
    """A run with a process per rank: the one DCP size, how long a collective waits (None:
    the op's own limit)."""

    size: int
    timeout_s: float | None

    def run(self, op: OpPackage, kernel_name: str, scenarios: list) -> list[list[CaseResult]]:
        """Each of ``scenarios``' case at ``size``, all on one set of rank processes (one
        start of torch and Triton per rank); a rank that dies or hangs makes every case a
        crash naming the ranks."""
        jobs = [(kernel_name, scenario.source) for scenario in scenarios]
        try:
            results = op.run_on_real_ranks(self.size, jobs, self.timeout_s)
        except RuntimeError as exc:  # the op's RealRanksError: one line naming the ranks
            return [[CaseResult(s.name, self.size, "crash", error=str(exc))] for s in scenarios]
        return [[result] for result in results]


def _real_ranks(op: OpPackage, params: dict, dcp_sizes, search: Search | None) -> RealRanks | None:
    """What ``--launcher torchrun`` asks of ``op`` (module docstring), or None without it."""
    if params["launcher"] != "torchrun":
        if params["rank_timeout"] is not None:
            raise InputError("--rank-timeout needs --launcher torchrun")
        return None
    if not op.has_real_ranks:
        raise InputError(f"--launcher torchrun: the {op.name} op has no real-rank mode")
    if search is not None:
        raise InputError("--launcher torchrun runs named scenarios; the property search does not")
    sizes = [n for n in dcp_sizes or () if n != 1]
    if len(sizes) != 1 or len(dcp_sizes) != 1:
        raise InputError("--launcher torchrun: --dcp must name one size N > 1")
    return RealRanks(sizes[0], params["rank_timeout"])


@dataclass
class OpCases:
    """What an op package's cases left: their results (scenario names prefixed with the
    op's when they join another op's in one report), where failures were saved, the files
    its kernels come from, and the stop that cut it short (None if none)."""

    results: list[CaseResult]
    saved: dict[tuple[str, int], Path]
    kernel_files: tuple
    stopped: KeyboardInterrupt | None = None
    broken_off: CaseResult | None = None  # dcpcheck's own error or a device fault, as a record
    internal_traceback: str = ""  # an internal error's whole traceback: for the bug report

    @property
    def reported(self) -> list[CaseResult]:
        """Every case the reports hold: the results, then the record of what broke them
        off."""
        return [*self.results, *([self.broken_off] if self.broken_off is not None else [])]

    @property
    def partial(self) -> bool:
        return self.stopped is not None or self.broken_off is not None


def judge_cases(
    op: OpPackage,
    scenarios: list,
    kernel_name: str,
    dcp_sizes: tuple[int, ...] | None,
    device,
    home: Path | None,
    fail_fast: bool,
    search: Search | None = None,
    prefixed: bool = False,
    real_ranks: RealRanks | None = None,
) -> OpCases:
    """``scenarios`` of ``op`` on ``kernel_name`` (on ``real_ranks`` when given), then its
    property search if asked; failures saved under ``home``. A Ctrl-C or SIGTERM keeps
    what ran (``stopped``); so does a device fault or an error of dcpcheck's own, with its
    record (``broken_off``, as ``session.run_session`` keeps the fused op's)."""
    kernel, kernel_files = _kernel(op, kernel_name)
    cases = OpCases([], {}, kernel_files)
    try:
        on_ranks = real_ranks.run(op, kernel_name, scenarios) if real_ranks else None
        for index, scenario in enumerate(scenarios):
            sizes = dcp_sizes or scenario.dcp_sizes
            if on_ranks is None:
                ran = op.run_scenario(kernel, kernel_name, scenario, sizes, device)
            else:
                ran = on_ranks[index]
            for result in ran:
                if prefixed:
                    result = dataclasses.replace(result, scenario=f"{op.name}/{result.scenario}")
                cases.results.append(result)
                if result.failed and home is not None:
                    try:
                        path = op.save_failed_case(scenario, result, kernel_name, home)
                        cases.saved[(result.scenario, result.dcp_size)] = path
                    except OSError as exc:  # as the fused op's runs: one warning, no more
                        _warn_unsaved(home, exc)
                        home = None
            if fail_fast and any(r.failed for r in cases.results):
                return cases
        if search is not None:
            shrunk = _search(op, kernel, kernel_name, search, dcp_sizes, device, home)
            if shrunk is not None:
                cases.results.append(shrunk)
    except KeyboardInterrupt as stop:  # Ctrl-C or SIGTERM: keep what ran
        cases.stopped = stop
    except (click.ClickException, KernelLoadFailure, KernelFailed):
        raise  # said in one line by the command, reported as such where it applies
    except Exception as exc:  # a device fault or dcpcheck's own bug: kept, never lost
        cases.broken_off, cases.internal_traceback = broken_off_by(exc)
    return cases


def run_cases(
    op: OpPackage,
    scenarios: list,
    kernel_name: str,
    dcp_sizes: tuple[int, ...] | None,
    device: str,
    paths: tuple[Path | None, Path | None],
    home: Path | None,
    fail_fast: bool,
    search: Search | None = None,
    real_ranks: RealRanks | None = None,
) -> int:
    """Run ``op``'s cases of ``scenarios``, then its property search if asked, then report
    them; the exit code. A kernel that never loads (exit 125), or whose import ends the
    process importing it (exit 1), is reported too: its record
    (``session.kernel_load_record``) in place of the cases, none judged."""
    backend = open_backend(device)
    with kernel_errors():
        kernel_name = op.canonical(kernel_name)
    if real_ranks is not None:
        err.print(f"[bold]ranks:[/] {real_ranks.size} processes, one per rank (torch.distributed)")
    config = RunConfig(kernel_name, dcp_sizes)

    def report(results: list[CaseResult], partial: bool, kernel_files: tuple = ()) -> None:
        try:
            write_reports(
                results, config, backend, *paths, partial=partial, kernel_files=kernel_files,
                op=op.name,
            )  # fmt: skip
        except ReportNotWritten as exc:
            raise InputError(str(exc)) from None

    try:
        cases = judge_cases(
            op, scenarios, kernel_name, dcp_sizes, backend.device, home, fail_fast, search,
            real_ranks=real_ranks,
        )  # fmt: skip
    except (KernelLoadFailure, KernelFailed) as unloaded:
        report([kernel_load_record(unloaded.status, unloaded.message)], True)
        unloaded.message += f"; no case was judged{kept_reports(*paths)}"
        raise
    report(cases.reported, cases.partial, cases.kernel_files)
    if cases.results:
        print_results(cases.results, cases.saved)
    if cases.stopped is not None:
        how, code = stop_reason(cases.stopped)
        raise Interrupted(f"{how} after {len(cases.results)} case(s)", code)
    if cases.broken_off is not None:
        raise broken_off(cases.broken_off, cases.internal_traceback, *paths)
    if any(r.failed for r in cases.results):
        return EXIT_FAIL
    if search is None:  # a property search judged what it drew
        require_judged(cases.results)
    return EXIT_OK


def run_op(ctx: click.Context) -> int:
    """``dcpcheck run --op OP`` of an op package (module docstring)."""
    params = ctx.params
    op = package(params["op"])
    options.refuse_untaken(ctx, op.name, "run", f"--op {op.name} does not take")
    dcp_sizes = parse_dcp_sizes(params["dcp_text"]) if params["dcp_text"] else None
    if params["property_only"] and params["patterns"]:
        raise InputError("--scenario and --property-only exclude each other")
    search = None
    if params["property_only"] or params["examples"] is not None:
        search = Search(params["examples"] or SEARCH_EXAMPLES, params["seed"])
    elif params["seed"] is not None:
        raise InputError(
            f"--seed: with --op {op.name} it seeds the property search; give "
            "--property-only or --examples N"
        )
    root = op.scenarios if params["scenario_dir"] is None else Path(params["scenario_dir"])
    try:
        scenarios = [] if params["property_only"] else (
            op.load_scenarios(list(params["patterns"]), root)
        )  # fmt: skip
    except ScenarioError as exc:
        raise InputError(str(exc)) from None
    real_ranks = _real_ranks(op, params, dcp_sizes, search)
    paths = (params["json_path"], params["junit_path"])
    preflight.check_report_paths(*paths)
    inputs = preflight.run_inputs([params["kernel_name"]], [s.source for s in scenarios])
    reports = [("--json", params["json_path"]), ("--junit", params["junit_path"])]
    preflight.check_reports_spare_inputs(reports, inputs)
    preflight.check_cost(op, scenarios, dcp_sizes, device_for_checks(params["device"]))
    home = params["home"]
    if ctx.get_parameter_source("home") is not click.core.ParameterSource.DEFAULT:
        preflight.check_home(home)
    return run_cases(
        op, scenarios, params["kernel_name"], dcp_sizes, params["device"], paths, home,
        params["fail_fast"], search, real_ranks,
    )  # fmt: skip


def repro_op(
    op_name: str, file: Path, kernel_name: str, dcp_text: str | None, device: str, json_path
) -> int:
    """``dcpcheck repro FILE`` of a scenario file of an op package: its cases, nothing
    saved."""
    op = package(op_name)
    try:
        scenario = op.load_scenario(file)
    except ScenarioError as exc:
        raise InputError(str(exc)) from None
    preflight.check_report_paths(json_path)
    inputs = preflight.run_inputs([kernel_name], [file])
    preflight.check_reports_spare_inputs([("--json", json_path)], inputs)
    dcp_sizes = parse_dcp_sizes(dcp_text) if dcp_text else None
    preflight.check_cost(op, [scenario], dcp_sizes, device_for_checks(device))
    err.print(f"[bold]op:[/] {op.name}")
    return run_cases(op, [scenario], kernel_name, dcp_sizes, device, (json_path, None), None, False)


def gate_cases(op_name: str, dcp_sizes, backend, home: Path | None, fail_fast: bool) -> OpCases:
    """``op_name``'s part of the default run: every shipped scenario on the project's
    kernels (``default``), as ``run --op OP`` runs them, named ``OP/scenario``."""
    op = package(op_name)
    try:
        scenarios = op.load_scenarios([], op.scenarios)
    except ScenarioError as exc:
        raise InputError(str(exc)) from None
    return judge_cases(
        op, scenarios, "default", dcp_sizes, backend.device, home, fail_fast, prefixed=True
    )
