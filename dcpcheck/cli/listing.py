"""``dcpcheck list``: every op's registered kernels, its mutants, its shipped scenarios and
its cache layouts (each op's from its package, ``dcpcheck.ops``)."""

from __future__ import annotations

import click

from dcpcheck.cases.scenario_files import ScenarioError
from dcpcheck.cli.common import InputError
from dcpcheck.op_registry import OPS
from dcpcheck.ops import package
from dcpcheck.output.console import out


def _op_kernels(op: str) -> list[tuple[str, str]]:
    """An op's kernels by name, with what each is."""
    from dcpcheck.backend import current_backend

    current_backend()  # its kernels are Triton: the backend is chosen before they are defined
    return list(package(op).kernels().items())


def _print_by_op(rows: dict[str, list[tuple[str, str]]]) -> None:
    """Each op's (name, what it is) rows under the op's ``--op`` line."""
    for index, (op, named) in enumerate(rows.items()):
        out.print(f"{chr(10) if index else ''}--op {op}:")
        width = max((len(name) for name, _ in named), default=0) + 1
        for name, description in named:
            out.print(f"{name:{width}} {description}", soft_wrap=True)


@click.command("list")
@click.argument(
    "what",
    type=click.Choice(["kernels", "mutants", "scenarios", "layouts", "ops"]),
    default="kernels",
)
def list_command(what: str) -> None:
    """List every op's registered kernels, its mutants (the selftest's), its shipped
    scenarios, the cache layouts it writes with their bytes per token (the fused op's MLA
    cache at kv_lora_rank 512 and rope_dim 64, the shape of every preset, ``auto`` in
    bf16; then its indexer cache's formats, index head 128), or the ops dcpcheck judges
    (``--op``)."""
    if what == "ops":
        for name, op in OPS.items():
            out.print(f"{name:18} {op.description}")
        return
    if what == "layouts":
        for op in OPS:
            for name, what_it_is in package(op).layouts().items():
                out.print(f"{name:18} {what_it_is}")
        return
    if what == "mutants":
        every = {op: _op_kernels(op) for op in OPS}
        _print_by_op({op: [k for k in named if k[0] != "default"] for op, named in every.items()})
        return
    if what == "kernels":
        _print_by_op({op: _op_kernels(op) for op in OPS})
        return
    try:
        shipped = {op: package(op).load_scenarios([], package(op).scenarios) for op in OPS}
    except ScenarioError as exc:
        raise InputError(str(exc)) from None
    _print_by_op({op: [(s.name, s.description) for s in named] for op, named in shipped.items()})
