"""vLLM's ``triton_reshape_and_cache_flash``, release by release, under the op's protocol,
called as the release's attention backends call it.

The function lives in ``vllm/attention/ops/triton_reshape_and_cache_flash.py`` (0.11.0 -
0.13.0) and ``vllm/v1/attention/ops/triton_reshape_and_cache_flash.py`` (0.14.0 on); 0.10.2
has neither. It is taken alone from its file with what it needs of it
(``loading.definitions_alone``) and the stand-ins below for its imports of vLLM.

**How its callers call it** (``callers``, release by release). The Triton attention
backend (``TritonAttentionImpl``, ``vllm/v1/attention/backends/triton_attn.py``) views its
cache as K and V, as the platform's fp8 dtype when its ``kv_cache_dtype`` starts with
``fp8``, and passes ``(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
layer._k_scale, layer._v_scale)``: positionally, the layer's slot mapping and its fp32
scale tensors. ROCm's backend passes the head-major 5-D key cache as allocated (uint8 for
an fp8 cache, which the function views itself), and so does this adapter. A layout no
caller of the release passes, and every case above DCP1 (no backend that calls the function
runs under DCP), is not applicable, with the line that shows it.

**Stand-ins.** ``current_platform`` is ``dcpcheck.adapters.shims.vllm.platforms``'s, which
also answers ``is_xpu`` (no) and, under Triton's interpreter, ``has_device_capability``
as an sm_90 GPU (the interpreter stores fp8e4nv as such a GPU does, with dcpcheck's
correction of its cast); ``torch`` is torch but for ``torch.cuda.get_device_capability``,
which on a CPU tensor answers sm_90 too: both choose launch parameters (a tile width, whether
fp8 may be stored), never what is computed. ``is_quantized_kv_cache`` is the shim's.
"""

from __future__ import annotations

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
from dcpcheck.kernels.loading import definitions_alone
from dcpcheck.op_registry import OPS, RESHAPE_AND_CACHE_FLASH
from dcpcheck.ops.reshape_and_cache_flash import callers
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


@dataclass(frozen=True)
class VllmCacheWrite:
    """A release's function under the op's protocol (module docstring)."""

    function: Callable[..., object]
    name: str
    version: str

    @classmethod
    def of(cls, path: Path, name: str, version: str) -> VllmCacheWrite:
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
        return cls(function, name, version)  # type: ignore[arg-type]

    def not_applicable(self, inputs: CacheWriteInputs) -> str | None:
        """Why the release's callers never ask the case (module docstring), or None."""
        refused = callers.DCP_REFUSED.get(self.version)
        if inputs.dcp_size > 1 and refused is not None:
            return (
                f"{self.name} runs no backend that calls {FUNCTION} under DCP: the impls "
                f"keep can_return_lse_for_decode False, which {refused} asserts"
            )
        group = callers.group_of(self.version)
        if group is not None and inputs.layout not in group.passed:
            return f"{self.name}'s callers never pass a {inputs.layout} cache: {group.never}"
        return None

    def __call__(
        self, inputs: CacheWriteInputs, key_cache: torch.Tensor, value_cache: torch.Tensor
    ) -> None:
        if inputs.layout == "head-major" and inputs.kv_cache_dtype == "fp8":
            key_cache, value_cache = key_cache.view(torch.uint8), value_cache.view(torch.uint8)
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
