"""Named scenarios of the lse-combine op: one TOML file each in ``scenarios/lse-combine/``,
read as strictly as the other ops' (``dcpcheck.ops.fused_norm_rope.scenario``): an unknown
key, a wrong type or a value out of range is one line naming the file and the key.

File format (``scenario_to_toml`` writes exactly this)::

    op = "lse-combine"
    name = "sink-and-empty-shards"     # the file stem, in a scenario directory
    description = "what it catches"
    heads = 16                         # every head of the layer; each DCP size divides it
    head_dim = 64                      # of the values and the output
    dtype = "bfloat16"                 # the partial outputs': bfloat16, float16, float32
    lse_dtype = "float32"              # optional: the partial LSEs' dtype
    base = "e"                         # optional: the LSEs' base, "e" or "2"
    return_lse = false                 # optional: the caller asks for the merged LSE
    masked = true                      # optional: the caller passes the local lengths
    empty = "neg-inf-zeros"            # optional: what an empty shard holds (case.EMPTY_SHARDS)
    interleave = 1                     # optional: positions dealt to ranks in runs of it
    padding = 0                        # optional: CUDA-graph padding rows
    sink_logit = 0.0                   # optional: added to position 0's logits
    logit_shift = 0.0                  # optional: added to every logit
    dcp = [1, 2, 4, 8]
    seed = 0

    [[requests]]                       # one or more
    context = 37                       # cached tokens, this step's included
    queries = 1                        # optional: query rows (1 + speculative tokens)
"""

from __future__ import annotations

import math
from typing import Any

from dcpcheck.cases import limits
from dcpcheck.cases.scenario_files import (
    HEAD_KEYS,
    RUN_KEYS,
    ScenarioError,
    ScenarioFormat,
    check_range,
    key_error,
    read_tables,
)
from dcpcheck.cases.toml_tables import Key, boolean, integer, known, number, string, table_array
from dcpcheck.op_registry import LSE_COMBINE
from dcpcheck.ops.lse_combine.case import DTYPES, EMPTY_SHARDS, NEEDS_LENGTHS, CombineBatch

HEADS_MAX = 256
HEAD_DIM_MAX = 1024
CONTEXT_MAX = 131_072
"""A request's context: 128K, the longest the LSE-precision study reaches."""
ROWS_MAX = 1024
LOGIT_MAX = 1e4
"""``|sink_logit|`` and ``|logit_shift|``: far past where fp32 ``exp`` overflows (88.7)."""

BASES = {"e": True, "2": False}

_KEYS: dict[str, Key] = {
    **HEAD_KEYS,
    "heads": Key("integer", integer),
    "head_dim": Key("integer", integer),
    "dtype": Key("string", string),
    "lse_dtype": Key("string", string, "float32"),
    "base": Key("string", string, "e"),
    "return_lse": Key("boolean", boolean, False),
    "masked": Key("boolean", boolean, True),
    "empty": Key("string", string, "neg-inf-zeros"),
    "interleave": Key("integer", integer, 1),
    "padding": Key("integer", integer, 0),
    "sink_logit": Key("number", number, 0.0),
    "logit_shift": Key("number", number, 0.0),
    **RUN_KEYS,
    "requests": Key("array of tables ([[requests]])", table_array),
}

_REQUEST_KEYS: dict[str, Key] = {
    "context": Key("integer", integer),
    "queries": Key("integer", integer, 1),
}


def _check(values: dict[str, Any], where: str) -> None:
    """The op's own keys within what it and ``dcpcheck.cases.limits`` allow (the keys
    every op's file has are ``read_op_scenario``'s)."""
    check_range(values, "heads", 1, HEADS_MAX, where)
    check_range(values, "head_dim", 1, HEAD_DIM_MAX, where)
    for key in ("dtype", "lse_dtype"):
        if values[key] not in DTYPES:
            raise key_error(where, key, f"must be one of {known(DTYPES)}, got {values[key]!r}")
    for key, choices in (("base", BASES), ("empty", EMPTY_SHARDS)):
        if values[key] not in choices:
            raise key_error(where, key, f"must be one of {known(choices)}, got {values[key]!r}")
    if values["empty"] in NEEDS_LENGTHS and not values["masked"]:
        raise key_error(
            where,
            "empty",
            f"{values['empty']!r} looks like a real shard: no merge can tell it apart unless "
            "its caller passes the lengths (masked = true)",
        )
    check_range(values, "interleave", 1, limits.BLOCK_SIZE_MAX, where)
    check_range(values, "padding", 0, limits.PADDING_MAX, where)
    for key in ("sink_logit", "logit_shift"):
        if not (math.isfinite(values[key]) and abs(values[key]) <= LOGIT_MAX):
            raise key_error(
                where, key, f"must be finite and at most {LOGIT_MAX:g} in size, got {values[key]}"
            )
    sizes = values["dcp"]
    if any(values["heads"] % n for n in sizes):
        raise key_error(
            where, "dcp", f"every DCP size must divide the {values['heads']} heads, got {sizes}"
        )
    if not 1 <= len(values["requests"]) <= limits.REQUESTS_MAX:
        raise key_error(where, "requests", f"must hold 1 to {limits.REQUESTS_MAX} requests")


def _requests(tables: list[dict[str, Any]], where: str) -> tuple[tuple[int, int], ...]:
    parsed = []
    for prefix, values in read_tables(tables, _REQUEST_KEYS, where):
        context, queries = values["context"], values["queries"]
        if not 1 <= queries <= context <= CONTEXT_MAX:
            key = "queries" if queries < 1 else "context"
            raise ScenarioError(
                f"{where}: key '{prefix}{key}': a request needs 1 <= queries <= context <= "
                f"{CONTEXT_MAX}, got context {context}, queries {queries}"
            )
        parsed.append((context, queries))
    rows = sum(queries for _, queries in parsed)
    if rows > ROWS_MAX:
        raise ScenarioError(f"{where}: key 'requests': {rows} query rows, over {ROWS_MAX}")
    return tuple(parsed)


def _batch(values: dict[str, Any], where: str) -> CombineBatch:
    _check(values, where)
    return CombineBatch(
        requests=_requests(values["requests"], where),
        heads=values["heads"],
        head_dim=values["head_dim"],
        dtype=values["dtype"],
        lse_dtype=values["lse_dtype"],
        base_e=BASES[values["base"]],
        return_lse=values["return_lse"],
        masked=values["masked"],
        empty=values["empty"],
        interleave=values["interleave"],
        padding=values["padding"],
        sink_logit=float(values["sink_logit"]),
        logit_shift=float(values["logit_shift"]),
        seed=values["seed"],
    )


def _base(b: CombineBatch) -> dict[str, object]:
    """The key that is no field of the batch: the LSEs' base."""
    return {"base": "e" if b.base_e else "2"}


FORMAT = ScenarioFormat(LSE_COMBINE, _KEYS, _batch, {"requests": _REQUEST_KEYS}, _base)
"""The op's scenario file (module docstring)."""

SCENARIOS = FORMAT.scenarios
load_scenario = FORMAT.load_scenario
load_scenarios = FORMAT.load_scenarios
scenario_to_toml = FORMAT.scenario_to_toml
