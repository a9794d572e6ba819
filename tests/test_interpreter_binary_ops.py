"""The interpreter skips converting the operands of a binary operation that need none
(dcpcheck.interpreter.binary_ops): operands of one type come back as they went in, any
other pair is converted by Triton, a kernel computes the same bits either way, only the
interpreter's own semantic is changed, and replacements that would disagree with Triton
are not installed."""

from __future__ import annotations

import importlib

import pytest
import torch
import triton
import triton.language as tl

from dcpcheck.interpreter import binary_ops
from dcpcheck.interpreter.binary_ops import INSTALLED, install_binary_ops_unconverted
from tests.conftest import BACKEND

pytestmark = pytest.mark.skipif(
    not BACKEND.interpreted, reason="installed on the interpreted backend only"
)
REPLACED = ("computation_type_impl", "binary_op_type_checking_impl", "broadcast_impl_value")


def semantic():
    return importlib.import_module("triton.runtime.interpreter").interpreter_semantic


def tritons_own(monkeypatch) -> None:
    """Put Triton's own methods back on the interpreter's semantic for the rest of the test
    (the instance's attributes gone, its class's methods answer)."""
    for name in REPLACED:
        monkeypatch.delattr(semantic(), name, raising=False)


def test_the_backend_installed_it_on_the_interpreters_semantic_alone_and_says_so():
    assert BACKEND.binary_ops == INSTALLED == "binary operations of one type unconverted"
    assert INSTALLED in BACKEND.describe()
    instance = vars(semantic())
    assert all(name in instance for name in REPLACED)
    klass = type(semantic())
    assert all(getattr(klass, name).__module__ == "triton.language.semantic" for name in REPLACED)


def block(element_ty, shape):
    return semantic().full(list(shape), 1, element_ty)


def test_operands_of_one_type_come_back_as_they_went_in():
    lhs, rhs = block(tl.int32, [2, 4]), block(tl.int32, [2, 4])
    left, right = semantic().binary_op_type_checking_impl(lhs, rhs)
    assert left is lhs and right is rhs
    top, bottom = block(tl.float32, [2, 4]), block(tl.float32, [2, 4])
    left, right = semantic().binary_op_type_checking_impl(top, bottom, div_or_mod=True)
    assert left is top and right is bottom


def test_operands_that_need_converting_are_converted_as_triton_converts_them():
    half, other = block(tl.bfloat16, [4]), block(tl.bfloat16, [4])
    lhs, rhs = semantic().binary_op_type_checking_impl(half, other, div_or_mod=True)
    assert (lhs.dtype, rhs.dtype) == (tl.float32, tl.float32)  # bf16 / bf16 is fp32
    row, column = block(tl.int32, [1, 4]), block(tl.int32, [4, 1])
    lhs, rhs = semantic().binary_op_type_checking_impl(row, column)
    assert list(lhs.shape) == list(rhs.shape) == [4, 4]
    lhs, rhs = semantic().binary_op_type_checking_impl(block(tl.int32, [4]), 2.5)
    assert (lhs.dtype, rhs.dtype, list(rhs.shape)) == (tl.float32, tl.float32, [4])


def test_a_pair_triton_refuses_is_refused_every_time():
    pointers = tl.block_type(tl.pointer_type(tl.float32), [4])
    ptr = semantic().tensor(block(tl.int64, [4]).handle, pointers)
    for _ in range(2):
        with pytest.raises(Exception, match=r"invalid operands|pointer"):
            semantic().binary_op_type_checking_impl(ptr, ptr)
        with pytest.raises(TypeError, match="unexpected type"):
            semantic().computation_type_impl(tl.pointer_type(tl.int8), False, tl.int8, False, False)


@triton.jit
def _arithmetic_kernel(x_ptr, n_ptr, out_ptr, quotient_ptr, BLOCK: tl.constexpr):
    rows = tl.arange(0, BLOCK)[:, None]
    cols = tl.arange(0, BLOCK)[None, :]
    x = tl.load(x_ptr + rows * BLOCK + cols)
    n = tl.load(n_ptr + cols)
    scaled = x * x + rows.to(tl.bfloat16) - (n % 3).to(tl.bfloat16)
    tl.store(out_ptr + rows * BLOCK + cols, tl.where(n > 2, scaled, x / x))
    tl.store(quotient_ptr + rows * BLOCK + cols, (n + rows) // 3 + (n & 1) * 0.5)


def test_a_kernel_computes_the_same_bits_with_tritons_own_conversions(monkeypatch):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(16, 16, generator=gen).to(torch.bfloat16)
    n = torch.randint(-40, 40, (16,), generator=gen, dtype=torch.int32)

    def launched():
        out, quotient = torch.empty_like(x), torch.empty(16, 16)
        _arithmetic_kernel[(1,)](x, n, out, quotient, BLOCK=16)
        return out.view(torch.int16), quotient.view(torch.int32)

    once = launched()
    tritons_own(monkeypatch)
    assert all(torch.equal(mine, theirs) for mine, theirs in zip(launched(), once, strict=True))


@pytest.mark.parametrize(
    "breaks, said",
    [
        ("_computation_types", "computation type of"),
        ("_same_type_operands", "converted otherwise"),
        ("_same_shape_broadcast", "broadcast otherwise"),
    ],
)
def test_a_replacement_that_disagrees_with_triton_is_not_installed(monkeypatch, breaks, said):
    tritons_own(monkeypatch)
    monkeypatch.setattr(binary_ops, "_status", None)  # as before installing
    make = getattr(binary_ops, breaks)

    def wrong(*args):
        replacement = make(*args)

        def answer(*operands, **flags):
            if breaks == "_computation_types":
                return tl.float64
            return tuple(reversed(replacement(*operands, **flags)))

        return answer

    monkeypatch.setattr(binary_ops, breaks, wrong)
    status = install_binary_ops_unconverted()
    assert status.startswith("binary operations converted as Triton does") and said in status
    assert not any(name in vars(semantic()) for name in REPLACED)


def test_internals_that_moved_leave_tritons_conversions_and_say_why(monkeypatch):
    tritons_own(monkeypatch)
    monkeypatch.setattr(binary_ops, "_status", None)

    def moved(*args):
        raise ValueError("full() takes other arguments")

    monkeypatch.setattr(binary_ops, "_disagreement", moved)
    status = install_binary_ops_unconverted()
    assert status == "binary operations converted as Triton does (full() takes other arguments)"
    assert not any(name in vars(semantic()) for name in REPLACED)
