"""``dcpcheck selftest``: dcpcheck against every mutant of the project's kernels, every
op's."""

from __future__ import annotations

import click

from dcpcheck.cases.verdicts import SelftestReport
from dcpcheck.cli import op_run, options
from dcpcheck.cli.common import InputError, open_backend
from dcpcheck.exit_codes import EXIT_FAIL, EXIT_OK
from dcpcheck.op_registry import FUSED_NORM_ROPE, OPS
from dcpcheck.ops import package, packaged
from dcpcheck.ops.fused_norm_rope import selftest
from dcpcheck.output.console import err, out, selftest_table


@click.command("selftest")
@click.option(
    "--profile",
    "profile_name",
    type=click.Choice(list(selftest.PROFILES)),
    default="ci",
    show_default=True,
    help="; ".join(f"{name}: {p.description}" for name, p in selftest.PROFILES.items()),
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
    profile_name: str,
    mutant_names: tuple[str, ...],
    op: str | None,
    device: str,
) -> None:
    """Run dcpcheck against every mutant of the project's kernels, every op's: exit 0 only
    when each correct kernel passes and every mutant is caught. The slot-mapping op's are
    judged on its shipped scenarios (`--profile` and `--mutant` are the fused op's)."""
    if op is not None and op != FUSED_NORM_ROPE:
        op_run.refuse_other_options(ctx, op, {"op", "device"})
    backend = open_backend(device)
    reports: dict[str, SelftestReport] = {}
    if op in (None, FUSED_NORM_ROPE):
        reports[FUSED_NORM_ROPE] = _fused(profile_name, mutant_names, backend)
    for name in packaged():
        if op in (None, name):
            with err.status("selftest") as status:
                reports[name] = package(name).selftest(backend, _progress(status))
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


def _fused(profile_name: str, mutant_names: tuple[str, ...], backend) -> SelftestReport:
    """The fused op's selftest, its table printed. Mutants named that all cannot show in
    this run are refused before any work: the selftest would judge none of them."""
    mutants = selftest.MUTANTS
    profile = selftest.PROFILES[profile_name]
    if mutant_names:
        known = {m.name: m for m in mutants}
        unknown = [n for n in mutant_names if n not in known]
        if unknown:
            raise InputError(f"--mutant: unknown {', '.join(unknown)} (see dcpcheck list mutants)")
        mutants = tuple(known[n] for n in mutant_names)
        unable = selftest.gpu_scale_skip_reason(profile, backend)
        if unable is not None and all(m.gpu_sized for m in mutants):
            raise InputError(
                f"--mutant: {', '.join(mutant_names)} cannot show in this run ({unable}): "
                "no mutant would be judged"
            )
    with err.status("selftest") as status:
        report = selftest.run_selftest(profile, backend, mutants=mutants, on_row=_progress(status))
    out.print(selftest_table(report, op=FUSED_NORM_ROPE))
    return report
