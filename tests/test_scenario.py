"""Scenario files (dcpcheck.ops.fused_norm_rope.scenario): the shipped ones load and
round-trip, every kind of mistake in a file (an oversized count included:
dcpcheck.cases.limits) is an error that names the file and the key, on one line, and a saved
file replays whatever it is renamed to."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from dcpcheck.cases import limits
from dcpcheck.cases.dcp import Batch, Request
from dcpcheck.cases.scenario_files import ScenarioError
from dcpcheck.cli import main
from dcpcheck.ops.fused_norm_rope.contract import (
    PRESETS,
    CacheLayout,
    DsMlaScale,
    IndexFormat,
    IndexScale,
    ModelPreset,
)
from dcpcheck.ops.fused_norm_rope.scenario import (
    SCENARIOS,
    Scenario,
    load_scenario,
    load_scenarios,
    scenario_to_toml,
)

SHIPPED = sorted(SCENARIOS.glob("*.toml"))

REQUIRED_SHIPPED = {
    "glm5-prefill-512",
    "glm5-prefill-1536-prefix",
    "decode-single-dcp4",
    "mixed-prefill-decode-padding",
    "fp8-cache",
    "fp8-ds-mla-cache",
    "fp8-ds-mla-pow2-scale",
    "indexer-replicated",
    "indexer-sharded",
    "shared-layer-no-indexer",
    "profiling-call",
    "profiling-ds-mla",
    "positions-near-max",
    "shuffled-block-table",
    "interleave-block",
    "fp16-interleaved-indexer",
    "below-floor-pow2-indexer",
    "below-floor-nvfp4-fp16",
    "block-gap",
    "fused-rows-decode-dcp4",
    "fused-rows-mixed-batch",
}


# ---------------------------------------------------------------------------------------
# Shipped scenarios


def test_the_promised_scenarios_are_shipped() -> None:
    assert REQUIRED_SHIPPED.issubset(path.stem for path in SHIPPED)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_shipped_scenario_loads(path: Path) -> None:
    scenario = load_scenario(path)
    assert scenario.name == path.stem
    assert scenario.source == path
    assert len(scenario.description) > 40  # says what it catches


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_shipped_scenario_round_trips(path: Path, tmp_path: Path) -> None:
    scenario = load_scenario(path)
    text = scenario_to_toml(scenario)
    copy = tmp_path / path.name
    copy.write_text(text, encoding="utf-8")
    again = load_scenario(copy)
    assert again == scenario
    assert scenario_to_toml(again) == text  # deterministic


def test_shipped_scenarios_have_the_shapes_they_promise() -> None:
    by_name = {s.name: s for s in load_scenarios([])}
    decode = by_name["decode-single-dcp4"]
    assert decode.dcp_sizes == (4,)
    assert decode.batch == Batch((Request(prefix=37, new=1),))
    prefill = by_name["glm5-prefill-1536-prefix"]
    assert (prefill.preset, prefill.block_size) == ("glm-5", 64)
    assert prefill.batch.requests == (Request(prefix=1024, new=1536),)
    assert by_name["glm5-prefill-512"].batch.num_tokens == 512
    mixed = by_name["mixed-prefill-decode-padding"].batch
    assert mixed.padding > 0
    assert {r.new for r in mixed.requests} >= {1, 3}
    near_max = by_name["positions-near-max"]
    assert max(r.length for r in near_max.batch.requests) == near_max.model.max_position
    assert by_name["fp8-cache"].cache_layout is CacheLayout.FP8
    assert by_name["fp8-ds-mla-cache"].cache_layout is CacheLayout.FP8_DS_MLA
    assert by_name["fp8-ds-mla-cache"].ds_mla_scale is None  # the run decides: amax by default
    pow2 = by_name["fp8-ds-mla-pow2-scale"]
    assert (pow2.cache_layout, pow2.ds_mla_scale) == (CacheLayout.FP8_DS_MLA, DsMlaScale.POW2)
    assert by_name["indexer-shuffled"].index_format == IndexFormat(True, IndexScale.FP32)
    assert by_name["indexer-mx-scales"].index_format == IndexFormat(False, IndexScale.MX)
    assert by_name["nvfp4-ds-mla-cache"].cache_layout is CacheLayout.NVFP4_DS_MLA
    assert by_name["indexer-sharded"].index_format == IndexFormat()  # the default, unnamed
    assert by_name["profiling-call"].profiling
    assert not by_name["shared-layer-no-indexer"].has_indexer
    assert by_name["indexer-replicated"].indexer == "replicated"
    assert by_name["interleave-block"].interleave > 1
    fp16 = by_name["fp16-interleaved-indexer"]
    assert fp16.dtype == "float16"
    assert fp16.model.index_rope_interleaved
    below_pow2 = by_name["below-floor-pow2-indexer"]
    assert (below_pow2.values, below_pow2.cache_layout, below_pow2.ds_mla_scale) == (
        "below-floor",
        CacheLayout.FP8_DS_MLA,
        DsMlaScale.POW2,
    )
    below_nvfp4 = by_name["below-floor-nvfp4-fp16"]
    assert (below_nvfp4.values, below_nvfp4.cache_layout, below_nvfp4.dtype) == (
        "below-floor",
        CacheLayout.NVFP4_DS_MLA,
        "float16",
    )
    assert below_pow2.has_indexer and below_nvfp4.has_indexer  # the UE8M0 rows too
    gap = by_name["block-gap"]
    assert gap.block_gap > 0 and gap.has_indexer  # both caches' blocks apart
    assert all(s.block_gap == 0 for s in by_name.values() if s is not gap)


def test_shuffled_scenario_gets_non_identity_block_tables() -> None:
    scenario = load_scenario(SCENARIOS / "shuffled-block-table.toml")
    for dcp_size in scenario.dcp_sizes:
        ids = [block for table in scenario.block_tables(dcp_size) for block in table]
        assert sorted(ids) == list(range(len(ids)))
        assert ids != sorted(ids)
    identity = dataclasses.replace(scenario, block_table="identity")
    ids = [block for table in identity.block_tables(2) for block in table]
    assert ids == list(range(len(ids)))


# ---------------------------------------------------------------------------------------
# Selecting scenarios by name


def test_patterns_select_sorted_unique_scenarios() -> None:
    chosen = load_scenarios(["fp8-*", "decode-single-dcp4", "fp8-cache"], SCENARIOS)
    assert [s.name for s in chosen] == [
        "decode-single-dcp4",
        "fp8-cache",
        "fp8-ds-mla-cache",
        "fp8-ds-mla-pow2-scale",
    ]


def test_no_patterns_select_everything() -> None:
    assert [s.name for s in load_scenarios([], SCENARIOS)] == [p.stem for p in SHIPPED]


def test_a_pattern_matching_nothing_is_an_error() -> None:
    with pytest.raises(ScenarioError, match="no scenario matches 'decode-singel'"):
        load_scenarios(["decode-single-dcp4", "decode-singel"], SCENARIOS)


# ---------------------------------------------------------------------------------------
# Bad files

REQUESTS = """
[[requests]]
prefix = 3
new = 4

[[requests]]
prefix = 9
new = 1
"""

VALID = (
    """\
name = "case"
description = "a scenario for the loader's tests"
preset = "small-neox"
dtype = "bfloat16"
cache_layout = "auto"
indexer = "sharded"
block_size = 16
interleave = 1
dcp = [1, 2]
seed = 0
"""
    + REQUESTS
)


def write_case(tmp_path: Path, text: str, name: str = "case") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_the_valid_base_case_loads_with_defaults(tmp_path: Path) -> None:
    scenario = load_scenario(write_case(tmp_path, VALID))
    assert scenario == Scenario(
        name="case",
        description="a scenario for the loader's tests",
        preset="small-neox",
        dtype="bfloat16",
        cache_layout=CacheLayout.AUTO,
        mla_scale=None,
        indexer="sharded",
        block_size=16,
        interleave=1,
        dcp_sizes=(1, 2),
        seed=0,
        block_table="identity",
        profiling=False,
        batch=Batch((Request(3, 4), Request(9, 1)), padding=0),
    )
    assert scenario.values == "normal"  # the optional value regime's default
    assert scenario.activation_rows == "separate"


# (case id, text replaced in VALID, replacement, key the message must name, words it must hold)
BAD_FILES = [
    ("unknown-top-level-key", "seed = 0", "seed = 0\nblok_size = 16", "blok_size", "known: "),
    ("unknown-request-key", "new = 4", "neww = 4", "requests[0].neww", "known: new, prefix"),
    ("wrong-type", "block_size = 16", 'block_size = "16"', "block_size", 'got "16" (string)'),
    ("bool-for-int-list", "dcp = [1, 2]", "dcp = true", "dcp", "got true (boolean)"),
    ("bool-in-int-list", "dcp = [1, 2]", "dcp = [1, true]", "dcp", "array of integers"),
    ("bool-for-int", "block_size = 16", "block_size = true", "block_size", "expected integer"),
    ("int-for-bool", "seed = 0", "seed = 0\nprofiling = 1", "profiling", "expected boolean"),
    ("float-for-int", "new = 4", "new = 4.0", "requests[0].new", "got 4.0 (float)"),
    ("missing-required-key", 'preset = "small-neox"\n', "", "preset", "required"),
    (
        "unknown-index-layout",
        'indexer = "sharded"',
        'indexer = "sharded"\nindex_layout = "tiled"',
        "index_layout",
        "known: plain, shuffled",
    ),
    (
        "unknown-index-scale",
        'indexer = "sharded"',
        'indexer = "sharded"\nindex_scale = "ue8m0"',
        "index_scale",
        "known: fp32, mx",
    ),
    (
        "shuffled-needs-blocks-of-16",
        'indexer = "sharded"\nblock_size = 16',
        'indexer = "sharded"\nindex_layout = "shuffled"\nblock_size = 8',
        "index_layout",
        "multiples of 16, got 8 and 128",
    ),
    (
        "index-format-without-indexer",
        'indexer = "sharded"',
        'indexer = "none"\nindex_scale = "mx"',
        "index_scale",
        "only allowed on an indexer layer",
    ),
    (
        "missing-requests",
        REQUESTS,
        "\n",
        "requests",
        "required",
    ),
    ("requests-not-tables", REQUESTS, "\nrequests = [1]\n", "requests", "array of tables"),
    (
        "empty-requests",
        REQUESTS,
        "\nrequests = []\n",
        "requests",
        "at least one request",
    ),
    (
        "interleave-not-dividing",
        "interleave = 1",
        "interleave = 3",
        "interleave",
        "does not divide",
    ),
    ("interleave-zero", "interleave = 1", "interleave = 0", "interleave", ">= 1"),
    ("block-size-zero", "block_size = 16", "block_size = 0", "block_size", ">= 1"),
    ("dcp-size-zero", "dcp = [1, 2]", "dcp = [1, 0]", "dcp", ">= 1, got 0"),
    ("dcp-empty", "dcp = [1, 2]", "dcp = []", "dcp", "at least one"),
    ("dcp-repeated", "dcp = [1, 2]", "dcp = [2, 2]", "dcp", "repeats"),
    ("bad-layout", 'cache_layout = "auto"', 'cache_layout = "fp16"', "cache_layout", "known: "),
    ("fp8-without-scale", 'cache_layout = "auto"', 'cache_layout = "fp8"', "mla_scale", "required"),
    (
        "scale-with-auto",
        'cache_layout = "auto"',
        'cache_layout = "auto"\nmla_scale = 0.3',
        "mla_scale",
        "only allowed with cache_layout 'fp8'",
    ),
    (
        "scale-with-ds-mla",
        'cache_layout = "auto"',
        'cache_layout = "fp8_ds_mla"\nmla_scale = 0.3',
        "mla_scale",
        "only allowed",
    ),
    (
        "scale-zero",
        'cache_layout = "auto"',
        'cache_layout = "fp8"\nmla_scale = 0.0',
        "mla_scale",
        "> 0",
    ),
    (
        "scale-nan",
        'cache_layout = "auto"',
        'cache_layout = "fp8"\nmla_scale = nan',
        "mla_scale",
        "finite",
    ),
    ("position-past-max", "prefix = 9", "prefix = 4096", "requests[1]", "max_position 4096"),
    ("unknown-preset", 'preset = "small-neox"', 'preset = "glm-6"', "preset", "unknown preset"),
    ("unknown-dtype", 'dtype = "bfloat16"', 'dtype = "float32"', "dtype", "known: bfloat16"),
    ("unknown-indexer", 'indexer = "sharded"', 'indexer = "global"', "indexer", "known: none"),
    ("unknown-block-table", "seed = 0", 'seed = 0\nblock_table = "random"', "block_table", "known"),
    ("zero-new-tokens", "new = 4", "new = 0", "requests[0].new", ">= 1, got 0"),
    ("negative-prefix", "prefix = 3", "prefix = -1", "requests[0].prefix", ">= 0, got -1"),
    ("negative-padding", "seed = 0", "seed = 0\npadding = -2", "padding", ">= 0, got -2"),
    ("negative-seed", "seed = 0", "seed = -1", "seed", ">= 0"),
    (
        "unknown-values",
        "seed = 0",
        'seed = 0\nvalues = "spiky"',
        "values",
        "known: below-floor, exact-ties",
    ),
    ("values-not-string", "seed = 0", "seed = 0\nvalues = 1", "values", "expected string"),
    (
        "unknown-activation-rows",
        "seed = 0",
        'seed = 0\nactivation_rows = "packed"',
        "activation_rows",
        "unknown layout 'packed' (known: fused, separate)",
    ),
    ("empty-description", "a scenario for the loader's tests", " ", "description", "blank"),
    # Counts past dcpcheck.cases.limits: refused before anything is sized by them.
    (
        "block-size-over-limit",
        "block_size = 16",
        "block_size = 1099511627776",
        "block_size",
        f"must be <= {limits.BLOCK_SIZE_MAX}, got 1099511627776 (BLOCK_SIZE_MAX, ",
    ),
    (
        "block-size-past-64-bits",
        "block_size = 16",
        "block_size = 99999999999999999999999",
        "block_size",
        f"must be <= {limits.BLOCK_SIZE_MAX}, got 99999999999999999999999",
    ),
    (
        "block-gap-unaligned",
        "block_size = 16",
        "block_size = 16\nblock_gap = 24",
        "block_gap",
        f"must be a multiple of {limits.BLOCK_GAP_ALIGNMENT} and >= 0, got 24",
    ),
    (
        "block-gap-over-limit",
        "block_size = 16",
        f"block_size = 16\nblock_gap = {limits.BLOCK_GAP_MAX + 16}",
        "block_gap",
        f"must be <= {limits.BLOCK_GAP_MAX}, got {limits.BLOCK_GAP_MAX + 16} (BLOCK_GAP_MAX, ",
    ),
    (
        "dcp-size-over-limit",
        "dcp = [1, 2]",
        "dcp = [1, 100000000]",
        "dcp",
        f"DCP size must be <= {limits.DCP_SIZE_MAX}, got 100000000 (DCP_SIZE_MAX, ",
    ),
    (
        "padding-over-limit",
        "seed = 0",
        "seed = 0\npadding = 50000000",
        "padding",
        f"must be <= {limits.PADDING_MAX}, got 50000000 (PADDING_MAX, ",
    ),
    (
        "seed-over-limit",
        "seed = 0",
        f"seed = {limits.SEED_MAX + 1}",
        "seed",
        f"must be <= {limits.SEED_MAX}, got {limits.SEED_MAX + 1} (SEED_MAX, ",
    ),
    (
        "too-many-requests",
        REQUESTS,
        "\n[[requests]]\nnew = 1\n" * (limits.REQUESTS_MAX + 1),
        "requests",
        f"the number of requests must be <= {limits.REQUESTS_MAX}, got {limits.REQUESTS_MAX + 1}",
    ),
    (
        "too-many-rows",
        REQUESTS,
        "\n[[requests]]\nnew = 4000\n" * 100,
        "requests",
        f"rows (new tokens + padding) must be <= {limits.BATCH_TOKENS_MAX}, got 400000",
    ),
    (
        "too-many-cached-tokens",
        REQUESTS,
        "\n[[requests]]\nprefix = 4000\nnew = 90\n" * 300,
        "requests",
        f"cached tokens (prefix + new of every request) must be <= "
        f"{limits.CONTEXT_TOKENS_MAX}, got 1227000",
    ),
]


@pytest.mark.parametrize(
    ("old", "new", "key", "words"),
    [case[1:] for case in BAD_FILES],
    ids=[case[0] for case in BAD_FILES],
)
def test_bad_file_names_file_and_key(
    tmp_path: Path, old: str, new: str, key: str, words: str
) -> None:
    assert old in VALID
    path = write_case(tmp_path, VALID.replace(old, new, 1))
    with pytest.raises(ScenarioError) as raised:
        load_scenario(path)
    message = str(raised.value)
    assert message.startswith(f"{path}: key '{key}': "), message
    assert words in message
    assert "\n" not in message


PROBE = {
    "block_size": ("block_size = 16", "block_size = 1099511627776"),
    "padding": ("seed = 0", "seed = 0\npadding = 50000000"),
    "dcp": ("dcp = [1, 2]", "dcp = [100000000]"),
}
"""Scenario files an adversary wrote: each must be refused by the reader, one line, not
die later in a traceback."""


@pytest.mark.parametrize("key", PROBE)
def test_the_oversized_probe_is_refused_by_the_reader(tmp_path: Path, key: str) -> None:
    old, new = PROBE[key]
    path = write_case(tmp_path, VALID.replace(old, new, 1))
    with pytest.raises(ScenarioError) as raised:
        load_scenario(path)
    message = str(raised.value)
    assert message.startswith(f"{path}: key '{key}': "), message
    assert "must be <= " in message and "dcpcheck/cases/limits.py" in message
    assert "\n" not in message


def test_limits_bind_scenarios_changed_in_code_too() -> None:
    """A ``--dcp`` or ``--seed`` override is a ``dataclasses.replace``: held to the same limits."""
    scenario = load_scenario(SCENARIOS / "decode-single-dcp4.toml")
    with pytest.raises(ScenarioError, match=r"key 'dcp': DCP size must be <= 64, got 65"):
        dataclasses.replace(scenario, dcp_sizes=(65,))
    with pytest.raises(ScenarioError, match=rf"key 'seed': must be <= {limits.SEED_MAX}"):
        dataclasses.replace(scenario, seed=limits.SEED_MAX + 1)
    at_limits = dataclasses.replace(
        scenario,
        block_size=limits.BLOCK_SIZE_MAX,
        dcp_sizes=(limits.DCP_SIZE_MAX,),
        seed=limits.SEED_MAX,
        batch=Batch((Request(37, 1),), padding=limits.PADDING_MAX),
    )
    assert at_limits.batch.padding == limits.PADDING_MAX


def test_the_shipped_and_the_searched_scenarios_are_within_the_limits() -> None:
    """The property search draws scenarios in code: its bounds must sit inside the limits,
    or a drawn scenario would be refused instead of run."""
    from dcpcheck.ops.fused_norm_rope import strategies

    assert strategies.MAX_DCP_SIZE <= limits.DCP_SIZE_MAX
    assert max(strategies.BLOCK_SIZES) <= limits.BLOCK_SIZE_MAX
    assert strategies.MAX_PADDING <= limits.PADDING_MAX
    assert strategies.MAX_VALUE_SEED <= limits.SEED_MAX
    assert load_scenarios([])  # every shipped file passes the limits


def test_toml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = write_case(tmp_path, VALID.replace("block_size = 16", "block_size = = 16"))
    with pytest.raises(ScenarioError, match=r"invalid TOML: .*line 7") as raised:
        load_scenario(path)
    assert str(raised.value).startswith(f"{path}: ")


def test_missing_file_is_a_scenario_error(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="no such scenario file"):
        load_scenario(tmp_path / "nowhere.toml")


def test_ds_mla_needs_a_512_64_preset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    narrow = ModelPreset("narrow-kv", 256, 256, 64, 128, False, 4096, 16)
    monkeypatch.setitem(PRESETS, narrow.name, narrow)
    text = VALID.replace('preset = "small-neox"', 'preset = "narrow-kv"').replace(
        'cache_layout = "auto"', 'cache_layout = "fp8_ds_mla"'
    )
    path = write_case(tmp_path, text)
    with pytest.raises(ScenarioError, match="kv_lora_rank 512") as raised:
        load_scenario(path)
    assert str(raised.value).startswith(f"{path}: key 'cache_layout': ")


def test_errors_name_the_path_relative_to_the_working_directory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Changing a loaded scenario in code (a --dcp override) is checked like a file, and the
    message points at the file as a user in the repository would type it."""
    monkeypatch.chdir(SCENARIOS.parents[1])
    scenario = load_scenario(SCENARIOS / "decode-single-dcp4.toml")
    with pytest.raises(ScenarioError) as raised:
        dataclasses.replace(scenario, dcp_sizes=(3,), interleave=3)
    assert str(raised.value) == (
        "scenarios/fused-norm-rope/decode-single-dcp4.toml: key 'interleave': "
        "interleave 3 does not divide block_size 16"
    )


def test_a_scenario_built_in_code_is_named_by_its_name() -> None:
    scenario = load_scenario(SCENARIOS / "decode-single-dcp4.toml")
    unsaved = dataclasses.replace(scenario, source=None)
    with pytest.raises(ScenarioError, match=r"^scenario 'decode-single-dcp4': key 'dcp': "):
        dataclasses.replace(unsaved, dcp_sizes=(0,))


# ---------------------------------------------------------------------------------------
# Renamed files


def test_a_renamed_file_loads_under_its_own_name(tmp_path: Path) -> None:
    """A saved failure renamed by its user (or copied under another name) keeps the name
    its ``name`` key gives, and points at the file it was read from."""
    path = write_case(tmp_path, VALID, name="the-bug-from-friday")
    scenario = load_scenario(path)
    assert scenario.name == "case"
    assert scenario.source == path
    assert scenario == load_scenario(write_case(tmp_path, VALID))  # the file name plays no part


def test_in_a_scenario_directory_name_and_file_must_agree(tmp_path: Path) -> None:
    """There ``--scenario NAME`` selects files by stem, while reports and replay lines name
    scenarios by ``name``: a file whose name differs would be replayed as another one."""
    path = write_case(tmp_path, VALID, name="other")
    with pytest.raises(ScenarioError) as raised:
        load_scenarios([], tmp_path)
    message = str(raised.value)
    assert message.startswith(f"{path}: key 'name': 'case' does not match the file name"), message
    assert "expected 'other'" in message and "\n" not in message


def test_dcpcheck_repro_replays_a_renamed_saved_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`dcpcheck repro` replays a saved failure whatever the file is renamed to."""
    saved = load_scenario(SCENARIOS / "decode-single-dcp4.toml")
    text = scenario_to_toml(dataclasses.replace(saved, name="shrunk-default-0123abcd"))
    renamed = write_case(tmp_path, text, name="renamed-by-its-user")
    monkeypatch.setattr(sys, "argv", ["dcpcheck", "repro", str(renamed)])
    with pytest.raises(SystemExit) as exited:
        main()
    captured = capsys.readouterr()
    assert exited.value.code == 0, captured.err
    assert "shrunk-default-0123abcd[dcp4]" in captured.out


# ---------------------------------------------------------------------------------------
# Writing


def test_round_trip_keeps_awkward_strings_and_floats(tmp_path: Path) -> None:
    scenario = load_scenario(write_case(tmp_path, VALID))
    awkward = dataclasses.replace(
        scenario,
        description='quotes " and \\ backslash\nnew line\ttab \x7f del, ünïcode, 😀',
        cache_layout=CacheLayout.FP8,
        mla_scale=1e-05,
        block_table="shuffled",
        profiling=True,
        batch=Batch((Request(0, 1),), padding=3),
        values="exact-ties",
    )
    copy_dir = tmp_path / "copy"
    copy_dir.mkdir()
    path = write_case(copy_dir, scenario_to_toml(awkward))
    assert load_scenario(path) == awkward
