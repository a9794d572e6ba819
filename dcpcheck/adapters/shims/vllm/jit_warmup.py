"""Stand-in for vLLM 0.29.0's JIT warm-up base (``vllm.model_executor.warmup``):
``VllmJitKernel``, the class a kernel of the V1 block table derives from so that vLLM can
compile it ahead of the first step, and the two helpers its warm-up uses.

The launch itself is the release's own code (the subclass's ``__call__`` in
``vllm/v1/worker/block_table.py``), which the slot-mapping op judges; warm-up compiles
nothing the launch does not, and the harness never warms up: the helpers refuse to be
used. (From 0.30.0 the launch goes through vLLM's ``kernel_launcher``, whose code is not
in the file: that has no stand-in.)
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

Key = TypeVar("Key")


class VllmJitKernel(Generic[Key]):
    """``VllmJitKernel[CompileKey]``: a subclass holds its Triton kernel and launches it."""

    def register_warmup(self, **dispatch_kwargs: Any) -> None:
        """A compile to do before the first step, which vLLM records: the harness warms
        nothing, and Triton compiles at the first launch anyway."""


def _never(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("dcpcheck's stand-in for vLLM's JIT warm-up: the harness warms nothing")


TritonWarmupTensor = _never
triton_scalar_specialization_rep = _never
