"""Whose slot mapping vLLM's callers hand ``fused_norm_rope`` as ``indexer_slot_mapping``
(0.30.0 on), and whether it ever stores a token on other ranks than the MLA
``slot_mapping`` does: facts read from each release's wheel, in files the release cache does
not hold, declared here with their lines. The adapter quotes them where a case gives the
indexer an ownership of its own under DCP (``vllm.VllmFusedNormRope.not_applicable``), for a
kernel loaded as ``vllm==X`` alone: a file named by its path has no release's callers, and
is judged on such a case.

In every release from 0.30.0 to 0.34.0 the callers never do:

* The NVIDIA caller, ``vllm/models/deepseek_v32/attention.py``, takes both mappings from
  the runner's per-layer mappings, the MLA layer's and the indexer cache layer's
  (:data:`MAPPINGS_TAKEN`); the runners give every layer its cache group's mapping
  (``slot_mappings_by_layer[layer_name] = slot_mapping``, ``v1/worker/gpu_model_runner.py``
  and ``v1/worker/gpu/attn_utils.py``). Its indexer cache is a ``DeepseekV32IndexerCache``
  (:data:`INDEXER_CACHE_CLASS`; ``deepseek_v32/nvidia/model.py`` builds this attention
  with its own indexer class, and only ROCm's subclass names another), whose spec is an
  ``MLAAttentionSpec`` of the model's block size that names no DCP flag
  (:data:`INDEXER_SPEC`), as the MLA layer's own spec (``MLAAttention.get_kv_cache_spec``)
  names none.
* 0.30.0 has no DCP flag on a spec: both runners shard every group they plan
  (:data:`RANK_OF_EVERY_GROUP`, :data:`OWNER_TEST`). From 0.31.0 an attention spec is
  sharded unless marked (``dcp_sharded: bool = True``, :data:`SHARDED_UNLESS_MARKED`), and
  the one place a runner marks one is a draft that runs at DCP1 under a DCP target, whose
  attention layers are all marked alike (:data:`DRAFT_KEPT_WHOLE`; every
  ``AttentionLayerBase`` of the draft, the indexer cache layer among them), so a model's MLA
  and indexer caches are sharded together or kept whole together.
* Every sharded group's tokens are dealt to the ranks by one test, the same DCP size, rank
  and interleave for every group (:data:`OWNER_TEST`; the V1 runner's table takes them once
  for every group, :data:`RANK_OF_EVERY_GROUP`), so two sharded mappings of one step store
  each token on the same rank.
* The ROCm caller (``deepseek_v32/amd/rocm.py``) passes no ``indexer_slot_mapping``, and the
  wrapper then addresses the indexer with the MLA mapping (:data:`ROCM_FALLBACK`).
* The one group a release keeps whole on every rank from 0.32.0, GLM-5-Next's kpool-tail
  ring (a ``CircularBufferSpec`` with ``dcp_sharded=False``,
  ``models/glm5next/common/attention.py:178``), never reaches ``fused_norm_rope``: no
  GLM-5-Next module calls it (its attention is ``MultiHeadLatentAttentionWrapper``), and the
  ring is written by GLM-5-Next's own ``kpool_seed_tail_cache`` from the slots the ring's
  metadata builder computes (:data:`RING_WRITER`; ``compute_kpool_tail_slot_mapping``,
  ``kept_whole.RING_REMAPPED`` of the slot-mapping op). HiSparse, whose hot caches are groups
  of their own, is refused under DCP at start-up (``vllm/config/vllm.py``).
"""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")

MAPPINGS_TAKEN = {
    ("0.30.0", "0.31.0"): (314, 316),
    ("0.32.0", "0.33.0"): (326, 328),
    ("0.34.0",): (323, 325),
}
"""The lines of ``vllm/models/deepseek_v32/attention.py`` where each release's caller takes
the MLA layer's mapping (``slot_mapping.get(self.layer_name)``) and the indexer cache's
(``slot_mapping.get(self.indexer.k_cache.prefix)``) from ``forward_context.slot_mapping``,
the runner's mapping of each layer, before it passes them as ``slot_mapping`` and
``indexer_slot_mapping``."""

INDEXER_CACHE_CLASS = {("0.30.0", "0.31.0", "0.32.0", "0.33.0"): 51, ("0.34.0",): 55}
"""The line of ``vllm/models/deepseek_v32/attention.py`` where the indexer of each release's
caller names its cache class (``indexer_cache_cls = DeepseekV32IndexerCache``)."""

INDEXER_SPEC = {("0.30.0", "0.31.0"): 658, ("0.32.0", "0.33.0", "0.34.0"): 659}
"""The line of ``vllm/model_executor/models/deepseek_v2.py`` where each release's
``DeepseekV32IndexerCache.get_kv_cache_spec`` returns an ``MLAAttentionSpec`` of
``cache_config.block_size`` with no ``dcp_sharded`` argument."""

SHARDED_UNLESS_MARKED = {("0.31.0",): 488, ("0.32.0",): 512, ("0.33.0",): 553, ("0.34.0",): 560}
"""The line of ``vllm/v1/kv_cache_interface.py`` where each release from 0.31.0 gives every
``AttentionSpec`` ``dcp_sharded: bool = True``."""

DRAFT_KEPT_WHOLE = {("0.31.0",): 575, ("0.32.0",): 602, ("0.33.0",): 620, ("0.34.0",): 641}
"""The line of ``vllm/v1/worker/gpu/model_runner.py`` where each release from 0.31.0 marks a
spec not sharded (``replace(kv_cache_spec[name], dcp_sharded=False)``), the one such place
in its runners: for every layer of ``draft_attn_layer_names`` (every ``AttentionLayerBase``
the draft model registers) when the draft runs at DCP1 under a DCP target."""

OWNER_TEST = {
    ("0.30.0", "0.32.0"): 333,
    ("0.31.0",): 344,
    ("0.33.0", "0.34.0"): 394,
}
"""The line of ``vllm/v1/worker/gpu/block_table.py`` where each release's GPU runner decides
whether a token is a rank's, for every cache group alike (``is_local = virtual_block_offsets
// CP_INTERLEAVE % CP_SIZE == cp_rank``); from 0.31.0 a group marked not sharded is local on
every rank (``is_local = ~sharded | is_local``, six lines below). The interleave divides the
block size (asserted at start-up, ``vllm/config/vllm.py``), so a position has one owner
whatever the group's block size."""

RANK_OF_EVERY_GROUP = {("0.30.0", "0.31.0"): 139, ("0.32.0", "0.33.0"): 98}
"""The line of ``vllm/v1/worker/block_table.py`` where each release's V1 runner gives the
table of every cache group the same DCP rank (``self.dcp_rank =
get_dcp_group().rank_in_group``), with which its slot kernel shards every group; 0.34.0
ships no V1 runner."""

ROCM_FALLBACK = {("0.30.0",): 532, ("0.31.0", "0.32.0"): 572, ("0.33.0", "0.34.0"): 582}
"""The line of ``vllm/models/deepseek_v32/common/kernels.py`` where each release's wrapper,
given no ``indexer_slot_mapping`` (as ``deepseek_v32/amd/rocm.py`` gives none), takes the
MLA ``slot_mapping`` for the indexer (``if indexer_slot_mapping is None:``)."""

RING_WRITER = {("0.32.0",): 240, ("0.33.0",): 247, ("0.34.0",): 272}
"""The line of ``vllm/models/glm5next/nvidia/sparse_indexer.py`` where each release that
keeps GLM-5-Next's kpool-tail ring whole writes it, ``kpool_seed_tail_cache(...)`` with the
ring metadata's ``slot_mapping``: the ring is no argument of ``fused_norm_rope``."""


def declared(table: dict[tuple[str, ...], T], version: str | None) -> T | None:
    """What ``table`` declares for release ``version``, or None."""
    return next((line for versions, line in table.items() if version in versions), None)


def apart_never_passed(version: str | None) -> str | None:
    """Why release ``version``'s callers never pass an indexer mapping that stores a token
    on other ranks than the MLA mapping does, with the lines (module docstring); None for a
    kernel with no release's callers or a release these facts do not cover."""
    taken = declared(MAPPINGS_TAKEN, version)
    if taken is None:
        return None
    mla, index = taken
    sharded = declared(SHARDED_UNLESS_MARKED, version)
    v1 = declared(RANK_OF_EVERY_GROUP, version)
    runners = f"v1/worker/gpu/block_table.py:{declared(OWNER_TEST, version)}"
    if v1 is not None:
        runners += f", v1/worker/block_table.py:{v1}"
    if sharded is None:
        marks = "this release marks no cache group kept whole"
    else:
        marks = (
            f"both specs are sharded unless marked (kv_cache_interface.py:{sharded}), and the "
            "runner marks only a DCP1 draft's attention layers, all alike "
            f"(v1/worker/gpu/model_runner.py:{declared(DRAFT_KEPT_WHOLE, version)})"
        )
    reason = (
        f"vLLM {version}'s callers never pass an indexer_slot_mapping whose ranks differ "
        f"from the MLA slot_mapping's: deepseek_v32/attention.py:{mla},{index} takes both "
        "from the runner's per-layer mappings; its indexer cache "
        f"(DeepseekV32IndexerCache, attention.py:{declared(INDEXER_CACHE_CLASS, version)}) "
        "has an MLAAttentionSpec of the MLA's block size with no DCP flag "
        f"(model_executor/models/deepseek_v2.py:{declared(INDEXER_SPEC, version)}); {marks}; "
        f"every sharded group's tokens go to the ranks by one test ({runners}); "
        "deepseek_v32/amd/rocm.py passes none, and the wrapper takes the MLA mapping "
        f"(common/kernels.py:{declared(ROCM_FALLBACK, version)})"
    )
    ring = declared(RING_WRITER, version)
    if ring is not None:
        reason += (
            "; GLM-5-Next's kpool-tail ring, the one group kept whole, is written by "
            f"kpool_seed_tail_cache (glm5next/nvidia/sparse_indexer.py:{ring}), never by "
            "fused_norm_rope"
        )
    return reason
