"""``dcpcheck selftest``: dcpcheck against every mutant of the project's kernel."""

from __future__ import annotations

import click

from dcpcheck.cli.common import InputError, device_option, open_backend
from dcpcheck.exit_codes import EXIT_FAIL, EXIT_OK
from dcpcheck.output.console import err, out
from dcpcheck.workflows import selftest


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
@device_option
def selftest_command(profile_name: str, mutant_names: tuple[str, ...], device: str) -> None:
    """Run dcpcheck against every mutant of the project's kernel: exit 0 only when the
    correct kernel passes and every mutant is caught."""
    mutants = selftest.MUTANTS
    if mutant_names:
        known = {m.name: m for m in mutants}
        unknown = [n for n in mutant_names if n not in known]
        if unknown:
            raise InputError(f"--mutant: unknown {', '.join(unknown)} (see dcpcheck list mutants)")
        mutants = tuple(known[n] for n in mutant_names)
    backend = open_backend(device)
    with err.status("selftest") as status:
        report_ = selftest.run_selftest(
            selftest.PROFILES[profile_name],
            backend,
            mutants=mutants,
            on_row=lambda row: status.update(f"selftest: {row.kernel} {row.status.value}"),
        )
    out.print(selftest.selftest_table(report_))
    raise SystemExit(EXIT_OK if report_.passed else EXIT_FAIL)
