"""The interpreter patches ``triton.language`` once per launch (dcpcheck.interpreter.calls):
a launch whose helpers all see modules it patched calls Triton's own ``_patch_lang`` once,
the language is restored after it, and the kernel computes what it did before."""

from __future__ import annotations

import importlib

import pytest
import torch
import triton
import triton.language as tl

from dcpcheck.interpreter import calls as interpreter_calls
from tests.conftest import BACKEND

pytestmark = pytest.mark.skipif(
    not BACKEND.interpreted, reason="the patch is installed on the interpreted backend only"
)


@triton.jit
def _square(x):
    return x * x


@triton.jit
def _plus_one(x):
    return _square(x) + 1


@triton.jit
def _helpers_kernel(src_ptr, dst_ptr, BLOCK: tl.constexpr):
    lanes = tl.arange(0, BLOCK)
    tl.store(dst_ptr + lanes, _plus_one(tl.load(src_ptr + lanes)))


@pytest.fixture
def builtin_scans(monkeypatch) -> list[object]:
    """Every module scan Triton's ``_patch_lang`` makes (``_patch_builtin`` calls)."""
    interpreter = importlib.import_module("triton.runtime.interpreter")
    scans: list[object] = []
    original = interpreter._patch_builtin

    def counting(pkg, builder, scope):
        scans.append(pkg)
        return original(pkg, builder, scope)

    monkeypatch.setattr(interpreter, "_patch_builtin", counting)
    return scans


def launch() -> torch.Tensor:
    src = torch.arange(8, dtype=torch.float32)
    dst = torch.empty_like(src)
    _helpers_kernel[(1,)](src, dst, BLOCK=8)
    return dst


def test_the_backend_line_says_the_patch_is_installed() -> None:
    assert BACKEND.language_patch == "language patched once per launch"
    assert "language patched once per launch" in BACKEND.describe()


def test_a_launch_patches_the_language_once_and_restores_it(builtin_scans) -> None:
    assert torch.equal(launch(), torch.arange(8, dtype=torch.float32) ** 2 + 1)
    once = len(builtin_scans)
    assert once > 0  # the launch's own patch ran
    assert tl.core.is_builtin(tl.arange)  # and the launch put the builtins back
    # Per helper call, Triton would scan the same modules again: two helpers, two more sets.
    builtin_scans.clear()
    interpreter = importlib.import_module("triton.runtime.interpreter")
    scopes = [interpreter._patch_lang(fn) for fn in (_plus_one.fn, _square.fn)]  # no launch
    for scope in reversed(scopes):
        scope.restore()
    assert len(builtin_scans) == 2 * once
    assert tl.core.is_builtin(tl.arange)


def test_a_helper_seeing_a_module_the_launch_did_not_patch_still_patches_it() -> None:
    launches = interpreter_calls._Launches()
    calls: list[object] = []

    def original(fn):
        calls.append(fn)
        return interpreter_calls._NothingPatched()

    patch_lang = launches.patch_lang(original)
    launches.patched = set()  # a launch has begun
    patch_lang(_helpers_kernel.fn)  # its own patch
    patch_lang(_square.fn)  # same modules: skipped
    assert calls == [_helpers_kernel.fn]
    launches.patched = set()  # as if the launch had patched nothing yet
    patch_lang(_square.fn)
    assert calls == [_helpers_kernel.fn, _square.fn]
