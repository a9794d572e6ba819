"""Mutants of a kernel file: one edit each of its syntax tree, inside its ``@triton.jit``
functions and the host functions that launch them (a function that calls
``kernel[grid](...)`` for a jit function ``kernel`` of the file), and of the file's
module-level named constants those use.

Each edit replaces the source text of one node (``ast``'s positions) with the edited
node unparsed, in parentheses for an expression, and keeps the file's line count: a
mutant's tracebacks, Triton's error messages and its diff point at the kernel's own
lines. The operators (``OPERATORS``), each what a one-line slip in a DCP kernel looks like:

* ``compare``: ``<`` / ``<=``, ``>`` / ``>=``, ``==`` / ``!=`` flipped;
* ``mask-conjunct``: one side of ``a & b`` (or ``a and b``) dropped;
* ``early-return``: the condition of an ``if ...: return`` negated, or the ``if`` removed;
* ``store-removed``: a ``tl.store`` or ``tl.atomic_*`` statement removed;
* ``branch-swapped``: ``tl.where(c, a, b)``'s branches swapped; a load's ``other=`` changed
  (to 0, or to 1 where it is 0);
* ``offset``: the pointer of a ``tl.load`` or ``tl.store`` moved by one element each way;
* ``arithmetic``: ``+`` / ``-``, ``*`` / ``/``, ``//`` to ``*``, ``%`` to ``//``;
* ``constant``: a number in a function set to 0, 1 and -1 (those it is not), an integer
  moved by one, a float by one fp32 ulp; a module-level named constant moved by one unit
  and by one fp32 ulp; ``True`` / ``False`` flipped;
* ``dtype``: a ``.to(dtype)`` conversion removed, or its dtype changed (``DTYPE_SWAPS``);
* ``arguments-swapped``: two adjacent positional arguments of the same kind (two names,
  two attribute reads, two calls, two numbers) swapped in a call of one of the file's own
  functions or a launch.

A mutant that no longer compiles is told apart when it runs (``runner``), not here.
"""

from __future__ import annotations

import ast
import copy
import difflib
import math
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

OPERATORS = (
    "compare",
    "mask-conjunct",
    "early-return",
    "store-removed",
    "branch-swapped",
    "offset",
    "arithmetic",
    "constant",
    "dtype",
    "arguments-swapped",
)

COMPARE_FLIPS: dict[type, type] = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
}
ARITHMETIC_SWAPS: dict[type, type] = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Div,
    ast.Div: ast.Mult,
    ast.FloorDiv: ast.Mult,
    ast.Mod: ast.FloorDiv,
}
DTYPE_SWAPS: dict[str, str] = {
    "float32": "bfloat16",
    "bfloat16": "float32",
    "float16": "float32",
    "float64": "float32",
    "int64": "int32",
    "int32": "int64",
    "int16": "int32",
    "uint8": "int8",
    "int8": "uint8",
}
"""What a dtype is changed to: the neighbour a slip would pick."""

_SYMBOLS = {
    ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=",
    ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
}  # fmt: skip


@dataclass(frozen=True)
class Mutant:
    """One edit of ``path``: where (``function``, ``line``), which ``operator``, what it
    changed (``change``), and the whole edited ``source``."""

    path: Path
    function: str
    line: int
    operator: str
    change: str
    source: str
    original: str

    @property
    def name(self) -> str:
        """``file:function:line:operator:change``: unique within a file's mutants (a
        second identical edit on one line gets ``#2``), stable while the file is."""
        return f"{self.path.name}:{self.function}:{self.line}:{self.operator}:{self.change}"

    @property
    def diff(self) -> str:
        """The edit as a unified diff of the file."""
        lines = difflib.unified_diff(
            self.original.splitlines(keepends=True),
            self.source.splitlines(keepends=True),
            f"a/{self.path.name}",
            f"b/{self.path.name}",
            n=1,
        )
        return "".join(lines)


def _decorator_names(node: ast.FunctionDef) -> set[str]:
    names = set()
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        names.add(ast.unparse(target))
    return names


def _is_jit(node: ast.AST) -> bool:
    return isinstance(node, ast.FunctionDef) and bool(
        _decorator_names(node) & {"triton.jit", "jit", "triton.autotune", "autotune"}
    )


def _launches(node: ast.FunctionDef, kernels: set[str]) -> bool:
    """Whether ``node`` calls ``kernel[grid](...)`` for one of ``kernels``."""
    for call in ast.walk(node):
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Subscript):
            launched = call.func.value
            name = launched.attr if isinstance(launched, ast.Attribute) else launched
            if getattr(name, "id", name) in kernels:
                return True
    return False


def jit_functions(tree: ast.Module) -> list[ast.FunctionDef]:
    """The ``@triton.jit`` functions of ``tree``."""
    return [n for n in ast.walk(tree) if _is_jit(n)]  # type: ignore[misc]


def _functions(tree: ast.Module) -> list[ast.FunctionDef]:
    """The file's jit functions and the host functions (methods included) that launch
    them, in source order."""
    every = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
    jit = [n for n in every if _is_jit(n)]
    kernels = {n.name for n in jit}
    host = [n for n in every if not _is_jit(n) and _launches(n, kernels)]
    return sorted(jit + host, key=lambda n: n.lineno)


class _Source:
    """The file's text, and one node's text replaced with its line count kept."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.data = text.encode()
        self.starts = [0]
        for line in self.data.splitlines(keepends=True):
            self.starts.append(self.starts[-1] + len(line))

    def _offset(self, line: int, column: int) -> int:
        return self.starts[line - 1] + column

    def replaced(self, node: ast.AST, replacement: str, expression: bool) -> str:
        start = self._offset(node.lineno, node.col_offset)  # type: ignore[attr-defined]
        end = self._offset(node.end_lineno, node.end_col_offset)  # type: ignore[attr-defined]
        spanned = node.end_lineno - node.lineno  # type: ignore[attr-defined]
        padding = "\n" * max(0, spanned - replacement.count("\n"))
        text = f"({replacement}{padding})" if expression else replacement + padding
        return (self.data[:start] + text.encode() + self.data[end:]).decode()


Edit = tuple[ast.AST, str, str, bool]
"""(the node replaced, its replacement's text, the change's label, whether an expression)."""


def _edited(node: ast.expr, change: Callable[[ast.expr], None]) -> str:
    twin = copy.deepcopy(node)
    change(twin)
    return ast.unparse(twin)


def _call_name(node: ast.AST) -> str:
    if isinstance(node, ast.Call):
        return ast.unparse(node.func) if not isinstance(node.func, ast.Subscript) else ""
    return ""


def _compare(node: ast.AST) -> Iterator[Edit]:
    if not isinstance(node, ast.Compare):
        return
    for index, op in enumerate(node.ops):
        flipped = COMPARE_FLIPS.get(type(op))
        if flipped is None:
            continue

        def flip(twin: ast.expr, index: int = index, flipped: type = flipped) -> None:
            twin.ops[index] = flipped()  # type: ignore[attr-defined]

        label = f"{_SYMBOLS[type(op)]} to {_SYMBOLS[flipped]}"
        yield node, _edited(node, flip), label, True


def _mask_conjunct(node: ast.AST) -> Iterator[Edit]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitAnd):
        yield node, ast.unparse(node.left), "& right dropped", True
        yield node, ast.unparse(node.right), "& left dropped", True
    if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.And):
        for index in range(len(node.values)):
            kept = [v for i, v in enumerate(node.values) if i != index]
            text = ast.unparse(ast.BoolOp(ast.And(), kept) if len(kept) > 1 else kept[0])
            yield node, text, f"and term {index + 1} dropped", True


def _early_return(node: ast.AST) -> Iterator[Edit]:
    if not isinstance(node, ast.If) or node.orelse:
        return
    if len(node.body) != 1 or not isinstance(node.body[0], ast.Return):
        return
    negated = ast.unparse(ast.UnaryOp(ast.Not(), node.test))
    yield node.test, negated, "condition negated", True
    yield node, "pass", "if removed", False


def _store_removed(node: ast.AST) -> Iterator[Edit]:
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        name = _call_name(node.value)
        if name.endswith(".store") or ".atomic_" in name:
            yield node, "pass", f"{name} removed", False


def _branch_swapped(node: ast.AST) -> Iterator[Edit]:
    if not isinstance(node, ast.Call):
        return
    name = _call_name(node)
    if name.endswith(".where") and len(node.args) == 3:

        def swap(twin: ast.expr) -> None:
            args = twin.args  # type: ignore[attr-defined]
            args[1], args[2] = args[2], args[1]

        yield node, _edited(node, swap), "where branches swapped", True
    if name.endswith(".load"):
        for keyword in node.keywords:
            if keyword.arg != "other":
                continue
            value = keyword.value
            zero = isinstance(value, ast.Constant) and value.value == 0
            yield value, "1" if zero else "0", f"other to {1 if zero else 0}", True


def _offset(node: ast.AST) -> Iterator[Edit]:
    if not isinstance(node, ast.Call) or not node.args:
        return
    name = _call_name(node)
    if name.endswith(".load") or name.endswith(".store"):
        pointer = node.args[0]
        text = ast.unparse(pointer)
        yield pointer, f"{text} + 1", "pointer + 1", True
        yield pointer, f"{text} - 1", "pointer - 1", True


def _arithmetic(node: ast.AST) -> Iterator[Edit]:
    if isinstance(node, ast.BinOp) and type(node.op) in ARITHMETIC_SWAPS:
        swapped = ARITHMETIC_SWAPS[type(node.op)]

        def swap(twin: ast.expr) -> None:
            twin.op = swapped()  # type: ignore[attr-defined]

        label = f"{_SYMBOLS[type(node.op)]} to {_SYMBOLS[swapped]}"
        yield node, _edited(node, swap), label, True


def fp32_ulp(value: float) -> float:
    """The gap from ``|value|`` to the next fp32 number above it."""
    if value == 0 or not math.isfinite(value):
        return 2.0**-149
    as_bits = struct.unpack("<I", struct.pack("<f", abs(value)))[0]
    return struct.unpack("<f", struct.pack("<I", as_bits + 1))[0] - abs(value)


def _numbers(value: float | int, boundaries: bool) -> list[tuple[str, str]]:
    """(replacement text, label) for a number: its boundaries (``boundaries``), one unit
    each way for an integer, one fp32 ulp each way for a float."""
    found: list[tuple[str, str]] = []
    if boundaries:
        found += [(repr(b), f"to {b}") for b in (0, 1, -1) if b != value]
    if isinstance(value, int):
        found += [(repr(value + 1), "+ 1"), (repr(value - 1), "- 1")]
    else:
        if value != 0:  # one ulp of 0 is a denormal: the boundaries say more
            ulp = fp32_ulp(value)
            found += [(repr(value + ulp), "+ 1 ulp"), (repr(value - ulp), "- 1 ulp")]
        if not boundaries:
            found += [(repr(value + 1), "+ 1"), (repr(value - 1), "- 1")]
    distinct: dict[float, tuple[str, str]] = {}
    for text, label in found:
        distinct.setdefault(float(text), (text, label))
    return list(distinct.values())


def _constant(node: ast.AST) -> Iterator[Edit]:
    if not isinstance(node, ast.Constant):
        return
    if isinstance(node.value, bool):
        yield node, repr(not node.value), f"{node.value} to {not node.value}", True
    elif isinstance(node.value, int | float):
        for text, label in _numbers(node.value, boundaries=True):
            yield node, text, f"{node.value!r} {label}", True


def _dtype(node: ast.AST) -> Iterator[Edit]:
    call = isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
    if call and node.func.attr == "to" and len(node.args) == 1 and not node.keywords:  # type: ignore[attr-defined]
        yield node, ast.unparse(node.func.value), f"{ast.unparse(node)} removed", True  # type: ignore[attr-defined]
    named = isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
    if named and node.attr in DTYPE_SWAPS and node.value.id in ("tl", "torch"):  # type: ignore[attr-defined]
        swapped = f"{node.value.id}.{DTYPE_SWAPS[node.attr]}"  # type: ignore[attr-defined]
        yield node, swapped, f"{ast.unparse(node)} to {swapped}", True


def _kind(node: ast.expr) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return "number"
    return type(node).__name__ if isinstance(node, ast.Name | ast.Attribute | ast.Call) else ""


def _arguments_swapped(node: ast.AST, own: set[str]) -> Iterator[Edit]:
    if not isinstance(node, ast.Call):
        return
    called = node.func.value if isinstance(node.func, ast.Subscript) else node.func
    if ast.unparse(called).split(".")[-1] not in own:
        return
    for index in range(len(node.args) - 1):
        first, second = node.args[index], node.args[index + 1]
        if isinstance(first, ast.Starred) or isinstance(second, ast.Starred):
            continue
        if not _kind(first) or _kind(first) != _kind(second):
            continue
        if ast.unparse(first) == ast.unparse(second):
            continue

        def swap(twin: ast.expr, i: int = index) -> None:
            args = twin.args  # type: ignore[attr-defined]
            args[i], args[i + 1] = args[i + 1], args[i]

        label = f"{ast.unparse(first)} and {ast.unparse(second)} swapped"
        yield node, _edited(node, swap), label, True


_BY_NODE: dict[str, Callable[[ast.AST], Iterator[Edit]]] = {
    "compare": _compare,
    "mask-conjunct": _mask_conjunct,
    "early-return": _early_return,
    "store-removed": _store_removed,
    "branch-swapped": _branch_swapped,
    "offset": _offset,
    "arithmetic": _arithmetic,
    "constant": _constant,
    "dtype": _dtype,
}


def _skipped_nodes(function: ast.FunctionDef) -> set[int]:
    """The nodes no edit touches: the signature (defaults, annotations), decorators and
    the docstring."""
    skipped: set[int] = set()
    parts: list[ast.AST] = [function.args, *function.decorator_list]
    if function.returns is not None:
        parts.append(function.returns)
    body = function.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        parts.append(body[0])
    for part in parts:
        skipped |= {id(n) for n in ast.walk(part)}
    return skipped


def _module_constants(tree: ast.Module, used: set[str]) -> Iterator[tuple[str, ast.Constant]]:
    """The module-level ``NAME = number`` (or ``NAME = tl.constexpr(number)``) the
    mutated functions read."""
    for node in tree.body:
        if not isinstance(node, ast.Assign | ast.AnnAssign):
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        if len(targets) != 1 or not isinstance(targets[0], ast.Name):
            continue
        value = node.value
        if isinstance(value, ast.Call) and len(value.args) == 1:
            value = value.args[0]
        number = isinstance(value, ast.Constant) and isinstance(value.value, int | float)
        if number and targets[0].id in used and not isinstance(value.value, bool):  # type: ignore[union-attr]
            yield targets[0].id, value  # type: ignore[misc]


def mutants_of(path: Path, source: str | None = None) -> list[Mutant]:
    """Every mutant of the file at ``path`` (``source``: its text, read when None), in
    source order; a second identical edit on one line is named ``#2``, ``#3``..."""
    original = path.read_text(encoding="utf-8") if source is None else source
    tree = ast.parse(original, filename=str(path))
    text = _Source(original)
    functions = _functions(tree)
    own = {f.name for f in functions} | {
        n.name for n in tree.body if isinstance(n, ast.FunctionDef)
    }
    found: list[Mutant] = []
    seen: dict[str, int] = {}

    def add(function: str, node: ast.AST, replacement: str, operator: str, label: str, expr: bool):
        mutated = text.replaced(node, replacement, expr)
        if mutated == original:
            return
        mutant = Mutant(path, function, node.lineno, operator, label, mutated, original)  # type: ignore[attr-defined]
        count = seen.get(mutant.name, 0) + 1
        seen[mutant.name] = count
        if count > 1:
            mutant = Mutant(
                path, function, mutant.line, operator, f"{label} #{count}", mutated, original
            )
        found.append(mutant)

    used: set[str] = set()
    for function in functions:
        skipped = _skipped_nodes(function)
        nodes = [n for n in ast.walk(function) if id(n) not in skipped and n is not function]
        nodes.sort(key=lambda n: (getattr(n, "lineno", 0), getattr(n, "col_offset", 0)))
        used |= {n.id for n in nodes if isinstance(n, ast.Name)}
        for node in nodes:
            for operator, edits in _BY_NODE.items():
                for target, replacement, label, expr in edits(node):
                    add(function.name, target, replacement, operator, label, expr)
            for target, replacement, label, expr in _arguments_swapped(node, own):
                add(function.name, target, replacement, "arguments-swapped", label, expr)
    for name, value in _module_constants(tree, used):
        for replacement, label in _numbers(value.value, boundaries=False):
            add("<module>", value, replacement, "constant", f"{name} {label}", True)
    return sorted(found, key=lambda m: (m.line, OPERATORS.index(m.operator)))
