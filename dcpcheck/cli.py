"""The ``dcpcheck`` command line: a thin layer over ``dcpcheck.runner`` and ``dcpcheck.search``.

Exit codes (part of the interface; ``git bisect run`` relies on 125):

\b
  0    every check passed
  1    a check failed (or the kernel raised)
  2    usage error or bad input, found before any work starts
  125  the kernel under test could not be loaded or compiled
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from dcpcheck import bisect as bisection
from dcpcheck import report, search
from dcpcheck.adapters import ADAPTER_NAMES
from dcpcheck.backend import BackendError, select_backend
from dcpcheck.contract import CacheLayout, Kernel
from dcpcheck.exit_codes import EXIT_FAIL, EXIT_KERNEL_LOAD, EXIT_OK, EXIT_USAGE
from dcpcheck.kernel_loading import KernelLoadError, load_kernel
from dcpcheck.runner import CaseResult, RunConfig, run, token_stream_case
from dcpcheck.scenario import SCENARIO_DIR, Scenario, ScenarioError, load_scenario, load_scenarios
from dcpcheck.token_streams import StreamComparison, compare_streams, stream_config_for

out = Console(highlight=False)
"""Results go to stdout; findings and replay commands print one line each (soft wrap)
so they can be grepped and pasted."""
err = Console(stderr=True, highlight=False)

FINDINGS_SHOWN = 6
"""Findings printed per failing case; the JSON and JUnit reports hold every one."""


class InputError(click.ClickException):
    """Bad input: one line on stderr, exit 2."""

    exit_code = EXIT_USAGE


class KernelLoadFailure(click.ClickException):
    """The kernel under test cannot be loaded: exit 125 so ``git bisect run`` skips."""

    exit_code = EXIT_KERNEL_LOAD


def parse_dcp_sizes(text: str) -> tuple[int, ...]:
    """``"4"`` or ``"1,2,4,8"`` -> sizes, each a positive integer."""
    sizes = []
    for part in text.split(","):
        try:
            size = int(part)
        except ValueError:
            raise InputError(
                f"--dcp: {part.strip()!r} is not an integer (e.g. --dcp 1,2,4)"
            ) from None
        if size < 1:
            raise InputError(f"--dcp: DCP size must be >= 1, got {size}")
        sizes.append(size)
    return tuple(dict.fromkeys(sizes))


@click.group(help=__doc__, context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    pass


@cli.command("run", epilog=__doc__.split("\n\n", 1)[1])
@click.option(
    "--dcp",
    "dcp_text",
    default=None,
    metavar="N[,N...]",
    help="DCP sizes to simulate, e.g. 4 or 1,2,4,8 (default: each scenario's own). "
    "DCP1 always runs as the baseline for the cross-rank checks.",
)
@click.option(
    "--kernel",
    "kernel_name",
    default="default",
    show_default=True,
    help="Registry name (see `dcpcheck list kernels`), package.module:function, "
    "or path/to/file.py:function implementing the kernel protocol.",
)
@click.option(
    "--scenario",
    "patterns",
    multiple=True,
    metavar="NAME|GLOB",
    help="Scenario names or globs (repeatable; default: all shipped scenarios).",
)
@click.option(
    "--scenario-dir",
    type=click.Path(path_type=Path),
    default=SCENARIO_DIR,
    show_default=True,
    help="Where scenario TOML files live.",
)
@click.option(
    "--seed",
    type=int,
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
@click.option(
    "--device",
    type=click.Choice(["auto", "cuda", "cpu"]),
    default="auto",
    show_default=True,
    help="auto: CUDA if present, else Triton's interpreter on the CPU.",
)
@click.option(
    "--json",
    "json_path",
    type=click.Path(path_type=Path),
    default=None,
    help="Write a JSON report here (atomically).",
)
@click.option(
    "--junit",
    "junit_path",
    type=click.Path(path_type=Path),
    default=None,
    help="Write a JUnit XML report here (atomically).",
)
@click.option(
    "--adapter",
    type=click.Choice(ADAPTER_NAMES),
    default="auto",
    show_default=True,
    help="How to call an external kernel: auto picks vLLM's adapter when the function's "
    "signature is a known vLLM fused_norm_rope shape, native the harness's protocol.",
)
@click.option(
    "--no-tokens",
    is_flag=True,
    help="Skip the end-to-end token-stream check (a tiny MLA model's greedy streams at "
    "DCP1 and the largest --dcp size must hash identically; see `dcpcheck hash`).",
)
@click.option("-x", "--fail-fast", is_flag=True, help="Stop at the first failing case.")
def run_command(
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
    fail_fast,
) -> None:
    """Run the contract checks of a kernel over scenarios x DCP sizes, then, if asked, the
    property search over drawn scenarios (a failure is shrunk and saved under HOME)."""
    dcp_sizes = parse_dcp_sizes(dcp_text) if dcp_text is not None else None
    if property_only and patterns:
        raise InputError("--scenario and --property-only exclude each other")
    for path in (json_path, junit_path):
        if path is not None:
            try:
                report.ensure_writable(path)
            except report.ReportPathError as exc:
                raise InputError(str(exc)) from None
    try:
        scenarios = [] if property_only else load_scenarios(list(patterns), scenario_dir)
    except ScenarioError as exc:
        raise InputError(str(exc)) from None
    search_config = None
    if property_only or examples is not None or profile_name is not None:
        profile = search.PROFILES[profile_name or "ci"]
        search_config = search.SearchConfig(kernel_name, profile, examples, dcp_sizes, seed, home)
    backend = _backend(device)
    kernel = _kernel(kernel_name, adapter)
    config = RunConfig(kernel_name, dcp_sizes, seed, fail_fast)

    named: list[CaseResult] = []
    searched: search.SearchResult | None = None
    started = time.perf_counter()
    partial = True
    try:
        _run_with_progress(kernel, scenarios, config, backend, named)
        failed = any(r.status != "pass" for r in named)
        if scenarios and not no_tokens and not (fail_fast and failed):
            with err.status("token streams: tiny MLA model, DCP1 vs DCPn"):
                named.append(token_stream_case(kernel, config, backend))
        named_seconds = time.perf_counter() - started
        failed = any(r.status != "pass" for r in named)
        if search_config is not None and not (fail_fast and failed):
            searched = _search_with_progress(kernel, search_config, backend)
        partial = False
    finally:
        # The shrunk failure's replay goes into the reports like any other case.
        replayed = searched.replay if searched is not None else []
        _write_reports(named + replayed, config, backend, json_path, junit_path, partial)
    if scenarios:
        print_results(named)
    if searched is not None:
        print_search(searched, search_config)
    if stats:
        print_stats(named, named_seconds, searched)
    passed = all(r.status == "pass" for r in named) and (searched is None or searched.passed)
    raise SystemExit(EXIT_OK if passed else EXIT_FAIL)


@cli.command("repro")
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
@click.option(
    "--device",
    type=click.Choice(["auto", "cuda", "cpu"]),
    default="auto",
    show_default=True,
    help="auto: CUDA if present, else Triton's interpreter on the CPU.",
)
def repro_command(file: Path, kernel_name: str, dcp_text: str | None, device: str) -> None:
    """Replay one scenario FILE, such as a shrunk failure the property search saved under
    .dcpcheck/failures/: exit 1 if the kernel still fails it, 0 if it passes."""
    dcp_sizes = parse_dcp_sizes(dcp_text) if dcp_text is not None else None
    try:
        scenario = load_scenario(file)
    except ScenarioError as exc:
        raise InputError(str(exc)) from None
    backend = _backend(device)
    kernel = _kernel(kernel_name)
    results: list[CaseResult] = []
    _run_with_progress(kernel, [scenario], RunConfig(kernel_name, dcp_sizes), backend, results)
    print_results(results)
    raise SystemExit(EXIT_OK if all(r.status == "pass" for r in results) else EXIT_FAIL)


def _backend(device: str):
    try:
        backend = select_backend(device)
    except BackendError as exc:
        raise InputError(str(exc)) from None
    err.print(f"[bold]backend:[/] {backend.describe()}")
    return backend


def _kernel(name: str, adapter: str = "auto") -> Kernel:
    try:
        return load_kernel(name, adapter)
    except KernelLoadError as exc:
        raise KernelLoadFailure(str(exc)) from None


def _run_with_progress(
    kernel: Kernel,
    scenarios: list[Scenario],
    config: RunConfig,
    backend,
    results: list[CaseResult],
) -> None:
    """Run with a progress bar on stderr, appending to ``results`` as each case lands, so
    that an interrupted run still reports what it did (marked partial)."""
    if not scenarios:
        return
    total = sum(len(config.dcp_sizes or s.dcp_sizes) for s in scenarios)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=err,
        transient=True,
    ) as progress:
        task = progress.add_task("checking", total=total)

        def on_result(result: CaseResult) -> None:
            results.append(result)
            progress.update(
                task, advance=1, description=escape(f"{result.scenario}[dcp{result.dcp_size}]")
            )

        run(kernel, scenarios, config, backend, on_result=on_result)


def _search_with_progress(
    kernel: Kernel, config: search.SearchConfig, backend
) -> search.SearchResult:
    """The property search with a count of examples on stderr (shrinking runs past the
    requested count, so no bar)."""
    with Progress(TextColumn("{task.description}"), console=err, transient=True) as progress:
        task = progress.add_task("property search")

        def on_example(count: int) -> None:
            progress.update(task, description=f"property search: example {count}")

        return search.search(kernel, config, backend, on_example=on_example)


def _write_reports(results, config, backend, json_path, junit_path, partial) -> None:
    backend_name = "interpreter" if backend.interpreted else "cuda"
    if json_path is not None:
        report.write_atomic(
            json_path,
            report.to_json(
                results, kernel=config.kernel_name, backend=backend_name, partial=partial
            ),
        )
    if junit_path is not None:
        report.write_atomic(
            junit_path, report.to_junit(results, kernel=config.kernel_name, partial=partial)
        )


def print_results(results: list[CaseResult]) -> None:
    """A table of scenario x DCP size with the checks that failed, then one line per
    finding and a replay command per failing case, then the summary line."""
    table = Table(title="dcpcheck")
    for column in ("case", "result", "checks", "s"):
        table.add_column(column, justify="right" if column == "s" else "left")
    for r in results:
        if r.status == "error":
            verdict, detail = "[red]ERROR[/]", "kernel raised: see below"
        else:
            ran = [c for c in r.checks if c.skipped is None]
            failed = [c.check for c in r.failed_checks]
            verdict = "[bold red]FAIL[/]" if failed else "[green]pass[/]"
            detail = (
                "failed: " + ", ".join(failed)
                if failed
                else f"{len(ran)} passed, {len(r.checks) - len(ran)} not applicable"
            )
        table.add_row(escape(f"{r.scenario}[dcp{r.dcp_size}]"), verdict, detail, f"{r.seconds:.1f}")
    out.print(table)
    for r in results:
        label = escape(f"{r.scenario}[dcp{r.dcp_size}]")
        if r.status == "error":
            out.print(f"[red]ERROR[/] {label}: {escape(r.error or '')}", soft_wrap=True)
            out.print(f"  replay: {escape(r.replay)}", soft_wrap=True)
        findings = [(c.check, f) for c in r.failed_checks for f in c.findings]
        for check, f in findings[:FINDINGS_SHOWN]:
            line = escape(report.format_finding(check, f))
            out.print(f"[red]FAIL[/] {label} {line}", soft_wrap=True)
        if len(findings) > FINDINGS_SHOWN:
            out.print(f"  ... and {len(findings) - FINDINGS_SHOWN} more finding(s) (all in --json)")
        if findings:
            out.print(f"  replay: {escape(r.replay)}", soft_wrap=True)
    s = report.summarize(results)
    colour = "green" if s["fail"] == s["error"] == 0 else "red"
    out.print(
        f"[{colour}]{s['cases']} case(s): {s['pass']} passed, {s['fail']} failed, "
        f"{s['error']} error(s)[/]"
    )


def print_search(result: search.SearchResult, config: search.SearchConfig) -> None:
    """One line for a passing search; for a failure, the shrunk scenario, where it was
    saved, and its replay's findings (through ``print_results``)."""
    seed = search.DEFAULT_SEED if config.seed is None else config.seed
    what = f"profile {config.profile.name}, seed {seed}"
    if result.passed:
        out.print(f"[green]property: {result.examples_run} example(s) passed[/] ({what})")
        return
    shrunk = result.shrunk
    batch = shrunk.batch
    out.print(
        f"[bold red]property: FAIL[/] ({what}): first failure at example "
        f"{result.examples_to_first_failure}, shrunk to {len(batch.requests)} request(s), "
        f"{batch.num_real_tokens} token(s) + {batch.padding} padding, DCP "
        f"{', '.join(map(str, shrunk.dcp_sizes))}; failed: {', '.join(result.failed_checks)}",
        soft_wrap=True,
    )
    out.print(f"  saved: {escape(str(result.saved_path))}", soft_wrap=True)
    print_results(result.replay)
    if all(r.status == "pass" for r in result.replay):
        out.print(
            "[red]the saved scenario passed when run again: the kernel is not deterministic[/]"
        )


def print_stats(
    named: list[CaseResult], named_seconds: float, searched: search.SearchResult | None
) -> None:
    """Throughput and the ownership shapes the run covered (``CaseResult.ownership``)."""

    def shapes(counts: dict[str, int]) -> str:
        return ", ".join(f"{counts.get(shape, 0)} {shape}" for shape in search.OWNERSHIP_SHAPES)

    if named:
        totals = search.ownership_totals(named)
        rate = len(named) / named_seconds if named_seconds > 0 else 0.0
        out.print(
            f"stats: scenarios: {len(named)} case(s) in {named_seconds:.1f} s "
            f"({rate:.2f} cases/s); rank launches: {shapes(totals)}",
            soft_wrap=True,
        )
    if searched is not None:
        out.print(
            f"stats: property: {searched.examples_run} example(s) in {searched.seconds:.1f} s "
            f"({searched.examples_per_second:.2f} examples/s); rank launches: "
            f"{shapes(searched.ownership)}",
            soft_wrap=True,
        )


@cli.command("hash")
@click.option(
    "--dcp",
    "dcp_text",
    default="1,4",
    show_default=True,
    metavar="N[,N...]",
    help="DCP sizes to generate at (DCP1 always runs as the baseline).",
)
@click.option(
    "--kernel",
    "kernel_name",
    default="default",
    show_default=True,
    help="The kernel under test (as for `dcpcheck run --kernel`).",
)
@click.option(
    "--prompts",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Requests in the batch, of different prompt lengths.",
)
@click.option(
    "--steps",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="Greedy decode steps per request (crosses block boundaries).",
)
@click.option(
    "--layout",
    "layout_name",
    type=click.Choice([c.value for c in CacheLayout]),
    default="auto",
    show_default=True,
    help="MLA cache layout of the model's caches.",
)
@click.option(
    "--preset",
    default=None,
    help="Model widths: a preset name (default: small-neox on the CPU, deepseek-v3.2 on a GPU).",
)
@click.option(
    "--seed", type=int, default=0, show_default=True, help="Weights, prompts and cache bytes."
)
@click.option(
    "--device",
    type=click.Choice(["auto", "cuda", "cpu"]),
    default="auto",
    show_default=True,
    help="auto: CUDA if present, else Triton's interpreter.",
)
@click.option(
    "--adapter",
    type=click.Choice(ADAPTER_NAMES),
    default="auto",
    show_default=True,
    help="How to call an external kernel (as for `dcpcheck run`).",
)
def hash_command(
    dcp_text, kernel_name, prompts, steps, layout_name, preset, seed, device, adapter
) -> None:
    """Generate greedy token streams with a tiny seeded MLA model at each DCP size and
    compare their SHA256 digests: exit 1 when any rank of any size differs from DCP1."""
    dcp_sizes = parse_dcp_sizes(dcp_text)
    backend = _backend(device)
    try:
        stream_config = stream_config_for(
            backend,
            CacheLayout(layout_name),
            preset=preset,
            prompts=prompts,
            steps=steps,
            seed=seed,
        )
    except ValueError as exc:
        raise InputError(str(exc)) from None
    kernel = _kernel(kernel_name, adapter)
    with err.status("generating token streams"):
        comparison = compare_streams(kernel, stream_config, dcp_sizes, backend.device)
    print_streams(comparison)
    raise SystemExit(EXIT_OK if comparison.identical else EXIT_FAIL)


def print_streams(comparison: StreamComparison) -> None:
    """Digests per DCP size and rank (whole stream, then per request), and the verdict."""
    c = comparison.config
    out.print(
        f"model: {c.preset}, {c.layers} layers, cache {c.cache_layout.value}, "
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
            f"{comparison.min_baseline_margin:.3g})"
        )
    else:
        out.print(
            f"[bold red]streams differ[/]: first divergence at "
            f"{escape(comparison.first_divergence.describe())}",
            soft_wrap=True,
        )


@cli.command("bisect")
@click.argument("kernel_spec", metavar="FILE:FUNCTION", required=False)
@click.option(
    "--repo",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("."),
    show_default=True,
    help="The git repository holding the kernel file.",
)
@click.option(
    "--file",
    "rel_file",
    default=None,
    help="The kernel file, relative to --repo (or give FILE:FUNCTION).",
)
@click.option(
    "--function",
    "function",
    default="fused_norm_rope",
    show_default=True,
    help="The kernel function in that file.",
)
@click.option("--good", required=True, help="A revision where the kernel passes.")
@click.option("--bad", default="HEAD", show_default=True, help="A revision where it fails.")
@click.option(
    "--scenario",
    "patterns",
    multiple=True,
    metavar="NAME|GLOB",
    help="Scenarios to check each revision with (default: all; a few small ones "
    "keep each step to seconds).",
)
@click.option("--dcp", "dcp_text", default=None, metavar="N[,N...]", help="DCP sizes.")
@click.option("--seed", type=int, default=None, help="Value seed override.")
@click.option(
    "--device", type=click.Choice(["auto", "cuda", "cpu"]), default="auto", show_default=True
)
@click.option(
    "--scenario-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Where scenario files live (default: the shipped ones).",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=float,
    default=600.0,
    show_default=True,
    help="Seconds one revision's run may take.",
)
def bisect_command(
    kernel_spec,
    repo,
    rel_file,
    function,
    good,
    bad,
    patterns,
    dcp_text,
    seed,
    device,
    scenario_dir,
    timeout_s,
) -> None:
    """Find the first commit that broke a kernel file: walk its history with `git show`
    (no checkout, no rebuild), run the checks at each midpoint in a fresh process,
    and skip revisions that do not load. Exit 0 when the first bad commit is named."""
    if kernel_spec is not None:
        rel_file, _, named_function = kernel_spec.rpartition(":")
        function = named_function or function
    if not rel_file:
        raise InputError("bisect: give --file REL (or FILE:FUNCTION)")
    if dcp_text is not None:
        parse_dcp_sizes(dcp_text)
    options = bisection.RunOptions(
        scenarios=tuple(patterns),
        dcp=dcp_text,
        seed=seed,
        device=device,
        scenario_dir=scenario_dir,
        timeout_s=timeout_s,
    )
    try:
        result = bisection.bisect(repo, rel_file, good, bad, function, options)
    except bisection.BisectError as exc:
        raise InputError(str(exc)) from None
    for line in bisection.render(result):
        out.print(escape(line), soft_wrap=True)
    raise SystemExit(EXIT_OK if result.first_bad is not None else EXIT_FAIL)


@cli.command("list")
@click.argument("what", type=click.Choice(["kernels", "scenarios"]), default="kernels")
def list_command(what: str) -> None:
    """List the registered kernels or the shipped scenarios."""
    if what == "kernels":
        from dcpcheck.kernels import KERNELS

        for entry in KERNELS.values():
            out.print(f"{entry.name:24} {entry.description}")
        return
    try:
        scenarios = load_scenarios([], SCENARIO_DIR)
    except ScenarioError as exc:
        raise InputError(str(exc)) from None
    for s in scenarios:
        out.print(f"{s.name:32} {s.description}")


def main() -> None:
    """Entry point: click's errors become one line on stderr with their exit code."""
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        err.print(f"dcpcheck: error: {exc.format_message()}", markup=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        err.print("dcpcheck: interrupted", markup=False)
        sys.exit(130)
