"""Give Triton's interpreted kernels the ``constexprs`` a compiled kernel has.

A ``@triton.jit`` function is a ``JITFunction`` when Triton compiles and an
``InterpretedFunction`` under ``TRITON_INTERPRET=1``. The first lists the positions of
its ``tl.constexpr`` parameters in ``constexprs``; the second has no such attribute. vLLM's
kernel owners (0.30.0 on, ``VllmTritonJitKernel``) read it to count a kernel's runtime
arguments before they launch it (``len(kernel.arg_names) - len(kernel.constexprs)``), so
on the CPU they would raise where the GPU launches. This adds the attribute to
``InterpretedFunction``, computed as a compiled kernel computes it: the parameters whose
annotation names ``constexpr`` (an annotation may be the class or, under ``from
__future__ import annotations``, its text). Nothing else of the interpreter changes.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any


def _constexprs(function: Any) -> list[int]:
    parameters = inspect.signature(function.fn).parameters.values()
    return [
        index
        for index, parameter in enumerate(parameters)
        if "constexpr"
        in (getattr(parameter.annotation, "__name__", None) or str(parameter.annotation))
    ]


def install_constexprs() -> None:
    """Add ``constexprs`` to the running interpreter's kernels (module docstring), once
    per process. Call only on the interpreted backend (it imports Triton's interpreter)."""
    interpreted = importlib.import_module("triton.runtime.interpreter").InterpretedFunction
    if not hasattr(interpreted, "constexprs"):
        interpreted.constexprs = property(_constexprs)
