"""``dcpcheck bisect``: the first commit of a kernel file's history that fails the checks,
or the first of a list of vLLM releases that fails (or that fixed a failure)."""

from __future__ import annotations

from pathlib import Path

import click
from rich.markup import escape

from dcpcheck.cli import options
from dcpcheck.cli.common import InputError
from dcpcheck.exit_codes import EXIT_FAIL, EXIT_OK
from dcpcheck.op_registry import DEFAULT_OP, OPS
from dcpcheck.output.console import out
from dcpcheck.workflows import bisection


@click.command("bisect")
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
    default=None,
    help="The kernel function in that file (default: the op's, fused_norm_rope for "
    "fused-norm-rope, _compute_slot_mappings_kernel for slot-mapping).",
)
@click.option("--good", default=None, help="A revision where the kernel passes.")
@click.option("--bad", default="HEAD", show_default=True, help="A revision where it fails.")
@click.option(
    "--releases",
    "releases_text",
    default=None,
    metavar="V1,V2,...",
    help="Bisect published vLLM releases (oldest first, e.g. 0.28.0,0.29.0,0.30.0) instead "
    "of a file's git history: each is run as --kernel vllm==V.",
)
@click.option(
    "--find",
    type=click.Choice([f.value for f in bisection.Find]),
    default=bisection.Find.FIRST_BAD.value,
    show_default=True,
    help="With --releases: the first release that fails (the oldest must pass), or the "
    "first that passes (the oldest must fail), like git bisect's --term-old/--term-new. "
    "Both ends are run first.",
)
@click.option(
    "--scenario",
    "patterns",
    multiple=True,
    metavar="NAME|GLOB",
    help="Scenarios to check each revision with (default: all; a few small ones "
    "keep each step to seconds).",
)
@click.option(
    "--op",
    type=click.Choice(list(OPS)),
    default=DEFAULT_OP,
    show_default=True,
    help="The op the kernel implements (`dcpcheck list ops`).",
)
@options.click_option(
    "dcp", help="DCP sizes every revision is checked at (default: each scenario's own)."
)
@options.click_option(
    "seed", help="Override every scenario's value seed (as `dcpcheck run --seed`)."
)
@options.click_option("device")
@click.option(
    "--scenario-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Where scenario files live (default: the shipped ones).",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0, min_open=True),
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
    releases_text,
    find,
    patterns,
    op,
    dcp_text,
    seed,
    device,
    scenario_dir,
    timeout_s,
) -> None:
    """Find the first commit that broke a kernel file: walk its history with `git show`
    (no checkout, no rebuild), run the checks at both ends and then at each midpoint in a
    fresh process, and skip revisions that do not load. Exit 0 when the first bad commit
    is named; 1 when the ends do not differ as --good and --bad say, or skipped revisions
    hide it.

    With --releases, bisect published vLLM releases instead (--find first-fixed names the
    release that fixed a failure)."""
    options = bisection.RunOptions(
        scenarios=tuple(patterns),
        dcp=dcp_text,
        seed=seed,
        device=device,
        scenario_dir=scenario_dir,
        timeout_s=timeout_s,
        op=op,
    )
    function = function or OPS[op].function
    try:
        if releases_text is not None:
            if kernel_spec is not None or rel_file is not None or good is not None:
                raise InputError("bisect: --releases takes no FILE:FUNCTION, --file or --good")
            versions = [v.strip() for v in releases_text.split(",") if v.strip()]
            result = bisection.bisect_releases(versions, bisection.Find(find), function, options)
        else:
            if kernel_spec is not None:
                rel_file, _, named_function = kernel_spec.rpartition(":")
                function = named_function or function
            if not rel_file:
                raise InputError("bisect: give --file REL (or FILE:FUNCTION), or --releases")
            if good is None:
                raise InputError("bisect: give --good REV, a revision where the kernel passes")
            result = bisection.bisect(repo, rel_file, good, bad, function, options)
    except bisection.BisectError as exc:
        raise InputError(str(exc)) from None
    for line in bisection.render(result):
        out.print(escape(line), soft_wrap=True)
    raise SystemExit(EXIT_OK if result.first_bad is not None else EXIT_FAIL)
