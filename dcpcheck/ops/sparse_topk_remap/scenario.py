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
    prefill = false                       # optional: a prefill chunk over the gathered
                                          #   workspace (PCP with DCP), no padding rows
    past_table = 0                        # optional, prefill: picks of each row past
                                          #   the block table
    earlier_entries = 0                   # optional, prefill: an earlier chunk's
                                          #   requests before the chunk's in the starts
    decode_requests = 0                   # optional, prefill: the first requests are
                                          #   decode ones converted in the same call
    gap_rows = 0                          # optional: rows of other layers' pages between
                                          #   consecutive blocks of the cache (with prefill,
                                          #   only beside decode_requests)

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
from pathlib import Path
from typing import Any

from dcpcheck.cases import limits
from dcpcheck.cases.scenario_files import (
    HEAD_KEYS,
    RUN_KEYS,
    NamedBatch,
    ScenarioError,
    ScenarioFormat,
    check_block_size,
    check_context_tokens,
    check_range,
    key_error,
    load_named,
    op_of,
    read_tables,
    scenario_files,
    shipped_scenarios,
)
from dcpcheck.cases.toml_tables import Key, boolean, integer, string, table_array
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
    **HEAD_KEYS,
    "topk": Key("integer", integer),
    "block_size": Key("integer", integer),
    "interleave": Key("integer", integer, 1),
    "compact": Key("boolean", boolean, False),
    "count_valid": Key("boolean", boolean, False),
    "unused": Key("integer", integer, 0),
    "duplicates": Key("integer", integer, 0),
    "padding": Key("integer", integer, 0),
    **RUN_KEYS,
    "prefill": Key("boolean", boolean, False),
    "past_table": Key("integer", integer, 0),
    "earlier_entries": Key("integer", integer, 0),
    "decode_requests": Key("integer", integer, 0),
    "gap_rows": Key("integer", integer, 0),
    "requests": Key("array of tables ([[requests]])", table_array),
}

EARLIER_ENTRIES_MAX = 64
"""Requests of an earlier chunk a prefill scenario may put before its own."""

GAP_ROWS_MAX = 64 * 64
"""Rows between consecutive blocks a scenario may ask: the pages of 64 other layers of
64 rows."""

_READ_WRITE_KEYS: dict[str, Key] = {
    **HEAD_KEYS,
    "write_side": Key("string", string),
    "topk": Key("integer", integer),
    "compact": Key("boolean", boolean, False),
    "count_valid": Key("boolean", boolean, False),
    **RUN_KEYS,
}

_REQUEST_KEYS: dict[str, Key] = {
    "context": Key("integer", integer),
    "rows": Key("integer", integer, 1),
}


def _check(values: dict[str, Any], where: str) -> None:
    """The op's own keys within what it and ``dcpcheck.cases.limits`` allow (the keys
    every op's file has are ``read_op_scenario``'s)."""
    topk = values["topk"]
    check_range(values, "topk", 1, TOPK_MAX, where)
    check_block_size(values, where)
    for key in ("unused", "duplicates", "past_table"):
        if not 0 <= values[key] <= topk:
            raise key_error(where, key, f"must be in 0..topk ({topk}), got {values[key]}")
    if values["unused"] + values["past_table"] > topk:
        detail = f"with unused ({values['unused']}) must be at most topk ({topk})"
        raise key_error(where, "past_table", detail)
    check_range(values, "earlier_entries", 0, EARLIER_ENTRIES_MAX, where)
    check_range(values, "gap_rows", 0, GAP_ROWS_MAX, where)
    if not values["prefill"]:
        for key in ("past_table", "earlier_entries", "decode_requests"):
            if values[key]:
                raise key_error(where, key, "is a prefill chunk's: set prefill = true")
    elif values["padding"]:
        raise key_error(where, "padding", "a prefill chunk has no padding rows")
    elif values["gap_rows"] and not values["decode_requests"]:
        detail = (
            "moves no entry of a prefill chunk's own rows (each is a workspace row): set "
            "decode_requests, whose rows it moves"
        )
        raise key_error(where, "gap_rows", detail)
    check_range(values, "padding", 0, limits.PADDING_MAX, where)
    if not 1 <= len(values["requests"]) <= limits.REQUESTS_MAX:
        raise key_error(
            where,
            "requests",
            f"must hold 1 to {limits.REQUESTS_MAX} requests, got {len(values['requests'])}",
        )
    decodes, most = values["decode_requests"], len(values["requests"]) - 1
    if not 0 <= decodes <= most:
        detail = f"must be in 0..{most}, leaving the chunk a prefill request, got {decodes}"
        raise key_error(where, "decode_requests", detail)


def _requests(tables: list[dict[str, Any]], where: str) -> tuple[tuple[int, int], ...]:
    parsed = []
    for prefix, values in read_tables(tables, _REQUEST_KEYS, where):
        context, rows = values["context"], values["rows"]
        if not 1 <= rows <= min(context, ROWS_MAX):
            raise ScenarioError(
                f"{where}: key '{prefix}rows': a request needs 1 to {ROWS_MAX} rows and no "
                f"more than its context, got context {context}, rows {rows}"
            )
        parsed.append((context, rows))
    check_context_tokens(sum(context for context, _ in parsed), where)
    return tuple(parsed)


def _remap_batch(values: dict[str, Any], where: str) -> RemapBatch:
    _check(values, where)
    return RemapBatch(
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
        prefill=values["prefill"],
        past_table=values["past_table"],
        earlier_entries=values["earlier_entries"],
        decode_requests=values["decode_requests"],
        gap_rows=values["gap_rows"],
    )


def _read_write_batch(values: dict[str, Any], where: str) -> ReadWriteBatch:
    """A batch of the end-to-end check (module docstring)."""
    written = FUSED_SCENARIOS / f"{values['write_side']}.toml"
    if op_of(written) is not None or not written.is_file():
        raise key_error(
            where,
            "write_side",
            f"{values['write_side']!r} is not a scenario of the fused op in {FUSED_SCENARIOS}",
        )
    check_range(values, "topk", 1, TOPK_MAX, where)
    return ReadWriteBatch(
        values["write_side"], values["topk"], values["compact"], values["count_valid"],
        values["seed"],
    )  # fmt: skip


REMAP = ScenarioFormat(OP, _KEYS, _remap_batch, {"requests": _REQUEST_KEYS})
"""The op's scenario file of requests (module docstring)."""

READ_WRITE = ScenarioFormat(OP, _READ_WRITE_KEYS, _read_write_batch, {})
"""The op's scenario file of the end-to-end check, which names ``write_side``."""


def load_scenario(path: Path) -> NamedBatch[RemapBatch] | NamedBatch[ReadWriteBatch]:
    """Read and check one scenario file of the op, wherever it lies: the end-to-end check's
    when it names ``write_side``."""
    path = Path(path)
    if path.is_file() and "write_side" in _top_keys(path):
        return READ_WRITE.load_scenario(path)
    return REMAP.load_scenario(path)


def load_scenarios(
    patterns: list[str], root: Path = SCENARIOS
) -> list[NamedBatch[RemapBatch] | NamedBatch[ReadWriteBatch]]:
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


def scenario_to_toml(scenario: NamedBatch[RemapBatch] | NamedBatch[ReadWriteBatch]) -> str:
    """The TOML text of ``scenario``, every key spelled out (module docstring)."""
    if isinstance(scenario.batch, ReadWriteBatch):
        return READ_WRITE.scenario_to_toml(scenario)  # type: ignore[arg-type]
    return REMAP.scenario_to_toml(scenario)  # type: ignore[arg-type]
