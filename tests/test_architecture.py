"""The package's shape, read from its source: imports point down a declared layer order,
no import cycle, no module too long to read.

Every ``import``/``from ... import`` of every module under ``dcpcheck/`` and ``reference/``
is read with ``ast``, wherever it sits (module level, inside a function, under
``TYPE_CHECKING``): an import made late to dodge a cycle is still a dependency, so it is
held to the same order. A module may import from its own layer or any layer below it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from dcpcheck import op_registry
from dcpcheck.op_registry import FUSED_NORM_ROPE, OPS

REPO = Path(__file__).resolve().parents[1]

LAYERS: tuple[tuple[str, ...], ...] = (
    # the oracle: pure torch, knows nothing of the harness
    ("reference",),
    # the device (whether a launch fits one, the gate's binaries compiled for it, Triton's
    # version key kept across processes, what a fault of it is), the processes forked from
    # one that imported torch, who else watches a process, every exit code, every file the
    # tool writes, the names of the ops
    (
        "dcpcheck",
        "dcpcheck.backend",
        "dcpcheck.fork_server",
        "dcpcheck.forked_child",
        "dcpcheck.observers",
        "dcpcheck.device_faults",
        "dcpcheck.gpu_fit",
        "dcpcheck.gate_binaries",
        "dcpcheck.line_workers",
        "dcpcheck.triton_key",
        "dcpcheck.kernel_modules",
        "dcpcheck.interpreter",
        "dcpcheck.exit_codes",
        "dcpcheck.files",
        "dcpcheck.op_registry",
    ),
    # what every op's cases share: DCP ownership, scenario files, seeded values, the run's
    # data model (configuration, verdicts, findings)
    ("dcpcheck.cases",),
    # what every op's adapters share, and the stand-ins foreign kernel files' imports need
    ("dcpcheck.adapters",),
    # loading any --kernel: files, modules, released vLLM wheels
    ("dcpcheck.kernels",),
    # the ops, one package each: contract, scenarios, cases, checks, the project's kernel
    # and its mutants, adapters, runner and search (dcpcheck.ops reads them by name)
    ("dcpcheck.ops",),
    # the tiny MLA model through the ops' kernels, and its token streams
    ("dcpcheck.e2e",),
    # where a case runs: in this process, a worker process, under compute-sanitizer
    ("dcpcheck.harness",),
    # a run's session and bisect: many cases of every op
    ("dcpcheck.workflows",),
    # mutation testing: a kernel file's mutants, each through the gate in a worker
    ("dcpcheck.mutation",),
    # JSON/JUnit reports, ownership maps, the console
    ("dcpcheck.output",),
    # real ranks over torch.distributed, judged through the harness
    ("dcpcheck.distributed",),
    # the edges: click commands, the pytest plugin, the ``-m`` entry point
    (
        "dcpcheck.cli",
        "dcpcheck.pytest_plugin",
        "dcpcheck.resident",
        "dcpcheck.__main__",
    ),
)

MAX_LINES = 600
"""Longest module allowed outside tests/: past this, one module is doing several jobs."""

STILL_TOO_LONG: set[str] = set()
"""Modules not yet split: expected to fail the length check, strictly, so one
that gets split must leave this set."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {
    _module_name(path): path
    for package in ("dcpcheck", "reference")
    for path in sorted((REPO / package).rglob("*.py"))
}


def layer_of(module: str) -> int:
    """The layer of the longest declared prefix of ``module``."""
    best, best_len = None, -1
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            matches = module == prefix or (module.startswith(prefix + ".") and prefix != "dcpcheck")
            if matches and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    if best is None:
        raise AssertionError(f"{module} is in no declared layer")
    return best


def _resolve(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    package = module.split(".")
    if not is_package:
        package = package[:-1]
    package = package[: len(package) - (node.level - 1)]
    return ".".join([*package, *([node.module] if node.module else [])])


def _parsed(module: str) -> ast.Module:
    return ast.parse(MODULES[module].read_text(), filename=str(MODULES[module]))


def _is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


def project_imports(module: str) -> set[str]:
    """The project modules ``module`` imports."""
    return imports_in(module, _parsed(module), _is_package(module))


def imports_in(module: str, tree: ast.Module, is_package: bool) -> set[str]:
    """The project modules the source ``tree`` of ``module`` imports (a ``from pkg import
    name`` counts ``pkg.name`` when that is a module, else ``pkg``)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, node, is_package)
            names = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
                for alias in node.names
            ]
        else:
            continue
        for name in names:
            while name and name not in MODULES:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


GRAPH = {module: project_imports(module) for module in MODULES}


def test_layers_are_whole_packages():
    """A layer names packages (or modules at the root of ``dcpcheck``), never one module
    inside a package: a package's modules share its layer, so the order holds between
    packages, with no module excepted."""
    for prefixes in LAYERS:
        for prefix in prefixes:
            path = REPO / Path(*prefix.split("."))
            inside_a_package = prefix.count(".") >= 2 or (
                prefix.count(".") == 1 and prefix.split(".")[0] == "reference"
            )
            assert path.is_dir() or not inside_a_package, f"{prefix} is a module in a package"


def test_every_module_has_a_layer():
    for module in MODULES:
        layer_of(module)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down(module):
    upward = sorted(
        f"{imported} (layer {layer_of(imported)})"
        for imported in GRAPH[module]
        if layer_of(imported) > layer_of(module)
    )
    assert not upward, f"{module} (layer {layer_of(module)}) imports upward: {upward}"


def test_reference_imports_only_torch():
    for module, path in MODULES.items():
        if not module.startswith("reference"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                roots = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                roots = {(node.module or "").split(".")[0]}
            else:
                continue
            assert roots <= {"torch", "reference", "__future__", "dataclasses", "math"} | {
                "enum",
                "functools",
                "typing",
                "collections",
            }, f"{module} imports {roots}"


def test_no_import_cycle():
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        stack.append(module)
        for imported in sorted(GRAPH[module]):
            if state.get(imported) == 1:
                cycle = [*stack[stack.index(imported) :], imported]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if imported not in state:
                visit(imported)
        stack.pop()
        state[module] = 2

    for module in sorted(MODULES):
        if module not in state:
            visit(module)


@pytest.mark.parametrize(
    "module",
    [
        pytest.param(m, marks=pytest.mark.xfail(strict=True, reason="not yet split"))
        if m in STILL_TOO_LONG
        else m
        for m in sorted(MODULES)
    ],
)
def test_module_is_short_enough_to_read(module):
    lines = len(MODULES[module].read_text().splitlines())
    assert lines <= MAX_LINES, f"{module}: {lines} lines (at most {MAX_LINES})"


def test_the_command_line_imports_no_triton_before_the_backend_is_chosen():
    """Triton's interpreter must be switched on (TRITON_INTERPRET) before Triton is imported:
    a ``@triton.jit`` made earlier is a compiled-mode function that the interpreter later
    refuses to call ("outside of the scope of a kernel"). So the CLI, the adapters and the
    kernel loader import Triton only once a backend is chosen (the vLLM adapter's MX switch
    lives apart from the Triton stand-in that reads it for that reason)."""
    import subprocess
    import sys

    probe = (
        "import sys, dcpcheck.cli, dcpcheck.ops.fused_norm_rope.vllm, dcpcheck.kernels.loading; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'triton'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert out.stdout.strip() == "[]", out.stdout


# ---------------------------------------------------------------------------------------
# An op is its package and its line in the registry: what lies outside reaches it through
# ``dcpcheck.ops.package`` (``OpPackage``) and names it through the registry.

OPS_DIR = REPO / "dcpcheck" / "ops"

OP_PACKAGES = frozenset(path.parent.name for path in OPS_DIR.glob("*/__init__.py"))
"""The op packages, as they lie on disk (a new one counts with no edit here)."""


def op_package_of(module: str) -> str | None:
    """The op package ``module`` is, or lies in (``fused_norm_rope``), else None."""
    parts = module.split(".")
    inside = len(parts) >= 3 and parts[:2] == ["dcpcheck", "ops"] and parts[2] in OP_PACKAGES
    return parts[2] if inside else None


def op_internals_imported(module: str, imported: set[str]) -> set[str]:
    """Rule (a): the modules below an op package (``dcpcheck.ops.<op>.x``) that ``module``
    imports when it lies outside ``dcpcheck.ops``; an op package itself is its face."""
    if module == "dcpcheck.ops" or module.startswith("dcpcheck.ops."):
        return set()
    return {name for name in imported if op_package_of(name) and name.count(".") >= 3}


OP_NAME_CONSTANTS = {
    name: value
    for name, value in vars(op_registry).items()
    if isinstance(value, str) and value in OPS and name != "DEFAULT_OP"
}
"""The registry's constants that name an op (``SLOT_MAPPING``), by name. ``DEFAULT_OP`` is
not one: it is the registry's choice of the op a command judges when none is named, and
a module reading it works whichever op the registry makes the default."""


def op_names_named(module: str, tree: ast.Module, is_package: bool) -> set[str]:
    """Rule (b): how the source ``tree`` of ``module`` names an op other than its own
    package's: each op-name string literal (``'"slot-mapping"'``) and each op-name constant
    of the registry it imports or reads (``"SLOT_MAPPING"``). The registry names them all."""
    if module == "dcpcheck.op_registry":
        return set()
    named: set[tuple[str, str]] = set()  # (op, as spelled)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in OPS:
            named.add((node.value, f'"{node.value}"'))
        elif isinstance(node, ast.ImportFrom):
            if _resolve(module, node, is_package) == "dcpcheck.op_registry":
                named |= {
                    (OP_NAME_CONSTANTS[alias.name], alias.name)
                    for alias in node.names
                    if alias.name in OP_NAME_CONSTANTS
                }
        elif isinstance(node, ast.Attribute) and node.attr in OP_NAME_CONSTANTS:
            named.add((OP_NAME_CONSTANTS[node.attr], node.attr))
    own = op_package_of(module)
    return {spelled for op, spelled in named if op_package_name(op) != own}


def op_package_name(op: str) -> str:
    """The package of an op, named as the op (``fused-norm-rope`` -> ``fused_norm_rope``)."""
    return op.replace("-", "_")


def test_nothing_outside_the_ops_imports_an_ops_internals():
    found = {
        module: {name.removeprefix("dcpcheck.ops.") for name in internals}
        for module in MODULES
        if (internals := op_internals_imported(module, GRAPH[module]))
    }
    assert not found, f"reach them through dcpcheck.ops.package: {found}"


def test_only_the_registry_and_an_ops_own_package_name_the_op():
    found = {
        module: named
        for module in MODULES
        if (named := op_names_named(module, _parsed(module), _is_package(module)))
    }
    assert not found, f"name them through dcpcheck.op_registry: {found}"


def test_an_ops_package_is_named_as_the_op():
    """Rule (b) finds an op's own package by its name: the registry agrees."""
    for name, op in OPS.items():
        assert op.package == f"dcpcheck.ops.{op_package_name(name)}"
    assert op_package_name(FUSED_NORM_ROPE) in OP_PACKAGES


PLANTED = """
from dcpcheck.ops import slot_mapping
from dcpcheck.ops.fused_norm_rope import contract
import dcpcheck.ops.lse_combine.kernels
from dcpcheck.op_registry import OPS, SLOT_MAPPING
from dcpcheck import op_registry

STAGE = "lse-combine"
DEFAULT = op_registry.SPARSE_TOPK_REMAP
"""


def test_rule_a_fails_on_a_planted_import_of_an_ops_internals():
    imported = imports_in("dcpcheck.cli.planted", ast.parse(PLANTED), False)
    internals = {"dcpcheck.ops.fused_norm_rope.contract", "dcpcheck.ops.lse_combine.kernels"}
    assert op_internals_imported("dcpcheck.cli.planted", imported) == internals
    assert op_internals_imported("dcpcheck.ops.slot_mapping.planted", imported) == set()


def test_rule_b_fails_on_a_planted_op_name():
    tree = ast.parse(PLANTED)
    named = {"SLOT_MAPPING", '"lse-combine"', "SPARSE_TOPK_REMAP"}
    assert op_names_named("dcpcheck.cli.planted", tree, False) == named
    # an op's own package may name it; the registry names them all
    assert op_names_named("dcpcheck.ops.slot_mapping.planted", tree, False) == named - {
        "SLOT_MAPPING"
    }
    assert op_names_named("dcpcheck.op_registry", tree, False) == set()
