"""The interpreter builds each block type and tensor shape once
(dcpcheck.interpreter.block_types): what it hands out equals what Triton builds afresh,
types that differ get different ones, a kernel computes the same values either way, and a
cache that would disagree is not installed."""

from __future__ import annotations

import importlib

import pytest
import torch
import triton
import triton.language as tl

from dcpcheck.interpreter import block_types
from dcpcheck.interpreter.block_types import INSTALLED, install_block_types_once
from tests.conftest import BACKEND

pytestmark = pytest.mark.skipif(
    not BACKEND.interpreted, reason="installed on the interpreted backend only"
)


def builder():
    return importlib.import_module("triton.runtime.interpreter").InterpreterBuilder


def tritons_own(monkeypatch) -> None:
    """Put Triton's own builders back for the rest of the test."""
    get, with_element = builder().get_block_ty, tl.core.block_type.with_element_ty
    monkeypatch.setattr(builder(), "get_block_ty", get.__wrapped__)
    monkeypatch.setattr(tl.core.block_type, "with_element_ty", with_element.__wrapped__)
    monkeypatch.setattr(tl.core.tensor, "__init__", tl.core.tensor.__init__.__wrapped__)


def test_the_backend_installed_it_and_says_so():
    assert BACKEND.block_types == INSTALLED == "block types and tensor shapes built once"
    assert INSTALLED in BACKEND.describe()
    assert builder().get_block_ty is not builder().get_block_ty.__wrapped__
    assert tl.core.tensor.__init__ is not tl.core.tensor.__init__.__wrapped__


def test_equal_types_share_one_block_type_and_it_is_what_triton_builds():
    get = builder().get_block_ty
    first = get(None, tl.float32, [4, 8])
    assert get(None, tl.float32, (tl.constexpr(4), 8)) is first
    assert first.with_element_ty(tl.float32) is first
    fresh = tl.block_type(tl.float32, [4, 8])
    assert first == fresh and first.name == fresh.name and first.numel == fresh.numel
    assert list(first.shape) == [4, 8]


def test_types_that_differ_get_block_types_that_differ():
    get = builder().get_block_ty
    fp16, const_fp16 = tl.pointer_type(tl.float16), tl.pointer_type(tl.float16, const=True)
    seen = [
        get(None, tl.float32, [16]),
        get(None, tl.bfloat16, [16]),
        get(None, tl.float32, [1, 16]),
        get(None, fp16, [16]),
        get(None, const_fp16, [16]),
        get(None, tl.pointer_type(tl.float32), [16]),
    ]
    for index, one in enumerate(seen):
        assert all(one != other for other in seen[index + 1 :]), one
    assert get(None, tl.pointer_type(tl.float16), [16]) is seen[3]  # equal, made again


def test_tensors_of_equal_types_share_a_shape_equal_to_the_one_triton_builds():
    block = builder().get_block_ty(None, tl.int32, [2, 16])
    first, second = tl.tensor("a", block), tl.tensor("b", tl.block_type(tl.int32, [2, 16]))
    assert second.shape is first.shape and second.numel is first.numel
    assert (second.handle, second.dtype) == ("b", tl.int32)
    fresh = tl.tensor.__new__(tl.tensor)
    tl.core.tensor.__init__.__wrapped__(fresh, "b", block)
    assert list(second.shape) == list(fresh.shape) == [2, 16]
    assert second.numel == fresh.numel == 32
    assert tl.tensor("c", tl.int64).shape is not first.shape  # another type: its own
    assert list(tl.tensor("c", tl.int64).shape) == [] and tl.tensor("c", tl.int64).numel == 1


def test_a_shape_triton_refuses_is_refused_every_time():
    for _ in range(2):
        with pytest.raises(ValueError, match="power of 2"):
            builder().get_block_ty(None, tl.float32, [3])


@triton.jit
def _mixed_kernel(x_ptr, y_ptr, out_ptr, BLOCK: tl.constexpr):
    rows = tl.arange(0, BLOCK)[:, None]
    cols = tl.arange(0, BLOCK)[None, :]
    x = tl.load(x_ptr + rows * BLOCK + cols).to(tl.float32)
    y = tl.load(y_ptr + cols)
    scaled = (x * y + rows.to(tl.float32)).to(tl.bfloat16)
    tl.store(out_ptr + rows * BLOCK + cols, tl.where(x > 0, scaled, -scaled))


def test_a_kernel_computes_the_same_bits_with_block_types_built_per_operation(monkeypatch):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(16, 16, generator=gen).to(torch.bfloat16)
    y = torch.randn(16, generator=gen)

    def launched():
        out = torch.empty(16, 16, dtype=torch.bfloat16)
        _mixed_kernel[(1,)](x, y, out, BLOCK=16)
        return out.view(torch.int16)

    once = launched()
    tritons_own(monkeypatch)
    assert torch.equal(launched(), once)


def own_builders() -> tuple:
    return builder().get_block_ty, tl.core.block_type.with_element_ty, tl.core.tensor.__init__


def test_a_block_type_cache_that_disagrees_with_triton_is_not_installed(monkeypatch):
    monkeypatch.setattr(block_types, "_status", None)  # as before installing
    tritons_own(monkeypatch)
    before = own_builders()

    def twice_as_wide(make):
        return lambda element_ty, shape: make(element_ty, [2 * s for s in shape])

    monkeypatch.setattr(block_types, "_cache", twice_as_wide)
    status = install_block_types_once()
    assert status.startswith("block types built per operation") and "block type" in status
    assert own_builders() == before


def test_shared_shapes_that_disagree_with_triton_are_not_installed(monkeypatch):
    monkeypatch.setattr(block_types, "_status", None)
    tritons_own(monkeypatch)
    before = own_builders()
    sharing = block_types._shared_shapes

    def one_more(init):
        shared = sharing(init)

        def tensor_init(self, handle, ty):
            shared(self, handle, ty)
            self.numel = tl.constexpr(self.numel.value + 1)

        return tensor_init

    monkeypatch.setattr(block_types, "_shared_shapes", one_more)
    status = install_block_types_once()
    assert status.startswith("block types built per operation") and "a tensor of" in status
    assert own_builders() == before
