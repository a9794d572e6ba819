"""Adapter for vLLM's fused MLA norm + RoPE + cache-write op, ``fused_norm_rope``
(``vllm/models/deepseek_v32/common/kernels.py``), in the two API shapes it has had.

Both shapes take, by keyword: ``positions`` [T] int64; ``q_c``/``kv_c``/``k_pe`` with
their RMSNorm weights and one eps each; ``k_rope_cos_sin_cache`` [max_pos, R] whose row
``p`` is ``[cos | sin]`` (the harness's table, DESIGN §2) and the same table again as
``index_k_rope_cos_sin_cache`` (the indexer rotates its first R lanes); the indexer's
``index_k`` with its LayerNorm weight, bias (fp32) and eps; ``topk_indices_buffer``
[T, topk] int32; ``mla_kv_cache`` [num_blocks, B, entry] with ``mla_kv_cache_dtype``
``auto`` / ``fp8`` / ``fp8_ds_mla`` (the harness's CacheLayout values) and
``mla_k_scale``, a one-element fp32 tensor; ``indexer_k_cache`` [num_blocks, B, I + 4]
bytes; ``has_indexer``, ``index_rope_interleave``; and ``q_c_out`` for Q.

* **In place** (vLLM at 01b9c661, the golden vectors' commit): ``write_kv_output=True``
  makes the kernel store the normalized KV into ``kv_c`` and the rotated k_pe into
  ``k_pe``; the indexer has its own ``indexer_slot_mapping``; index K has no output.
* **Separate outputs** (after PR 54908): ``kv_c_out``, ``k_pe_out`` and ``index_k_out``
  buffers; one ``slot_mapping`` serves both caches.

Cache views: for ``auto`` the kernel stores KV and k_pe as elements, so the MLA cache is
the harness's bytes viewed in the activation dtype ([.., KV + R] elements); for the fp8
layouts vLLM's wrapper itself views a uint8 cache as fp8 (and, for ``fp8_ds_mla``, as
fp32 and bf16 at byte strides), so the bytes go as they are. Every view shares the
harness's memory, so the kernel's cache writes land where the checks read them.

A profiling call (no slot mapping) passes no caches: both wrappers insist on a slot
mapping whenever a cache is given.
"""

from __future__ import annotations

import enum
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from dcpcheck.adapters import AdapterError, Limitation
from dcpcheck.contract import CacheLayout, FusedOpCaches, FusedOpInputs, FusedOpOutputs


class ApiShape(enum.Enum):
    """The known signatures of vLLM's ``fused_norm_rope``."""

    IN_PLACE = "in-place kv_c/k_pe outputs (write_kv_output)"
    SEPARATE_OUTPUTS = "separate kv_c_out/k_pe_out/index_k_out outputs"


COMMON_PARAMETERS = (
    "positions",
    "q_c",
    "q_rms_norm_w",
    "q_rms_eps",
    "kv_c",
    "kv_rms_norm_w",
    "kv_rms_eps",
    "k_pe",
    "k_rope_cos_sin_cache",
    "index_k",
    "index_k_layer_norm_w",
    "index_k_layer_norm_bias",
    "index_k_layer_norm_eps",
    "index_k_rope_cos_sin_cache",
    "topk_indices_buffer",
    "slot_mapping",
    "indexer_k_cache",
    "mla_kv_cache",
    "mla_kv_cache_dtype",
    "mla_k_scale",
    "has_indexer",
    "index_rope_interleave",
    "q_c_out",
)
"""Parameters every known shape has (vLLM names, passed by keyword)."""

SHAPE_PARAMETERS: dict[ApiShape, tuple[str, ...]] = {
    ApiShape.IN_PLACE: ("indexer_slot_mapping", "write_kv_output"),
    ApiShape.SEPARATE_OUTPUTS: ("kv_c_out", "k_pe_out", "index_k_out"),
}
"""The parameters that tell one shape from the other."""

NO_INDEX_K_OUTPUT = Limitation(
    ("outputs", "ranks_agree"),
    "index_k_out",
    "vLLM's in-place fused_norm_rope API (write_kv_output) has no indexer-K output buffer",
)

ONE_SLOT_MAPPING = Limitation(
    (
        "cache_owned",
        "cache_foreign",
        "prefix_intact",
        "padding_inert",
        "guard_bands",
        "shards_reassemble",
    ),
    "index_cache",
    "vLLM's fused_norm_rope with kv_c_out/k_pe_out takes one slot_mapping for both caches, "
    "so it cannot write the indexer cache under the indexer's own slot mapping; "
    "the indexer cache was not passed",
)


def _parameters(function: Callable[..., object]) -> set[str] | None:
    try:
        return set(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return None


def api_shape(function: Callable[..., object]) -> ApiShape | None:
    """The known vLLM shape ``function``'s signature has, or None (none, or ambiguous)."""
    names = _parameters(function)
    if names is None or not names.issuperset(COMMON_PARAMETERS):
        return None
    shapes = [shape for shape, extra in SHAPE_PARAMETERS.items() if names.issuperset(extra)]
    return shapes[0] if len(shapes) == 1 else None


def signature_text(function: Callable[..., object]) -> str:
    """``function``'s signature in one line, for error messages."""
    try:
        return f"{getattr(function, '__name__', 'callable')}{inspect.signature(function)}"
    except (TypeError, ValueError):
        return repr(function)


def _mla_cache_view(cache: torch.Tensor, inputs: FusedOpInputs) -> torch.Tensor:
    """The MLA cache as the kernel addresses it (module docstring): same memory."""
    if inputs.cache_layout is CacheLayout.AUTO:
        return cache.view(inputs.kv_c.dtype)
    return cache


@dataclass(frozen=True)
class VllmFusedNormRope:
    """vLLM's ``fused_norm_rope`` in one of its :class:`ApiShape` s, as a protocol kernel."""

    function: Callable[..., object]
    shape: ApiShape
    name: str = "vllm"

    def limitations(self, inputs: FusedOpInputs) -> tuple[Limitation, ...]:
        if not inputs.has_indexer:
            return ()
        if self.shape is ApiShape.IN_PLACE:
            return (NO_INDEX_K_OUTPUT,)
        if not self._one_mapping_serves_both(inputs):
            return (ONE_SLOT_MAPPING,)
        return ()

    @staticmethod
    def _one_mapping_serves_both(inputs: FusedOpInputs) -> bool:
        """Whether the indexer's slots are the MLA cache's (a sharded indexer), so the
        separate-outputs shape's single ``slot_mapping`` can address both caches."""
        if inputs.slot_mapping is None or inputs.index_slot_mapping is None:
            return True
        return torch.equal(inputs.slot_mapping, inputs.index_slot_mapping)

    def _common_arguments(
        self, inputs: FusedOpInputs, outputs: FusedOpOutputs, caches: FusedOpCaches
    ) -> dict[str, Any]:
        profiling = inputs.slot_mapping is None
        mla_scale = None
        if inputs.cache_layout is CacheLayout.FP8 and inputs.mla_scale is not None:
            mla_scale = torch.tensor(
                [inputs.mla_scale], dtype=torch.float32, device=inputs.kv_c.device
            )
        return {
            "positions": inputs.positions,
            "q_c": inputs.q_c,
            "q_rms_norm_w": inputs.q_weight,
            "q_rms_eps": inputs.eps,
            "kv_rms_norm_w": inputs.kv_weight,
            "kv_rms_eps": inputs.eps,
            "k_rope_cos_sin_cache": inputs.cos_sin,
            "index_k": inputs.index_k,
            "index_k_layer_norm_w": inputs.index_weight,
            "index_k_layer_norm_bias": inputs.index_bias,
            "index_k_layer_norm_eps": inputs.eps,
            "index_k_rope_cos_sin_cache": inputs.cos_sin if inputs.has_indexer else None,
            "topk_indices_buffer": outputs.topk_indices,
            "slot_mapping": inputs.slot_mapping,
            "indexer_k_cache": None if profiling else caches.index,
            "mla_kv_cache": None if profiling else _mla_cache_view(caches.mla, inputs),
            "mla_kv_cache_dtype": inputs.cache_layout.value,
            "mla_k_scale": mla_scale,
            "has_indexer": inputs.has_indexer,
            "index_rope_interleave": inputs.index_rope_interleaved,
            "q_c_out": outputs.q_out,
        }

    def __call__(
        self, inputs: FusedOpInputs, outputs: FusedOpOutputs, caches: FusedOpCaches
    ) -> None:
        arguments = self._common_arguments(inputs, outputs, caches)
        if self.shape is ApiShape.IN_PLACE:
            # The kernel overwrites kv_c and k_pe: hand it copies, never the harness's
            # inputs, and read the results back into the harness's outputs.
            kv_c, k_pe = inputs.kv_c.clone(), inputs.k_pe.clone()
            self.function(
                **arguments,
                kv_c=kv_c,
                k_pe=k_pe,
                indexer_slot_mapping=inputs.index_slot_mapping,
                write_kv_output=True,
            )
            outputs.kv_out.copy_(kv_c)
            outputs.kpe_out.copy_(k_pe)
            return
        if not self._one_mapping_serves_both(inputs):
            arguments["indexer_k_cache"] = None  # see ONE_SLOT_MAPPING
        self.function(
            **arguments,
            kv_c=inputs.kv_c,
            k_pe=inputs.k_pe,
            kv_c_out=outputs.kv_out,
            k_pe_out=outputs.kpe_out,
            index_k_out=outputs.index_k_out,
        )


def adapt(function: Callable[..., object]) -> VllmFusedNormRope:
    """``function`` (a vLLM ``fused_norm_rope``) as a protocol kernel."""
    shape = api_shape(function)
    if shape is None:
        names = _parameters(function) or set()
        missing = [p for p in COMMON_PARAMETERS if p not in names]
        if missing:
            why = f"lacks {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}"
        else:
            shapes = " / ".join("+".join(extra) for extra in SHAPE_PARAMETERS.values())
            why = f"has not exactly one of the shapes' own parameters ({shapes})"
        raise AdapterError(f"not a known vLLM fused_norm_rope signature: it {why}")
    return VllmFusedNormRope(function, shape)
