"""Whether vLLM's callers ever hand ``fused_norm_rope`` a cache whose blocks lie apart
(``Scenario.block_gap``): facts read from each release's wheel, in files the release cache
does not hold, declared here with their lines. The adapter quotes them where a case's caches
have a gap between blocks (``vllm.VllmFusedNormRope.not_applicable``), for a kernel loaded as
``vllm==X`` alone: a file named by its path has no release's callers, and is judged.

0.25.0 - 0.28.0 address both caches as if their blocks were back to back (the MLA block size
is ``stride(0) // stride(1)``, the indexer's block start ``block * block_size * shape[2]``),
and no caller of theirs passes any other cache:

* These releases have no block-outermost layout: the layouts a KV cache may take are
  ``NHD`` and ``HND`` (:data:`LAYOUT_NAMES`, and ``VLLM_KV_CACHE_LAYOUT``'s choices in
  ``envs.py``), both with the block dimension of each layer's own tensor outermost.
* DeepSeek V3.2's MLA and indexer caches are full-attention specs of one block size, so
  they form one group of uniform type (:data:`UNIFORM_TYPE_GROUP`), and that group gives
  every layer a tensor of its own (:data:`PER_LAYER_TENSOR`), which the runners allocate
  alone and view contiguously (:data:`CONTIGUOUS_VIEW`): a layer's blocks lie back to back.
  The packed and padded-page views that do lay blocks apart serve several groups
  (DeepSeek V4, ``--enable-cross-layers``), and the indexer opts out of cross-layer blocks
  (``v1/attention/backends/mla/indexer.py``: "DeepseekV32Indexer kernels do not support
  cross-layer").

From 0.29.0 a block-outermost layout (``VLLM_KV_CACHE_LAYOUT=BLHNC`` or ``BLNHC``) is accepted
for DeepSeek V3.2 and gives every layer's view the whole block of every layer as its
``stride(0)`` (``v1/core/kv_cache_utils.py:1438`` in 0.29.0); HiSparse (0.30.0) and a DCP1
draft under a DCP target (0.31.0) choose one themselves. So 0.29.0 on is judged on such caches:
0.29.0 addresses the indexer cache by its shape (README), and fails.
"""

from __future__ import annotations

from dcpcheck.ops.fused_norm_rope.indexer_groups import declared

LAYOUT_NAMES = {("0.25.0", "0.25.1", "0.26.0", "0.27.0", "0.27.1", "0.28.0"): 42}
"""The line of ``vllm/v1/attention/backends/utils.py`` where each release names the layouts a
KV cache may take (``KVCacheLayoutType = Literal["NHD", "HND"]``)."""

UNIFORM_TYPE_GROUP = {
    ("0.25.0", "0.25.1"): 1723,
    ("0.26.0",): 1754,
    ("0.27.0", "0.27.1"): 1807,
    ("0.28.0",): 1767,
}
"""The line of ``vllm/v1/core/kv_cache_utils.py`` where each release puts layers of one
attention type and block size into one group (``UniformTypeKVCacheSpecs.from_specs``)."""

PER_LAYER_TENSOR = {
    ("0.25.0", "0.25.1"): 1358,
    ("0.26.0",): 1384,
    ("0.27.0", "0.27.1"): 1401,
    ("0.28.0",): 1367,
}
"""The line of ``vllm/v1/core/kv_cache_utils.py`` where that group's KV cache tensors are
made, one per layer (``shared_by=[layer_name]``) and none packed."""

CONTIGUOUS_VIEW = {("0.25.0", "0.25.1", "0.26.0"): 251, ("0.27.0", "0.27.1"): 262, ("0.28.0",): 341}
"""The line of ``vllm/v1/worker/gpu/attn_utils.py`` where each release views an unpacked,
unpadded layer tensor as its cache, contiguously (``kv_raw_tensor.view(dtype).view(...)``)."""


def apart_never_passed(version: str | None) -> str | None:
    """Why release ``version``'s callers never pass a cache whose blocks lie apart, with the
    lines (module docstring); None for a kernel with no release's callers or a release whose
    callers may."""
    layouts = declared(LAYOUT_NAMES, version)
    if layouts is None:
        return None
    return (
        f"vLLM {version}'s callers never pass a cache whose blocks lie apart: its KV cache "
        f'layouts are NHD and HND alone (v1/attention/backends/utils.py:{layouts}), '
        "DeepSeek V3.2's MLA and indexer caches form one group of uniform type "
        f"(v1/core/kv_cache_utils.py:{declared(UNIFORM_TYPE_GROUP, version)}) that gives "
        f"every layer a tensor of its own (:{declared(PER_LAYER_TENSOR, version)}), viewed "
        f"contiguously (v1/worker/gpu/attn_utils.py:{declared(CONTIGUOUS_VIEW, version)})"
    )
