"""Stand-in for vLLM's JIT warm-up (``vllm.model_executor.warmup.jit_warmup`` and its
Triton helper): the base classes a kernel of vLLM derives from so that vLLM can compile it
ahead of the first step, and the launcher that runs it.

From 0.29.0 a kernel lives in a class (``VllmJitKernel``), from 0.30.0 in a Triton owner
(``VllmTritonJitKernel``) whose ``__call__``, wrapped by ``kernel_launcher``, does not
launch: it returns a launch specification, ``(grid, kwargs)`` or ``(grid, kwargs,
outputs)``, that the owner's ``launch`` completes and runs. What ``launch`` does is vLLM's
contract with its kernels' files, which they rely on and which is not in them, so it is
stood in for here as vLLM 0.34.0's ``jit_warmup_triton_helper.py`` defines it:

* every argument of the ``__call__`` (bound by name, defaults applied) becomes the kernel
  parameter named ``name``, ``name_ptr``, ``NAME`` or ``NAME_PTR`` (the first the kernel
  has), unless the specification sets that parameter itself;
* a parameter ``X_stride<d>`` or ``X_STRIDE_<d>`` nobody set is the stride along ``d``
  (0 without one) of the tensor bound to ``X`` or ``X_ptr``;
* ``kernel`` in the specification replaces the owner's; without a grid nothing launches;
  a ``_runtime_launcher`` is called as ``launcher(kernel, grid, *first_args, **rest)``
  with the kernel's first ``_runtime_launcher_arg_count`` parameters positional, else the
  kernel is launched as ``kernel[grid](**kwargs)``; the specification's outputs, if any,
  are returned.

The harness never warms up: the warm-up helpers refuse to be used, and registering a
warm-up records nothing (Triton compiles at the first launch anyway).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

Key = TypeVar("Key")

LaunchSpec = tuple
"""``(grid, kwargs)`` or ``(grid, kwargs, outputs)``."""


class VllmJitKernel(Generic[Key]):
    """``VllmJitKernel[CompileKey]``: a subclass holds its kernel and launches it."""

    def register_warmup(self, *args: Any, **kwargs: Any) -> None:
        """A compile to do before the first step, which vLLM records: the harness warms
        nothing."""


def _arg_names(kernel: Any) -> tuple[str, ...]:
    names = getattr(kernel, "arg_names", None)
    if names is not None:
        return tuple(names)
    return tuple(inspect.signature(kernel.fn).parameters)


def _stride_of(target: str, bound: Mapping[str, Any]) -> tuple[str, int] | None:
    """``(tensor parameter, dim)`` a stride parameter named ``target`` reads, if bound."""
    for marker, pointer in (("_stride", "_ptr"), ("_STRIDE", "_PTR")):
        name, found, dim = target.rpartition(marker)
        dim = dim.removeprefix("_")
        if found and (not dim or dim.isdigit()):
            source = name if name in bound else name + pointer
            return (source, int(dim or 0)) if source in bound else None
    return None


class VllmTritonJitKernel(VllmJitKernel[Key]):
    """A Triton kernel's owner: ``kernel`` is its ``@triton.jit`` function, and
    ``__call__`` (wrapped by ``kernel_launcher``) says how to launch it (module
    docstring)."""

    kernel: Any
    bind_launch_inputs = True
    _warming = False

    def launch(self, spec: LaunchSpec, inputs: Mapping[str, Any]) -> Any:
        grid, given, *rest = spec
        outputs = rest[0] if rest else None
        kwargs = dict(given)
        names = _arg_names(kwargs.get("kernel") or self.kernel)
        for name, value in inputs.items():
            candidates = (name, f"{name}_ptr", name.upper(), f"{name}_ptr".upper())
            target = next((c for c in candidates if c in names), None)
            if target is not None and target not in given:
                kwargs[target] = value
        for target in names:
            stride = None if target in kwargs else _stride_of(target, kwargs)
            if stride is not None:
                kwargs[target] = kwargs[stride[0]].stride(stride[1])
        kernel = kwargs.pop("kernel", None) or self.kernel
        launcher = kwargs.pop("_runtime_launcher", None)
        positional = kwargs.pop("_runtime_launcher_arg_count", 0)
        if grid is None:
            return outputs
        if launcher is not None:
            first = [kwargs.pop(name) for name in names[:positional]]
            launcher(kernel, grid, *first, **kwargs)
        else:
            kernel[grid](**kwargs)
        return outputs


def kernel_launcher(call: Callable[..., LaunchSpec]) -> Callable[..., Any]:
    """``__call__`` turned into a launch: its arguments bound by name and handed, with
    the specification it returns, to the owner's ``launch`` (module docstring)."""
    signature = inspect.signature(call)

    @functools.wraps(call)
    def launch(self: Any, *args: Any, **kwargs: Any) -> Any:
        spec = call(self, *args, **kwargs)
        if not self.bind_launch_inputs:
            return self.launch(spec, {})
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        inputs = {name: value for name, value in bound.arguments.items() if name != "self"}
        return self.launch(spec, inputs)

    return launch


@dataclass(frozen=True)
class WarmupIntRange:
    """The integers a warm-up would compile for; the harness never expands it."""

    start: int
    stop: int
    step: int = 1
    advance: Callable[[int], int] | None = None


def _never(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("dcpcheck's stand-in for vLLM's JIT warm-up: the harness warms nothing")


TritonWarmupTensor = _never
triton_scalar_specialization_rep = _never
zip_inputs = _never

STANDS_IN_FOR = (
    "VllmJitKernel",
    "VllmTritonJitKernel",
    "kernel_launcher",
    "LaunchSpec",
    "WarmupIntRange",
    "TritonWarmupTensor",
    "triton_scalar_specialization_rep",
    "zip_inputs",
)
"""The names of vLLM's warm-up modules this stand-in gives."""
