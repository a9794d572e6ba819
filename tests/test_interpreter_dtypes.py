"""The interpreter's bf16 <-> fp32 casts and dtype lookup take a fast path
(dcpcheck.interpreter.dtypes) that gives Triton's own bits: on every probe, on subnormals
(left to Triton), and through a kernel; a fast path that differed would not be installed."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from dcpcheck.backend import Backend
from dcpcheck.interpreter import dtypes as interpreter_dtypes
from dcpcheck.interpreter.dtypes import (
    install_dtype_fast_paths,
    narrow_fp32,
    probe_disagreements,
    widen_bf16,
)
from tests.conftest import BACKEND

pytestmark = pytest.mark.skipif(
    not BACKEND.interpreted, reason="the fast paths are installed on the interpreted backend only"
)


def interpreter():
    return importlib.import_module("triton.runtime.interpreter")


def tritons_own():
    """Triton's ``_convert_float`` and ``_get_np_dtype``, under the installed fast paths."""
    return interpreter()._convert_float.__wrapped__, interpreter()._get_np_dtype.__wrapped__


@triton.jit
def _round_trip_kernel(src_ptr, wide_ptr, narrow_ptr, BLOCK: tl.constexpr):
    lanes = tl.arange(0, BLOCK)
    wide = tl.load(src_ptr + lanes).to(tl.float32)
    tl.store(wide_ptr + lanes, wide)
    tl.store(narrow_ptr + lanes, (wide * 1.00390625).to(tl.bfloat16))


def round_trip(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    wide = torch.empty(values.shape, dtype=torch.float32)
    narrow = torch.empty_like(values)
    _round_trip_kernel[(1,)](values, wide, narrow, BLOCK=values.numel())
    return wide.view(torch.int32), narrow.view(torch.int16)


SPECIAL_BF16 = [1.0, -2.5, 0.0, -0.0, float("inf"), float("-inf"), float("nan"), 3.0e38]


def test_the_backend_installed_the_fast_paths_and_says_so():
    assert BACKEND.dtype_paths == "bf16 casts vectorized"
    assert "bf16 casts vectorized" in BACKEND.describe()
    assert interpreter()._convert_float is not tritons_own()[0]


def test_the_fast_paths_agree_with_triton_on_every_probe():
    assert probe_disagreements(*tritons_own()) == []


def test_a_conversion_that_rounds_instead_of_truncating_is_found():
    convert, get_np_dtype = tritons_own()

    def rounds_to_nearest(data, source, target, rounding_mode):
        rtne = interpreter()._ir.ROUNDING_MODE.RTNE
        return convert(data, source, target, rtne if target == tl.bfloat16 else rounding_mode)

    assert probe_disagreements(rounds_to_nearest, get_np_dtype) == [
        "fp32 -> bf16 differs from Triton's _convert_float"
    ]


def test_a_dtype_table_that_changed_is_found():
    convert, get_np_dtype = tritons_own()

    def bf16_as_fp16(tt_dtype):
        return np.dtype(np.float16) if tt_dtype == tl.bfloat16 else get_np_dtype(tt_dtype)

    found = probe_disagreements(convert, bf16_as_fp16)
    assert found and all("bf16" in line for line in found)


def test_a_subnormal_goes_to_tritons_code():
    convert, _ = tritons_own()
    bits = np.array([0x3F80, 0x0001, 0x8042], dtype=np.uint16)  # 1.0 and two subnormals
    assert widen_bf16(bits) is None
    want = convert(bits, tl.bfloat16, tl.float32, None)
    # Triton renormalises subnormals into other bits than a plain shift would give...
    assert not np.array_equal(want, bits.astype(np.uint32) << np.uint32(16))
    # ...and the installed path hands the whole array to it.
    assert np.array_equal(interpreter()._convert_float(bits, tl.bfloat16, tl.float32, None), want)
    fp32 = np.array([1.0, 1e-40], dtype=np.float32)
    assert narrow_fp32(fp32) is None


def test_a_kernel_writes_the_same_bits_with_and_without_the_fast_paths(monkeypatch):
    gen = torch.Generator().manual_seed(0)
    values = torch.cat([torch.randn(56, generator=gen), torch.tensor(SPECIAL_BF16)])
    values = values.to(torch.bfloat16)
    fast = round_trip(values)
    convert, get_np_dtype = tritons_own()
    monkeypatch.setattr(interpreter(), "_convert_float", convert)
    monkeypatch.setattr(interpreter(), "_get_np_dtype", get_np_dtype)
    slow = round_trip(values)
    assert torch.equal(fast[0], slow[0]) and torch.equal(fast[1], slow[1])
    assert torch.equal(fast[0], values.float().view(torch.int32))  # widening is exact


def test_moved_internals_are_reported_not_guessed(monkeypatch):
    def renamed(data, source, target):  # a future signature
        raise AssertionError("must not be called")

    monkeypatch.setattr(interpreter_dtypes, "_status", None)
    monkeypatch.setattr(interpreter(), "_convert_float", renamed)
    status = install_dtype_fast_paths()
    assert status.startswith("bf16 casts interpreted bit by bit") and "target" in status
    assert interpreter()._convert_float is renamed
    line = Backend(torch.device("cpu"), interpreted=True, dtype_paths=status).describe()
    assert "bf16 casts interpreted bit by bit" in line and "\n" not in line


def test_a_fast_path_that_disagrees_is_not_installed(monkeypatch):
    convert, get_np_dtype = tritons_own()
    monkeypatch.setattr(interpreter_dtypes, "_status", None)
    monkeypatch.setattr(interpreter(), "_convert_float", convert)
    monkeypatch.setattr(interpreter(), "_get_np_dtype", get_np_dtype)
    monkeypatch.setattr(interpreter_dtypes, "widen_bf16", lambda data: None)
    status = install_dtype_fast_paths()
    assert (
        status
        == "bf16 casts interpreted bit by bit (bf16 -> fp32 differs from Triton's _convert_float)"
    )
    assert interpreter()._convert_float is convert
    assert interpreter()._get_np_dtype is get_np_dtype
