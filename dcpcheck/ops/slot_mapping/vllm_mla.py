"""The local sequence lengths of vLLM's releases before ``get_dcp_local_seq_lens``
(0.10.2, 0.11.0) as a routine of the op: the MLA metadata builder
(``vllm/v1/attention/backends/mla/common.py``) computed them itself, in one statement of
its ``build`` under ``if self.dcp_world_size > 1:``, rewriting the decode requests'
lengths in place (``seq_lens[:num_decodes] = ...``, from the builder's DCP size and rank).

That statement is the routine: it is read from the release's file (:func:`builder_lengths`)
and compiled alone, at its own lines of that file, as the body of a function of the names
it uses (``self``, ``seq_lens``, ``num_decodes``) with ``torch`` as its only global; the
builder's ``self`` is a stand-in carrying ``dcp_world_size`` and ``dcp_rank``. Every request
of a case is a decode request to it (the builder rewrites the decodes' lengths; a prefill's
context is split by other code). What its release never asks it is not applicable: DCP1
(the statement runs under ``dcp_world_size > 1`` only) and an interleave above 1 (those
releases have no interleave setting: the statement deals positions to the ranks one at a
time).
"""

from __future__ import annotations

import ast
import builtins
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch

from dcpcheck.adapters.protocol import AdapterError
from dcpcheck.kernels.loading import source_of
from dcpcheck.ops.slot_mapping.contract import LocalSeqLensInputs

GUARD = "self.dcp_world_size > 1"
"""The condition the builder computes the local lengths under."""

TARGET = "seq_lens[:num_decodes]"
"""What the statement assigns: the decode requests' lengths."""

NAMES = ("self", "seq_lens", "num_decodes")
"""The names the statement may use, the parameters it is compiled with."""


@dataclass(frozen=True)
class BuilderLengths:
    """The builder's statement compiled alone (module docstring), called as the
    attention backends' function is: ``(lengths, dcp_size, dcp_rank, interleave)`` ->
    every request's length on rank ``dcp_rank``. ``evidence``: ``file:line`` of it."""

    statement: Callable[..., None]
    evidence: str

    def __call__(
        self, lengths: torch.Tensor, dcp_size: int, dcp_rank: int, interleave: int
    ) -> torch.Tensor:
        builder = SimpleNamespace(dcp_world_size=dcp_size, dcp_rank=dcp_rank)
        seq_lens = lengths.clone()
        self.statement(builder, seq_lens, seq_lens.shape[0])
        return seq_lens

    def not_applicable(self, inputs: LocalSeqLensInputs) -> str | None:
        """What the release never asks the statement (module docstring), or None."""
        if inputs.dcp_size == 1:
            return f"the MLA builder computes local lengths only under DCP ({self.evidence})"
        if inputs.interleave > 1:
            return (
                "this release has no interleave setting: its MLA builder deals positions "
                f"to the ranks one at a time ({self.evidence})"
            )
        return None


def _statement(tree: ast.Module) -> ast.Assign | None:
    """The assignment to :data:`TARGET` under ``if`` :data:`GUARD`, if the file has one."""
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) == GUARD:
            for child in node.body:
                if isinstance(child, ast.Assign) and [ast.unparse(t) for t in child.targets] == [
                    TARGET
                ]:
                    return child
    return None


def builder_lengths(path: Path, where: str) -> BuilderLengths:
    """The MLA builder's local-length statement of the file at ``path`` (module
    docstring); ``AdapterError`` when the file has none or it uses other names."""
    statement = _statement(ast.parse(source_of(path)))
    if statement is None:
        raise AdapterError(f"{where}: {path.name} computes no {TARGET} under `if {GUARD}:`")
    used = {n.id for n in ast.walk(statement) if isinstance(n, ast.Name)}
    if not used <= set(NAMES):
        others = ", ".join(sorted(used - set(NAMES)))
        raise AdapterError(f"{where}: {path.name}:{statement.lineno} uses {others} as well")
    module = ast.parse(f"def builder_lengths({', '.join(NAMES)}):\n    pass\n")
    ast.increment_lineno(module, statement.lineno - 1)  # the def at the statement's line
    function = module.body[0]
    assert isinstance(function, ast.FunctionDef)
    function.body = [statement]
    namespace: dict[str, object] = {"torch": torch, "__builtins__": builtins}
    exec(compile(module, str(path), "exec"), namespace)  # the release's own statement
    return BuilderLengths(namespace["builder_lengths"], f"{path.name}:{statement.lineno}")  # type: ignore[arg-type]
