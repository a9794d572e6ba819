"""Triton's CPU interpreter multiplies bf16 blocks as a GPU does
(``dcpcheck.interpreter.dots``).

The interpreter keeps bf16 as raw 16-bit patterns and its ``tl.dot`` multiplied those as
integers. The same kernel runs here on the backend in use (compiled on a GPU, through the
corrected interpreter on the CPU) and must give the fp32 product of its bf16 operands.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from tests.conftest import BACKEND

SIZE = 16


@triton.jit
def _dot(a_ptr, b_ptr, out_ptr, SIZE: tl.constexpr):
    rows = tl.arange(0, SIZE)
    at = rows[:, None] * SIZE + rows[None, :]
    tl.store(out_ptr + at, tl.dot(tl.load(a_ptr + at), tl.load(b_ptr + at)))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_a_dot_of_loaded_blocks_is_their_fp32_product(dtype):
    generator = torch.Generator().manual_seed(3)
    a, b = (torch.randn(SIZE, SIZE, generator=generator).to(dtype) for _ in range(2))
    out = torch.empty(SIZE, SIZE, device=BACKEND.device)
    _dot[(1,)](a.to(BACKEND.device), b.to(BACKEND.device), out, SIZE=SIZE)
    expected = a.double() @ b.double()
    # fp32 sums of 16 exact products (a GPU's tf32 for fp32 operands: 10-bit mantissas)
    tolerance = 2e-2 if dtype is torch.float32 and not BACKEND.interpreted else 1e-4
    torch.testing.assert_close(out.cpu().double(), expected, rtol=tolerance, atol=tolerance)


@pytest.mark.skipif(not BACKEND.interpreted, reason="the correction is the interpreter's")
def test_widening_keeps_every_bf16_value():
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    from dcpcheck.interpreter.dots import _widened

    bits = np.arange(1 << 16, dtype=np.uint16)
    widened = _widened(interpreter, interpreter.TensorHandle(bits, tl.bfloat16))
    expected = torch.from_numpy(bits.view(np.int16).copy()).view(torch.bfloat16).float()
    assert widened.dtype == tl.float32
    assert torch.equal(
        torch.from_numpy(widened.data.copy()).view(torch.int32), expected.view(torch.int32)
    )
