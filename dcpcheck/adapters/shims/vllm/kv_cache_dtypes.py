"""Stand-in for ``is_quantized_kv_cache`` (``vllm.utils.torch_utils`` in vLLM 0.29.0 -
0.32.0, ``vllm.v1.kv_cache_interface`` from 0.33.0).

The kernel file asks it one thing: whether the MLA cache dtype string names a quantized
cache, to choose between storing elements (``auto``) and encoding them. The harness passes
only the cache layouts it knows (dcpcheck.ops.fused_norm_rope.contract.CacheLayout); any
other name is refused here rather than guessed, so a new vLLM cache dtype shows up as a
load-time error instead of a silently wrong answer.
"""

from __future__ import annotations

QUANTIZED_KV_CACHE_DTYPES = {
    "auto": False,  # the activation dtype: elements stored as they are
    "fp8": True,  # per-tensor-scaled fp8
    "fp8_e4m3": True,  # vLLM's other spelling of the same
    "fp8_ds_mla": True,  # DeepSeek's tiled fp8 entry (656 bytes)
    "nvfp4_ds_mla": True,  # the e2m1 entry of vLLM 0.30+ (352 bytes)
}
"""The answer for every cache dtype the harness can hand a vLLM kernel."""


def is_quantized_kv_cache(kv_cache_dtype: str) -> bool:
    """Whether ``kv_cache_dtype`` stores encoded (quantized) values rather than elements."""
    try:
        return QUANTIZED_KV_CACHE_DTYPES[kv_cache_dtype]
    except KeyError:
        raise ValueError(
            f"dcpcheck's stand-in for vllm's is_quantized_kv_cache knows "
            f"{', '.join(QUANTIZED_KV_CACHE_DTYPES)}, not {kv_cache_dtype!r}"
        ) from None
