"""Make Triton's CPU interpreter convert to and from bf16 by value, as a GPU does.

What goes wrong. The interpreter keeps a bf16 block as its raw bits in a uint16 array,
and its ``cast_impl`` converts by value only between bf16 and fp32. Every other cast into
or out of bf16 is numpy's ``astype`` on those bits (triton 3.9): an integer becomes the
bf16 whose *bits* are that integer, so ``tl.load(bf16_ptr, mask=m, other=1)`` pads the
masked lanes with 2^-133 (bits 0x0001) where a GPU pads them with 1.0; a bf16 becomes the
integer of its bits (1.0 becomes 16,256); bf16 and fp16 or fp64 exchange bits, not
values. A kernel that pads a bf16 load with an integer constant, or converts between bf16
and an integer, computes one thing here and another on every GPU: a mutant of the
project's kernel that pads its row loads with 1 instead of 0 passes every case on the
CPU and fails them on a GPU.

The correction. A cast between bf16 and any type but fp32 goes through fp32: the
interpreter's own bf16 <-> fp32 conversion on one side, numpy's by value on the other.
An integer of magnitude up to 2^24 reaches fp32 exactly, and every bf16 is an fp32, so
the values are the GPU's; fp32 -> bf16 keeps the interpreter's rounding
(``dcpcheck.interpreter.dtypes``). A bf16 -> bf16 cast and every cast that involves no
bf16 are left to the interpreter.

If Triton's internals have moved (no ``InterpreterBuilder.cast_impl``), nothing is
patched and the status says so in the backend's line.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

from dcpcheck.interpreter.builder_methods import wrap_builder_methods

_MARK = "_dcpcheck_bf16_casts"
_status: str | None = None


def _by_value(cast: Callable[..., Any], interpreter: Any) -> Callable[..., Any]:
    """``cast`` (``cast_impl(self, src, dst_type)``) with every bf16 cast but bf16 <-> fp32
    and bf16 -> bf16 taken through fp32 (module docstring)."""
    language = importlib.import_module("triton.language")
    bf16, fp32 = language.bfloat16, language.float32

    @functools.wraps(cast)
    def cast_impl(self, src, dst_type):
        source, target = src.dtype.scalar, dst_type.scalar
        if (source == bf16) != (target == bf16) and fp32 not in (source, target):
            return cast(self, cast(self, src, fp32), dst_type)
        return cast(self, src, dst_type)

    return cast_impl


def install_bf16_casts() -> str:
    """Have the running interpreter cast to and from bf16 by value (module docstring), once
    per process; the status as the backend's line shows it. Call only on the interpreted
    backend (it imports Triton's interpreter)."""
    global _status
    if _status is None:
        try:
            wrap_builder_methods({"cast_impl": _by_value}, _MARK)
        except (ImportError, AttributeError) as exc:
            _status = f"bf16 casts as the interpreter makes them ({exc})"
        else:
            _status = "bf16 cast by value through fp32"
    return _status
