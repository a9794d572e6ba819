"""Make Triton's CPU interpreter multiply bf16 blocks the way a GPU does.

What goes wrong. The interpreter keeps a bf16 block as the raw 16-bit patterns in a numpy
``uint16`` array (numpy has no bf16), and its ``tl.dot`` hands those arrays straight to
``np.matmul`` (``InterpreterBuilder.create_dot``; fp8 operands are widened first, bf16 ones
are not; triton 3.9). A dot of two bf16 blocks then multiplies bit patterns as integers:
a product of 16 x 16 standard normal values comes out near 1e10. A kernel that feeds
``tl.dot`` its bf16 loads as they are - vLLM's Triton decode attention does, on its query
and its cache - computes garbage on the CPU and right on every GPU.

The correction. A dot with a bf16 operand gets that operand widened to fp32 first, bit for
bit (a bf16 value is the upper half of the fp32 with the same value), and the product is
taken as the interpreter takes any other, into the accumulator's dtype. That is what a
GPU's bf16 matrix instruction computes: exact products summed in fp32, in another order.
Other operand types are left to the interpreter as they were.

If Triton's internals have moved (no ``InterpreterBuilder.create_dot``), nothing is patched
and the status says so in the backend's line.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from dcpcheck.interpreter.builder_methods import wrap_builder_methods

_MARK = "_dcpcheck_bf16_dots"
_status: str | None = None


def _widened(interpreter: Any, operand: Any) -> Any:
    """``operand`` as fp32 when it is a bf16 block, else ``operand`` itself."""
    import numpy as np
    import triton.language as tl

    if operand.dtype.scalar != tl.bfloat16:
        return operand
    bits = operand.data.astype(np.uint32) << np.uint32(16)
    return interpreter.TensorHandle(bits.view(np.float32), tl.float32)


def _dots_widened(dot: Callable[..., Any], interpreter: Any) -> Callable[..., Any]:
    @functools.wraps(dot)
    def create_dot(self, a, b, d, *args, **kwargs):
        return dot(self, _widened(interpreter, a), _widened(interpreter, b), d, *args, **kwargs)

    return create_dot


def install_bf16_dots() -> str:
    """Have the running interpreter widen bf16 operands of ``tl.dot`` to fp32 (module
    docstring), once per process; the status as the backend's line shows it. Call only on
    the interpreted backend (it imports Triton's interpreter)."""
    global _status
    if _status is None:
        try:  # TensorHandle: the type a widened operand is made of
            wrap_builder_methods({"create_dot": _dots_widened}, _MARK, ("TensorHandle",))
        except (ImportError, AttributeError) as exc:
            _status = f"bf16 dots as the interpreter takes them ({exc})"
        else:
            _status = "bf16 dot operands widened to fp32"
    return _status
