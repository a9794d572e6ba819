"""The slot-mapping kernels dcpcheck can name: the project's (``default``), its mutants
(``mutant/NAME``), or any callable with the op's protocol (``package.module:function``,
``path/to/file.py:function``). Import only once the backend is chosen (``kernel``)."""

from __future__ import annotations

from dcpcheck.kernels.loading import load_callable
from dcpcheck.ops.slot_mapping.contract import SlotMappingKernel
from dcpcheck.ops.slot_mapping.kernel import compute_slot_mappings
from dcpcheck.ops.slot_mapping.mutants import MUTANTS

KERNELS: dict[str, SlotMappingKernel] = {
    "default": compute_slot_mappings,
    **{f"mutant/{m.__name__.replace('_', '-')}": m for m in MUTANTS},
}

DESCRIPTIONS: dict[str, str] = {
    "default": "the project's slot-mapping Triton kernel",
    **{f"mutant/{m.__name__.replace('_', '-')}": m.__doc__.split("\n")[0] for m in MUTANTS},
}
"""What each kernel of ``KERNELS`` is, as ``dcpcheck list kernels`` and the selftest say."""


def load(spec: str) -> SlotMappingKernel:
    """The kernel ``spec`` names (module docstring); ``KernelLoadError`` with one line."""
    if spec in KERNELS:
        return KERNELS[spec]
    return load_callable(spec, list(KERNELS))  # type: ignore[return-value]
