"""Stand-in for ``vllm.platforms``: ``current_platform``, answered from torch.

vLLM's kernel files ask the platform for launch choices - whether Programmatic Dependent
Launch may be used (``is_arch_support_pdl``), whether the device is CUDA or ROCm, whether it
reaches a compute capability - and, from 0.31.0 on, for its fp8 dtype (``fp8_dtype``). The
launch choices change how a kernel is launched, not what it computes, so answering them
from torch keeps results intact; the fp8 dtype is the one NVIDIA GPUs and the harness's
oracle use.
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

    def fp8_dtype(self) -> torch.dtype:
        """``torch.float8_e4m3fn`` (OCP e4m3, max 448): vLLM's answer on every NVIDIA GPU.
        Only AMD's gfx942 answers e4m3fnuz, and dcpcheck runs no ROCm device."""
        return torch.float8_e4m3fn

    def __getattr__(self, name: str):
        raise AttributeError(
            f"current_platform.{name} is not part of dcpcheck's vllm.platforms stand-in "
            "(dcpcheck/adapters/shims/vllm/platforms.py); install vllm to use it"
        )


current_platform = StandInPlatform()
