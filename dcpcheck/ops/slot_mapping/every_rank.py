"""The attention backends' local-length function (``get_dcp_local_seq_lens``, 0.11.1 on)
asked for every rank at once: its ``dcp_rank`` ``None`` (or not given), it returns
``[requests, dcp_size]``, column ``r`` rank ``r``'s lengths. The runners ask it for one
rank; the MLA metadata builder asks it for every rank, for the context lengths of a chunked
prefill that it splits over the ranks (``vllm/v1/attention/backends/mla/common.py`` to
0.14.1, ``vllm/model_executor/layers/attention/mla_attention.py`` from 0.15.0), and so
does the sparse indexer from 0.25.0 (``vllm/v1/attention/backends/mla/indexer.py``), each
under DCP only. The function's two branches are different code, so each way it is asked
is judged (``VllmLocalSeqLens.asks``), where a file of its release asks it so
(:func:`every_rank_callers`, read from the release's files, never declared).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass

import torch

from dcpcheck.ops.slot_mapping.contract import LocalSeqLensInputs

SEQ_LENS_FUNCTION = "get_dcp_local_seq_lens"

DCP_GUARD = re.compile(r"\bdcp_(?:world_)?size\s*>\s*1\b")
"""An ``if`` test that runs its body under DCP only."""


@dataclass(frozen=True)
class EveryRankCallers:
    """The calls of a release's files that ask :data:`SEQ_LENS_FUNCTION` for every rank at
    once (``file:line`` each), and whether each runs under DCP only (an enclosing ``if``
    statement or expression testing :data:`DCP_GUARD`, or a name assigned that test)."""

    lines: tuple[str, ...]
    under_dcp_only: bool

    def __bool__(self) -> bool:
        return bool(self.lines)


def _rank_argument(call: ast.Call) -> ast.expr | None:
    """What a call passes as ``dcp_rank`` (the third argument), None when nothing."""
    if len(call.args) > 2:
        return call.args[2]
    return next((k.value for k in call.keywords if k.arg == "dcp_rank"), None)


def every_rank_callers(sources: dict[str, str]) -> EveryRankCallers:
    """The calls of :data:`SEQ_LENS_FUNCTION` in ``sources`` (``file`` -> its text) whose
    ``dcp_rank`` is ``None`` or not given: each asks every rank's lengths at once."""
    lines, guarded = [], []
    for where, source in sources.items():
        if SEQ_LENS_FUNCTION not in source:  # most of a release's files: nothing to parse
            continue
        tree = ast.parse(source)
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        flags = {
            target.id
            for node in ast.walk(tree)
            if isinstance(node, ast.Assign) and DCP_GUARD.search(ast.unparse(node.value))
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not _names(node.func, SEQ_LENS_FUNCTION):
                continue
            rank = _rank_argument(node)
            if rank is not None and not (isinstance(rank, ast.Constant) and rank.value is None):
                continue
            lines.append(f"{where}:{node.lineno}")
            guarded.append(_under_dcp_guard(node, parents, flags))
    return EveryRankCallers(tuple(sorted(lines)), all(guarded))


def _names(func: ast.expr, name: str) -> bool:
    """Whether a call's ``func`` is ``name`` or ``something.name``."""
    return (isinstance(func, ast.Name) and func.id == name) or (
        isinstance(func, ast.Attribute) and func.attr == name
    )


def _under_dcp_guard(node: ast.AST, parents: dict[ast.AST, ast.AST], flags: set[str]) -> bool:
    """Whether ``node`` lies in the body of an ``if`` statement or expression whose test is
    :data:`DCP_GUARD`, or a name of ``flags`` (each assigned such a test)."""
    child, parent = node, parents.get(node)
    while parent is not None:
        if isinstance(parent, ast.If | ast.IfExp):
            taken = child in parent.body if isinstance(parent, ast.If) else child is parent.body
            test = ast.unparse(parent.test)
            if taken and (DCP_GUARD.search(test) or test in flags):
                return True
        child, parent = parent, parents.get(parent)
    return False


@dataclass(frozen=True)
class EveryRankAsk:
    """:data:`SEQ_LENS_FUNCTION` asked for every rank at once (``dcp_rank=None``), as
    ``callers`` ask it: it returns ``[requests, dcp_size]``, column ``r`` rank ``r``'s
    lengths, and each rank's launch writes its own column. A result of another shape is
    the routine's error."""

    function: Callable[..., torch.Tensor]
    callers: EveryRankCallers

    @property
    def label(self) -> str:
        return f"asked for every rank at once ({', '.join(self.callers.lines)})"

    def not_applicable(self, inputs: LocalSeqLensInputs) -> str | None:
        """DCP1 where every caller asks only under DCP."""
        if inputs.dcp_size == 1 and self.callers.under_dcp_only:
            return (
                f"{SEQ_LENS_FUNCTION} is asked for every rank at once only under DCP "
                f"({', '.join(self.callers.lines)})"
            )
        return None

    def __call__(self, inputs: LocalSeqLensInputs, local_seq_lens: torch.Tensor) -> None:
        lengths = inputs.seq_lens[: inputs.num_reqs].cpu()  # the callers pass CPU lengths
        every = self.function(lengths, inputs.dcp_size, None, inputs.interleave)
        shape = (inputs.num_reqs, inputs.dcp_size)
        if tuple(every.shape) != shape:
            raise ValueError(
                f"{SEQ_LENS_FUNCTION}(..., dcp_rank=None) returned shape "
                f"{list(every.shape)}, not [requests, dcp_size] = {list(shape)}"
            )
        column = every[:, inputs.dcp_rank]
        local_seq_lens[: inputs.num_reqs] = column.to(local_seq_lens.device)
