"""Triton's CPU interpreter reads a mask as a GPU does (``dcpcheck.interpreter.masks``).

A boolean block combined with a boolean scalar comes out of the interpreter as an int32
block of 0s and 1s, which its masked load and store refuse; compiled Triton has an ``i1``
block and runs. The same kernels run here on the backend in use: on a GPU compiled, on the
CPU through the corrected interpreter, and must give the same values either way.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from tests.conftest import BACKEND

BLOCK = 8


@triton.jit
def _folded_scalar(x_ptr, out_ptr, end, flag, BLOCK: tl.constexpr):
    rows = tl.arange(0, BLOCK)
    kept = (rows < end) & (flag >= 0)  # a block and a scalar
    values = tl.load(x_ptr + rows, mask=kept, other=-1)
    tl.store(out_ptr + rows, values, mask=kept | (flag < 0))


@triton.jit
def _negated_scalar(x_ptr, out_ptr, end, sharded_ptr, BLOCK: tl.constexpr):
    rows = tl.arange(0, BLOCK)
    # The flag is read from memory, as vLLM's slot-mapping kernel reads a group's: a plain
    # integer argument of 1 is a compile-time constant on a GPU, where ``~(1 != 0)`` is
    # Python's ``~True``, -2, and no mask.
    sharded = tl.load(sharded_ptr) != 0
    kept = ~sharded | (rows < end)  # a negated scalar or a block
    tl.store(out_ptr + rows, tl.load(x_ptr + rows, mask=kept, other=-1))


@triton.jit
def _not_a_mask(x_ptr, out_ptr, BLOCK: tl.constexpr):
    rows = tl.arange(0, BLOCK)
    twos = (rows < 3).to(tl.int32) * 2  # 2 and 0: no GPU mask holds a 2
    tl.store(out_ptr + rows, tl.load(x_ptr + rows, mask=twos, other=-1))


def _run(kernel, *scalars) -> list[int]:
    x = torch.arange(10, 10 + BLOCK, dtype=torch.int32, device=BACKEND.device)
    out = torch.full((BLOCK,), 99, dtype=torch.int32, device=BACKEND.device)
    kernel[(1,)](x, out, *scalars, BLOCK=BLOCK)
    return out.cpu().tolist()


@pytest.mark.parametrize(
    ("flag", "expected"),
    [(1, [10, 11, 12, 99, 99, 99, 99, 99]), (-1, [-1] * BLOCK)],
)
def test_a_block_folded_with_a_scalar_is_a_mask(flag, expected):
    assert _run(_folded_scalar, 3, flag) == expected


@pytest.mark.parametrize(
    ("sharded", "expected"),
    [(1, [10, 11, 12, -1, -1, -1, -1, -1]), (0, list(range(10, 10 + BLOCK)))],
)
def test_a_negated_scalar_or_a_block_is_a_mask(sharded, expected):
    flag = torch.tensor([sharded], dtype=torch.int32, device=BACKEND.device)
    assert _run(_negated_scalar, 3, flag) == expected


@pytest.mark.skipif(not BACKEND.interpreted, reason="the interpreter's correction only")
def test_a_mask_holding_another_value_is_still_refused():
    with pytest.raises(Exception, match="mask has unsupported dtype"):
        _run(_not_a_mask)


@pytest.mark.skipif(not BACKEND.interpreted, reason="the interpreter's correction only")
def test_without_the_correction_the_interpreter_refuses_the_folded_mask(monkeypatch):
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    monkeypatch.setattr(builder, "create_masked_load", builder.create_masked_load.__wrapped__)
    monkeypatch.setattr(builder, "create_masked_store", builder.create_masked_store.__wrapped__)
    with pytest.raises(Exception, match="mask has unsupported dtype"):
        _run(_folded_scalar, 3, 1)


@pytest.mark.skipif(not BACKEND.interpreted, reason="the interpreter's correction only")
def test_the_backend_line_says_so():
    assert "0/1 integer masks read as booleans" in BACKEND.describe()
