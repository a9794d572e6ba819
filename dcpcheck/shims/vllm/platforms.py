"""Stand-in for ``vllm.platforms``: ``current_platform``, answered from torch.

vLLM's kernel files ask the platform only for launch choices: whether Programmatic
Dependent Launch may be used (``is_arch_support_pdl``), whether the device is CUDA or
ROCm, and whether it reaches a compute capability. None of these changes what a kernel
computes, only how it is launched, so answering them from torch keeps results intact.
"""

from __future__ import annotations

import torch


class StandInPlatform:
    """The few ``current_platform`` queries vLLM's kernel files make."""

    def is_cuda(self) -> bool:
        return torch.cuda.is_available() and torch.version.cuda is not None

    def is_rocm(self) -> bool:
        return torch.cuda.is_available() and torch.version.hip is not None

    def has_device_capability(self, capability: int) -> bool:
        """``capability`` as vLLM writes it, ``major * 10 + minor`` (90 = Hopper)."""
        if not torch.cuda.is_available():
            return False
        major, minor = torch.cuda.get_device_capability()
        return major * 10 + minor >= capability

    def is_arch_support_pdl(self) -> bool:
        """Always False: PDL only overlaps a kernel's prologue with the previous kernel's
        tail, which the harness (one launch at a time) has no use for, and Triton's CPU
        interpreter has no ``gdc_wait``. Results do not depend on it."""
        return False

    def __getattr__(self, name: str):
        raise AttributeError(
            f"current_platform.{name} is not part of dcpcheck's vllm.platforms stand-in "
            "(dcpcheck/shims/vllm/platforms.py); install vllm to use it"
        )


current_platform = StandInPlatform()
