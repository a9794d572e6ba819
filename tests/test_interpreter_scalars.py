"""Triton's CPU interpreter takes a loaded scalar as a loop bound
(``dcpcheck.interpreter.scalars``).

A scalar loaded from memory is a one-element, one-dimensional array inside the interpreter;
a ``range`` over loaded bounds needs it as an integer, which NumPy 2 gives only for a
zero-dimensional array. The kernel below runs on the backend in use: compiled on a GPU,
through the corrected interpreter on the CPU, with the same values either way.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from dcpcheck.interpreter.scalars import scalar_index
from tests.conftest import BACKEND

BLOCK = 4


@triton.jit
def _copy_between_loaded_bounds(bounds_ptr, x_ptr, out_ptr, BLOCK: tl.constexpr):
    begin = tl.load(bounds_ptr)
    end = tl.load(bounds_ptr + 1)
    for start in range(begin, end, BLOCK):
        rows = start + tl.arange(0, BLOCK)
        inside = rows < end
        tl.store(out_ptr + rows, tl.load(x_ptr + rows, mask=inside), mask=inside)


def test_a_loop_over_loaded_bounds_runs():
    bounds = torch.tensor([3, 9], dtype=torch.int32, device=BACKEND.device)
    x = torch.arange(16, dtype=torch.int32, device=BACKEND.device)
    out = torch.full((16,), -1, dtype=torch.int32, device=BACKEND.device)
    _copy_between_loaded_bounds[(1,)](bounds, x, out, BLOCK=BLOCK)
    assert out.cpu().tolist() == [-1] * 3 + list(range(3, 9)) + [-1] * 7


def test_a_one_element_array_is_its_element_and_a_wider_one_is_refused():
    one = SimpleNamespace(handle=SimpleNamespace(data=np.array([7], dtype=np.int32)))
    assert scalar_index(one) == 7
    with pytest.raises(TypeError):  # what Triton 3.6's own conversion does to either
        int(one.handle.data)
    wide = SimpleNamespace(handle=SimpleNamespace(data=np.array([7, 8], dtype=np.int32)))
    with pytest.raises(TypeError):
        scalar_index(wide)


@pytest.mark.skipif(not BACKEND.interpreted, reason="the interpreter's correction only")
def test_the_backend_line_says_so():
    assert "one-element blocks index as integers" in BACKEND.describe()
