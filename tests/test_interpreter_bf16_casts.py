"""Triton's CPU interpreter casts to and from bf16 by value, as a GPU does
(``dcpcheck.interpreter.bf16_casts``).

The interpreter keeps bf16 as raw bits and converts any type but fp32 to or from them by
numpy's ``astype`` of the bits: an integer ``other`` of a masked bf16 load pads with the
bf16 whose bits are that integer, a bf16 converted to an integer gives its bits. The same
kernels run here on the backend in use (on a GPU compiled, on the CPU through the
corrected interpreter) and must give the GPU's values either way.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from tests.conftest import BACKEND

BLOCK = 8
LIVE = 5


@triton.jit
def _padded_by_integer(x_ptr, out_ptr, live, BLOCK: tl.constexpr):
    lanes = tl.arange(0, BLOCK)
    values = tl.load(x_ptr + lanes, mask=lanes < live, other=1)  # an integer pad, bf16 load
    tl.store(out_ptr + lanes, values.to(tl.float32))


@triton.jit
def _to_integer(x_ptr, out_ptr, BLOCK: tl.constexpr):
    lanes = tl.arange(0, BLOCK)
    tl.store(out_ptr + lanes, tl.load(x_ptr + lanes).to(tl.int32))


@triton.jit
def _through_fp16(x_ptr, out_ptr, BLOCK: tl.constexpr):
    lanes = tl.arange(0, BLOCK)
    tl.store(out_ptr + lanes, tl.load(x_ptr + lanes).to(tl.float16).to(tl.float32))


VALUES = [1.0, -2.5, 3.75, 100.0, -0.0, 0.5, -7.0, 65280.0]
"""bf16 values, each exact in fp16 but the last (beyond fp16's 65,504 only by rounding:
65,280 is an fp16 too), so every cast here is exact on a GPU."""


def _bf16(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.bfloat16, device=BACKEND.device)


def _padded() -> list[float]:
    x = _bf16([2.0] * BLOCK)
    out = torch.full((BLOCK,), 99.0, device=BACKEND.device)
    _padded_by_integer[(1,)](x, out, LIVE, BLOCK=BLOCK)
    return out.cpu().tolist()


def test_an_integer_pad_of_a_bf16_load_is_its_value():
    assert _padded() == [2.0] * LIVE + [1.0] * (BLOCK - LIVE)


def test_a_bf16_converted_to_an_integer_is_its_value_truncated():
    out = torch.zeros(BLOCK, dtype=torch.int32, device=BACKEND.device)
    _to_integer[(1,)](_bf16(VALUES), out, BLOCK=BLOCK)
    assert out.cpu().tolist() == [1, -2, 3, 100, 0, 0, -7, 65280]


def test_bf16_through_fp16_keeps_its_value():
    out = torch.zeros(BLOCK, device=BACKEND.device)
    _through_fp16[(1,)](_bf16(VALUES), out, BLOCK=BLOCK)
    assert out.cpu().tolist() == VALUES


@pytest.mark.skipif(not BACKEND.interpreted, reason="the interpreter's correction only")
def test_without_the_correction_the_interpreter_pads_with_the_integers_bits(monkeypatch):
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    monkeypatch.setattr(builder, "cast_impl", builder.cast_impl.__wrapped__)
    padding = _padded()[LIVE:]
    assert padding != [1.0] * (BLOCK - LIVE)  # bits 0x0001: 2^-133, flushed on the way out
    assert all(abs(value) < 2.0**-126 for value in padding)


@pytest.mark.skipif(not BACKEND.interpreted, reason="the interpreter's correction only")
def test_the_backend_line_says_so():
    assert "bf16 cast by value through fp32" in BACKEND.describe()
