"""Named scenarios of the slot-mapping op: one TOML file each in ``scenarios/slot-mapping/``,
read as strictly as the fused op's (``dcpcheck.ops.fused_norm_rope.scenario``): an unknown
key, a wrong type or a value out of range is one line naming the file and the key.

File format (``scenario_to_toml`` writes exactly this)::

    op = "slot-mapping"
    name = "mla-and-replicated-indexer"   # the file stem, in a scenario directory
    description = "what it catches"
    block_sizes = [16, 64]                # one per cache group
    sharded = [true, false]               # per group: sharded across ranks, or replicated
    interleave = 1                        # optional, default 1; divides every block size
    kernel_block_sizes = [16, 16]         # optional, default the block sizes; each divides
                                          # its block size
    dcp = [1, 2, 4, 8]                    # DCP sizes to run
    seed = 0                              # shuffles the block tables
    padding = 0                           # optional: CUDA-graph padding rows
    without_blocks = [2]                  # optional: requests that own no blocks

    [[requests]]                          # one or more
    prefix = 37                           # optional, default 0: tokens already cached
    new = 1                               # tokens of this step
"""

from __future__ import annotations

from typing import Any

from dcpcheck.cases import limits
from dcpcheck.cases.scenario_files import (
    HEAD_KEYS,
    RUN_KEYS,
    ScenarioError,
    ScenarioFormat,
    check_context_tokens,
    check_range,
    key_error,
    read_tables,
)
from dcpcheck.cases.toml_tables import Key, boolean, integer, integer_array, table_array
from dcpcheck.ops.slot_mapping.case import SlotMappingBatch
from dcpcheck.ops.slot_mapping.contract import check_kernel_block_sizes

OP = "slot-mapping"

GROUPS_MAX = 8
"""Cache groups one scenario may name: a layer has an MLA cache and maybe an indexer
cache; a model a handful of attention kinds."""


def _booleans(value: object) -> bool:
    return isinstance(value, list) and all(map(boolean, value))


_KEYS: dict[str, Key] = {
    **HEAD_KEYS,
    "block_sizes": Key("array of integers", integer_array),
    "sharded": Key("array of booleans", _booleans),
    "interleave": Key("integer", integer, 1),
    "kernel_block_sizes": Key("array of integers", integer_array, []),
    **RUN_KEYS,
    "padding": Key("integer", integer, 0),
    "without_blocks": Key("array of integers", integer_array, []),
    "requests": Key("array of tables ([[requests]])", table_array),
}

_REQUEST_KEYS: dict[str, Key] = {
    "prefix": Key("integer", integer, 0),
    "new": Key("integer", integer),
}


def _check(values: dict[str, Any], where: str) -> None:
    """The op's own keys within what it and ``dcpcheck.cases.limits`` allow (the keys
    every op's file has are ``read_op_scenario``'s)."""
    sizes, sharded, interleave = values["block_sizes"], values["sharded"], values["interleave"]
    if not 1 <= len(sizes) <= GROUPS_MAX:
        raise key_error(
            where, "block_sizes", f"must name 1 to {GROUPS_MAX} cache groups, got {len(sizes)}"
        )
    if len(sharded) != len(sizes):
        raise key_error(
            where, "sharded", f"must have one flag per group ({len(sizes)}), got {len(sharded)}"
        )
    check_range(values, "interleave", 1, limits.BLOCK_SIZE_MAX, where)
    for size in sizes:
        if not 1 <= size <= limits.BLOCK_SIZE_MAX or size % interleave:
            raise key_error(
                where,
                "block_sizes",
                f"each must be in 1..{limits.BLOCK_SIZE_MAX} and a multiple of the "
                f"interleave {interleave}, got {sizes}",
            )
    kernel = values["kernel_block_sizes"]
    if kernel:
        try:
            check_kernel_block_sizes(tuple(sizes), tuple(kernel))
        except ValueError as error:
            raise key_error(where, "kernel_block_sizes", str(error)) from None
    check_range(values, "padding", 0, limits.SLOT_PADDING_MAX, where)
    requests = values["requests"]
    if not 1 <= len(requests) <= limits.REQUESTS_MAX:
        raise key_error(
            where,
            "requests",
            f"must hold 1 to {limits.REQUESTS_MAX} requests, got {len(requests)}",
        )
    if any(not 0 <= i < len(requests) for i in values["without_blocks"]):
        raise key_error(
            where,
            "without_blocks",
            f"must index the {len(requests)} requests, got {values['without_blocks']}",
        )


def _requests(tables: list[dict[str, Any]], where: str) -> tuple[tuple[int, int], ...]:
    parsed = []
    for prefix, values in read_tables(tables, _REQUEST_KEYS, where):
        for key, least in (("prefix", 0), ("new", 1)):
            if values[key] < least:
                raise ScenarioError(
                    f"{where}: key '{prefix}{key}': must be >= {least}, got {values[key]}"
                )
        parsed.append((values["prefix"], values["new"]))
    check_context_tokens(sum(prefix + new for prefix, new in parsed), where)
    return tuple(parsed)


def _batch(values: dict[str, Any], where: str) -> SlotMappingBatch:
    _check(values, where)
    return SlotMappingBatch(
        requests=_requests(values["requests"], where),
        block_sizes=tuple(values["block_sizes"]),
        sharded=tuple(values["sharded"]),
        interleave=values["interleave"],
        kernel_block_sizes=tuple(values["kernel_block_sizes"]),
        padding=values["padding"],
        without_blocks=tuple(values["without_blocks"]),
        seed=values["seed"],
    )


FORMAT = ScenarioFormat(OP, _KEYS, _batch, {"requests": _REQUEST_KEYS})
"""The op's scenario file (module docstring)."""

SCENARIOS = FORMAT.scenarios
load_scenario = FORMAT.load_scenario
load_scenarios = FORMAT.load_scenarios
scenario_to_toml = FORMAT.scenario_to_toml
