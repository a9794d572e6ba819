"""The kernel modules the backend and the GPU-fit recorder rely on (``dcpcheck.kernel_modules``)
are every module of ``dcpcheck`` that defines a Triton kernel, as Triton itself sees them
once imported, and a new package's kernels are found with no edit."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

from dcpcheck.kernel_modules import PACKAGE, defines_triton_kernel, kernel_modules, module_name

NOT_IMPORTED = {"dcpcheck.__main__"}
"""Modules whose import runs something (the command line)."""


def _defines_kernels_when_imported(name: str) -> bool:
    """Whether module ``name``, once imported, holds a Triton kernel it defined itself."""
    module = importlib.import_module(name)
    return any(
        isinstance(value, (JITFunction, InterpretedFunction)) and value.fn.__module__ == name
        for value in vars(module).values()
    )


def test_every_module_that_defines_a_triton_kernel_is_a_kernel_module():
    """Triton's own objects are the oracle: every module mentioning Triton is imported (the
    backend is fixed by the conftest) and the ones holding a kernel they defined are
    exactly the derived kernel modules."""
    candidates = {
        module_name(path)
        for path in PACKAGE.rglob("*.py")
        if "triton" in path.read_text(encoding="utf-8")
    } - NOT_IMPORTED
    defining = {name for name in candidates if _defines_kernels_when_imported(name)}
    assert defining == kernel_modules()


def test_the_kernel_modules_include_those_a_hand_list_missed():
    """The fused op's NVFP4 and indexer-cache writers and the vLLM stand-ins' helpers define
    kernels too: a backend switch must refuse once they are imported."""
    assert {
        "dcpcheck.ops.fused_norm_rope.nvfp4_ds_mla",
        "dcpcheck.ops.fused_norm_rope.index_cache",
        "dcpcheck.adapters.shims.vllm.block_tables",
        "dcpcheck.ops.sparse_topk_remap.kernel",
    } <= kernel_modules()
    # mutants' sources hold "@triton.jit" in strings, which defines nothing
    assert "dcpcheck.ops.fused_norm_rope.variants" not in kernel_modules()


@pytest.mark.parametrize(
    ("source", "defines"),
    [
        ("import triton\n@triton.jit\ndef f(x):\n    pass\n", True),
        ("import triton as t\n@t.jit(do_not_specialize=['x'])\ndef f(x):\n    pass\n", True),
        ("from triton import jit\n@jit\ndef f(x):\n    pass\n", True),
        ("import triton\nclass K:\n    @triton.jit\n    def f(x):\n        pass\n", True),
        ("import triton\nSOURCE = '''\n@triton.jit\ndef f(x):\n    pass\n'''\n", False),
        ("import numba\n@numba.jit\ndef f(x):\n    pass\n", False),
        ("import triton\ndef f(x):\n    return triton.jit(x)\n", False),
    ],
)
def test_what_counts_as_defining_a_kernel(source: str, defines: bool):
    assert defines_triton_kernel(source) is defines


def test_a_new_op_packages_kernel_is_found_with_no_edit(tmp_path: Path):
    """A package laid out like ``dcpcheck`` with a new op package: its kernel module is
    found by the same search, and its other modules are not."""
    package = tmp_path / "dcpcheck"
    op = package / "ops" / "new_op"
    op.mkdir(parents=True)
    for folder in (package, package / "ops", op):
        (folder / "__init__.py").write_text("")
    (op / "kernel.py").write_text("import triton\n\n\n@triton.jit\ndef _k(x):\n    pass\n")
    (op / "runner.py").write_text("from dcpcheck.ops.new_op import kernel\n")
    assert kernel_modules(package) == {"dcpcheck.ops.new_op.kernel"}
