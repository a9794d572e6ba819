"""``dcpcheck run --op slot-mapping`` and ``dcpcheck repro`` of a slot-mapping scenario
file: the op's cases (``dcpcheck.ops.slot_mapping.runner``) through the console, the
reports, the saved failures and the exit codes every run shares.

The options it takes are the named-scenario options of ``run`` and the property search's
``--property-only``, ``--examples`` and ``--seed`` (the op's own search,
``dcpcheck.ops.slot_mapping.search``); the others (profiles, token streams, the oracle
switch, isolation, real ranks, the sanitizer, the fused op's encodings) belong to the
fused op's harness and are refused with one line.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import click

from dcpcheck.cases.scenario import SCENARIO_DIR, ScenarioError
from dcpcheck.cases.verdicts import CaseResult, RunConfig
from dcpcheck.cli import preflight
from dcpcheck.cli.common import (
    InputError,
    Interrupted,
    kernel_errors,
    open_backend,
    parse_dcp_sizes,
    refuse_options,
    stop_reason,
    warn,
)
from dcpcheck.exit_codes import EXIT_FAIL, EXIT_OK
from dcpcheck.op_registry import SLOT_MAPPING
from dcpcheck.ops.slot_mapping import scenario as op_scenario
from dcpcheck.output.console import err, out, print_results
from dcpcheck.output.report import ReportNotWritten, write_reports

RUN_OPTIONS = {
    "op",
    "property_only",
    "examples",
    "seed",
    "dcp_text",
    "kernel_name",
    "patterns",
    "scenario_dir",
    "device",
    "json_path",
    "junit_path",
    "home",
    "fail_fast",
}
"""The ``run`` options the op's runs take (module docstring)."""

SEARCH_EXAMPLES = 100
"""Examples of the op's property search when ``--property-only`` names no count."""

REPRO_OPTIONS = {"file", "kernel_name", "dcp_text", "device", "json_path"}
"""The ``repro`` options a replay of the op's scenario file takes."""


def refuse_other_options(ctx: click.Context, allowed: set[str]) -> None:
    """Exit 2 naming every option given on the command line that the op does not take."""
    refuse_options(ctx, allowed, f"--op {SLOT_MAPPING} does not take")


def _kernel(name: str):
    """The kernel ``name`` names, and the files its code comes from (for the reports)."""
    from dcpcheck.ops.slot_mapping import kernels  # defines its Triton kernel: backend first

    with kernel_errors():
        return kernels.load(name), kernels.judged_files(name)


def canonical_kernel(name: str) -> str:
    """``name`` as the reports and replays spell it (a release's version normalised)."""
    from dcpcheck.ops.slot_mapping.kernels import canonical

    with kernel_errors():
        return canonical(name)


def _warn_unsaved(home: Path, exc: OSError) -> None:
    warn(f"cannot save failing cases under {home}: {exc.strerror} (see --home)")


@dataclass(frozen=True)
class Search:
    """The property search a run asked for: examples, Hypothesis's seed."""

    examples: int
    seed: int | None


def _search(kernel, kernel_name, search, dcp_sizes, device, home: Path | None):
    """The op's property search; the shrunk failure's case (saved, then replayed from its
    file, so the report names the file) or None; one line on the console either way."""
    from dcpcheck.ops.slot_mapping import search as op_search
    from dcpcheck.ops.slot_mapping.runner import run_scenario

    outcome = op_search.search(kernel, kernel_name, search.examples, device, dcp_sizes, search.seed)
    if outcome.passed:
        judged = outcome.examples_run - outcome.not_applicable
        unasked = f", {outcome.not_applicable} not applicable" if outcome.not_applicable else ""
        out.print(f"property: pass ({judged} examples judged{unasked})")
        return None
    path = None
    if home is not None:
        try:
            path = op_search.save_outcome(outcome, kernel_name, home)
        except OSError as exc:
            _warn_unsaved(home, exc)
    shrunk = outcome.failure if path is None else op_scenario.load_scenario(path)
    [result] = run_scenario(kernel, kernel_name, shrunk, shrunk.dcp_sizes, device)
    batch = shrunk.batch
    out.print(
        f"property: FAIL at example {outcome.first_failure}, shrunk to "
        f"{len(batch.requests)} request(s), {batch.num_rows} row(s), "
        f"{len(batch.block_sizes)} group(s), DCP {shrunk.dcp_sizes[0]}"
        + (f"\n  saved: {path}" if path is not None else ""),
        soft_wrap=True,
    )
    return result


def run_cases(
    scenarios: list,
    kernel_name: str,
    dcp_sizes: tuple[int, ...] | None,
    device: str,
    paths: tuple[Path | None, Path | None],
    home: Path | None,
    fail_fast: bool,
    search: Search | None = None,
) -> int:
    """Run the op's cases of ``scenarios``, then its property search if asked, then report
    them; the exit code."""
    from dcpcheck.ops.slot_mapping.runner import run_scenario, save_failed_case

    backend = open_backend(device)
    kernel_name = canonical_kernel(kernel_name)
    kernel, kernel_files = _kernel(kernel_name)
    results: list[CaseResult] = []
    saved: dict[tuple[str, int], Path] = {}
    stopped = None
    try:
        for scenario in scenarios:
            sizes = dcp_sizes or scenario.dcp_sizes
            for result in run_scenario(kernel, kernel_name, scenario, sizes, backend.device):
                results.append(result)
                if result.failed and home is not None:
                    try:
                        saved[(result.scenario, result.dcp_size)] = save_failed_case(
                            scenario, result, kernel_name, home
                        )
                    except OSError as exc:  # as the fused op's runs: one warning, no more
                        _warn_unsaved(home, exc)
                        home = None
            if fail_fast and any(r.failed for r in results):
                break
        if search is not None and not (fail_fast and any(r.failed for r in results)):
            shrunk = _search(kernel, kernel_name, search, dcp_sizes, backend.device, home)
            if shrunk is not None:
                results.append(shrunk)
    except KeyboardInterrupt as stop:  # Ctrl-C or SIGTERM: keep what ran
        stopped = stop
    config = RunConfig(kernel_name, dcp_sizes)
    try:
        partial = stopped is not None
        write_reports(
            results, config, backend, *paths, partial=partial, kernel_files=kernel_files,
            op=SLOT_MAPPING,
        )  # fmt: skip
    except ReportNotWritten as exc:
        raise InputError(str(exc)) from None
    if results:
        print_results(results, saved)
    if stopped is not None:
        how, code = stop_reason(stopped)
        raise Interrupted(f"{how} after {len(results)} case(s)", code)
    return EXIT_FAIL if any(r.failed for r in results) else EXIT_OK


def run_op(ctx: click.Context) -> int:
    """``dcpcheck run --op slot-mapping`` (module docstring)."""
    params = ctx.params
    refuse_other_options(ctx, RUN_OPTIONS)
    dcp_sizes = parse_dcp_sizes(params["dcp_text"]) if params["dcp_text"] else None
    if params["property_only"] and params["patterns"]:
        raise InputError("--scenario and --property-only exclude each other")
    search = None
    if params["property_only"] or params["examples"] is not None:
        search = Search(params["examples"] or SEARCH_EXAMPLES, params["seed"])
    elif params["seed"] is not None:
        raise InputError(
            f"--seed: with --op {SLOT_MAPPING} it seeds the property search; give "
            "--property-only or --examples N"
        )
    root = params["scenario_dir"]
    root = op_scenario.SCENARIOS if Path(root) == SCENARIO_DIR else Path(root)
    try:
        scenarios = (
            []
            if params["property_only"]
            else (op_scenario.load_scenarios(list(params["patterns"]), root))
        )
    except ScenarioError as exc:
        raise InputError(str(exc)) from None
    paths = (params["json_path"], params["junit_path"])
    preflight.check_report_paths(*paths)
    home = params["home"]
    if ctx.get_parameter_source("home") is not click.core.ParameterSource.DEFAULT:
        preflight.check_home(home)
    return run_cases(
        scenarios, params["kernel_name"], dcp_sizes, params["device"], paths, home,
        params["fail_fast"], search,
    )  # fmt: skip


def repro_op(file: Path, kernel_name: str, dcp_text: str | None, device: str, json_path) -> int:
    """``dcpcheck repro FILE`` of a slot-mapping scenario file: its cases, nothing saved."""
    try:
        scenario = op_scenario.load_scenario(file)
    except ScenarioError as exc:
        raise InputError(str(exc)) from None
    preflight.check_report_paths(json_path)
    dcp_sizes = parse_dcp_sizes(dcp_text) if dcp_text else None
    err.print(f"[bold]op:[/] {SLOT_MAPPING}")
    return run_cases([scenario], kernel_name, dcp_sizes, device, (json_path, None), None, False)


@dataclass(frozen=True)
class GateCases:
    """The slot-mapping op's part of the default run: its cases (scenario names prefixed
    with the op's, so one report tells the ops apart), where failures were saved, the
    files its kernels come from, and the stop that cut it short (None if none)."""

    results: list[CaseResult]
    saved: dict[tuple[str, int], Path]
    kernel_files: tuple
    stopped: KeyboardInterrupt | None = None


def gate_cases(
    dcp_sizes: tuple[int, ...] | None, backend, home: Path | None, fail_fast: bool
) -> GateCases:
    """Every shipped scenario of the op on the project's kernels (``default``), as ``run
    --op slot-mapping`` runs them; failures saved under ``home``."""
    from dcpcheck.ops.slot_mapping.runner import run_scenario, save_failed_case

    kernel, kernel_files = _kernel("default")
    results: list[CaseResult] = []
    saved: dict[tuple[str, int], Path] = {}
    try:
        for scenario in op_scenario.load_scenarios([]):
            sizes = dcp_sizes or scenario.dcp_sizes
            for result in run_scenario(kernel, "default", scenario, sizes, backend.device):
                named = dataclasses.replace(result, scenario=f"{SLOT_MAPPING}/{result.scenario}")
                results.append(named)
                if result.failed and home is not None:
                    try:
                        path = save_failed_case(scenario, result, "default", home)
                        saved[(named.scenario, named.dcp_size)] = path
                    except OSError as exc:
                        _warn_unsaved(home, exc)
                        home = None
            if fail_fast and any(r.failed for r in results):
                break
    except KeyboardInterrupt as stop:  # Ctrl-C or SIGTERM: keep what ran
        return GateCases(results, saved, kernel_files, stop)
    return GateCases(results, saved, kernel_files)
