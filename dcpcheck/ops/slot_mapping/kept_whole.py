"""Which cache groups each vLLM release keeps whole on every rank under DCP, and whether
anything reads the slots its runner computes for them: facts read from each release's
wheel, in files the release cache does not hold (``vllm/v1/kv_cache_interface.py``,
``vllm/v1/core/single_type_kv_cache_manager.py``, the attention backends), declared here
with their lines. Both runners' adapters quote them where a release's slot routine, which
shards every group it is handed, is never handed a replicated group whose slots are read
(``vllm.VllmSlotMappings.not_applicable``, ``vllm_v1.VllmV1SlotMappings.replicated``).

In every release a sliding-window group is refused at start-up under DCP
(``SLIDING_WINDOW_REFUSED``). Up to 0.25.1 the KV cache manager shards every group, a
recurrent state's included (``MANAGER_SHARDS``). From 0.26.0 it shards every group but a
recurrent state's (``OTHER_GROUPS_SHARDED``), and that state's reader takes it by block,
never by slot (``RECURRENT_SLOTS_UNREAD``): its ``update_block_table`` is handed the slot
mapping and leaves it unread. DeepSeek V3.2's indexer cache shares the MLA group (one spec
class and block size), which is sharded.
"""

from __future__ import annotations

SLIDING_WINDOW_REFUSED = {
    ("0.10.2",): 171,
    ("0.11.0",): 197,
    ("0.11.1", "0.11.2"): 221,
    ("0.12.0", "0.13.0"): 222,
    ("0.14.0", "0.14.1", "0.15.0", "0.15.1", "0.16.0", "0.17.0", "0.17.1"): 252,
    ("0.18.0", "0.18.1", "0.19.0", "0.19.1"): 252,
    ("0.20.0", "0.20.1", "0.20.2"): 444,
    ("0.21.0",): 466,
    ("0.22.0", "0.22.1"): 486,
    ("0.23.0",): 511,
    ("0.24.0",): 529,
    ("0.25.0", "0.25.1"): 569,
    ("0.26.0",): 591,
    ("0.27.0", "0.27.1"): 611,
    ("0.28.0",): 575,
    ("0.29.0",): 733,
    ("0.30.0",): 845,
    ("0.31.0",): 869,
    ("0.32.0",): 888,
    ("0.33.0",): 947,
}
"""The line of ``vllm/v1/kv_cache_interface.py`` where each V1 release's
``SlidingWindowSpec.max_memory_usage_bytes`` asserts DCP 1 (from 0.31.0: unless the spec is
not DCP-sharded), read from the release's wheel: the engine takes every planned group's
``max_memory_usage_bytes`` at start-up (``get_max_concurrency_for_kv_cache_config`` in
``vllm/v1/core/kv_cache_utils.py``), so a sliding-window group under DCP never reaches the
runner (module docstring)."""

MANAGER_SHARDS = {
    ("0.10.2", "0.11.0"): 40,
    ("0.11.1", "0.11.2"): 46,
    ("0.12.0", "0.13.0"): 48,
    ("0.14.0", "0.14.1", "0.15.0", "0.15.1", "0.16.0"): 50,
    ("0.17.0", "0.17.1", "0.18.0", "0.18.1", "0.19.0", "0.19.1"): 54,
    ("0.20.0", "0.20.1", "0.20.2", "0.21.0"): 63,
    ("0.22.0", "0.22.1"): 64,
    ("0.23.0", "0.24.0"): 70,
    ("0.25.0", "0.25.1"): 71,
}
"""The line of ``vllm/v1/core/single_type_kv_cache_manager.py`` where the base
``SingleTypeKVCacheManager`` of each release up to 0.25.1 multiplies every group's block size
by the DCP size (``self.block_size *= dcp_world_size``), read from the release's wheel: the
manager shards every group, a recurrent state's included; from 0.26.0 the Mamba manager
keeps its spec's block size and the runner builds its table without slots (module
docstring)."""

FLAGGED_WINDOWS = ("0.31.0", "0.32.0", "0.33.0")
"""The releases whose sliding-window assert spares a spec marked not DCP-sharded
(``not self.dcp_sharded or ...``), read from their wheels: none the V1 runner plans with
slots is so marked (module docstring)."""

RING_REMAPPED = {("0.32.0",): 882, ("0.33.0",): 880}
"""The line of ``vllm/v1/attention/backends/mla/indexer.py`` where each release whose V1
runner can be handed a replicated attention group (GLM-5-Next's kpool-tail ring, a
``CircularBufferSpec`` with ``dcp_sharded=False``, which the runner builds a slot-computing
table for: only a recurrent state's is built without) replaces that table's slots: the
ring's metadata builder maps every scheduled token to the request's ring itself
(``compute_kpool_tail_slot_mapping``, from the positions the V1 runner passes), read from
the release's wheel."""


def declared(table: dict[tuple[str, ...], int], version: str | None) -> int | None:
    """The line ``table`` declares for release ``version``, or None."""
    return next((line for versions, line in table.items() if version in versions), None)


OTHER_GROUPS_SHARDED = {
    ("0.26.0", "0.27.0", "0.27.1", "0.28.0"): 79,
    ("0.29.0",): 83,
    ("0.30.0",): 110,
}
"""The line of ``vllm/v1/core/single_type_kv_cache_manager.py`` where the base manager of
each release from 0.26.0 to 0.30.0 multiplies a group's block size by the DCP size
(``self.block_size *= dcp_world_size``), which the recurrent state's manager alone undoes,
read from the release's wheel."""

RECURRENT_SLOTS_UNREAD = {
    ("0.26.0",): 653,
    ("0.27.0", "0.27.1"): 797,
    ("0.28.0", "0.29.0"): 811,
    ("0.30.0",): 880,
}
"""The line of ``vllm/v1/attention/backends/mamba_attn.py`` where each release from 0.26.0
to 0.30.0 hands the recurrent state's metadata builder the group's slot mapping
(``update_block_table(..., slot_mapping)``), which it leaves unread: the state is read by
its block-table entry, read from the release's wheel."""
