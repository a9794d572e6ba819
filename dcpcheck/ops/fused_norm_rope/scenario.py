"""Named scenarios: one TOML file each in ``scenarios/fused-norm-rope/``, read strictly.

A scenario fixes everything a run needs besides the kernel: model shape, dtypes, cache
layout, indexer mode, the DCP layouts to try and the batch of requests. Files are read
strictly because a typo that silently falls back to a default (``blok_size = 1``) would
make a check pass for the wrong reason: every unknown key, wrong type and out-of-range
value is an error, reported on one line that names the file and the key.

Parsing checks what each value *is* (types, per-request counts); ``Scenario`` itself
checks that the values fit together (layouts, presets, positions) and stay within
``dcpcheck.cases.limits``, so a scenario built or changed in code (``dataclasses.replace``
for a ``--dcp`` override or a shrunk failure) is held to the same rules as one read from a
file. Whether a scenario within those limits fits in the memory at hand is
``cost``'s question, asked once the device is known.

A file's ``name`` is the scenario's name wherever the file lies, so a saved failure that
was renamed or copied still replays (``load_scenario``). In a scenario directory, where
``--scenario NAME`` selects files by stem and reports and replay lines name scenarios by
``name``, the two must agree (``load_scenarios``).

File format (``scenario_to_toml`` writes exactly this, keys in this order)::

    op = "fused-norm-rope"            # optional: a file without it is this op's
    name = "decode-single-dcp4"       # the file stem, in a scenario directory
    description = "what it catches"
    preset = "small-neox"             # a key of dcpcheck.ops.fused_norm_rope.contract.PRESETS
    dtype = "bfloat16"                # or "float16"
    cache_layout = "auto"             # or "fp8" (needs mla_scale), "fp8_ds_mla",
                                      #   "nvfp4_ds_mla" (both: kv_lora 512, rope 64)
    mla_scale = 0.3                   # only with cache_layout = "fp8"
    ds_mla_scale = "pow2"             # optional, only with cache_layout = "fp8_ds_mla":
                                      #   "amax" or "pow2" (DS_MLA_SCALE_KEY says more)
    indexer = "sharded"               # or "replicated", "none" (a shared layer)
    index_layout = "shuffled"         # optional, default "plain"; "shuffled" needs
                                      #   block_size a multiple of 16 (INDEX_FORMAT_KEYS)
    index_scale = "mx"                # optional, default "fp32"
    block_size = 16
    block_gap = 0                     # optional: bytes between one block and the next of
                                      #   each cache (BLOCK_GAP_KEY)
    interleave = 1                    # optional, default 1
    dcp = [1, 2, 4]                   # DCP sizes to run
    seed = 0
    values = "normal"                 # optional: or "zero-rows", "fp8-saturating",
                                      #   "exact-ties", "below-floor" (VALUE_REGIMES: the
                                      #   token values)
    block_table = "identity"          # optional, or "shuffled"
    profiling = false                 # optional: a call with no slot mapping
    padding = 0                       # optional: CUDA-graph padding rows
    activation_rows = "fused"         # optional, default "separate": "fused" lays the
                                      #   inputs and outputs out as vLLM's callers do
                                      #   (activation_rows.ACTIVATION_ROWS)

    [[requests]]                      # one or more
    prefix = 37                       # optional, default 0: tokens already cached
    new = 1                           # tokens computed in this step
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import torch

from dcpcheck.cases import limits
from dcpcheck.cases.dcp import (
    Batch,
    BatchError,
    BlockTables,
    DcpLayout,
    DcpLayoutError,
    Request,
    build_block_tables,
)
from dcpcheck.cases.scenario_files import (
    NAME_PATTERN,
    ScenarioError,
    display_path,
    load_named,
    read_toml,
    scenario_files,
    shipped_scenarios,
    where_of,
)
from dcpcheck.cases.toml_tables import (
    Key,
    boolean,
    integer,
    integer_array,
    known,
    number,
    read_table,
    string,
    table_array,
    toml_literal,
)
from dcpcheck.op_registry import FUSED_NORM_ROPE
from dcpcheck.ops.fused_norm_rope.activation_rows import ACTIVATION_ROWS
from dcpcheck.ops.fused_norm_rope.contract import (
    INDEX_SHUFFLE_TILE,
    PRESETS,
    CacheLayout,
    DsMlaScale,
    IndexFormat,
    IndexScale,
    ModelPreset,
    mla_entry_bytes,
)

SCENARIOS = shipped_scenarios(FUSED_NORM_ROPE)
"""The op's shipped scenarios."""

DTYPES: dict[str, torch.dtype] = {"bfloat16": torch.bfloat16, "float16": torch.float16}
"""Activation dtypes a scenario may name."""

INDEXER_MODES = ("sharded", "replicated", "none")
"""``sharded``: the indexer cache uses the MLA cache's DCP mapping; ``replicated``: every rank
stores every token at its DCP1 slot; ``none``: a shared layer with no indexer at all."""

VALUE_REGIMES = ("normal", "zero-rows", "fp8-saturating", "exact-ties", "below-floor")
"""How ``case.make_activations`` fills the token values (details in its docstring):
``normal``: seeded Gaussian rows; ``zero-rows``: every even row of ``q_c``/``kv_c``/``index_k``
is zero (the norms' ``eps`` keeps them finite); ``fp8-saturating``: kv weights and ``k_pe``
scaled so every token's ``kv_out`` and ``kpe_out`` rows reach far beyond ``448 * s`` for any
per-tensor fp8 scale ``s <= 1``; ``exact-ties``: small-integer rows whose RMSNorm is exact in
fp32 and lands 3/8 of the outputs exactly on rounding ties of the output dtype;
``below-floor``: every even row of ``q_c``/``kv_c``/``index_k`` is tiny (about 1e-7, so its
norm only scales it by ``1/sqrt(eps)``) and never zero, and the indexer's weight and bias are
scaled down, so every quantized tile of those rows is non-zero with its amax below its
scale's floor: the indexer's UE8M0 amax floor 1e-4, the fp8_ds_mla ``pow2`` ratio floor
1e-4 and the nvfp4_ds_mla floor 2^-9 (the ``amax`` rule's FLT_MIN floor needs subnormal
ratios no activation reaches, and the per-tensor ``fp8`` scale has no floor;
``value_regimes.BELOW_FLOOR_UNIT``). Part of the scenario, so a failure found in one regime
replays in it."""

DS_MLA_SCALE_KEY = "ds_mla_scale"
"""The fp8_ds_mla tile-scale rule a scenario demands (``contract.DsMlaScale``: ``"amax"`` as
vLLM wrote it up to 0.30.0, ``"pow2"`` from 0.31.0 on). Optional: unset, the rule comes
from ``--ds-mla-scale`` or the kernel's own declaration, else ``amax``
(``runner.effective_ds_mla_scale``); set, it beats the kernel's declaration and yields
only to ``--ds-mla-scale``. Only allowed with ``cache_layout = "fp8_ds_mla"``, like
``mla_scale`` with ``fp8``: in a file of another layout it would do nothing, and a key
that does nothing reads as if it mattered. (The run-wide ``--ds-mla-scale`` and a
kernel's declaration span scenarios of every layout, so those are ignored, not refused,
where the layout has no tile scales.) Saved failures always spell it out, so a replay
uses the rule the failing run used."""

INDEX_LAYOUTS = ("plain", "shuffled")
"""``index_layout``: the indexer cache's values token-major (``plain``) or in 16 x 16 tiles
(``shuffled``, ``contract.INDEX_SHUFFLE_TILE``). With ``index_scale`` (``"fp32"`` or
``"mx"``, ``contract.IndexScale``) it makes the case's ``contract.IndexFormat``. Both are
optional and only allowed on indexer layers; saved failures spell them out only when they
are not the default, so files written before they existed read as they did."""

BLOCK_GAP_KEY = "block_gap"
"""Bytes of other data between the end of one block and the start of the next, in both
caches: a block-outermost layout (vLLM's ``BLHNC``/``BLNHC``, the layer dimension inside
the block dimension) hands each layer a view whose block stride is the whole block of every
layer, so a kernel must address a block by the cache's ``stride(0)``, never by
``block_size * entry``. Optional, default 0 (blocks back to back); a multiple of
``limits.BLOCK_GAP_ALIGNMENT`` up to ``limits.BLOCK_GAP_MAX``. The gap's bytes are guard
bytes: a write into one is a ``guard_bands`` finding."""

BLOCK_TABLE_MODES = ("identity", "shuffled")
"""``identity``: block ids consecutive from 0; ``shuffled``: a permutation seeded by ``seed``."""

_DCP_LAYOUT_KEYS = {"block_size": "block_size", "dcp_size": "dcp", "interleave": "interleave"}
"""DcpLayoutError.field -> the scenario key that set it."""


@dataclass(frozen=True)
class Scenario:
    """One named, replayable configuration of the harness (see module docstring)."""

    name: str
    description: str
    preset: str
    dtype: str
    cache_layout: CacheLayout
    mla_scale: float | None
    indexer: str
    block_size: int
    interleave: int
    dcp_sizes: tuple[int, ...]
    seed: int
    block_table: str
    profiling: bool
    batch: Batch
    values: str = "normal"
    block_gap: int = 0  # BLOCK_GAP_KEY
    ds_mla_scale: DsMlaScale | None = None  # None: not named here (DS_MLA_SCALE_KEY)
    index_format: IndexFormat = dataclasses.field(default_factory=IndexFormat)  # INDEX_LAYOUTS
    activation_rows: str = "separate"  # activation_rows.ACTIVATION_ROWS
    source: Path | None = dataclasses.field(default=None, compare=False)

    def __post_init__(self) -> None:
        self._check_names()
        self._check_limits()
        self._check_cache()
        self._check_layouts()
        self._check_positions()
        if self.seed < 0:
            self._fail("seed", f"must be >= 0, got {self.seed}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def model(self) -> ModelPreset:
        return PRESETS[self.preset]

    @property
    def has_indexer(self) -> bool:
        return self.indexer != "none"

    def layout(self, dcp_size: int) -> DcpLayout:
        """The DCP layout of this scenario at one DCP size."""
        return DcpLayout(self.block_size, dcp_size, self.interleave)

    def block_tables(self, dcp_size: int) -> BlockTables:
        """Block tables at one DCP size: identity, or shuffled with this scenario's seed."""
        shuffle_seed = self.seed if self.block_table == "shuffled" else None
        return build_block_tables(self.batch, self.block_size, dcp_size, shuffle_seed)

    @property
    def where(self) -> str:
        """How a message names this scenario: its file as the user would type it, else its
        name (a scenario built in code)."""
        return where_of(self.source, self.name)

    def error(self, key: str, problem: str) -> ScenarioError:
        """The one-line error about ``key`` of this scenario (module docstring)."""
        return ScenarioError(f"{self.where}: key '{key}': {problem}")

    def _fail(self, key: str, problem: str) -> NoReturn:
        raise self.error(key, problem)

    def _check_names(self) -> None:
        if NAME_PATTERN.fullmatch(self.name) is None:
            self._fail("name", f"{self.name!r} is not a valid name ({NAME_PATTERN.pattern})")
        if not self.description.strip():
            self._fail("description", "must say what the scenario catches, got a blank string")
        if self.preset not in PRESETS:
            self._fail("preset", f"unknown preset {self.preset!r} (known: {known(PRESETS)})")
        if self.dtype not in DTYPES:
            self._fail("dtype", f"unknown dtype {self.dtype!r} (known: {known(DTYPES)})")
        if self.indexer not in INDEXER_MODES:
            self._fail("indexer", f"unknown mode {self.indexer!r} (known: {known(INDEXER_MODES)})")
        if self.values not in VALUE_REGIMES:
            self._fail("values", f"unknown regime {self.values!r} (known: {known(VALUE_REGIMES)})")
        if self.activation_rows not in ACTIVATION_ROWS:
            self._fail(
                "activation_rows",
                f"unknown layout {self.activation_rows!r} (known: {known(ACTIVATION_ROWS)})",
            )
        if self.block_table not in BLOCK_TABLE_MODES:
            self._fail(
                "block_table",
                f"unknown mode {self.block_table!r} (known: {known(BLOCK_TABLE_MODES)})",
            )

    def _check_limits(self) -> None:
        """Every count within ``dcpcheck.cases.limits`` (which says why each bound is what
        it is), before anything is sized by it."""
        batch = self.batch
        counts = (  # (key, what the count is, the count, its limit's name in ``limits``)
            ("block_size", "", self.block_size, "BLOCK_SIZE_MAX"),
            (BLOCK_GAP_KEY, "", self.block_gap, "BLOCK_GAP_MAX"),
            *(("dcp", "DCP size ", size, "DCP_SIZE_MAX") for size in self.dcp_sizes),
            ("seed", "", self.seed, "SEED_MAX"),
            ("padding", "", batch.padding, "PADDING_MAX"),
            ("requests", "the number of requests ", len(batch.requests), "REQUESTS_MAX"),
            ("requests", "rows (new tokens + padding) ", batch.num_tokens, "BATCH_TOKENS_MAX"),
            (
                "requests",
                "cached tokens (prefix + new of every request) ",
                batch.num_prefix_tokens + batch.num_real_tokens,
                "CONTEXT_TOKENS_MAX",
            ),
        )
        for key, what, count, name in counts:
            limit = getattr(limits, name)
            if isinstance(count, int) and count > limit:  # a non-integer is refused below
                self._fail(
                    key, f"{what}must be <= {limit}, got {count} ({name}, dcpcheck/cases/limits.py)"
                )
        step = limits.BLOCK_GAP_ALIGNMENT
        if self.block_gap < 0 or self.block_gap % step:
            self._fail(
                BLOCK_GAP_KEY,
                f"must be a multiple of {step} and >= 0, got {self.block_gap} "
                "(BLOCK_GAP_ALIGNMENT, dcpcheck/cases/limits.py)",
            )

    def _check_cache(self) -> None:
        if self.cache_layout is CacheLayout.FP8:
            if self.mla_scale is None:
                self._fail("mla_scale", "required with cache_layout 'fp8' (the per-tensor scale)")
            elif not (math.isfinite(self.mla_scale) and self.mla_scale > 0):
                self._fail("mla_scale", f"must be finite and > 0, got {self.mla_scale}")
        elif self.mla_scale is not None:
            self._fail(
                "mla_scale",
                f"only allowed with cache_layout 'fp8', not {self.cache_layout.value!r}",
            )
        if self.ds_mla_scale is not None:
            if not isinstance(self.ds_mla_scale, DsMlaScale):
                self._fail(DS_MLA_SCALE_KEY, f"expected a DsMlaScale, got {self.ds_mla_scale!r}")
            if self.cache_layout is not CacheLayout.FP8_DS_MLA:
                self._fail(
                    DS_MLA_SCALE_KEY,
                    f"only allowed with cache_layout 'fp8_ds_mla', not "
                    f"{self.cache_layout.value!r} (no other layout has a choice of scale rule)",
                )
        self._check_index_format()
        model = self.model
        try:
            mla_entry_bytes(self.cache_layout, model.kv_lora_rank, model.rope_dim, self.torch_dtype)
        except ValueError as error:
            self._fail(
                "cache_layout", f"{self.cache_layout.value!r} with preset {model.name!r}: {error}"
            )

    def _check_index_format(self) -> None:
        fmt = self.index_format
        if fmt == IndexFormat():
            return
        key = "index_layout" if fmt.shuffled else "index_scale"
        if not self.has_indexer:
            self._fail(key, f"{fmt.name!r} is only allowed on an indexer layer (indexer 'none')")
        tile = INDEX_SHUFFLE_TILE
        if fmt.shuffled and (self.block_size % tile or self.model.index_head_dim % tile):
            self._fail(
                "index_layout",
                f"'shuffled' needs block_size and the preset's index dim to be multiples of "
                f"{tile}, got {self.block_size} and {self.model.index_head_dim}",
            )

    def _check_layouts(self) -> None:
        if not self.dcp_sizes:
            self._fail("dcp", "needs at least one DCP size")
        if len(set(self.dcp_sizes)) != len(self.dcp_sizes):
            self._fail("dcp", f"repeats a DCP size: {list(self.dcp_sizes)}")
        for dcp_size in self.dcp_sizes:
            try:
                self.layout(dcp_size)
            except DcpLayoutError as error:
                self._fail(_DCP_LAYOUT_KEYS[error.field], str(error))

    def _check_positions(self) -> None:
        if not self.batch.requests:
            self._fail("requests", "needs at least one request")
        max_position = self.model.max_position
        for index, request in enumerate(self.batch.requests):
            last = request.length - 1
            if last >= max_position:
                self._fail(
                    f"requests[{index}]",
                    f"last position {last} (prefix {request.prefix} + new {request.new} - 1) is "
                    f"past preset {self.preset!r} max_position {max_position} (positions "
                    f"0..{max_position - 1})",
                )


# ---------------------------------------------------------------------------------------
# Reading


_TOP_LEVEL_KEYS: dict[str, Key] = {
    "op": Key("string", string, FUSED_NORM_ROPE),
    "name": Key("string", string),
    "description": Key("string", string),
    "preset": Key("string", string),
    "dtype": Key("string", string),
    "cache_layout": Key("string", string),
    "mla_scale": Key("float", number, None),
    DS_MLA_SCALE_KEY: Key("string", string, None),
    "indexer": Key("string", string),
    "index_layout": Key("string", string, "plain"),
    "index_scale": Key("string", string, IndexScale.FP32.value),
    "block_size": Key("integer", integer),
    BLOCK_GAP_KEY: Key("integer", integer, 0),
    "interleave": Key("integer", integer, 1),
    "dcp": Key("array of integers", integer_array),
    "seed": Key("integer", integer),
    "values": Key("string", string, "normal"),
    "block_table": Key("string", string, "identity"),
    "profiling": Key("boolean", boolean, False),
    "padding": Key("integer", integer, 0),
    "activation_rows": Key("string", string, "separate"),
    "requests": Key("array of tables ([[requests]])", table_array),
}

_REQUEST_KEYS: dict[str, Key] = {
    "prefix": Key("integer", integer, 0),
    "new": Key("integer", integer),
}


def _read_batch(requests: list[dict[str, Any]], padding: int, where: str) -> Batch:
    parsed = []
    for index, table in enumerate(requests):
        key_prefix = f"requests[{index}]."
        values = read_table(table, _REQUEST_KEYS, where, ScenarioError, key_prefix)
        try:
            parsed.append(Request(prefix=values["prefix"], new=values["new"]))
        except BatchError as error:
            raise ScenarioError(f"{where}: key '{key_prefix}{error.field}': {error}") from None
    try:
        return Batch(tuple(parsed), padding=padding)
    except BatchError as error:
        raise ScenarioError(f"{where}: key '{error.field}': {error}") from None


def load_scenario(path: Path) -> Scenario:
    """Read and validate one scenario file, wherever it lies and whatever it is called.

    Its ``name`` key names the scenario and ``source`` is ``path``, so a saved failure
    renamed or copied elsewhere still replays under its own name (a replay line of a file
    outside ``scenarios/fused-norm-rope/`` points at the file,
    ``runner.RunConfig.replay_command``).
    ``load_scenarios`` adds what a scenario directory needs: name and stem agree.
    """
    path = Path(path)
    where = display_path(path)
    table = read_toml(path, where)

    if table.get("op", FUSED_NORM_ROPE) != FUSED_NORM_ROPE:
        op = table["op"]
        raise ScenarioError(
            f"{where}: key 'op': a {op!r} scenario, not a {FUSED_NORM_ROPE} one: run it with "
            f"--op {op}, or `dcpcheck repro FILE`"
        )
    values = read_table(table, _TOP_LEVEL_KEYS, where, ScenarioError)
    layouts = {layout.value: layout for layout in CacheLayout}
    if values["cache_layout"] not in layouts:
        raise ScenarioError(
            f"{where}: key 'cache_layout': unknown layout {values['cache_layout']!r} "
            f"(known: {known(layouts)})"
        )
    mla_scale = values["mla_scale"]
    rules = {rule.value: rule for rule in DsMlaScale}
    ds_mla_scale = values[DS_MLA_SCALE_KEY]
    if ds_mla_scale is not None and ds_mla_scale not in rules:
        raise ScenarioError(
            f"{where}: key '{DS_MLA_SCALE_KEY}': unknown rule {ds_mla_scale!r} "
            f"(known: {known(rules)})"
        )
    if values["index_layout"] not in INDEX_LAYOUTS:
        raise ScenarioError(
            f"{where}: key 'index_layout': unknown layout {values['index_layout']!r} "
            f"(known: {known(INDEX_LAYOUTS)})"
        )
    index_scales = {scale.value: scale for scale in IndexScale}
    if values["index_scale"] not in index_scales:
        raise ScenarioError(
            f"{where}: key 'index_scale': unknown format {values['index_scale']!r} "
            f"(known: {known(index_scales)})"
        )
    index_format = IndexFormat(
        values["index_layout"] == "shuffled", index_scales[values["index_scale"]]
    )
    return Scenario(
        name=values["name"],
        description=values["description"],
        preset=values["preset"],
        dtype=values["dtype"],
        cache_layout=layouts[values["cache_layout"]],
        mla_scale=None if mla_scale is None else float(mla_scale),
        indexer=values["indexer"],
        block_size=values["block_size"],
        block_gap=values[BLOCK_GAP_KEY],
        interleave=values["interleave"],
        dcp_sizes=tuple(values["dcp"]),
        seed=values["seed"],
        block_table=values["block_table"],
        profiling=values["profiling"],
        batch=_read_batch(values["requests"], values["padding"], where),
        values=values["values"],
        ds_mla_scale=None if ds_mla_scale is None else rules[ds_mla_scale],
        index_format=index_format,
        activation_rows=values["activation_rows"],
        source=path,
    )


def load_scenarios(patterns: Sequence[str], root: Path = SCENARIOS) -> list[Scenario]:
    """The scenarios under ``root`` whose names match any of ``patterns``, sorted by name.

    A pattern is a name or an ``fnmatch`` glob over names (``fp8-*``); no patterns means
    every scenario. A pattern that matches nothing is an error, so a typo on the command
    line never quietly runs zero scenarios.

    Patterns select files by stem, while results, reports and replay lines
    (``dcpcheck run --scenario NAME``) name a scenario by its ``name`` key, and the run
    looks scenarios up by name: so here the two must agree, or a replay line would select
    another file (or none), and two files naming one scenario would shadow each other.
    """
    return load_named(scenario_files(patterns, root), load_scenario)


# ---------------------------------------------------------------------------------------
# Writing


def scenario_to_toml(scenario: Scenario) -> str:
    """The TOML text of ``scenario``: every key spelled out, in the module docstring's order,
    so that ``load_scenario`` of the written file gives back an equal scenario."""
    s = scenario
    top: list[tuple[str, object]] = [
        ("name", s.name),
        ("description", s.description),
        ("preset", s.preset),
        ("dtype", s.dtype),
        ("cache_layout", s.cache_layout.value),
    ]
    if s.mla_scale is not None:
        top.append(("mla_scale", float(s.mla_scale)))
    if s.ds_mla_scale is not None:
        top.append((DS_MLA_SCALE_KEY, s.ds_mla_scale.value))
    top.append(("indexer", s.indexer))
    if s.index_format.shuffled:
        top.append(("index_layout", "shuffled"))
    if s.index_format.scale is not IndexScale.FP32:
        top.append(("index_scale", s.index_format.scale.value))
    top += [
        ("block_size", s.block_size),
        *([(BLOCK_GAP_KEY, s.block_gap)] if s.block_gap else []),
        ("interleave", s.interleave),
        ("dcp", list(s.dcp_sizes)),
        ("seed", s.seed),
        ("values", s.values),
        ("block_table", s.block_table),
        ("profiling", s.profiling),
        ("padding", s.batch.padding),
        *([("activation_rows", s.activation_rows)] if s.activation_rows != "separate" else []),
    ]
    lines = [f"{key} = {toml_literal(value)}" for key, value in top]
    for request in s.batch.requests:
        lines += ["", "[[requests]]", f"prefix = {request.prefix}", f"new = {request.new}"]
    return "\n".join(lines) + "\n"
