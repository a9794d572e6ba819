"""Stand-ins for the few host-project modules a kernel file imports, so a kernel can be
loaded straight from a checkout without installing (or building) the project it belongs to.

A fused kernel file needs its host project for a few helpers only: a platform query (launch
options, the fp8 dtype), a re-export of Triton, a predicate on cache-dtype names, and the
switch and packer of one scale format. Installing vLLM to get those would pull in a CUDA
build, a model zoo and a server; the stand-ins under ``dcpcheck/adapters/shims/<package>/`` answer
the same imports in a few lines each, and each says what it stands for and what value it
gives (:data:`STAND_INS` lists them).

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
import re
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager

STAND_INS: dict[str, dict[str, str]] = {
    "vllm": {
        # 0.28.0 and later, and vLLM's git history before them
        "vllm.platforms": "platforms",
        "vllm.triton_utils": "triton_utils",
        # 0.29.0 - 0.32.0 import it from here, 0.33.0 from vllm.v1.kv_cache_interface
        "vllm.utils.torch_utils": "kv_cache_dtypes",
        "vllm.v1.kv_cache_interface": "kv_cache_dtypes",
        # 0.33.0: the indexer cache's MX-packed scales
        "vllm.utils.deep_gemm": "mx_scales",
        "vllm.v1.attention.ops.common": "mx_scales",
        # the GPU model runner's block tables (vllm/v1/worker/gpu/block_table.py), 0.12.0 on
        "vllm.attention.backends.utils": "block_tables",
        "vllm.v1.attention.backends.utils": "block_tables",
        "vllm.v1.worker.gpu.buffer_utils": "block_tables",
        # the V1 runner's block table (vllm/v1/worker/block_table.py), 0.10.2 on
        "vllm.distributed": "v1_runner",
        "vllm.logger": "v1_runner",
        "vllm.utils": "v1_runner",
        "vllm.utils.math_utils": "v1_runner",
        "vllm.v1.utils": "v1_runner",
        "vllm.v1.worker.cp_utils": "v1_runner",
        # 0.29.0: the V1 block table's kernel class derives from this
        "vllm.model_executor.warmup.jit_warmup": "jit_warmup",
        "vllm.model_executor.warmup.jit_warmup_triton_helper": "jit_warmup",
    },
}
"""Host package -> {host module: the module of ``dcpcheck.adapters.shims.<package>``
standing in for it}.

Several host modules may share one stand-in when they export the same helper (vLLM moved
``is_quantized_kv_cache`` between releases)."""


def _module_level(tree: ast.Module) -> Iterator[ast.AST]:
    """The nodes that run when the module is imported: everything except function bodies."""
    pending: list[ast.AST] = list(tree.body)
    while pending:
        node = pending.pop()
        yield node
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            pending.extend(ast.iter_child_nodes(node))


def imported_modules(tree: ast.Module) -> set[str]:
    """The modules a module imports when it is loaded (absolute imports only), by full
    dotted name: ``from vllm.platforms import x`` gives ``vllm.platforms``."""
    modules = set()
    for node in _module_level(tree):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.add(node.module)
    return modules


def _stand_in_module(host: str, host_module: str) -> str:
    if host_module == host:
        return f"{__name__}.{host}"
    return f"{__name__}.{host}.{STAND_INS[host][host_module]}"


def _parent_packages(module: str) -> list[str]:
    """``a.b.c`` -> ``[a.b]``: the packages between the host and ``module``, which an
    ``import a.b.c`` statement binds too."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(2, len(parts))]


@contextmanager
def stand_ins_for(modules: set[str]) -> Iterator[tuple[str, ...]]:
    """Install stand-ins for those of ``modules`` (a file's imports, by full name) that
    have one and whose package is not really installed, for the duration of the block;
    yield the host modules stood in for (empty if none).

    Only the imported modules get a stand-in; the packages between the host and one of
    them (``vllm.v1.attention.ops`` for ``vllm.v1.attention.ops.common``) are empty
    placeholders, so importing anything else from the host still fails, and
    :func:`missing_stand_in` names it. Every ``sys.modules`` entry of a stood-in package
    added inside the block is removed on leaving it, so nothing of the stand-in outlives
    the load.
    """
    hosts = {name.split(".")[0] for name in modules}
    hosts = {h for h in hosts if h in STAND_INS and importlib.util.find_spec(h) is None}
    installed: list[str] = []
    for host in sorted(hosts):
        sys.modules[host] = importlib.import_module(_stand_in_module(host, host))
        for name in sorted(modules & STAND_INS[host].keys()):
            for parent in _parent_packages(name):
                if parent not in sys.modules:
                    placeholder = types.ModuleType(parent, "dcpcheck stand-in package")
                    placeholder.__path__ = []
                    sys.modules[parent] = placeholder
            sys.modules[name] = importlib.import_module(_stand_in_module(host, name))
            installed.append(name)
    try:
        yield tuple(installed) if installed else tuple(sorted(hosts))
    finally:
        for name in list(sys.modules):
            if name.split(".")[0] in hosts:
                del sys.modules[name]


def missing_stand_in(error: ImportError, stood_in: tuple[str, ...]) -> str | None:
    """If ``error`` is a stood-in package's module that has no stand-in, or a name a
    stand-in does not provide, say so in a line."""
    name = getattr(error, "name", None) or ""
    for module in stood_in:  # a stand-in lacking a name: the error names the stand-in
        if name == _stand_in_module(module.split(".")[0], module):
            name = module
    host = name.split(".")[0]
    if not stood_in or host not in STAND_INS:
        return None
    install = f"install {host} to load this file"
    if name in STAND_INS[host]:
        missing = re.match(r"cannot import name '(\w+)'", str(error))
        what = missing[1] if missing else "a name"
        return (
            f"needs {what} from {name}, which dcpcheck's stand-in "
            f"(dcpcheck/adapters/shims/{host}/{STAND_INS[host][name]}.py) does not provide: "
            f"{install}"
        )
    return (
        f"needs {name}, and {host} is not installed; dcpcheck stands in only for "
        f"{', '.join(STAND_INS[host])} (dcpcheck/adapters/shims/{host}): {install}"
    )
