"""Stand-ins for the few host-project modules a kernel file imports, so a kernel can be
loaded straight from a checkout without installing (or building) the project it belongs to.

A fused kernel file rarely needs its host project for anything but two helpers: a
platform query (to pick launch options) and a re-export of Triton. Installing vLLM to
get those would pull in a CUDA build, a model zoo and a server; the stand-ins under
``dcpcheck/shims/<package>/`` answer the same imports in a few lines each.

A stand-in is used only

* while loading an external file whose module-level statements import its package
  (imports inside functions run later, if ever, and are left alone),
* when the real package is not importable (a real install always wins), and
* for the modules that have a stand-in: any other module of the package still fails to
  import, and :func:`missing_stand_in` turns that failure into a message naming it.

The stand-ins are removed from ``sys.modules`` once the file is loaded; the kernel keeps
the objects it bound at import time (``current_platform``, ``tl``, ``triton``).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager

STAND_INS: dict[str, tuple[str, ...]] = {
    "vllm": ("vllm.platforms", "vllm.triton_utils"),
}
"""Host package -> the modules of it dcpcheck can stand in for (``dcpcheck.shims.<name>``)."""


def _module_level(tree: ast.Module) -> Iterator[ast.AST]:
    """The nodes that run when the module is imported: everything except function bodies."""
    pending: list[ast.AST] = list(tree.body)
    while pending:
        node = pending.pop()
        yield node
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            pending.extend(ast.iter_child_nodes(node))


def imported_packages(tree: ast.Module) -> set[str]:
    """Top-level packages a module imports when it is loaded (absolute imports only)."""
    packages = set()
    for node in _module_level(tree):
        if isinstance(node, ast.Import):
            packages.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            packages.add(node.module.split(".")[0])
    return packages


def _stand_in_module(host_module: str) -> str:
    return f"{__name__}.{host_module}"


@contextmanager
def stand_ins_for(packages: set[str]) -> Iterator[tuple[str, ...]]:
    """Install the stand-ins of ``packages`` that are not really installed, for the
    duration of the block; yield the host modules stood in for (empty if none).

    Every ``sys.modules`` entry of a stood-in package added inside the block is removed
    on leaving it, so nothing of the stand-in outlives the load.
    """
    hosts = sorted(p for p in packages if p in STAND_INS and importlib.util.find_spec(p) is None)
    installed: list[str] = []
    for host in hosts:
        for name in (host, *STAND_INS[host]):
            sys.modules[name] = importlib.import_module(_stand_in_module(name))
            installed.append(name)
    try:
        yield tuple(name for name in installed if name not in STAND_INS)
    finally:
        for name in list(sys.modules):
            if name.split(".")[0] in hosts:
                del sys.modules[name]


def missing_stand_in(error: ImportError, stood_in: tuple[str, ...]) -> str | None:
    """If ``error`` is a stood-in package's module that has no stand-in, say so in a line."""
    name = getattr(error, "name", None) or ""
    host = name.split(".")[0]
    if not stood_in or host not in STAND_INS or name in STAND_INS[host]:
        return None
    return (
        f"needs {name}, and {host} is not installed; dcpcheck stands in only for "
        f"{', '.join(STAND_INS[host])} (dcpcheck/shims/{host}): install {host} to load this file"
    )
