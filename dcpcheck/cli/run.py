"""``dcpcheck run`` and ``dcpcheck repro``: check a kernel over scenarios (and the property
search), write the reports, save failing cases; replay one saved case."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path

import click
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from dcpcheck.cases.options import PASSED_TO_RANKS
from dcpcheck.cases.scenario_files import ScenarioError, op_of
from dcpcheck.cases.verdicts import CaseResult, NamedScenario, RunConfig
from dcpcheck.cli import op_run, options, preflight
from dcpcheck.cli.common import (
    HELP,
    InputError,
    Interrupted,
    KernelFailed,
    KernelLoadFailure,
    announce_oracle,
    broken_off,
    device_for_checks,
    given_options,
    kept_reports,
    kernel_files,
    open_backend,
    parse_dcp_sizes,
    refuse_options,
    require_judged,
    stop_reason,
    typed_option,
    warn,
)
from dcpcheck.cli.kernel_process import (
    case_timeout_for,
    kernel_under_test,
)
from dcpcheck.distributed.group import DEFAULT_RANK_TIMEOUT_S
from dcpcheck.exit_codes import EXIT_FAIL, EXIT_OK
from dcpcheck.ops import runner_ops, session_op
from dcpcheck.output.console import err, out, print_results, print_search, print_stats
from dcpcheck.output.report import ReportNotWritten, write_reports
from dcpcheck.workflows.session import (
    RunOutcome,
    RunPlan,
    Session,
    kernel_load_record,
    run_session,
)


@contextlib.contextmanager
def _progress(scenarios: list[NamedScenario], config: RunConfig) -> Iterator[tuple]:
    """The callbacks of ``run_session`` as a progress display on stderr: a bar over the
    named cases, then a line for the token streams, then the search's example count
    (shrinking runs past the requested count, so no bar there)."""
    total = sum(len(config.sizes_of(s)) for s in scenarios)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=err,
        transient=True,
    ) as progress:
        cases = progress.add_task("checking", total=total, visible=total > 0)
        stage = progress.add_task("", total=None, visible=False)

        def on_result(result: CaseResult) -> None:
            label = f"{result.scenario}[dcp{result.dcp_size}]"
            progress.update(cases, advance=1, description=escape(label))

        def on_stage(name: str) -> None:
            progress.update(cases, visible=False)
            what = STAGE_LINES.get(name, name)
            progress.update(stage, description=what, visible=True)

        def on_example(count: int) -> None:
            progress.update(stage, description=f"property search: example {count}")

        yield on_result, on_stage, on_example


STAGE_LINES = {"token streams": "token streams: tiny MLA model, DCP1 vs DCPn"}


@click.command("run", epilog=HELP.split("\n\n", 1)[1])
@options.click_options("run")
@click.pass_context
def run_command(
    ctx: click.Context,
    op,
    dcp_text,
    kernel_name,
    patterns,
    scenario_dir,
    seed,
    examples,
    property_only,
    profile_name,
    stats,
    home,
    device,
    json_path,
    junit_path,
    adapter,
    no_tokens,
    report_dir,
    launcher,
    rank_timeout,
    ds_mla_scale,
    oracle,
    fail_fast,
    isolate,
    case_timeout,
    sanitize,
) -> None:
    """Run the contract checks of a kernel over scenarios x DCP sizes, then, if asked, the
    property search over drawn scenarios (a failure is shrunk and saved under HOME).

    A failing named-scenario case is saved too, as a scenario file under HOME/failures/
    (its seed and DCP size baked in) that `dcpcheck repro` replays."""
    fused = session_op()
    if op not in (None, fused.name):
        raise SystemExit(op_run.run_op(ctx))
    every_op = op is None and _is_the_gate(ctx)
    dcp_sizes = parse_dcp_sizes(dcp_text) if dcp_text is not None else None
    if launcher == "torchrun":
        raise SystemExit(_launch_ranks(ctx, dcp_sizes, rank_timeout))
    if rank_timeout is not None:
        raise InputError("--rank-timeout needs --launcher torchrun")
    if property_only and patterns:
        raise InputError("--scenario and --property-only exclude each other")
    timeout = case_timeout_for(fused.name, kernel_name, isolate, case_timeout, sanitize)
    preflight.check_report_paths(json_path, junit_path)
    if report_dir is not None:
        preflight.check_report_dir(report_dir)
    searching = property_only or examples is not None or profile_name is not None
    if searching or ctx.get_parameter_source("home") is not click.core.ParameterSource.DEFAULT:
        preflight.check_home(home)  # one given must hold failures; a search's database too
    search_config = None
    if searching:
        if sanitize is not None:
            raise InputError(
                "--sanitize runs named scenarios only: the property search would start a "
                "sanitized worker per drawn example"
            )
        asked = fused.session_cases().search_config
        search_config = options.config(asked, options.option_values(ctx, "run"))
    scenarios = [] if property_only else (
        preflight.named_scenarios(fused, patterns, scenario_dir, dcp_sizes, seed)
    )  # fmt: skip
    config = options.config(RunConfig, options.option_values(ctx, "run"))
    reports = [("--json", json_path), ("--junit", junit_path)]
    if report_dir is not None:
        from dcpcheck.output import ownership_map  # here: PIL is for --report-dir alone

        cases = [(s.name, n) for s in scenarios for n in config.sizes_of(s)]
        reports += [("--report-dir", p) for p in ownership_map.report_files(report_dir, cases)]
    inputs = preflight.run_inputs([kernel_name], [s.source for s in scenarios])
    preflight.check_reports_spare_inputs(reports, inputs)
    preflight.check_cost(fused, scenarios, config.dcp_sizes, device_for_checks(device))
    backend = open_backend(device)
    announce_oracle(oracle == "on")

    plan = RunPlan(scenarios, token_streams=not no_tokens, search=search_config)
    preflight.check_sanitizer(sanitize, backend)
    paths = (json_path, junit_path)
    loading = kernel_under_test(fused.name, kernel_name, adapter, backend, timeout, sanitize)
    with _reported_if_stopped(loading, config, backend, paths) as kernel:
        session = Session(kernel, config, backend, home, on_warning=warn)
        with _progress(scenarios, config) as (on_result, on_stage, on_example):
            try:
                if every_op and _compile_gate_binaries(backend):
                    plan = dataclasses.replace(plan, compile_ahead=False)
            except KeyboardInterrupt as stop:  # as a stop in the cases: partial reports
                outcome = RunOutcome([], stopped=stop)
            else:
                outcome = run_session(
                    session, plan, on_result=on_result, on_stage=on_stage, on_example=on_example
                )
        searched = None if outcome.searched is None else (search_config, outcome.searched)
        judged = kernel_files(fused.name, kernel_name)
        others = _other_ops(every_op, outcome, dcp_sizes, backend, home, fail_fast)
        reported, partial = [*outcome.reported], outcome.partial
        for cases in others.values():
            reported += cases.reported
            judged = (*judged, *cases.kernel_files)
            partial = partial or cases.partial
        ops = ",".join([fused.name, *others])
        _write_reports(reported, config, backend, paths, partial, searched, judged, ops)
    if scenarios:
        shown = [*outcome.results, *(r for cases in others.values() for r in cases.results)]
        saved = dict(session.saved)
        for cases in others.values():
            saved.update(cases.saved)
        print_results(shown, saved)
    for op_name, cases in others.items():
        if cases.stopped is not None:
            how, code = stop_reason(cases.stopped)
            raise Interrupted(f"{how} in the {op_name} op's cases{kept_reports(*paths)}", code)
        if cases.broken_off is not None:
            raise broken_off(cases.broken_off, cases.internal_traceback, *paths)
    if outcome.broken_off is not None:
        raise broken_off(outcome.broken_off, outcome.internal_traceback, json_path, junit_path)
    if report_dir is not None and outcome.stopped is None:
        from dcpcheck.output import ownership_map  # here: PIL is for --report-dir alone

        written = ownership_map.write_report_dir(
            outcome.results, scenarios, report_dir, kernel_name=kernel_name,
            case_map=fused.case_map,
        )  # fmt: skip
        out.print(f"report: {escape(str(written[0]))}", soft_wrap=True)
    if outcome.stopped is not None:
        kept = kept_reports(json_path, junit_path)
        how, code = stop_reason(outcome.stopped)
        raise Interrupted(f"{how} after {len(outcome.results)} case(s){kept}", code)
    if outcome.searched is not None:
        print_search(outcome.searched, search_config)
    if stats:
        print_stats(outcome.results, outcome.named_seconds, outcome.searched)
    if any(result.failed for cases in others.values() for result in cases.results):
        raise SystemExit(EXIT_FAIL)
    if outcome.searched is None:  # a property search judged what it drew
        require_judged([*outcome.results, *(r for c in others.values() for r in c.results)])
    raise SystemExit(outcome.exit_code)


def _other_ops(every_op, outcome, dcp_sizes, backend, home, fail_fast) -> dict:
    """After the fused op's session of the plain gate, every op package's shipped
    scenarios on its project kernels (``op_run.gate_cases``), op by op; none when the run
    is not the gate, broke, was stopped or, with ``-x``, has failed already."""
    others: dict[str, op_run.OpCases] = {}
    if not every_op or outcome.stopped is not None or outcome.broken_off is not None:
        return others
    for op_name in runner_ops():
        failed = outcome.exit_code != EXIT_OK or any(
            r.failed for cases in others.values() for r in cases.results
        )
        if fail_fast and failed:
            break
        others[op_name] = op_run.gate_cases(op_name, dcp_sizes, backend, home, fail_fast)
        if others[op_name].partial:
            break
    return others


def _compile_gate_binaries(backend) -> bool:
    """The plain gate's Triton binaries that Triton's cache lacks, compiled by worker
    processes before its cases (``dcpcheck.gate_binaries``); one line says so when any was,
    or when a listed launch is left to its case. True when every listed binary is loaded:
    the fused op's dry pass (``compile_ahead``) would then compile nothing."""
    from dcpcheck import gate_binaries  # here: only the plain gate on a GPU needs it

    done = gate_binaries.compile_gate_binaries(backend)
    if done is not None and (done.compiled or done.problems):
        err.print(f"[bold]compiled:[/] {escape(done.describe())}", soft_wrap=True)
    return done is not None and not done.problems


def _is_the_gate(ctx: click.Context) -> bool:
    """Whether this run is the plain gate, which judges every op: the project's kernels
    on every shipped scenario, in this process, with no option that picks the fused op's
    scenarios, kernel or machinery (its property search may run too)."""
    fused_only = (
        "patterns", "scenario_dir", "property_only", "launcher", "sanitize", "report_dir",
        "seed", "adapter", "ds_mla_scale", "isolate",
    )  # fmt: skip
    given = given_options(ctx)
    return not any(name in given for name in fused_only) and ctx.params["kernel_name"] == "default"


@contextlib.contextmanager
def _reported_if_stopped(loading, config, backend, paths) -> Iterator[object]:
    """Enter ``loading`` (``kernel_under_test``); a Ctrl-C or SIGTERM while it loads (a
    release's first use downloads its wheel) still writes the reports, empty and partial,
    so no earlier run's report is left to be read as this one's. So does a kernel that
    never loads (exit 125) or whose import ends or hangs the process importing it (exit
    1), its reports holding the record of it (``session.kernel_load_record``) and its
    error line saying that no case was judged."""
    try:
        kernel = loading.__enter__()
    except KeyboardInterrupt as stop:
        _write_reports([], config, backend, paths, True, None, ())
        how, code = stop_reason(stop)
        raise Interrupted(f"{how} loading the kernel{kept_reports(*paths)}", code) from None
    except (KernelLoadFailure, KernelFailed) as unloaded:
        record = kernel_load_record(unloaded.status, unloaded.message)
        _write_reports([record], config, backend, paths, True, None, ())
        unloaded.message += f"; no case was judged{kept_reports(*paths)}"
        raise
    with contextlib.ExitStack() as stack:
        stack.push(loading)
        yield kernel


def _launch_ranks(ctx: click.Context, dcp_sizes, rank_timeout: float | None) -> int:
    """``run --launcher torchrun``: start one process per rank; their exit code."""
    from dcpcheck.distributed import launcher  # torchrun's launcher: for this option alone

    sizes = [n for n in (dcp_sizes or ()) if n != 1]
    if len(sizes) != 1:
        raise InputError("--launcher torchrun: --dcp must name one size N > 1 (and maybe 1)")
    passed = options.keys(PASSED_TO_RANKS)
    refusal = "--launcher torchrun does not support"
    refuse_options(ctx, {*passed, "launcher", "rank_timeout"}, refusal)
    given = given_options(ctx)
    argv = ["run"]
    for command_param in ctx.command.params:
        name = command_param.name
        if name not in given or name not in passed:
            continue
        value = ctx.params[name]
        flag = typed_option(command_param, value)
        if command_param.is_flag:
            argv.append(flag)
        elif command_param.multiple:
            for item in value:
                argv += [flag, str(item)]
        else:
            argv += [flag, str(value)]
    return launcher.launch(sizes[0], argv, rank_timeout or DEFAULT_RANK_TIMEOUT_S)


def _write_reports(
    results, config, backend, paths, partial, searched, judged, op: str | None = None
) -> None:
    """Both reports (``report.write_reports``) at ``paths`` (JSON, JUnit) of ``op`` (the
    ops, comma-separated, of a run of several; None: the session op alone). Their paths
    were tried before any work, so failing now means the disk changed under the run
    (full, unmounted): one line, exit 2."""
    ops = session_op().name if op is None else op
    options = {"partial": partial, "searched": searched, "kernel_files": judged, "op": ops}
    try:
        write_reports(results, config, backend, *paths, **options)
    except ReportNotWritten as exc:
        raise InputError(str(exc)) from None


@click.command("repro")
@click.argument("file", type=click.Path(path_type=Path))
@options.click_options("repro")
@click.pass_context
def repro_command(
    ctx: click.Context,
    file: Path,
    kernel_name: str,
    dcp_text: str | None,
    seed: int | None,
    device: str,
    adapter: str,
    ds_mla_scale: str | None,
    oracle: str,
    isolate: bool | None,
    runs: int,
    json_path: Path | None,
    case_timeout: float | None,
    sanitize: str | None,
) -> None:
    """Replay one scenario FILE, such as a failure saved under .dcpcheck/failures/ (by the
    property search or a failing `dcpcheck run`): exit 1 if the kernel still fails it, 0
    if it passes."""
    named = op_of(file)
    if named in runner_ops():
        refusal = f"repro of a {named} scenario file does not take"  # no --op was typed
        options.refuse_untaken(ctx, named, "repro", refusal)
        raise SystemExit(op_run.repro_op(named, file, kernel_name, dcp_text, device, json_path))
    dcp_sizes = parse_dcp_sizes(dcp_text) if dcp_text is not None else None
    fused = session_op()
    timeout = case_timeout_for(fused.name, kernel_name, isolate, case_timeout, sanitize)
    try:
        scenario = fused.load_scenario(file)
    except ScenarioError as exc:
        raise InputError(str(exc)) from None
    except OSError as exc:
        raise InputError(f"{file}: cannot read: {exc.strerror}") from None
    preflight.check_overrides(scenario, dcp_sizes, seed)
    preflight.check_report_paths(json_path)
    inputs = preflight.run_inputs([kernel_name], [file])
    preflight.check_reports_spare_inputs([("--json", json_path)], inputs)
    config = options.config(RunConfig, options.option_values(ctx, "repro"))
    preflight.check_cost(fused, [scenario], config.dcp_sizes, device_for_checks(device))
    backend = open_backend(device)
    announce_oracle(oracle == "on")
    preflight.check_sanitizer(sanitize, backend)
    outcomes: list[RunOutcome] = []
    loading = kernel_under_test(fused.name, kernel_name, adapter, backend, timeout, sanitize)
    with _reported_if_stopped(loading, config, backend, (json_path, None)) as kernel:
        session = Session(kernel, config, backend)  # a replay saves nothing new
        while len(outcomes) < runs and not (outcomes and outcomes[-1].partial):
            with _progress([scenario], config) as (on_result, _, _):
                outcomes.append(
                    run_session(
                        session, RunPlan([scenario], token_streams=False), on_result=on_result
                    )
                )
    failed = [outcome for outcome in outcomes if not outcome.passed]
    shown = failed[0] if failed else outcomes[-1]  # the first failing run says most
    print_results(shown.results)
    if json_path is not None:  # the run shown; a broken or stopped last one marks it partial
        partial = outcomes[-1].partial
        judged = kernel_files(fused.name, kernel_name)
        _write_reports(shown.reported, config, backend, (json_path, None), partial, None, judged)
    if outcomes[-1].broken_off is not None:  # a broken run ends the loop: the last
        raise broken_off(outcomes[-1].broken_off, outcomes[-1].internal_traceback, json_path)
    if outcomes[-1].stopped is not None:
        how, code = stop_reason(outcomes[-1].stopped)
        raise Interrupted(
            f"{how} after {len(outcomes)} run(s){kept_reports(json_path, None)}", code
        )
    if runs > 1:
        _print_stability(len(outcomes), len(failed))
    require_judged(shown.results)
    raise SystemExit(EXIT_FAIL if failed else EXIT_OK)


def _print_stability(runs: int, failed: int) -> None:
    """The verdict over ``--runs``: the same every time, or not (then the kernel is not
    deterministic and one passing replay proves nothing)."""
    if 0 < failed < runs:
        out.print(
            f"[bold magenta]NONDETERMINISTIC:[/] failed {failed} of {runs} runs, passed "
            f"{runs - failed}: the verdict is not stable, so a passing replay proves nothing"
        )
    else:
        verdict = "[red]failed[/]" if failed else "[green]passed[/]"
        out.print(f"stable over {runs} runs: {verdict} every time")
