"""The launches of the project's kernel as Triton keys them, for the benchmarks that ask
what a launch compiles (``kernel_registers.py``, ``kernel_specializations.py``).

Triton compiles one binary per key: the constexprs, each argument's dtype, and its own
specializations of the other arguments - a pointer whose address is divisible by 16, an
integer equal to 1 or divisible by 16 - except the arguments the kernel declares
``do_not_specialize``, read here from the kernel itself.

Import this after the backend is chosen: it imports the launcher, whose kernel module
Triton defines compiled or interpreted as ``TRITON_INTERPRET`` is then.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from dcpcheck.ops.fused_norm_rope import launcher


@dataclass(frozen=True)
class Argument:
    """One positional argument of a launch, as Triton specializes it."""

    name: str
    dtype: torch.dtype | None  # a tensor's; None for a scalar
    value: int | float | None  # a scalar's; None for a tensor
    divisible_by_16: bool  # a tensor's address, an integer's value
    specialized: bool  # False for a float and a ``do_not_specialize`` integer

    @property
    def key(self) -> tuple:
        if self.dtype is not None:
            return (self.name, str(self.dtype), self.divisible_by_16)
        if not self.specialized:
            return (self.name, type(self.value).__name__)
        return (self.name, self.value == 1, self.divisible_by_16)


@dataclass(frozen=True)
class Launch:
    """One recorded launch: its positional arguments and its constexprs."""

    arguments: tuple[Argument, ...]
    constexprs: dict[str, object]

    def key(self, ignore: tuple[str, ...] = ()) -> tuple:
        """What Triton compiles a binary for, leaving out the constexprs in ``ignore``."""
        constexprs = tuple(sorted((k, v) for k, v in self.constexprs.items() if k not in ignore))
        return constexprs, tuple(a.key for a in self.arguments)


def _not_specialized(kernel) -> set[str]:
    """The kernel's ``do_not_specialize`` names (compiled or interpreted, by name or index)."""
    declared = kernel.kwargs["do_not_specialize"] if hasattr(kernel, "kwargs") else None
    if declared is None:
        declared = kernel.do_not_specialize
    return {kernel.arg_names[d] if isinstance(d, int) else d for d in declared or ()}


class _Recorder:
    """Stands in for the launcher's ``@triton.jit`` kernel: ``kernel[grid](*args, **kwargs)``
    records the launch, then launches it too when ``forward``."""

    def __init__(self, kernel, forward: bool) -> None:
        self.kernel, self.forward = kernel, forward
        self.skip = _not_specialized(kernel)
        self.launches: list[Launch] = []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            names = self.kernel.arg_names
            arguments = tuple(
                _argument(name, value, name not in self.skip)
                for name, value in zip(names[: len(args)], args, strict=True)
            )
            constexprs = {k: v for k, v in kwargs.items() if k in names}
            self.launches.append(Launch(arguments, constexprs))
            if self.forward:
                self.kernel[grid](*args, **kwargs)

        return launch


def _argument(name: str, value: object, specializable: bool) -> Argument:
    if isinstance(value, torch.Tensor):
        return Argument(name, value.dtype, None, value.data_ptr() % 16 == 0, True)
    if isinstance(value, float):
        return Argument(name, None, value, False, False)
    return Argument(name, None, value, specializable and value % 16 == 0, specializable)


@contextlib.contextmanager
def recorded_launches(forward: bool) -> Iterator[list[Launch]]:
    """Every launch of the project's kernel inside the ``with``, in order; launched as
    well when ``forward``, else only recorded."""
    kernel = launcher._fused_norm_rope_kernel
    recorder = _Recorder(kernel, forward)
    launcher._fused_norm_rope_kernel = recorder
    try:
        yield recorder.launches
    finally:
        launcher._fused_norm_rope_kernel = kernel
