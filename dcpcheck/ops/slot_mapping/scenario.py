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

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dcpcheck.cases import limits
from dcpcheck.cases.scenario_files import (
    ScenarioError,
    load_named,
    read_op_scenario,
    scenario_files,
    shipped_scenarios,
)
from dcpcheck.cases.toml_tables import (
    Key,
    boolean,
    integer,
    integer_array,
    read_table,
    string,
    table_array,
    toml_literal,
)
from dcpcheck.ops.slot_mapping.case import SlotMappingBatch
from dcpcheck.ops.slot_mapping.contract import check_kernel_block_sizes

OP = "slot-mapping"

SCENARIOS = shipped_scenarios(OP)
"""The op's shipped scenarios."""

GROUPS_MAX = 8
"""Cache groups one scenario may name: a layer has an MLA cache and maybe an indexer
cache; a model a handful of attention kinds."""


def _booleans(value: object) -> bool:
    return isinstance(value, list) and all(map(boolean, value))


_KEYS: dict[str, Key] = {
    "op": Key("string", string),
    "name": Key("string", string),
    "description": Key("string", string),
    "block_sizes": Key("array of integers", integer_array),
    "sharded": Key("array of booleans", _booleans),
    "interleave": Key("integer", integer, 1),
    "kernel_block_sizes": Key("array of integers", integer_array, []),
    "dcp": Key("array of integers", integer_array),
    "seed": Key("integer", integer),
    "padding": Key("integer", integer, 0),
    "without_blocks": Key("array of integers", integer_array, []),
    "requests": Key("array of tables ([[requests]])", table_array),
}

_REQUEST_KEYS: dict[str, Key] = {
    "prefix": Key("integer", integer, 0),
    "new": Key("integer", integer),
}


@dataclass(frozen=True)
class SlotMappingScenario:
    """One named, replayable batch of the op and the DCP sizes it runs at."""

    name: str
    description: str
    batch: SlotMappingBatch
    dcp_sizes: tuple[int, ...]
    source: Path | None = field(default=None, compare=False)

    @property
    def seed(self) -> int:
        return self.batch.seed


def _check(values: dict[str, Any], where: str) -> None:
    """The op's own keys within what it and ``dcpcheck.cases.limits`` allow (the keys
    every op's file has are ``read_op_scenario``'s)."""

    def fail(key: str, problem: str) -> None:
        raise ScenarioError(f"{where}: key '{key}': {problem}")

    sizes, sharded, interleave = values["block_sizes"], values["sharded"], values["interleave"]
    if not 1 <= len(sizes) <= GROUPS_MAX:
        fail("block_sizes", f"must name 1 to {GROUPS_MAX} cache groups, got {len(sizes)}")
    if len(sharded) != len(sizes):
        fail("sharded", f"must have one flag per group ({len(sizes)}), got {len(sharded)}")
    if not 1 <= interleave <= limits.BLOCK_SIZE_MAX:
        fail("interleave", f"must be in 1..{limits.BLOCK_SIZE_MAX}, got {interleave}")
    for size in sizes:
        if not 1 <= size <= limits.BLOCK_SIZE_MAX or size % interleave:
            fail(
                "block_sizes",
                f"each must be in 1..{limits.BLOCK_SIZE_MAX} and a multiple of the "
                f"interleave {interleave}, got {sizes}",
            )
    kernel = values["kernel_block_sizes"]
    if kernel:
        try:
            check_kernel_block_sizes(tuple(sizes), tuple(kernel))
        except ValueError as error:
            fail("kernel_block_sizes", str(error))
    if not 0 <= values["padding"] <= limits.SLOT_PADDING_MAX:
        fail("padding", f"must be in 0..{limits.SLOT_PADDING_MAX}, got {values['padding']}")
    requests = values["requests"]
    if not 1 <= len(requests) <= limits.REQUESTS_MAX:
        fail("requests", f"must hold 1 to {limits.REQUESTS_MAX} requests, got {len(requests)}")
    if any(not 0 <= i < len(requests) for i in values["without_blocks"]):
        fail(
            "without_blocks",
            f"must index the {len(requests)} requests, got {values['without_blocks']}",
        )


def _requests(tables: list[dict[str, Any]], where: str) -> tuple[tuple[int, int], ...]:
    parsed = []
    for index, table in enumerate(tables):
        prefix = f"requests[{index}]."
        values = read_table(table, _REQUEST_KEYS, where, ScenarioError, prefix)
        for key, least in (("prefix", 0), ("new", 1)):
            if values[key] < least:
                raise ScenarioError(
                    f"{where}: key '{prefix}{key}': must be >= {least}, got {values[key]}"
                )
        parsed.append((values["prefix"], values["new"]))
    total = sum(prefix + new for prefix, new in parsed)
    if total > limits.CONTEXT_TOKENS_MAX:
        raise ScenarioError(
            f"{where}: key 'requests': {total} cached tokens, over {limits.CONTEXT_TOKENS_MAX} "
            "(CONTEXT_TOKENS_MAX, dcpcheck/cases/limits.py)"
        )
    return tuple(parsed)


def load_scenario(path: Path) -> SlotMappingScenario:
    """Read and check one scenario file of the op, wherever it lies."""
    path = Path(path)
    where = str(path)
    values = read_op_scenario(path, _KEYS, OP)
    _check(values, where)
    batch = SlotMappingBatch(
        requests=_requests(values["requests"], where),
        block_sizes=tuple(values["block_sizes"]),
        sharded=tuple(values["sharded"]),
        interleave=values["interleave"],
        kernel_block_sizes=tuple(values["kernel_block_sizes"]),
        padding=values["padding"],
        without_blocks=tuple(values["without_blocks"]),
        seed=values["seed"],
    )
    return SlotMappingScenario(
        values["name"], values["description"], batch, tuple(values["dcp"]), source=path
    )


def load_scenarios(patterns: list[str], root: Path = SCENARIOS) -> list[SlotMappingScenario]:
    """The op's scenarios under ``root`` whose names match a pattern (all without one),
    sorted by name, as ``dcpcheck.ops.fused_norm_rope.scenario.load_scenarios`` selects the
    fused op's."""
    return load_named(scenario_files(patterns, root, f"{OP} scenario"), load_scenario)


def scenario_to_toml(scenario: SlotMappingScenario) -> str:
    """The TOML text of ``scenario``, every key spelled out (module docstring)."""
    b = scenario.batch
    top: list[tuple[str, object]] = [
        ("op", OP),
        ("name", scenario.name),
        ("description", scenario.description),
        ("block_sizes", list(b.block_sizes)),
        ("sharded", list(b.sharded)),
        ("interleave", b.interleave),
        ("kernel_block_sizes", list(b.kernel_block_sizes)),
        ("dcp", list(scenario.dcp_sizes)),
        ("seed", b.seed),
        ("padding", b.padding),
        ("without_blocks", list(b.without_blocks)),
    ]
    lines = [f"{key} = {toml_literal(value)}" for key, value in top]
    for prefix, new in b.requests:
        lines += ["", "[[requests]]", f"prefix = {prefix}", f"new = {new}"]
    return "\n".join(lines) + "\n"
