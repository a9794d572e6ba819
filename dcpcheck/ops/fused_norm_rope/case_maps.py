"""What a fused-op case's ownership map shows (``dcpcheck.cases.case_map``): the MLA
cache's slot mappings (the one DCP shards), a row per output field, then the sparse
indices and the caches (the indexer's rows only on a layer with an indexer), and the
scenario's layout in words."""

from __future__ import annotations

from dcpcheck.cases.case_map import CaseMap, build_case_map
from dcpcheck.cases.dcp import slot_mappings
from dcpcheck.cases.verdicts import CaseResult
from dcpcheck.ops.fused_norm_rope.checks import OUTPUT_FIELDS
from dcpcheck.ops.fused_norm_rope.scenario import Scenario

MAP_ROWS = (*OUTPUT_FIELDS, "topk_indices", "mla_cache", "index_cache")
"""Field rows under each rank, in this order (``index_*`` rows only on indexer layers)."""


def case_map(result: CaseResult, scenario: Scenario) -> CaseMap:
    """The map of ``result``, a run of ``scenario`` at ``result.dcp_size``."""
    dcp = result.dcp_size
    mappings = slot_mappings(scenario.batch, scenario.layout(dcp), scenario.block_tables(dcp))
    on_layer = {"index_k_out", "index_cache"} if scenario.has_indexer else set()
    rows = [r for r in MAP_ROWS if not r.startswith("index_") or r in on_layer]
    batch = scenario.batch
    layout = (
        f"{batch.num_real_tokens} token(s) + {batch.padding} padding, block_size "
        f"{scenario.block_size}, interleave {scenario.interleave}, "
        f"{scenario.cache_layout.value} cache"
    )
    if scenario.has_indexer:
        layout += f", {scenario.index_format.name} indexer cache"
    return build_case_map(result, mappings, rows, scenario.description, layout)
