"""The commands one rank runs (``python -m dcpcheck {run,hash} ...`` in a rank's
environment, under torchrun or the launcher; ``dcpcheck.cli.main`` hands them here): click
options onto ``dcpcheck.distributed.ranks``; rank 0
prints and writes the reports.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import click

from dcpcheck import files
from dcpcheck.backend import BackendError
from dcpcheck.cases.options import RANK_HASH
from dcpcheck.cases.scenario_files import ScenarioError
from dcpcheck.cases.verdicts import KernelError, RunConfig
from dcpcheck.cli import common, options, preflight
from dcpcheck.cli.hashing import (
    STAGE_OPTION,
    chain_files,
    chain_json,
    chain_stages,
    check_chain_sizes,
    check_json,
    hash_config,
    print_chain,
    stream_options,
)
from dcpcheck.cli.kernel_process import loaded_here
from dcpcheck.distributed.group import (
    DistributedUsageError,
    PeerLost,
    Progress,
    RankGroup,
    rank_group,
)
from dcpcheck.distributed.ranks import distributed_sizes, run_distributed
from dcpcheck.distributed.streams import compare_streams_distributed, streams_to_json
from dcpcheck.exit_codes import EXIT_FAIL, EXIT_INTERRUPTED, EXIT_OK, EXIT_PEER_LOST
from dcpcheck.ops import session_op
from dcpcheck.output import console
from dcpcheck.output.report import ReportNotWritten, write_reports
from dcpcheck.workflows.session import RunOutcome


@click.group(help="Real ranks: dcpcheck with one DCP rank per process, through torch.distributed.")
def commands() -> None:
    pass


@contextmanager
def _joined(device: str, rank_timeout_s: float, progress: Progress) -> Iterator[RankGroup]:
    try:
        with rank_group(device, rank_timeout_s, progress) as group:
            if group.is_root:
                console.err.print(
                    f"[bold]backend:[/] {group.backend.describe()}, {group.world_size} rank(s) "
                    f"over {group.transport}"
                )
            yield group
    except (BackendError, DistributedUsageError) as exc:
        raise common.InputError(str(exc)) from None


@commands.command("run")
@options.click_options("ranks")
@click.pass_obj
def run_command(
    progress: Progress,
    dcp_text,
    patterns,
    scenario_dir,
    seed,
    json_path,
    junit_path,
    no_tokens,
    stats,
    ds_mla_scale,
    oracle,
    fail_fast,
    kernel_name,
    adapter,
    device,
    rank_timeout_s,
) -> None:
    """`dcpcheck run` with this process as one rank; rank 0 prints the report."""
    judged = session_op()
    folder = judged.scenarios if scenario_dir is None else scenario_dir
    try:
        scenarios = judged.load_scenarios(list(patterns), folder)
    except ScenarioError as exc:
        raise common.InputError(str(exc)) from None
    preflight.check_report_paths(json_path, junit_path)
    inputs = preflight.run_inputs([kernel_name], [s.source for s in scenarios])
    preflight.check_reports_spare_inputs([("--json", json_path), ("--junit", junit_path)], inputs)
    config = options.config(RunConfig, options.option_values(click.get_current_context(), "ranks"))
    with _joined(device, rank_timeout_s, progress) as group:
        if group.is_root:
            common.announce_oracle(config.oracle)
        kernel = loaded_here(judged.name, kernel_name, adapter)
        started = time.perf_counter()
        results = run_distributed(kernel, scenarios, config, group, tokens=not no_tokens)
        if results is None:
            return
        outcome = RunOutcome(results)
        try:
            write_reports(
                results,
                config,
                group.backend,
                json_path,
                junit_path,
                partial=False,
                kernel_files=common.kernel_files(judged.name, kernel_name),
                op=judged.name,
            )
        except ReportNotWritten as exc:
            raise common.InputError(str(exc)) from None
        console.print_results(results)
        if stats:
            console.print_stats(results, time.perf_counter() - started, None)
    common.require_judged(results)
    raise SystemExit(outcome.exit_code)


@commands.command("hash")
@options.click_option(
    "dcp",
    help="The world size, and 1 (DCP1 always runs as the baseline, on rank 0).",
    metavar="N[,N]",
)
@stream_options
@STAGE_OPTION
@click.option(
    "--json",
    "json_path",
    type=click.Path(path_type=Path),
    default=None,
    help="Write every digest, in full, and the verdict here.",
)
@options.click_options("ranks", RANK_HASH)
@click.pass_obj
def hash_command(
    progress: Progress,
    dcp_text,
    prompts,
    steps,
    layout_name,
    preset,
    interleave,
    seed,
    stage_texts,
    json_path,
    kernel_name,
    adapter,
    device,
    rank_timeout_s,
) -> None:
    """`dcpcheck hash` with this process as one rank: decode attention is merged across
    the ranks by all-gather; rank 0 prints the digests."""
    dcp_sizes = common.parse_dcp_sizes(dcp_text) if dcp_text is not None else None
    check_json(json_path, kernel_name, stage_texts)
    with _joined(device, rank_timeout_s, progress) as group:
        distributed_sizes(dcp_sizes, group.world_size)
        stream_config = hash_config(
            group.backend, layout_name, preset, prompts, steps, interleave, seed
        )
        check_chain_sizes(stream_config, [group.world_size])
        fused, stages = chain_stages(kernel_name, adapter, stage_texts)
        chosen = adapter if fused.spec == kernel_name else "auto"
        kernel = loaded_here(fused.name, fused.spec, chosen)
        if group.rank == 0:
            print_chain(fused, stages)
        try:
            comparison = compare_streams_distributed(kernel, stream_config, group, stages)
        except KernelError as exc:  # on rank 0 only: it still leaves with the others
            console.err.print(f"dcpcheck: the kernel raised: {exc}", markup=False, soft_wrap=True)
            code = EXIT_FAIL
        else:
            if comparison is None:
                return
            if json_path is not None:
                backend_name = "interpreter" if group.backend.interpreted else "cuda"
                text = streams_to_json(
                    comparison,
                    kernel=kernel_name,
                    backend=backend_name,
                    kernel_files=chain_files(fused, stages),
                    chain=chain_json(fused, stages),
                )
                files.write_atomic(json_path, text)
            console.print_streams(comparison)
            code = EXIT_OK if comparison.identical else EXIT_FAIL
    raise SystemExit(code)


def _exit_code(argv: Sequence[str] | None, progress: Progress) -> int:
    """Run a command; its exit code, with click's and the collectives' errors as one line
    on stderr (``dcpcheck.cli.main``'s format)."""
    try:
        commands.main(args=argv, standalone_mode=False, obj=progress)
    except SystemExit as exc:
        return EXIT_OK if exc.code is None else int(exc.code)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        console.err.print(f"dcpcheck: error: {exc.format_message()}", markup=False, soft_wrap=True)
        return exc.exit_code
    except click.exceptions.Abort:
        console.err.print("dcpcheck: interrupted", markup=False)
        return EXIT_INTERRUPTED
    except PeerLost as exc:
        if progress.path is None:  # under launch(), the launcher names the rank at fault
            console.err.print(f"dcpcheck: {exc}", markup=False, soft_wrap=True)
        return EXIT_PEER_LOST
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m dcpcheck {run,hash} ...`` as one rank (in torchrun's environment or
    :func:`launch`'s). The last heartbeat carries the exit code, so the launcher can tell
    a rank that ended by itself from one that died."""
    progress = Progress.from_environment()
    code = _exit_code(argv, progress)
    progress.finished(code)
    sys.exit(code)
