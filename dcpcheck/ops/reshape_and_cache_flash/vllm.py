"""vLLM's ``triton_reshape_and_cache_flash``, release by release, under the op's protocol,
called as the release's attention backends call it.

The function lives in ``vllm/attention/ops/triton_reshape_and_cache_flash.py`` (0.11.0 -
0.13.0) and ``vllm/v1/attention/ops/triton_reshape_and_cache_flash.py`` (0.14.0 on); 0.10.2
has neither. It is taken alone from its file with what it needs of it
(``loading.definitions_alone``) and the stand-ins below for its imports of vLLM.

**How its callers call it.** The Triton attention backend (``TritonAttentionImpl``,
``vllm/v1/attention/backends/triton_attn.py``) unbinds its ``[blocks, 2, block_size,
kv_heads, head_size]`` cache into K and V, views them as the platform's fp8 dtype when its
``kv_cache_dtype`` starts with ``fp8``, and passes ``(key, value, key_cache, value_cache,
slot_mapping, kv_cache_dtype, layer._k_scale, layer._v_scale)``: positionally, the layer's
rank-local slot mapping and its fp32 scale tensors (the op's ``nhd`` layout). ROCm's
backends pass the head-major 5-D key cache, which the function handles where its file
reads ``key_cache.ndim == 5``; a cache whose heads are not contiguous (the op's ``hnd``
layout) is asked only of a release whose function addresses heads by their stride.
A case a release's function cannot be asked is not applicable, with the reason.

**Stand-ins.** ``current_platform`` is ``dcpcheck.adapters.shims.vllm.platforms``'s, which
also answers ``is_xpu`` (no) and, under Triton's interpreter, ``has_device_capability``
as an sm_90 GPU (the interpreter stores fp8e4nv as such a GPU does, with dcpcheck's
correction of its cast); ``torch`` is torch but for ``torch.cuda.get_device_capability``,
which on a CPU tensor answers sm_90 too: both choose launch parameters (a tile width, whether
fp8 may be stored), never what is computed. ``is_quantized_kv_cache`` is the shim's.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import triton
import triton.language as tl

from dcpcheck.adapters.protocol import AdapterError
from dcpcheck.adapters.shims.vllm.kv_cache_dtypes import is_quantized_kv_cache
from dcpcheck.adapters.shims.vllm.platforms import StandInPlatform
from dcpcheck.kernels.loading import definitions_alone, source_of
from dcpcheck.op_registry import OPS, RESHAPE_AND_CACHE_FLASH
from dcpcheck.ops.reshape_and_cache_flash.contract import CacheWriteInputs

FUNCTION = OPS[RESHAPE_AND_CACHE_FLASH].function
MEMBERS = OPS[RESHAPE_AND_CACHE_FLASH].wheel_members
"""The files the function lived in, oldest first."""

PARAMETERS = (
    "key", "value", "key_cache", "value_cache", "slot_mapping", "kv_cache_dtype", "k_scale",
    "v_scale",
)  # fmt: skip
"""The parameters every release's callers pass, in their order."""

SM90 = (9, 0)


class _Platform(StandInPlatform):
    """The shim's platform, with the two answers this file asks beyond it (module
    docstring)."""

    def is_xpu(self) -> bool:
        return False

    def has_device_capability(self, capability: int) -> bool:
        if not torch.cuda.is_available():
            return capability <= SM90[0] * 10 + SM90[1]
        return super().has_device_capability(capability)


def _device_capability(device: Any = None) -> tuple[int, int]:
    if torch.device(device or "cpu").type == "cpu":
        return SM90
    return torch.cuda.get_device_capability(device)


class _Torch(SimpleNamespace):
    """torch, but for ``cuda.get_device_capability`` (module docstring)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


_TORCH = _Torch(cuda=SimpleNamespace(get_device_capability=_device_capability))

HEAD_MAJOR = re.compile(r"key_cache\.ndim == 5")
STRIDED_HEADS = re.compile(r"block_offset \* page_stride\s*\+\s*cur_head \* head_stride")
"""What a release's file says it handles: the 5-D head-major key cache; heads addressed by
their stride in a 4-D cache."""


@dataclass(frozen=True)
class VllmCacheWrite:
    """A release's function under the op's protocol (module docstring)."""

    function: Callable[..., object]
    name: str
    head_major: bool
    strided_heads: bool

    @classmethod
    def of(cls, path: Path, name: str) -> VllmCacheWrite:
        provided: dict[str, object] = {
            "torch": _TORCH,
            "triton": triton,
            "tl": tl,
            "current_platform": _Platform(),
            "is_quantized_kv_cache": is_quantized_kv_cache,
        }
        function = definitions_alone(path, FUNCTION, provided, name)[FUNCTION]
        parameters = tuple(function.__code__.co_varnames[: len(PARAMETERS)])  # type: ignore[attr-defined]
        if parameters != PARAMETERS:
            raise AdapterError(
                f"{name}: {FUNCTION} takes ({', '.join(parameters)}), not the "
                f"({', '.join(PARAMETERS)}) its callers pass"
            )
        source = source_of(path)
        return cls(
            function,  # type: ignore[arg-type]
            name,
            HEAD_MAJOR.search(source) is not None,
            STRIDED_HEADS.search(source) is not None,
        )

    def not_applicable(self, inputs: CacheWriteInputs) -> str | None:
        """Why the case cannot be asked (module docstring), or None."""
        if inputs.layout == "head-major" and not self.head_major:
            return f"{self.name}'s {FUNCTION} has no head-major (5-D) key cache"
        if inputs.layout == "hnd" and not self.strided_heads:
            return (
                f"{self.name}'s {FUNCTION} writes 4-D caches whose heads are contiguous "
                "(a head stride of head_size); a cache with a head stride of its own is "
                "asked from the first release that addresses heads by it"
            )
        return None

    def __call__(
        self, inputs: CacheWriteInputs, key_cache: torch.Tensor, value_cache: torch.Tensor
    ) -> None:
        self.function(
            inputs.key,
            inputs.value,
            key_cache,
            value_cache,
            inputs.slot_mapping,
            inputs.kv_cache_dtype,
            inputs.k_scale,
            inputs.v_scale,
        )
