"""``dcpcheck list``: every op's registered kernels, its mutants and its shipped scenarios
(each op's from its package, ``dcpcheck.ops``), the MLA cache layouts."""

from __future__ import annotations

import click
import torch

from dcpcheck.cases.scenario_files import ScenarioError
from dcpcheck.cli.common import InputError
from dcpcheck.op_registry import OPS
from dcpcheck.ops import package
from dcpcheck.ops.fused_norm_rope.contract import (
    DS_MLA_NOPE_DIM,
    DS_MLA_ROPE_DIM,
    PRESETS,
    CacheLayout,
    IndexFormat,
    IndexScale,
    index_entry_bytes,
    mla_entry_bytes,
)
from dcpcheck.output.console import out

INDEX_HEAD_DIM = PRESETS["deepseek-v3.2"].index_head_dim
"""Every preset's indexer head: 128 fp8 values per token."""


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
    scenarios, the cache layouts with their bytes per token (the MLA cache's at
    kv_lora_rank 512 and rope_dim 64, the shape of every preset, ``auto`` in bf16 or
    fp16; then the indexer cache's formats, index head 128), or the ops dcpcheck judges
    (``--op``)."""
    if what == "ops":
        for name, op in OPS.items():
            out.print(f"{name:18} {op.description}")
        return
    if what == "layouts":
        for layout in CacheLayout:
            size = mla_entry_bytes(layout, DS_MLA_NOPE_DIM, DS_MLA_ROPE_DIM, torch.bfloat16)
            out.print(f"{layout.value:18} {size:4} bytes per token  MLA cache")
        index_bytes = index_entry_bytes(INDEX_HEAD_DIM)
        for fmt in (IndexFormat(s, scale) for s in (False, True) for scale in IndexScale):
            values = "16 x 16 tiles" if fmt.shuffled else "token-major"
            scale = "UE8M0 byte x4" if fmt.scale is IndexScale.MX else "fp32 scale"
            out.print(
                f"index:{fmt.name:12} {index_bytes:4} bytes per token  indexer cache "
                f"(fp8 values {values}, {scale})"
            )
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
