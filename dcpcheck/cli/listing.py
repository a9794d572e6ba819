"""``dcpcheck list``: registered kernels, the selftest's mutants, the shipped scenarios."""

from __future__ import annotations

import click

from dcpcheck.cli.common import InputError
from dcpcheck.output.console import out
from dcpcheck.spec.scenario import SCENARIO_DIR, ScenarioError, load_scenarios
from dcpcheck.workflows import selftest


@click.command("list")
@click.argument("what", type=click.Choice(["kernels", "mutants", "scenarios"]), default="kernels")
def list_command(what: str) -> None:
    """List the registered kernels, the selftest's mutants, or the shipped scenarios."""
    if what == "mutants":
        for variant in selftest.MUTANTS:
            out.print(f"{variant.name:34} {variant.description}", soft_wrap=True)
        return
    if what == "kernels":
        from dcpcheck.kernels.registry import KERNELS

        for entry in KERNELS.values():
            out.print(f"{entry.name:24} {entry.description}")
        return
    try:
        scenarios = load_scenarios([], SCENARIO_DIR)
    except ScenarioError as exc:
        raise InputError(str(exc)) from None
    for s in scenarios:
        out.print(f"{s.name:32} {s.description}")
