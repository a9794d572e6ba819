"""``dcpcheck run`` and ``dcpcheck repro``: check a kernel over scenarios (and the property
search), write the reports, save failing cases; replay one saved case."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import click
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from dcpcheck import files
from dcpcheck.cli.common import (
    HELP,
    SEED_MAX,
    InputError,
    Interrupted,
    KernelLoadFailure,
    adapter_option,
    announce_oracle,
    device_option,
    ds_mla_scale_option,
    ds_mla_scale_rule,
    fail_fast_option,
    json_option,
    junit_option,
    kernel_option,
    load,
    no_tokens_option,
    open_backend,
    oracle_option,
    parse_dcp_sizes,
    scenario_dir_option,
    scenario_option,
    stop_reason,
)
from dcpcheck.distributed import launcher
from dcpcheck.distributed.group import DEFAULT_RANK_TIMEOUT_S
from dcpcheck.exit_codes import EXIT_FAIL, EXIT_OK
from dcpcheck.harness.isolation import DEFAULT_CASE_TIMEOUT_S, IsolatedKernel
from dcpcheck.harness.runner import (
    CaseResult,
    KernelUnderTest,
    RunConfig,
    declared_ds_mla_scale,
    run,
    token_stream_case,
    with_effective_ds_mla_scale,
)
from dcpcheck.kernels.loading import KernelLoadError
from dcpcheck.kernels.registry import KERNELS
from dcpcheck.output import ownership_map, report
from dcpcheck.output.console import err, out, print_results, print_search, print_stats
from dcpcheck.spec.scenario import Scenario, ScenarioError, load_scenario, load_scenarios
from dcpcheck.workflows import search

isolate_option = click.option(
    "--isolate/--no-isolate",
    default=None,
    help="Run the kernel in a worker process, so that a crash (segfault, CUDA illegal "
    "memory access) or a hang fails its case (status crash / timeout) and the run goes on "
    "with a fresh worker. Default: on for kernels from outside the registry "
    "(module:function, file.py:function), off for registry kernels.",
)


case_timeout_option = click.option(
    "--case-timeout",
    type=float,
    default=None,
    metavar="SECONDS",
    help=f"Seconds to wait for each case's result before killing the worker and reporting "
    f"the case as timeout (default {DEFAULT_CASE_TIMEOUT_S:g}: a scenario's first case "
    "includes its DCP1 baseline and, on a GPU, Triton's compilation). Implies --isolate.",
)


def _case_timeout(kernel_name: str, isolate: bool | None, case_timeout: float | None):
    """The per-case timeout if the kernel is to run isolated, else None (in process).

    Isolation defaults to on for kernels from outside the registry (code this project has
    not vetted) and off for registry kernels; an explicit ``--case-timeout`` asks for it,
    since only a worker process can be stopped in the middle of a case.
    """
    if case_timeout is not None and not (math.isfinite(case_timeout) and case_timeout > 0):
        raise InputError(f"--case-timeout: must be a number of seconds > 0, got {case_timeout}")
    if isolate is False and case_timeout is not None:
        raise InputError(
            "--case-timeout needs --isolate: only a worker process can be stopped mid-case"
        )
    if isolate is None:
        isolate = case_timeout is not None or kernel_name not in KERNELS
    if not isolate:
        return None
    return DEFAULT_CASE_TIMEOUT_S if case_timeout is None else case_timeout


@contextlib.contextmanager
def _kernel_under_test(
    name: str, adapter: str, backend, case_timeout: float | None
) -> Iterator[KernelUnderTest]:
    """The kernel, in this process (``case_timeout`` None) or behind a worker process.

    The kernel is loaded here first in both cases, so a load error is one line and exit
    125 without starting a process; leaving the ``with`` kills the worker, whatever ends it.
    A kernel that declares an fp8_ds_mla tile-scale rule dcpcheck does not know is a load
    error too (``runner.declared_ds_mla_scale``): its cases could not say what they demand.
    """
    kernel = load(name, adapter)
    try:
        declared_ds_mla_scale(kernel)
    except ValueError as exc:
        raise KernelLoadFailure(f"{name}: {exc}") from None
    if case_timeout is None:
        yield kernel
        return
    isolated = IsolatedKernel(name, adapter, backend, case_timeout)
    try:
        isolated.start()
    except KernelLoadError as exc:
        raise KernelLoadFailure(str(exc)) from None
    try:
        yield isolated
    finally:
        isolated.close()


def _check_report_paths(*paths: Path | None) -> None:
    """Every report path must be writable, and each its own file, before any work."""
    given = [path for path in paths if path is not None]
    if len({path.resolve() for path in given}) < len(given):
        raise InputError(f"--json and --junit name the same file: {given[0]}")
    for path in given:
        try:
            files.ensure_writable(path)
        except files.ReportPathError as exc:
            raise InputError(str(exc)) from None


def _check_home(home: Path) -> None:
    try:
        files.ensure_directory_writable(home)
    except files.ReportPathError as exc:
        raise InputError(f"--home: {exc}") from None


def _check_overrides(scenario: Scenario, dcp_sizes: tuple[int, ...] | None, seed) -> None:
    """``scenario`` as it will run (``Scenario`` validates the layout at each DCP size), and
    its seed within ``SEED_MAX``."""
    try:
        dataclasses.replace(
            scenario,
            dcp_sizes=dcp_sizes or scenario.dcp_sizes,
            seed=scenario.seed if seed is None else seed,
        )
    except ScenarioError as exc:
        raise InputError(f"{exc} (with the --dcp / --seed given)") from None
    if scenario.seed > SEED_MAX:
        where = scenario.source if scenario.source is not None else scenario.name
        raise InputError(f"{where}: key 'seed': must be <= {SEED_MAX}, got {scenario.seed}")


def _run_with_progress(
    kernel: KernelUnderTest,
    scenarios: list[Scenario],
    config: RunConfig,
    backend,
    keep: Callable[[CaseResult], None],
) -> None:
    """Run with a progress bar on stderr, handing each result to ``keep`` as it lands, so
    that an interrupted run still reports what it did (marked partial)."""
    if not scenarios:
        return
    total = sum(len(config.sizes_of(s)) for s in scenarios)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=err,
        transient=True,
    ) as progress:
        task = progress.add_task("checking", total=total)

        def on_result(result: CaseResult) -> None:
            keep(result)
            progress.update(
                task, advance=1, description=escape(f"{result.scenario}[dcp{result.dcp_size}]")
            )

        run(kernel, scenarios, config, backend, on_result=on_result)


@click.command("run", epilog=HELP.split("\n\n", 1)[1])
@click.option(
    "--dcp",
    "dcp_text",
    default=None,
    metavar="N[,N...]",
    help="DCP sizes to simulate, e.g. 4 or 1,2,4,8 (default: each scenario's own). "
    "DCP1 always runs as the baseline for the cross-rank checks.",
)
@kernel_option
@scenario_option
@scenario_dir_option
@click.option(
    "--seed",
    type=click.IntRange(0, SEED_MAX),
    default=None,
    help="Override every scenario's value seed (explores new values). For the property "
    "search: Hypothesis's seed, so it draws other scenarios (default: a fixed seed, the "
    "same scenarios on every run).",
)
@click.option(
    "--examples",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="After the named scenarios, run the property search over N drawn scenarios "
    "(default with --profile or --property-only: the profile's count).",
)
@click.option(
    "--property-only",
    is_flag=True,
    help="Run only the property search, no named scenarios.",
)
@click.option(
    "--profile",
    "profile_name",
    type=click.Choice(list(search.PROFILES)),
    default=None,
    help="Property search sizes and counts (runs the search; default ci). "
    + "; ".join(f"{p.name}: {p.description}" for p in search.PROFILES.values())
    + ".",
)
@click.option(
    "--stats",
    is_flag=True,
    help="Report cases / examples run, per second, and how many rank launches had an "
    "all-negative, mixed or fully-owned slot mapping.",
)
@click.option(
    "--home",
    type=click.Path(path_type=Path),
    default=search.DEFAULT_HOME,
    show_default=True,
    envvar=search.HOME_ENV,
    help=f"Run directory (env {search.HOME_ENV}): shrunk failures go to HOME/failures/, "
    "Hypothesis's example database to HOME/hypothesis/.",
)
@device_option
@json_option
@junit_option
@adapter_option
@no_tokens_option
@click.option(
    "--report-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Write a self-contained HTML report and a PNG ownership map per case here: "
    "tokens x ranks colored by ownership, with each field's verdict.",
)
@click.option(
    "--launcher",
    type=click.Choice(["none", "torchrun"]),
    default="none",
    show_default=True,
    help="torchrun: every DCP rank is a real process on its own device (NCCL on GPUs, "
    "gloo on the CPU), results gathered to rank 0; --dcp names one size N (and 1).",
)
@click.option(
    "--rank-timeout",
    type=click.FloatRange(min=1.0),
    default=None,
    metavar="SECONDS",
    help="With --launcher torchrun: seconds without progress from any rank before the run "
    "is stopped, naming the rank(s) that hung.",
)
@ds_mla_scale_option
@oracle_option
@fail_fast_option
@isolate_option
@case_timeout_option
@click.pass_context
def run_command(
    ctx: click.Context,
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
) -> None:
    """Run the contract checks of a kernel over scenarios x DCP sizes, then, if asked, the
    property search over drawn scenarios (a failure is shrunk and saved under HOME).

    A failing named-scenario case is saved too, as a scenario file under HOME/failures/
    (its seed and DCP size baked in) that `dcpcheck repro` replays."""
    dcp_sizes = parse_dcp_sizes(dcp_text) if dcp_text is not None else None
    if launcher == "torchrun":
        raise SystemExit(_launch_ranks(ctx, dcp_sizes, rank_timeout))
    if rank_timeout is not None:
        raise InputError("--rank-timeout needs --launcher torchrun")
    if property_only and patterns:
        raise InputError("--scenario and --property-only exclude each other")
    timeout = _case_timeout(kernel_name, isolate, case_timeout)
    _check_report_paths(json_path, junit_path)
    if report_dir is not None:
        _check_report_dir(report_dir)
    search_config = None
    if property_only or examples is not None or profile_name is not None:
        _check_home(home)  # the search writes its example database there
        profile = search.PROFILES[profile_name or "ci"]
        search_config = search.SearchConfig(
            kernel_name,
            profile,
            examples,
            dcp_sizes,
            seed,
            home,
            ds_mla_scale=ds_mla_scale_rule(ds_mla_scale),
            oracle=oracle == "on",
        )
    scenarios = [] if property_only else _scenarios(patterns, scenario_dir, dcp_sizes, seed)
    backend = open_backend(device)
    announce_oracle(oracle == "on")
    config = RunConfig(
        kernel_name,
        dcp_sizes,
        seed,
        fail_fast,
        ds_mla_scale=ds_mla_scale_rule(ds_mla_scale),
        oracle=oracle == "on",
    )

    named: list[CaseResult] = []
    saved: dict[tuple[str, int], Path] = {}
    searched: search.SearchResult | None = None
    started = time.perf_counter()
    named_seconds = 0.0
    partial, stopped = True, None
    with _kernel_under_test(kernel_name, adapter, backend, timeout) as kernel:
        by_name = {s.name: s for s in scenarios}
        saving = True  # until HOME turns out not to be writable: then one warning

        def keep(result: CaseResult) -> None:
            nonlocal saving
            named.append(result)
            if result.status == "pass" or not saving:
                return
            try:
                scenario = by_name[result.scenario]
                as_run = with_effective_ds_mla_scale(scenario, config, kernel)
                path = _save_failed_case(as_run, result, config, home)
            except OSError as exc:
                saving = False
                err.print(
                    f"dcpcheck: warning: cannot save failing cases under {home}: "
                    f"{exc.strerror} (see --home)",
                    markup=False,
                    soft_wrap=True,
                )
            else:
                saved[(result.scenario, result.dcp_size)] = path

        try:
            _run_with_progress(kernel, scenarios, config, backend, keep)
            failed = any(r.status != "pass" for r in named)
            if scenarios and not no_tokens and not (fail_fast and failed):
                with err.status("token streams: tiny MLA model, DCP1 vs DCPn"):
                    named.append(token_stream_case(kernel, config, backend))
            named_seconds = time.perf_counter() - started
            failed = any(r.status != "pass" for r in named)
            if search_config is not None and not (fail_fast and failed):
                searched = _search_with_progress(kernel, search_config, backend)
            partial = False
        except KeyboardInterrupt as stop:  # Ctrl-C or SIGTERM, wherever the run was
            stopped = stop  # reported below, once the reports are written, the worker gone
        finally:
            # The shrunk failure's replay goes into the reports like any other case.
            replayed = searched.replay if searched is not None else []
            _write_reports(named + replayed, config, backend, json_path, junit_path, partial)
    if scenarios:
        print_results(named, saved)
    if report_dir is not None and stopped is None:
        written = ownership_map.write_report_dir(
            named, scenarios, report_dir, kernel_name=kernel_name
        )
        out.print(f"report: {escape(str(written[0]))}", soft_wrap=True)
    if stopped is not None:
        written = [str(path) for path in (json_path, junit_path) if path is not None]
        kept = f"; partial report(s): {', '.join(written)}" if written else ""
        how, code = stop_reason(stopped)
        raise Interrupted(f"{how} after {len(named)} case(s){kept}", code)
    if searched is not None:
        print_search(searched, search_config)
    if stats:
        print_stats(named, named_seconds, searched)
    passed = all(r.status == "pass" for r in named) and (searched is None or searched.passed)
    raise SystemExit(EXIT_OK if passed else EXIT_FAIL)


RANK_OPTIONS = (
    "dcp_text",
    "patterns",
    "scenario_dir",
    "seed",
    "kernel_name",
    "adapter",
    "device",
    "json_path",
    "junit_path",
    "no_tokens",
    "fail_fast",
    "stats",
    "ds_mla_scale",
    "oracle",
)
"""The ``run`` options a real-rank run passes on to every rank (dcpcheck.distributed)."""


def _launch_ranks(ctx: click.Context, dcp_sizes, rank_timeout: float | None) -> int:
    """``run --launcher torchrun``: start one process per rank; their exit code."""
    sizes = [n for n in (dcp_sizes or ()) if n != 1]
    if len(sizes) != 1:
        raise InputError("--launcher torchrun: --dcp must name one size N > 1 (and maybe 1)")
    given = {
        name
        for name, value in ctx.params.items()
        if ctx.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE
        and value not in (None, False, ())
    }
    unsupported = given - set(RANK_OPTIONS) - {"launcher", "rank_timeout"}
    if unsupported:
        names = ", ".join(sorted(f"--{n.replace('_', '-')}" for n in unsupported))
        raise InputError(f"--launcher torchrun does not support {names}")
    argv = ["run"]
    for command_param in ctx.command.params:
        name = command_param.name
        if name not in given or name not in RANK_OPTIONS:
            continue
        flag = command_param.opts[0]
        value = ctx.params[name]
        if command_param.is_flag:
            argv.append(flag)
        elif command_param.multiple:
            for item in value:
                argv += [flag, str(item)]
        else:
            argv += [flag, str(value)]
    return launcher.launch(sizes[0], argv, rank_timeout or DEFAULT_RANK_TIMEOUT_S)


def _check_report_dir(report_dir: Path) -> None:
    try:
        files.ensure_directory_writable(report_dir)
    except files.ReportPathError as exc:
        raise InputError(str(exc)) from None


def _scenarios(
    patterns: tuple[str, ...], scenario_dir: Path, dcp_sizes: tuple[int, ...] | None, seed
) -> list[Scenario]:
    """The scenarios to run, each checked with the ``--dcp`` / ``--seed`` overrides applied,
    so that a combination that cannot run is an error before any work."""
    if not scenario_dir.is_dir():
        what = "does not exist" if not scenario_dir.exists() else "is not a directory"
        raise InputError(f"--scenario-dir: {scenario_dir} {what}")
    try:
        scenarios = load_scenarios(list(patterns), scenario_dir)
    except ScenarioError as exc:
        raise InputError(str(exc)) from None
    except OSError as exc:
        raise InputError(f"{exc.filename}: cannot read: {exc.strerror}") from None
    if not scenarios:
        raise InputError(f"--scenario-dir: no scenario files (*.toml) in {scenario_dir}")
    for scenario in scenarios:
        _check_overrides(scenario, dcp_sizes, seed)
    return scenarios


def _failure_phrase(result: CaseResult) -> str:
    """What failed, as the property search words it; a crash or timeout by its reason."""
    phrases = search.failure_summary([result])
    return phrases[0] if phrases else f"DCP{result.dcp_size}: {result.status} ({result.error})"


def _save_failed_case(
    scenario: Scenario, result: CaseResult, config: RunConfig, home: Path
) -> Path:
    """Save the failing case under ``home/failures/`` with the seed and DCP size it ran at,
    so ``dcpcheck repro FILE`` replays exactly it. ``scenario`` is the one that ran, its
    fp8_ds_mla tile-scale rule resolved (``runner.with_effective_ds_mla_scale``), so the
    file names that rule. ``OSError`` if ``home`` cannot be written: the caller warns and
    goes on (the replay command reproduces the case too)."""
    seed = scenario.seed if config.seed is None else config.seed
    case = dataclasses.replace(scenario, dcp_sizes=(result.dcp_size,), seed=seed)
    description = (
        f"Saved by dcpcheck run: kernel {config.kernel_name} fails scenario "
        f"{scenario.name} at {_failure_phrase(result)}. Replay: dcpcheck repro "
        f"<this file> --kernel {config.kernel_name}{config.oracle_flag}"
    )
    stem = f"{scenario.name}-{search.kernel_slug(config.kernel_name)}-dcp{result.dcp_size}"
    return search.save_failure(case, stem, description, home / search.FAILURES_DIR)


def _search_with_progress(
    kernel: KernelUnderTest, config: search.SearchConfig, backend
) -> search.SearchResult:
    """The property search with a count of examples on stderr (shrinking runs past the
    requested count, so no bar)."""
    with Progress(TextColumn("{task.description}"), console=err, transient=True) as progress:
        task = progress.add_task("property search")

        def on_example(count: int) -> None:
            progress.update(task, description=f"property search: example {count}")

        return search.search(kernel, config, backend, on_example=on_example)


def _write_reports(results, config, backend, json_path, junit_path, partial) -> None:
    """Both reports, atomically. Their paths were tried before any work, so failing now
    means the disk changed under the run (full, unmounted): one line, exit 2."""
    backend_name = "interpreter" if backend.interpreted else "cuda"
    reports = []
    if json_path is not None:
        text = report.to_json(
            results,
            kernel=config.kernel_name,
            backend=backend_name,
            partial=partial,
            oracle=config.oracle,
        )
        reports.append((json_path, text))
    if junit_path is not None:
        text = report.to_junit(
            results, kernel=config.kernel_name, partial=partial, oracle=config.oracle
        )
        reports.append((junit_path, text))
    for path, text in reports:
        try:
            files.write_atomic(path, text)
        except OSError as exc:
            raise InputError(f"{path}: cannot write the report: {exc.strerror}") from None


@click.command("repro")
@click.argument("file", type=click.Path(path_type=Path))
@click.option(
    "--kernel",
    "kernel_name",
    default="default",
    show_default=True,
    help="The kernel to replay it on (as for `dcpcheck run --kernel`).",
)
@click.option(
    "--dcp",
    "dcp_text",
    default=None,
    metavar="N[,N...]",
    help="DCP sizes to simulate instead of the file's own.",
)
@device_option
@adapter_option
@ds_mla_scale_option
@oracle_option
@isolate_option
@case_timeout_option
def repro_command(
    file: Path,
    kernel_name: str,
    dcp_text: str | None,
    device: str,
    adapter: str,
    ds_mla_scale: str | None,
    oracle: str,
    isolate: bool | None,
    case_timeout: float | None,
) -> None:
    """Replay one scenario FILE, such as a failure saved under .dcpcheck/failures/ (by the
    property search or a failing `dcpcheck run`): exit 1 if the kernel still fails it, 0
    if it passes."""
    dcp_sizes = parse_dcp_sizes(dcp_text) if dcp_text is not None else None
    timeout = _case_timeout(kernel_name, isolate, case_timeout)
    try:
        scenario = load_scenario(file)
    except ScenarioError as exc:
        raise InputError(str(exc)) from None
    except OSError as exc:
        raise InputError(f"{file}: cannot read: {exc.strerror}") from None
    _check_overrides(scenario, dcp_sizes, None)
    backend = open_backend(device)
    announce_oracle(oracle == "on")
    results: list[CaseResult] = []
    with _kernel_under_test(kernel_name, adapter, backend, timeout) as kernel:
        config = RunConfig(
            kernel_name,
            dcp_sizes,
            ds_mla_scale=ds_mla_scale_rule(ds_mla_scale),
            oracle=oracle == "on",
        )
        _run_with_progress(kernel, [scenario], config, backend, results.append)
    print_results(results)
    raise SystemExit(EXIT_OK if all(r.status == "pass" for r in results) else EXIT_FAIL)
