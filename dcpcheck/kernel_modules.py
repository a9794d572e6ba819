"""The modules that define the project's Triton kernels, found in its source.

Two parts of the tool need them and neither may import the other's side: the backend
(``dcpcheck.backend``), which refuses to switch once one of them is imported, since
Triton fixes a kernel as compiled or interpreted when it is defined; and the GPU-fit
recorder (``dcpcheck.gpu_fit``), which records the launches of exactly these kernels.

They are read from the package's source with ``ast``, not imported (importing one would
define its kernels): a module of ``dcpcheck`` is a kernel module when a function in it is
decorated with ``triton.jit`` (``@triton.jit``, ``@triton.jit(...)``, or ``jit`` imported
from ``triton``). A new op package's kernels are found with no edit here.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

PACKAGE = Path(__file__).parent
"""The ``dcpcheck`` package, whose modules are searched."""

_DECORATOR_LINE = re.compile(r"^[ \t]*@[\w.]*jit\b", re.MULTILINE)
"""A line that may decorate a function with ``jit``: only modules with one are parsed,
which keeps the search short (every recording process makes it at its start,
``gpu_fit.record_if_asked``)."""


def _jit_names(tree: ast.Module) -> set[str]:
    """How ``triton.jit`` may be spelled in a module: ``triton.jit`` under each name
    ``triton`` is imported as, and each name ``jit`` is imported from ``triton`` as."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {f"{a.asname or a.name}.jit" for a in node.names if a.name == "triton"}
        elif isinstance(node, ast.ImportFrom) and node.module == "triton" and node.level == 0:
            names |= {a.asname or a.name for a in node.names if a.name == "jit"}
    return names


def defines_triton_kernel(source: str) -> bool:
    """Whether module ``source`` defines a function decorated with ``triton.jit``."""
    tree = ast.parse(source)
    jit = _jit_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for decorator in node.decorator_list:
                called = decorator.func if isinstance(decorator, ast.Call) else decorator
                if ast.unparse(called) in jit:
                    return True
    return False


def module_name(path: Path, package: Path = PACKAGE) -> str:
    """The dotted name of the module at ``path`` inside ``package``."""
    parts = [package.name, *path.relative_to(package).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def kernel_modules(package: Path = PACKAGE) -> frozenset[str]:
    """Every module of ``package`` that defines a Triton kernel (module docstring). Once
    one is imported, its ``@triton.jit`` functions are defined, compiled or interpreted
    for good."""
    return frozenset(
        module_name(path, package)
        for path in sorted(package.rglob("*.py"))
        if _DECORATOR_LINE.search(source := path.read_text(encoding="utf-8"))
        and defines_triton_kernel(source)
    )
