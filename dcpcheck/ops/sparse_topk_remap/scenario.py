"""Named scenarios of the sparse-topk-remap op: one TOML file each in
``scenarios/sparse-topk-remap/``, read as strictly as the other ops' (an unknown key, a
wrong type or a value out of range is one line naming the file and the key).

File format (``scenario_to_toml`` writes exactly this)::

    op = "sparse-topk-remap"
    name = "compacted-interleaved"        # the file stem, in a scenario directory
    description = "what it catches"
    topk = 64                             # picks per row (DeepSeek's indexer: 2048)
    block_size = 64                       # a multiple of the interleave
    interleave = 1                        # optional, default 1
    compact = false                       # optional: the rank's slots packed to the front
    count_valid = false                   # optional: the caller asks for the counts
    unused = 0                            # optional: picks of each row left -1
    duplicates = 0                        # optional: picks of each row that repeat one
    padding = 0                           # optional: CUDA-graph padding rows
    dcp = [1, 2, 4]                       # DCP sizes to run
    seed = 0                              # the picks and the block table

    [[requests]]                          # one or more
    context = 300                         # tokens the request holds
    rows = 1                              # optional, default 1: query rows (speculative)

A scenario of the end-to-end check (``read_write``) names the fused op's scenario that
writes instead of requests and a cache layout of its own::

    op = "sparse-topk-remap"
    name = "reads-interleave-block"
    description = "what it catches"
    write_side = "interleave-block"       # a scenario of the fused op, in its folder
    topk = 128
    compact = false                       # optional
    count_valid = false                   # optional
    dcp = [1, 2, 4]
    seed = 0                              # the picks
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dcpcheck.cases import limits
from dcpcheck.cases.scenario_files import (
    ScenarioError,
    load_named,
    op_of,
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
from dcpcheck.ops.fused_norm_rope.scenario import SCENARIOS as FUSED_SCENARIOS
from dcpcheck.ops.sparse_topk_remap.case import ReadWriteBatch, RemapBatch

OP = "sparse-topk-remap"

SCENARIOS = shipped_scenarios(OP)
"""The op's shipped scenarios."""

TOPK_MAX = 4096
"""Picks per row a scenario may ask: DeepSeek's indexer picks 2048, GLM's 2176."""

ROWS_MAX = 16
"""Query rows per request: a decode row and its speculative ones."""

_KEYS: dict[str, Key] = {
    "op": Key("string", string),
    "name": Key("string", string),
    "description": Key("string", string),
    "topk": Key("integer", integer),
    "block_size": Key("integer", integer),
    "interleave": Key("integer", integer, 1),
    "compact": Key("boolean", boolean, False),
    "count_valid": Key("boolean", boolean, False),
    "unused": Key("integer", integer, 0),
    "duplicates": Key("integer", integer, 0),
    "padding": Key("integer", integer, 0),
    "dcp": Key("array of integers", integer_array),
    "seed": Key("integer", integer),
    "requests": Key("array of tables ([[requests]])", table_array),
}

_READ_WRITE_KEYS: dict[str, Key] = {
    "op": Key("string", string),
    "name": Key("string", string),
    "description": Key("string", string),
    "write_side": Key("string", string),
    "topk": Key("integer", integer),
    "compact": Key("boolean", boolean, False),
    "count_valid": Key("boolean", boolean, False),
    "dcp": Key("array of integers", integer_array),
    "seed": Key("integer", integer),
}

_REQUEST_KEYS: dict[str, Key] = {
    "context": Key("integer", integer),
    "rows": Key("integer", integer, 1),
}


@dataclass(frozen=True)
class RemapScenario:
    """One named, replayable batch of the op and the DCP sizes it runs at."""

    name: str
    description: str
    batch: RemapBatch | ReadWriteBatch
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

    topk, interleave = values["topk"], values["interleave"]
    if not 1 <= topk <= TOPK_MAX:
        fail("topk", f"must be in 1..{TOPK_MAX}, got {topk}")
    if not 1 <= interleave <= limits.BLOCK_SIZE_MAX:
        fail("interleave", f"must be in 1..{limits.BLOCK_SIZE_MAX}, got {interleave}")
    size = values["block_size"]
    if not 1 <= size <= limits.BLOCK_SIZE_MAX or size % interleave:
        fail(
            "block_size",
            f"must be in 1..{limits.BLOCK_SIZE_MAX} and a multiple of the interleave "
            f"{interleave}, got {size}",
        )
    for key in ("unused", "duplicates"):
        if not 0 <= values[key] <= topk:
            fail(key, f"must be in 0..topk ({topk}), got {values[key]}")
    if not 0 <= values["padding"] <= limits.PADDING_MAX:
        fail("padding", f"must be in 0..{limits.PADDING_MAX}, got {values['padding']}")
    if not 1 <= len(values["requests"]) <= limits.REQUESTS_MAX:
        fail(
            "requests",
            f"must hold 1 to {limits.REQUESTS_MAX} requests, got {len(values['requests'])}",
        )


def _requests(tables: list[dict[str, Any]], where: str) -> tuple[tuple[int, int], ...]:
    parsed = []
    for index, table in enumerate(tables):
        prefix = f"requests[{index}]."
        values = read_table(table, _REQUEST_KEYS, where, ScenarioError, prefix)
        context, rows = values["context"], values["rows"]
        if not 1 <= rows <= min(context, ROWS_MAX):
            raise ScenarioError(
                f"{where}: key '{prefix}rows': a request needs 1 to {ROWS_MAX} rows and no "
                f"more than its context, got context {context}, rows {rows}"
            )
        parsed.append((context, rows))
    total = sum(context for context, _ in parsed)
    if total > limits.CONTEXT_TOKENS_MAX:
        raise ScenarioError(
            f"{where}: key 'requests': {total} cached tokens, over {limits.CONTEXT_TOKENS_MAX} "
            "(CONTEXT_TOKENS_MAX, dcpcheck/cases/limits.py)"
        )
    return tuple(parsed)


def _read_write_scenario(path: Path) -> RemapScenario:
    """A scenario of the end-to-end check (module docstring)."""
    where = str(path)
    values = read_op_scenario(path, _READ_WRITE_KEYS, OP)
    written = FUSED_SCENARIOS / f"{values['write_side']}.toml"
    if op_of(written) is not None or not written.is_file():
        raise ScenarioError(
            f"{where}: key 'write_side': {values['write_side']!r} is not a scenario of the "
            f"fused op in {FUSED_SCENARIOS}"
        )
    if not 1 <= values["topk"] <= TOPK_MAX:
        raise ScenarioError(f"{where}: key 'topk': must be in 1..{TOPK_MAX}, got {values['topk']}")
    batch = ReadWriteBatch(
        values["write_side"], values["topk"], values["compact"], values["count_valid"],
        values["seed"],
    )  # fmt: skip
    return RemapScenario(
        values["name"], values["description"], batch, tuple(values["dcp"]), source=path
    )


def load_scenario(path: Path) -> RemapScenario:
    """Read and check one scenario file of the op, wherever it lies."""
    path = Path(path)
    where = str(path)
    if path.is_file() and "write_side" in _top_keys(path):
        return _read_write_scenario(path)
    values = read_op_scenario(path, _KEYS, OP)
    _check(values, where)
    batch = RemapBatch(
        requests=_requests(values["requests"], where),
        topk=values["topk"],
        block_size=values["block_size"],
        interleave=values["interleave"],
        compact=values["compact"],
        count_valid=values["count_valid"],
        unused=values["unused"],
        duplicates=values["duplicates"],
        padding=values["padding"],
        seed=values["seed"],
    )
    return RemapScenario(
        values["name"], values["description"], batch, tuple(values["dcp"]), source=path
    )


def load_scenarios(patterns: list[str], root: Path = SCENARIOS) -> list[RemapScenario]:
    """The op's scenarios under ``root`` whose names match a pattern (all without one),
    sorted by name."""
    return load_named(scenario_files(patterns, root, f"{OP} scenario"), load_scenario)


def _top_keys(path: Path) -> set[str]:
    """The top-level keys of a TOML file (none when it is not TOML: the strict reader then
    says why)."""
    try:
        with path.open("rb") as file:
            return set(tomllib.load(file))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError):
        return set()


def scenario_to_toml(scenario: RemapScenario) -> str:
    """The TOML text of ``scenario``, every key spelled out (module docstring)."""
    b = scenario.batch
    if isinstance(b, ReadWriteBatch):
        pairs: list[tuple[str, object]] = [
            ("op", OP),
            ("name", scenario.name),
            ("description", scenario.description),
            ("write_side", b.write_side),
            ("topk", b.topk),
            ("compact", b.compact),
            ("count_valid", b.count_valid),
            ("dcp", list(scenario.dcp_sizes)),
            ("seed", b.seed),
        ]
        return "\n".join(f"{key} = {toml_literal(value)}" for key, value in pairs) + "\n"
    top: list[tuple[str, object]] = [
        ("op", OP),
        ("name", scenario.name),
        ("description", scenario.description),
        ("topk", b.topk),
        ("block_size", b.block_size),
        ("interleave", b.interleave),
        ("compact", b.compact),
        ("count_valid", b.count_valid),
        ("unused", b.unused),
        ("duplicates", b.duplicates),
        ("padding", b.padding),
        ("dcp", list(scenario.dcp_sizes)),
        ("seed", b.seed),
    ]
    lines = [f"{key} = {toml_literal(value)}" for key, value in top]
    for context, rows in b.requests:
        lines += ["", "[[requests]]", f"context = {context}", f"rows = {rows}"]
    return "\n".join(lines) + "\n"
