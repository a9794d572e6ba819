"""Which mutants a run takes: the files of a kernel that hold Triton code, the mutants a
``--mutant`` pattern names, and a deterministic sample spread over the operators
(``--limit``)."""

from __future__ import annotations

import ast
import fnmatch
from collections.abc import Sequence
from pathlib import Path

from dcpcheck.mutation.operators import OPERATORS, Mutant, jit_functions


def triton_files(paths: Sequence[Path]) -> list[Path]:
    """The files of ``paths`` that define a ``@triton.jit`` function (read from their
    syntax tree, not their text): what a kernel's mutants are edits of (its host code that
    launches them lives there or is not mutated)."""
    return [p for p in paths if any(jit_functions(ast.parse(p.read_bytes(), str(p))))]


def named(mutants: Sequence[Mutant], patterns: Sequence[str]) -> list[Mutant]:
    """The mutants whose name is one of ``patterns`` or matches one as a glob."""
    return [m for m in mutants if any(fnmatch.fnmatchcase(m.name, p) for p in patterns)]


def sample(mutants: Sequence[Mutant], limit: int) -> list[Mutant]:
    """At most ``limit`` of ``mutants``, the same on every run: the operators take turns
    (in ``OPERATORS`` order), each giving its mutants evenly spaced through the file."""
    by_operator = {op: [m for m in mutants if m.operator == op] for op in OPERATORS}
    share = {op: 0 for op in OPERATORS}
    left = limit
    while left > 0 and any(share[op] < len(by_operator[op]) for op in OPERATORS):
        for op in OPERATORS:
            if left and share[op] < len(by_operator[op]):
                share[op] += 1
                left -= 1
    chosen: list[Mutant] = []
    for op in OPERATORS:
        pool, count = by_operator[op], share[op]
        chosen += [pool[(i * len(pool)) // count] for i in range(count)] if count else []
    order = {m.name: i for i, m in enumerate(mutants)}
    return sorted(chosen, key=lambda m: order[m.name])
