"""Which functions of a kernel file the gate can reach: those it ran (``dcpcheck.kernels.ran``,
recorded while the unedited kernel passed its gate) and every function of the file they
name, transitively. A mutant of any other function is an edit of code that the routines
the op judges never call, under any input: the release files hold other entry points
(another cache layout's writer, a helper of another backend), and running their mutants
through the gate only counts survivors that no scenario could kill.

The closure reads names, not calls, so it over-approximates: a function is reached when a
reached one mentions its name anywhere (a call, a launch ``kernel[grid](...)``, a
reference passed along, a module-level name whose value mentions it), a class when its
name is mentioned (then its class-level statements and dunder methods: its body runs on
import, which names no other method), a method when any reached code reads an attribute
of its name. Over-approximating can
only keep a mutant in the run, never skip one the gate could see.
"""

from __future__ import annotations

import ast
from collections.abc import Collection
from pathlib import Path


def _definitions(tree: ast.Module) -> dict[str, list[ast.AST]]:
    """Every function and class of ``tree``, nested ones and methods included, and every
    name the module's own statements assign (a table of kernels, an alias), by name."""
    found: dict[str, list[ast.AST]] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.setdefault(node.name, []).append(node)
    for statement in tree.body:
        if isinstance(statement, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        found.setdefault(name.id, []).append(statement)
    return found


def _mentioned(node: ast.AST) -> set[str]:
    """The names ``node``'s body reads: bare names and attribute names."""
    names: set[str] = set()
    for inner in ast.walk(node):
        if isinstance(inner, ast.Name):
            names.add(inner.id)
        elif isinstance(inner, ast.Attribute):
            names.add(inner.attr)
    return names


def _class_mentions(node: ast.ClassDef) -> set[str]:
    """What naming a class reaches: its bases, decorators and class-level statements, and
    its dunder methods (construction, calls, operators); any other method is reached by
    reading an attribute of its name."""
    methods = [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    names = {m.name for m in methods if m.name.startswith("__") and m.name.endswith("__")}
    for part in [*node.bases, *node.keywords, *node.decorator_list, *node.body]:
        if part not in methods:
            names |= _mentioned(part)
    return names


def reachable(path: Path, ran: Collection[str]) -> set[str]:
    """The names of the functions and classes of ``path`` that the functions named ``ran``
    reach (module docstring), ``ran`` included (``<module>``, the file's own statements,
    among them once it was imported)."""
    definitions = _definitions(ast.parse(path.read_bytes(), str(path)))
    reached: set[str] = set(ran)
    pending = [name for name in ran if name in definitions]
    expanded: set[str] = set()
    while pending:
        name = pending.pop()
        if name in expanded:
            continue
        expanded.add(name)
        reached.add(name)
        for node in definitions[name]:
            mentioned = (
                _class_mentions(node) if isinstance(node, ast.ClassDef) else _mentioned(node)
            )
            pending += [m for m in mentioned if m in definitions and m not in expanded]
    return reached
