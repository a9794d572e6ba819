"""Triton's CPU interpreter computes no overflow check that nothing reads
(``dcpcheck.interpreter.overflow_checks``).

An int32 product past int32's range wraps on both backends, as a compiled kernel's does;
the checks the interpreter would otherwise compute for it go to a ``device_assert`` that
asserts only in debug mode, and the probe that decides whether to stop computing them
tells a live assert from a dropped one.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch
import triton
import triton.language as tl
from triton.language.semantic import TritonSemantic

from dcpcheck.interpreter.overflow_checks import _asserts_are_dropped
from tests.conftest import BACKEND


@triton.jit
def _scale(x_ptr, out_ptr, FACTOR: tl.constexpr):
    lanes = tl.arange(0, 4)
    tl.store(out_ptr + lanes, tl.load(x_ptr + lanes) * FACTOR)


def test_an_int32_product_past_the_range_wraps():
    values = [1, 3, 4095, 70000]
    factor = 1 << 20
    x = torch.tensor(values, dtype=torch.int32, device=BACKEND.device)
    out = torch.zeros(4, dtype=torch.int32, device=BACKEND.device)
    _scale[(1,)](x, out, FACTOR=factor)
    wrapped = [(v * factor + 2**31) % 2**32 - 2**31 for v in values]
    assert out.cpu().tolist() == wrapped
    assert wrapped[3] != values[3] * factor  # the case does overflow


def _probe_target(debug: bool) -> SimpleNamespace:
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder()
    builder.options = dataclasses.replace(builder.options, debug=debug)
    return SimpleNamespace(
        TensorHandle=interpreter.TensorHandle, interpreter_semantic=TritonSemantic(builder)
    )


def test_the_probe_tells_a_live_assert_from_a_dropped_one():
    assert _asserts_are_dropped(_probe_target(debug=False))
    assert not _asserts_are_dropped(_probe_target(debug=True))


@pytest.mark.skipif(not BACKEND.interpreted, reason="the interpreter's correction only")
def test_the_backend_line_says_so():
    from triton.runtime import interpreter

    assert "no overflow checks computed" in BACKEND.describe()
    assert not interpreter.interpreter_builder.options.sanitize_overflow
