"""``dcpcheck mutate``: mutation testing of a kernel file, so the gate's strength is
measured (``dcpcheck.mutation``)."""

from __future__ import annotations

import os
from pathlib import Path

import click
import torch

from dcpcheck import files
from dcpcheck.cli import options, preflight
from dcpcheck.cli.common import (
    InputError,
    kernel_errors,
    parse_dcp_sizes,
    stop_reason,
)
from dcpcheck.exit_codes import EXIT_FAIL, EXIT_OK
from dcpcheck.kernels.loading import KernelLoadError
from dcpcheck.mutation import campaign as campaigns
from dcpcheck.mutation import equivalents, report, selection
from dcpcheck.mutation.equivalents import EquivalentsError
from dcpcheck.mutation.operators import OPERATORS
from dcpcheck.mutation.runner import SURVIVED, Gate, GateError
from dcpcheck.op_registry import DEFAULT_OP, OPS
from dcpcheck.ops import package
from dcpcheck.output.console import err, out


def _kernel_files(op: str, kernel: str) -> list[Path]:
    """The files of ``--kernel`` that hold Triton code its routines run (not those read
    only for their callers' lines): what its mutants edit. One that
    cannot be read or parsed is a kernel that does not load (exit 125)."""
    with kernel_errors():
        try:
            judged = package(op).judged_files(kernel)
            found = selection.triton_files([Path(f.path) for f in judged if f.runs])
        except OSError as exc:
            raise KernelLoadError(f"{exc.filename}: cannot read: {exc.strerror}") from None
        except SyntaxError as exc:
            raise KernelLoadError(f"{exc.filename}:{exc.lineno}: syntax error: {exc.msg}") from None
    if not found:
        raise InputError(f"{kernel}: none of its files defines a @triton.jit function to mutate")
    return found


def _check_reports(
    gate: Gate, kernel_files: list[Path], json_path: Path | None, junit_path: Path | None
) -> None:
    """``--json`` and ``--junit`` writable, and none of them a file the campaign reads (a
    kernel file, its mutants file, a scenario file of the gate): exit 2, before any
    mutant runs."""
    preflight.check_report_paths(json_path, junit_path)
    inputs = [("the kernel file", path) for path in kernel_files]
    inputs += [("the mutants file", equivalents.file_for(path)) for path in kernel_files]
    inputs += [("the scenario file", path) for path in gate.scenario_paths()]
    preflight.check_reports_spare_inputs([("--json", json_path), ("--junit", junit_path)], inputs)


@click.command("mutate")
@options.click_option("kernel")
@click.option(
    "--op",
    type=click.Choice(list(OPS)),
    default=DEFAULT_OP,
    show_default=True,
    help="The op whose gate judges the mutants.",
)
@options.click_option(
    "dcp", help="DCP sizes the gate runs besides DCP1 (default: each scenario's own)."
)
@options.click_option("scenario")
@options.click_option("scenario-dir")
@click.option(
    "--search",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Then run the property search over N drawn scenarios on every survivor.",
)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Run a deterministic sample of N mutants, spread over the operators.",
)
@click.option(
    "--mutant",
    "mutant_patterns",
    multiple=True,
    metavar="NAME|GLOB",
    help="Only the mutants so named (repeatable; a survivor's replay names it).",
)
@click.option(
    "--operator",
    "operators",
    multiple=True,
    type=click.Choice(OPERATORS),
    help="Only this operator's mutants (repeatable).",
)
@click.option(
    "--jobs",
    type=click.IntRange(min=1),
    default=None,
    help="Mutants run at once (default: the CPU cores; 4 with a CUDA device).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=1),
    default=600.0,
    show_default=True,
    help="Seconds a mutant's gate may take before it counts as timed out.",
)
@click.option("--list", "list_only", is_flag=True, help="List the mutants and run nothing.")
@click.option(
    "--min-score",
    type=click.FloatRange(0, 100),
    default=None,
    help="Exit 0 when the score reaches this percentage (default: only when none survives).",
)
@click.option(
    "--home",
    type=click.Path(path_type=Path),
    default=files.DEFAULT_HOME,
    show_default=True,
    envvar=files.HOME_ENV,
    help=f"Run directory (env {files.HOME_ENV}): outcomes are cached in HOME/mutants/.",
)
@options.click_option("json")
@options.click_option("junit")
def mutate_command(
    kernel_name: str,
    op: str,
    dcp_text: str | None,
    patterns: tuple[str, ...],
    scenario_dir: Path | None,
    search: int | None,
    limit: int | None,
    mutant_patterns: tuple[str, ...],
    operators: tuple[str, ...],
    jobs: int | None,
    timeout: float,
    list_only: bool,
    min_score: float | None,
    home: Path,
    json_path: Path | None,
    junit_path: Path | None,
) -> None:
    """Mutate the kernel's Triton file(s) one edit at a time and run the op's gate on each
    mutant (its named scenarios at DCP1 and --dcp, in a worker process of its own). Mutants
    that no input can observe are explained in KERNEL.mutants.toml next to the file; those
    of functions that nothing the gate runs reaches are reported unreached, not run.

    Exit 0 when mutants were judged and none survives (or the score reaches --min-score); 1
    when one does, when none was judged (every one explained in the mutants file or not
    compiled: no score), or when the kernel fails its own gate; 2 for bad input (a pattern
    no mutant matches, a bad mutants file, a gate that refuses its arguments); 125 when
    the kernel does not load; 130 on Ctrl-C and 143 on SIGTERM, after the report of what
    finished."""
    kernel_files = _kernel_files(op, kernel_name)
    gate = Gate(
        op,
        kernel_name,
        parse_dcp_sizes(dcp_text) if dcp_text else (),
        patterns,
        search or 0,
        timeout,
        scenario_dir,
    )
    _check_reports(gate, kernel_files, json_path, junit_path)
    try:
        mutants = campaigns.plan(kernel_files, mutant_patterns, limit, operators)
    except campaigns.MutationError as exc:
        raise InputError(str(exc)) from None
    if list_only:
        for mutant in mutants:
            out.print(mutant.name, markup=False, highlight=False)
        out.print(f"{len(mutants)} mutant(s) of {', '.join(map(str, kernel_files))}", markup=False)
        raise SystemExit(EXIT_OK)
    if jobs is None:
        jobs = 4 if torch.cuda.is_available() else max(1, os.cpu_count() or 1)
    done = {False: 0, True: 0}  # outcomes landed, by the gate's pass and the search's
    survived = [0]

    def progress(mutant, outcome, searched: bool) -> None:
        """One line per outcome: ``[k/N]`` in the gate's pass over the N mutants, then
        ``[search k/S]`` in the search's pass over its S survivors."""
        done[searched] += 1
        if searched:
            where = f"search {done[True]}/{survived[0]}"
        else:
            where = f"{done[False]}/{len(mutants)}"
            survived[0] += outcome.outcome == SURVIVED
        err.print(f"[{where}] {outcome.outcome:<12} {mutant.name}", markup=False, highlight=False)

    try:
        found = campaigns.mutate(gate, kernel_files, mutants, home, jobs, progress)
    except (EquivalentsError, GateError) as exc:
        raise InputError(str(exc)) from None
    except campaigns.MutationError as exc:  # the kernel fails its own gate: no mutant ran
        report.write(campaigns.Campaign(gate, kernel_files, error=str(exc)), json_path, junit_path)
        err.print(f"dcpcheck: {exc}; no mutant was judged", markup=False, soft_wrap=True)
        raise SystemExit(EXIT_FAIL) from None
    report.print_campaign(out, found)
    report.write(found, json_path, junit_path)
    if found.stopped is not None:
        raise SystemExit(stop_reason(found.stopped)[1])
    if found.score is None:
        err.print(
            f"dcpcheck: error: no mutant was judged: each of the {len(found.entries)} is "
            "explained by its mutants file or did not compile",
            markup=False,
            soft_wrap=True,
        )
        raise SystemExit(EXIT_FAIL)
    passed = found.score >= min_score if min_score is not None else not found.survivors
    raise SystemExit(EXIT_OK if passed else EXIT_FAIL)
