"""Named scenarios of the reshape-and-cache-flash op: one TOML file each in
``scenarios/reshape-and-cache-flash/``, read as strictly as the other ops' (an unknown key,
a wrong type or a value out of range is one line naming the file and the key).

File format (``scenario_to_toml`` writes exactly this)::

    op = "reshape-and-cache-flash"
    name = "decode"                       # the file stem, in a scenario directory
    description = "what it catches"
    kv_heads = 2                          # optional, default 2
    head_size = 64                        # optional, default 64
    dtype = "bfloat16"                    # optional: float16, bfloat16 or float32
    kv_cache_dtype = "auto"               # optional: auto or fp8
    k_scale = 1.0                         # optional: an fp8 cache's key scale
    v_scale = 1.0                         # optional: an fp8 cache's value scale
    layout = "nhd"                        # optional: nhd, hnd or head-major
    block_size = 16                       # a multiple of the interleave
    interleave = 1                        # optional, default 1
    padding = 0                           # optional: CUDA-graph padding rows (slot -1)
    dcp = [1, 2, 4]                       # DCP sizes to run
    seed = 0                              # the keys, values and the block table

    [[requests]]                          # none or more
    prefix = 0                            # optional: tokens already cached
    new = 1                               # tokens the step writes
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
    integer,
    integer_array,
    number,
    read_table,
    string,
    table_array,
    toml_literal,
)
from dcpcheck.op_registry import RESHAPE_AND_CACHE_FLASH
from dcpcheck.ops.reshape_and_cache_flash.case import DTYPES, CacheWriteBatch
from reference.reshape_and_cache_flash import KV_CACHE_DTYPES, LAYOUTS, PACK_BYTES

OP = RESHAPE_AND_CACHE_FLASH

SCENARIOS = shipped_scenarios(OP)
"""The op's shipped scenarios."""

KV_HEADS_MAX = 64
HEAD_SIZE_MAX = 512
NEW_MAX = 8192
"""Tokens a request writes in one step at most (a long prefill chunk)."""

_KEYS: dict[str, Key] = {
    "op": Key("string", string),
    "name": Key("string", string),
    "description": Key("string", string),
    "kv_heads": Key("integer", integer, 2),
    "head_size": Key("integer", integer, 64),
    "dtype": Key("string", string, "bfloat16"),
    "kv_cache_dtype": Key("string", string, "auto"),
    "k_scale": Key("number", number, 1.0),
    "v_scale": Key("number", number, 1.0),
    "layout": Key("string", string, "nhd"),
    "block_size": Key("integer", integer),
    "interleave": Key("integer", integer, 1),
    "padding": Key("integer", integer, 0),
    "dcp": Key("array of integers", integer_array),
    "seed": Key("integer", integer),
    "requests": Key("array of tables ([[requests]])", table_array, []),
}

_REQUEST_KEYS: dict[str, Key] = {
    "prefix": Key("integer", integer, 0),
    "new": Key("integer", integer),
}


@dataclass(frozen=True)
class CacheWriteScenario:
    """One named, replayable batch of the op and the DCP sizes it runs at."""

    name: str
    description: str
    batch: CacheWriteBatch
    dcp_sizes: tuple[int, ...]
    source: Path | None = field(default=None, compare=False)

    @property
    def seed(self) -> int:
        return self.batch.seed


def _check(values: dict[str, Any], where: str) -> None:
    """The op's own keys within what it and ``dcpcheck.cases.limits`` allow."""

    def fail(key: str, problem: str) -> None:
        raise ScenarioError(f"{where}: key '{key}': {problem}")

    for key, choices in (("dtype", tuple(DTYPES)), ("kv_cache_dtype", KV_CACHE_DTYPES),
                         ("layout", LAYOUTS)):  # fmt: skip
        if values[key] not in choices:
            fail(key, f"must be one of {', '.join(choices)}, got {values[key]!r}")
    if not 1 <= values["kv_heads"] <= KV_HEADS_MAX:
        fail("kv_heads", f"must be in 1..{KV_HEADS_MAX}, got {values['kv_heads']}")
    head_size = values["head_size"]
    if not 1 <= head_size <= HEAD_SIZE_MAX or head_size % PACK_BYTES:
        fail(
            "head_size",
            f"must be in 1..{HEAD_SIZE_MAX} and a multiple of {PACK_BYTES}, got {head_size}",
        )
    for key in ("k_scale", "v_scale"):
        if not 0 < values[key] < float("inf"):
            fail(key, f"must be a positive finite number, got {values[key]}")
    interleave = values["interleave"]
    if not 1 <= interleave <= limits.BLOCK_SIZE_MAX:
        fail("interleave", f"must be in 1..{limits.BLOCK_SIZE_MAX}, got {interleave}")
    size = values["block_size"]
    if not 1 <= size <= limits.BLOCK_SIZE_MAX or size % interleave:
        fail(
            "block_size",
            f"must be in 1..{limits.BLOCK_SIZE_MAX} and a multiple of the interleave "
            f"{interleave}, got {size}",
        )
    if not 0 <= values["padding"] <= limits.PADDING_MAX:
        fail("padding", f"must be in 0..{limits.PADDING_MAX}, got {values['padding']}")
    if len(values["requests"]) > limits.REQUESTS_MAX:
        fail("requests", f"must hold at most {limits.REQUESTS_MAX} requests")
    if not values["requests"] and not values["padding"]:
        fail("requests", "a batch needs a request or a padding row")


def _requests(tables: list[dict[str, Any]], where: str) -> tuple[tuple[int, int], ...]:
    parsed = []
    for index, table in enumerate(tables):
        prefix_key = f"requests[{index}]."
        values = read_table(table, _REQUEST_KEYS, where, ScenarioError, prefix_key)
        prefix, new = values["prefix"], values["new"]
        if not 1 <= new <= NEW_MAX or prefix < 0:
            raise ScenarioError(
                f"{where}: key '{prefix_key}new': a request writes 1 to {NEW_MAX} tokens "
                f"after a prefix of 0 or more, got prefix {prefix}, new {new}"
            )
        parsed.append((prefix, new))
    total = sum(prefix + new for prefix, new in parsed)
    if total > limits.CONTEXT_TOKENS_MAX:
        raise ScenarioError(
            f"{where}: key 'requests': {total} cached tokens, over {limits.CONTEXT_TOKENS_MAX} "
            "(CONTEXT_TOKENS_MAX, dcpcheck/cases/limits.py)"
        )
    return tuple(parsed)


def load_scenario(path: Path) -> CacheWriteScenario:
    """Read and check one scenario file of the op, wherever it lies."""
    path = Path(path)
    where = str(path)
    values = read_op_scenario(path, _KEYS, OP)
    _check(values, where)
    batch = CacheWriteBatch(
        requests=_requests(values["requests"], where),
        kv_heads=values["kv_heads"],
        head_size=values["head_size"],
        dtype=values["dtype"],
        kv_cache_dtype=values["kv_cache_dtype"],
        k_scale=float(values["k_scale"]),
        v_scale=float(values["v_scale"]),
        layout=values["layout"],
        block_size=values["block_size"],
        interleave=values["interleave"],
        padding=values["padding"],
        seed=values["seed"],
    )
    return CacheWriteScenario(
        values["name"], values["description"], batch, tuple(values["dcp"]), source=path
    )


def load_scenarios(patterns: list[str], root: Path = SCENARIOS) -> list[CacheWriteScenario]:
    """The op's scenarios under ``root`` whose names match a pattern (all without one),
    sorted by name."""
    return load_named(scenario_files(patterns, root, f"{OP} scenario"), load_scenario)


def scenario_to_toml(scenario: CacheWriteScenario) -> str:
    """The TOML text of ``scenario``, every key spelled out (module docstring)."""
    b = scenario.batch
    top: list[tuple[str, object]] = [
        ("op", OP),
        ("name", scenario.name),
        ("description", scenario.description),
        ("kv_heads", b.kv_heads),
        ("head_size", b.head_size),
        ("dtype", b.dtype),
        ("kv_cache_dtype", b.kv_cache_dtype),
        ("k_scale", b.k_scale),
        ("v_scale", b.v_scale),
        ("layout", b.layout),
        ("block_size", b.block_size),
        ("interleave", b.interleave),
        ("padding", b.padding),
        ("dcp", list(scenario.dcp_sizes)),
        ("seed", b.seed),
    ]
    lines = [f"{key} = {toml_literal(value)}" for key, value in top]
    for prefix, new in b.requests:
        lines += ["", "[[requests]]", f"prefix = {prefix}", f"new = {new}"]
    return "\n".join(lines) + "\n"
