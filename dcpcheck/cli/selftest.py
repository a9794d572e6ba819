"""``dcpcheck selftest``: dcpcheck against every mutant of the project's kernels, every
op's (each op's ``selftest``, ``dcpcheck.ops``)."""

from __future__ import annotations

import click

from dcpcheck.cases.verdicts import SelftestReport
from dcpcheck.cli import op_run, options
from dcpcheck.cli.common import InputError, open_backend
from dcpcheck.exit_codes import EXIT_FAIL, EXIT_OK
from dcpcheck.op_registry import OPS
from dcpcheck.ops import SelftestRefused, package
from dcpcheck.output.console import err, out, selftest_table

PROFILES = {
    name: description for op in OPS for name, description in package(op).selftest_profiles().items()
}
"""Every profile of an op's own selftest (``--profile``), with what it does."""

DEFAULTS = ", ".join(
    f"{profile} for {op}"
    for op in OPS
    if (profile := package(op).selftest_default_profile()) is not None
)
"""The profile each op with a selftest of its own runs when ``--profile`` names none."""


@click.command("selftest")
@click.option(
    "--profile",
    "profile_name",
    type=click.Choice(list(PROFILES)),
    default=None,
    help="; ".join(f"{name}: {description}" for name, description in PROFILES.items())
    + f" [default: {DEFAULTS}]",
)
@click.option(
    "--mutant",
    "mutant_names",
    multiple=True,
    metavar="NAME",
    help="Only these mutants (repeatable; see `dcpcheck list mutants`).",
)
@click.option(
    "--op",
    type=click.Choice(list(OPS)),
    default=None,
    help="Only this op's kernel and mutants (default: every op's).",
)
@options.click_option("device")
@click.pass_context
def selftest_command(
    ctx: click.Context,
    profile_name: str | None,
    mutant_names: tuple[str, ...],
    op: str | None,
    device: str,
) -> None:
    """Run dcpcheck against every mutant of the project's kernels, every op's: exit 0 only
    when each correct kernel passes and every mutant is caught. An op without a selftest
    of its own is judged on its shipped scenarios (`--profile` and `--mutant` are the
    fused op's, whose selftest is its own)."""
    if op is not None and not package(op).has_own_selftest:
        op_run.refuse_other_options(ctx, op, {"op", "device"})
    backend = open_backend(device)
    reports: dict[str, SelftestReport] = {}
    for name in OPS:
        if op not in (None, name):
            continue
        tested = package(name)
        own = tested.has_own_selftest
        with err.status("selftest") as status:
            try:
                reports[name] = tested.selftest(
                    backend,
                    _progress(status),
                    profile_name if own else None,
                    mutant_names if own else (),
                )
            except SelftestRefused as exc:
                raise InputError(str(exc)) from None
        out.print(selftest_table(reports[name], op=name))
    for name, report in reports.items():
        if report.judged_none:
            err.print(
                f"dcpcheck: error: {name}: no mutant was judged (each was skipped): "
                "this selftest proves nothing of the checks",
                markup=False,
                soft_wrap=True,
            )
    raise SystemExit(EXIT_OK if all(r.passed for r in reports.values()) else EXIT_FAIL)


def _progress(status):
    return lambda row: status.update(f"selftest: {row.kernel} {row.status.value}")
