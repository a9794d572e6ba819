"""Where kernels run: natively on a CUDA device, or through Triton's CPU interpreter.

Triton decides between compiling and interpreting when a ``@triton.jit`` function is
*defined*, from ``TRITON_INTERPRET``. So the choice must be made before any kernel module
is imported; ``select_backend`` does that, and kernel modules are imported lazily by the
registry after it.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field, replace

import torch

from dcpcheck.kernel_modules import kernel_modules


class BackendError(ValueError):
    """The requested device cannot be used in this process."""


@dataclass(frozen=True)
class Backend:
    device: torch.device
    interpreted: bool
    fp8_cast: str = field(default="", compare=False)
    """What was done about the interpreter's fp8 cast (dcpcheck.interpreter.fp8), if any."""
    language_patch: str = field(default="", compare=False)
    """How often the interpreter patches ``triton.language`` (dcpcheck.interpreter.calls)."""
    dtype_paths: str = field(default="", compare=False)
    """Whether the interpreter's bf16 casts take the fast path (dcpcheck.interpreter.dtypes)."""
    masks: str = field(default="", compare=False)
    """How the interpreter reads integer masks (dcpcheck.interpreter.masks)."""
    dots: str = field(default="", compare=False)
    """How the interpreter multiplies bf16 blocks (dcpcheck.interpreter.dots)."""
    scalars: str = field(default="", compare=False)
    """How the interpreter turns loaded scalars into integers (dcpcheck.interpreter.scalars)."""
    bf16_casts: str = field(default="", compare=False)
    """How the interpreter casts to and from bf16 (dcpcheck.interpreter.bf16_casts)."""
    overflow_checks: str = field(default="", compare=False)
    """Whether the interpreter computes its dropped overflow checks
    (dcpcheck.interpreter.overflow_checks)."""
    block_types: str = field(default="", compare=False)
    """Whether the interpreter builds each block type and tensor shape once
    (dcpcheck.interpreter.block_types)."""
    binary_ops: str = field(default="", compare=False)
    """Whether the interpreter skips converting the operands of a binary operation that
    need none (dcpcheck.interpreter.binary_ops)."""

    def describe(self) -> str:
        if self.interpreted:
            notes = (
                self.fp8_cast,
                self.language_patch,
                self.dtype_paths,
                self.masks,
                self.dots,
                self.scalars,
                self.bf16_casts,
                self.overflow_checks,
                self.block_types,
                self.binary_ops,
            )
            notes = [n for n in notes if n]
            note = "".join(f"; {n}" for n in notes)
            return f"cpu (Triton interpreter, TRITON_INTERPRET=1: no CUDA device in use{note})"
        return f"{self.device} ({torch.cuda.get_device_name(self.device)})"


_selected: Backend | None = None


def _kernel_modules_loaded() -> bool:
    return any(name in sys.modules for name in kernel_modules())


def planned_device(device: str = "auto") -> torch.device:
    """The device ``select_backend(device)`` would pick, without picking it (nothing is
    imported or installed): what the up-front checks size a run against."""
    if device not in ("auto", "cuda", "cpu"):
        raise BackendError(f"unknown device {device!r} (expected auto, cuda or cpu)")
    if device == "cuda" and not torch.cuda.is_available():
        raise BackendError("--device cuda asked for, but torch sees no CUDA device")
    want_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    return torch.device("cuda" if want_cuda else "cpu")


def select_backend(device: str = "auto") -> Backend:
    """Pick the device for this process: ``auto`` (CUDA if present), ``cuda`` or ``cpu``.

    The first call fixes the choice; a later call asking for a different one is an error,
    because kernels already defined cannot switch between compiled and interpreted.
    """
    global _selected
    target = planned_device(device)
    chosen = Backend(target, interpreted=target.type != "cuda")
    if _selected is not None:
        if _selected != chosen and device != "auto":
            raise BackendError(
                f"backend already fixed to {_selected.describe()}; cannot switch to {device}"
            )
        return _selected
    if chosen.interpreted:
        os.environ["TRITON_INTERPRET"] = "1"
        from dcpcheck.interpreter import install

        chosen = replace(chosen, **install())
        from dcpcheck.gpu_fit import record_if_asked

        record_if_asked()
    elif os.environ.get("TRITON_INTERPRET") == "1":
        if _kernel_modules_loaded():
            raise BackendError("kernels were defined under TRITON_INTERPRET=1; cannot use cuda")
        os.environ["TRITON_INTERPRET"] = "0"
    if not chosen.interpreted:
        from dcpcheck.triton_key import remember

        remember()
    _selected = chosen
    return chosen


def current_backend() -> Backend:
    """The backend chosen so far, choosing ``auto`` if none was."""
    return _selected if _selected is not None else select_backend("auto")
