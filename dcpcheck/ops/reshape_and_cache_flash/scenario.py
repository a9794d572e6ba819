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

from typing import Any

from dcpcheck.cases import limits
from dcpcheck.cases.scenario_files import (
    HEAD_KEYS,
    RUN_KEYS,
    ScenarioError,
    ScenarioFormat,
    check_block_size,
    check_context_tokens,
    check_range,
    key_error,
    read_tables,
)
from dcpcheck.cases.toml_tables import Key, integer, number, string, table_array
from dcpcheck.op_registry import RESHAPE_AND_CACHE_FLASH
from dcpcheck.ops.reshape_and_cache_flash.case import DTYPES, CacheWriteBatch
from reference.reshape_and_cache_flash import KV_CACHE_DTYPES, LAYOUTS, PACK_BYTES

KV_HEADS_MAX = 64
HEAD_SIZE_MAX = 512
NEW_MAX = 8192
"""Tokens a request writes in one step at most (a long prefill chunk)."""

_KEYS: dict[str, Key] = {
    **HEAD_KEYS,
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
    **RUN_KEYS,
    "requests": Key("array of tables ([[requests]])", table_array, []),
}

_REQUEST_KEYS: dict[str, Key] = {
    "prefix": Key("integer", integer, 0),
    "new": Key("integer", integer),
}


def _check(values: dict[str, Any], where: str) -> None:
    """The op's own keys within what it and ``dcpcheck.cases.limits`` allow."""
    for key, choices in (("dtype", tuple(DTYPES)), ("kv_cache_dtype", KV_CACHE_DTYPES),
                         ("layout", LAYOUTS)):  # fmt: skip
        if values[key] not in choices:
            raise key_error(where, key, f"must be one of {', '.join(choices)}, got {values[key]!r}")
    check_range(values, "kv_heads", 1, KV_HEADS_MAX, where)
    head_size = values["head_size"]
    if not 1 <= head_size <= HEAD_SIZE_MAX or head_size % PACK_BYTES:
        raise key_error(
            where,
            "head_size",
            f"must be in 1..{HEAD_SIZE_MAX} and a multiple of {PACK_BYTES}, got {head_size}",
        )
    for key in ("k_scale", "v_scale"):
        if not 0 < values[key] < float("inf"):
            raise key_error(where, key, f"must be a positive finite number, got {values[key]}")
    check_block_size(values, where)
    check_range(values, "padding", 0, limits.PADDING_MAX, where)
    if len(values["requests"]) > limits.REQUESTS_MAX:
        raise key_error(where, "requests", f"must hold at most {limits.REQUESTS_MAX} requests")
    if not values["requests"] and not values["padding"]:
        raise key_error(where, "requests", "a batch needs a request or a padding row")


def _requests(tables: list[dict[str, Any]], where: str) -> tuple[tuple[int, int], ...]:
    parsed = []
    for prefix_key, values in read_tables(tables, _REQUEST_KEYS, where):
        prefix, new = values["prefix"], values["new"]
        if not 1 <= new <= NEW_MAX or prefix < 0:
            raise ScenarioError(
                f"{where}: key '{prefix_key}new': a request writes 1 to {NEW_MAX} tokens "
                f"after a prefix of 0 or more, got prefix {prefix}, new {new}"
            )
        parsed.append((prefix, new))
    check_context_tokens(sum(prefix + new for prefix, new in parsed), where)
    return tuple(parsed)


def _batch(values: dict[str, Any], where: str) -> CacheWriteBatch:
    _check(values, where)
    return CacheWriteBatch(
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


FORMAT = ScenarioFormat(RESHAPE_AND_CACHE_FLASH, _KEYS, _batch, {"requests": _REQUEST_KEYS})
"""The op's scenario file (module docstring)."""

SCENARIOS = FORMAT.scenarios
load_scenario = FORMAT.load_scenario
load_scenarios = FORMAT.load_scenarios
scenario_to_toml = FORMAT.scenario_to_toml
