"""The two fp8_ds_mla tile-scale rules, from the oracle to the command line.

vLLM scaled each 128-value NoPE tile by ``max(amax * (1/448), FLT_MIN)`` up to 0.30.0
(``"amax"``) and by the power of two ``2^ceil(log2(max(amax * (1/448), 1e-4)))`` from
0.31.0 on (``"pow2"``). Here:

* the oracle's scales and entry bytes against values computed by hand (``struct`` for
  the fp32 reciprocal, the e4m3 bit layout for the bytes), never against itself;
* the project's Triton kernel against the oracle, bit for bit, on ratios that sit on, just
  above and just below powers of two;
* which rule a case demands (option > the kernel's declaration > scenario key > ``amax``),
  in process, under ``--isolate`` and in the failures a run and the property search save.

The witness kernel of the precedence tests is ``tests.fixtures.declared_encoding``'s
``always_pow2``: it writes power-of-two scales whatever it is asked and declares ``pow2``,
so it passes a case exactly when the harness resolved ``pow2`` for it.
"""

from __future__ import annotations

import dataclasses
import struct
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl
from click.testing import CliRunner

import reference as ref
from dcpcheck.cases.scenario_files import ScenarioError
from dcpcheck.cases.verdicts import RunConfig
from dcpcheck.cli import cli
from dcpcheck.harness.isolation import IsolatedKernel
from dcpcheck.ops.fused_norm_rope import search
from dcpcheck.ops.fused_norm_rope.case import build_case
from dcpcheck.ops.fused_norm_rope.contract import CacheLayout, DsMlaScale, FusedOpInputs
from dcpcheck.ops.fused_norm_rope.kernel import _ds_mla_tile_scales
from dcpcheck.ops.fused_norm_rope.kernels import load_kernel
from dcpcheck.ops.fused_norm_rope.runner import (
    declared_ds_mla_scale,
    effective_ds_mla_scale,
    run_scenario,
    with_effective_ds_mla_scale,
)
from dcpcheck.ops.fused_norm_rope.scenario import (
    SCENARIOS,
    load_scenario,
    load_scenarios,
    scenario_to_toml,
)
from dcpcheck.ops.fused_norm_rope.selftest import PROFILES as SELFTEST_PROFILES
from dcpcheck.ops.fused_norm_rope.selftest import selftest_scenarios
from dcpcheck.ops.fused_norm_rope.variants import MUTANTS
from reference.quant import FLT_MIN
from tests.conftest import BACKEND
from tests.fixtures.declared_encoding import always_pow2, oracle_writing_pow2
from tests.test_kernel import build_launch, run_and_check

AMAX, POW2 = DsMlaScale.AMAX, DsMlaScale.POW2
WITNESS = "tests.fixtures.declared_encoding:always_pow2"
AMAX_SCENARIO = "fp8-ds-mla-cache"  # names no rule
POW2_SCENARIO = "fp8-ds-mla-pow2-scale"  # ds_mla_scale = "pow2"


def f32(x: float) -> float:
    """``x`` rounded to fp32, as a Python float."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


INV_448 = f32(1 / 448)
"""1/448 rounded to fp32. The product of two fp32 values is exact in a double, so
``f32(a * INV_448)`` is the fp32 multiply the rules do."""


def shipped(name: str, dcp: tuple[int, ...] = (1,)):
    return dataclasses.replace(load_scenario(SCENARIOS / f"{name}.toml"), dcp_sizes=dcp)


def passes(kernel, scenario, config: RunConfig | None = None) -> bool:
    config = config or RunConfig("witness", None)
    return all(r.status == "pass" for r in run_scenario(kernel, scenario, config, BACKEND))


# ----------------------------------------------------------------------------------------
# The oracle, by hand
# ----------------------------------------------------------------------------------------

ABOVE_3_5 = torch.nextafter(torch.tensor(3.5), torch.tensor(4.0)).item()

POW2_GOLDEN = [
    (448.0, 1.0),  # 448 * fp32(1/448) is exactly 1.0: a power of two stays
    (449.0, 2.0),  # just above 1: the next power up
    (224.0, 0.5),  # exactly 2^-1
    (3.5, 2.0**-7),  # 3.5 * fp32(1/448) is exactly 2^-7
    (ABOVE_3_5, 2.0**-6),  # one fp32 ulp above it: doubled
    (1.0, 2.0**-8),  # 2^-9 < 0.00223 <= 2^-8
    (0.0, 2.0**-13),  # floored at 1e-4; ceil(log2(1e-4)) = ceil(-13.29) = -13
    (0.01, 2.0**-13),  # ratio 2.2e-5, below the floor
    (1000.0, 4.0),  # ratio 2.23
]


def test_rule_names_are_the_contracts():
    assert ref.DS_MLA_SCALE_RULES == ("amax", "pow2")
    assert (AMAX.value, POW2.value) == (ref.DS_MLA_SCALE_AMAX, ref.DS_MLA_SCALE_POW2)


@pytest.mark.parametrize(("amax", "scale"), POW2_GOLDEN, ids=[str(a) for a, _ in POW2_GOLDEN])
def test_pow2_tile_scale_by_hand(amax, scale):
    assert ref.ds_mla_tile_scale(torch.tensor([amax]), "pow2").item() == scale


def test_amax_tile_scale_by_hand_and_the_default():
    amax = torch.tensor([448.0, 449.0, 3.5, 0.0])
    expected = [f32(448 * INV_448), f32(449 * INV_448), f32(3.5 * INV_448), FLT_MIN]
    assert expected[0] == 1.0 and expected[1] != 1.0
    assert ref.ds_mla_tile_scale(amax, "amax").tolist() == expected
    assert ref.ds_mla_tile_scale(amax).tolist() == expected  # the op document's default rule


def test_unknown_rule_is_refused():
    with pytest.raises(ValueError, match="unknown fp8_ds_mla tile-scale rule 'ue8m0'"):
        ref.ds_mla_tile_scale(torch.ones(1), "ue8m0")
    kv, kpe = torch.ones(1, 512), torch.ones(1, 64)
    with pytest.raises(ValueError, match="tile-scale rule"):
        ref.encode_mla_entries(kv, kpe, "auto", torch.bfloat16, None, ds_mla_scale="POW2")


# One token, four tiles, each with a couple of nonzero lanes (the rest zero):
#   tile 0: 449, -100   amax scale 449/448 (bytes 448 -> 0x7E, -99.78 -> -96 = 0xEC);
#                       pow2 scale 2 (224.5 -> 224 = 0x76; -50 is a tie of 48 and 52,
#                       to even: -48 = 0xE4)
#   tile 1: 3.5, 1.0    scale 2^-7 under both rules: 448 = 0x7E, 128 = 0x70
#   tile 2: all zero    scale FLT_MIN / 2^-13, bytes 0
#   tile 3: 448, 7.0    scale 1.0 under both rules: 448 = 0x7E, 7 = 0x4E
TILE_LANES = {0: (449.0, -100.0), 1: (3.5, 1.0), 2: (0.0, 0.0), 3: (448.0, 7.0)}
NOPE_BYTES = {
    "amax": {0: (0x7E, 0xEC), 1: (0x7E, 0x70), 2: (0, 0), 3: (0x7E, 0x4E)},
    "pow2": {0: (0x76, 0xE4), 1: (0x7E, 0x70), 2: (0, 0), 3: (0x7E, 0x4E)},
}
TILE_SCALES = {
    "amax": (f32(449 * INV_448), 2.0**-7, FLT_MIN, 1.0),
    "pow2": (2.0, 2.0**-7, 2.0**-13, 1.0),
}


@pytest.mark.parametrize("rule", ["amax", "pow2"])
def test_ds_mla_entry_under_each_rule_by_hand(rule):
    kv = torch.zeros(1, 512)
    for tile, lanes in TILE_LANES.items():
        kv[0, 128 * tile : 128 * tile + 2] = torch.tensor(lanes)
    kpe = torch.linspace(-2, 2, 64).unsqueeze(0)
    entry = ref.encode_mla_entries(kv, kpe, "fp8_ds_mla", torch.bfloat16, None, ds_mla_scale=rule)
    row = bytes(entry[0].tolist())
    for tile, (first, second) in NOPE_BYTES[rule].items():
        assert tuple(row[128 * tile : 128 * tile + 2]) == (first, second), f"tile {tile}"
        assert not any(row[128 * tile + 2 : 128 * (tile + 1)]), f"tile {tile}: zero lanes"
    assert struct.unpack("<4f", row[512:528]) == TILE_SCALES[rule]
    rope = torch.tensor(list(row[528:]), dtype=torch.uint8).view(torch.bfloat16)
    assert torch.equal(rope, kpe[0].to(torch.bfloat16))


def test_the_rule_reaches_the_oracles_entries():
    """``fused_norm_rope`` encodes by the rule it is given (and only fp8_ds_mla cares)."""
    gen = torch.Generator().manual_seed(0)
    args = (
        torch.randn(3, 256, generator=gen),
        torch.ones(256),
        torch.randn(3, 512, generator=gen),
        torch.ones(512),
        torch.randn(3, 64, generator=gen),
        torch.tensor([5, 6, 7]),
        ref.cos_sin_table(16, 64, 10000.0),
        1e-6,
    )
    by_rule = {
        rule: ref.fused_norm_rope(*args, cache_layout="fp8_ds_mla", ds_mla_scale=rule)
        for rule in ("amax", "pow2")
    }
    scales = {
        r: by_rule[r].mla_entries[:, 512:528].contiguous().view(torch.float32) for r in by_rule
    }
    mantissa, _ = torch.frexp(scales["pow2"])
    assert torch.all(mantissa == 0.5), "pow2 scales are powers of two"
    assert torch.all(scales["pow2"] >= scales["amax"]) and torch.all(
        scales["pow2"] < 2 * scales["amax"]
    )
    assert not torch.equal(
        by_rule["amax"].mla_entries[:, :512], by_rule["pow2"].mla_entries[:, :512]
    )
    auto = {
        rule: ref.fused_norm_rope(*args, cache_layout="auto", ds_mla_scale=rule).mla_entries
        for rule in ("amax", "pow2")
    }
    assert torch.equal(auto["amax"], auto["pow2"])


# ----------------------------------------------------------------------------------------
# The project's kernel, bit for bit
# ----------------------------------------------------------------------------------------


@triton.jit
def _scales_kernel(amax_ptr, amax_rule_ptr, pow2_rule_ptr, N: tl.constexpr):
    lanes = tl.arange(0, N)
    amax = tl.load(amax_ptr + lanes)
    tl.store(amax_rule_ptr + lanes, _ds_mla_tile_scales(amax, False))
    tl.store(pow2_rule_ptr + lanes, _ds_mla_tile_scales(amax, True))


def test_kernel_tile_scales_equal_the_oracles_bitwise(device):
    """Ratios exactly on powers of two, one fp32 ulp either side, the 1e-4 floor and the
    FLT_MIN floor, and random amaxes: both rules, every bit."""
    on_power = 448.0 * torch.tensor([2.0**k for k in range(-14, 10)])
    up, down = torch.full_like(on_power, torch.inf), torch.zeros_like(on_power)
    amax = torch.cat([
        on_power, torch.nextafter(on_power, up), torch.nextafter(on_power, down),
        torch.tensor([0.0, 1e-30, 0.0448, 0.04479, 0.04481, 449.0, 1000.0]),
        torch.rand(60, generator=torch.Generator().manual_seed(1)) * 3000,
    ])  # fmt: skip
    n = triton.next_power_of_2(amax.numel())
    amax = torch.cat([amax, torch.ones(n - amax.numel())]).to(device)
    by_amax, by_pow2 = (torch.empty(n, dtype=torch.float32, device=device) for _ in range(2))
    _scales_kernel[(1,)](amax, by_amax, by_pow2, n)
    assert torch.equal(by_amax.cpu(), ref.ds_mla_tile_scale(amax.cpu(), "amax"))
    assert torch.equal(by_pow2.cpu(), ref.ds_mla_tile_scale(amax.cpu(), "pow2"))


@pytest.mark.parametrize("owned_fraction", [0.5, 1.0])
def test_kernel_writes_the_pow2_rule_it_is_asked_for(device, owned_fraction):
    """A whole launch under ``pow2``: outputs and owned entries match the oracle of that
    rule, foreign bytes untouched; the stored scales are exactly the oracle's powers of
    two, which differ from what the ``amax`` rule stores."""
    launch = build_launch(device, layout=CacheLayout.FP8_DS_MLA, owned_fraction=owned_fraction)
    launch.inputs = dataclasses.replace(launch.inputs, ds_mla_scale=POW2)
    expected = run_and_check(launch)
    owned = launch.inputs.slot_mapping[launch.inputs.slot_mapping >= 0].cpu()
    written = launch.caches.mla.reshape(-1, 656)[owned.to(launch.caches.mla.device)].cpu()
    ours = written[:, 512:528].contiguous().view(torch.float32)
    theirs = expected.mla_entries.cpu()[launch.inputs.slot_mapping.cpu() >= 0][:, 512:528]
    assert torch.equal(ours, theirs.contiguous().view(torch.float32))
    amax_rule = ref.fused_norm_rope(
        *(getattr(launch.inputs, f).cpu() for f in ("q_c", "q_weight", "kv_c", "kv_weight")),
        launch.inputs.k_pe.cpu(), launch.inputs.positions.cpu(), launch.inputs.cos_sin.cpu(),
        launch.inputs.eps, cache_layout="fp8_ds_mla", ds_mla_scale="amax",
    ).mla_entries  # fmt: skip
    assert not torch.equal(theirs, amax_rule[launch.inputs.slot_mapping.cpu() >= 0][:, 512:528])


def test_kernel_takes_the_rule_by_value_and_refuses_a_typo(device):
    launch = build_launch(device, layout=CacheLayout.FP8_DS_MLA, seed=2)
    launch.inputs = dataclasses.replace(launch.inputs, ds_mla_scale="pow2")
    run_and_check(launch)  # the oracle side reads .value: compare against POW2's
    bad = build_launch(device, layout=CacheLayout.FP8_DS_MLA, seed=2)
    bad.inputs = dataclasses.replace(bad.inputs, ds_mla_scale="power-of-two")
    with pytest.raises(ValueError, match="power-of-two"):
        load_kernel("default")(bad.inputs, bad.outputs, bad.caches)


# ----------------------------------------------------------------------------------------
# Scenarios
# ----------------------------------------------------------------------------------------


def test_shipped_scenarios_cover_both_rules():
    rules = {s.name: s.ds_mla_scale for s in load_scenarios([])}
    assert rules[POW2_SCENARIO] is POW2
    assert rules[AMAX_SCENARIO] is None  # unset: the run decides, amax by default
    pow2 = shipped(POW2_SCENARIO)
    assert (pow2.preset, pow2.cache_layout, pow2.dcp_sizes) == (
        "small-neox",
        CacheLayout.FP8_DS_MLA,
        (1,),
    )
    assert load_scenario(SCENARIOS / f"{POW2_SCENARIO}.toml").dcp_sizes == (1, 2, 4)


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(text.replace(f'name = "{AMAX_SCENARIO}"', f'name = "{name}"'))
    return path


def _amax_text() -> str:
    return (SCENARIOS / f"{AMAX_SCENARIO}.toml").read_text()


def test_scenario_key_round_trips(tmp_path):
    key = 'cache_layout = "fp8_ds_mla"\n'
    text = _amax_text().replace(key, key + 'ds_mla_scale = "amax"\n')
    scenario = load_scenario(_write(tmp_path, "explicit-amax", text))
    assert scenario.ds_mla_scale is AMAX
    written = scenario_to_toml(scenario)
    assert 'ds_mla_scale = "amax"' in written
    (tmp_path / "again").mkdir()
    again = tmp_path / "again" / "explicit-amax.toml"
    again.write_text(written)
    assert load_scenario(again) == scenario
    assert "ds_mla_scale" not in scenario_to_toml(shipped(AMAX_SCENARIO))  # unset stays unset


@pytest.mark.parametrize(
    ("old", "new", "words"),
    [
        ('cache_layout = "fp8_ds_mla"\n', 'cache_layout = "fp8_ds_mla"\nds_mla_scale = "ue8m0"\n',
         "key 'ds_mla_scale': unknown rule 'ue8m0' (known: amax, pow2)"),
        ('cache_layout = "fp8_ds_mla"\n', 'cache_layout = "fp8_ds_mla"\nds_mla_scale = 2\n',
         "key 'ds_mla_scale': expected string, got 2 (integer)"),
        ('cache_layout = "fp8_ds_mla"\n', 'cache_layout = "auto"\nds_mla_scale = "pow2"\n',
         "key 'ds_mla_scale': only allowed with cache_layout 'fp8_ds_mla', not 'auto'"),
    ],
    ids=["unknown-rule", "not-a-string", "other-layout"],
)  # fmt: skip
def test_scenario_key_errors_are_one_line(tmp_path, old, new, words):
    path = _write(tmp_path, "bad", _amax_text().replace(old, new))
    with pytest.raises(ScenarioError) as error:
        load_scenario(path)
    assert words in str(error.value) and "\n" not in str(error.value)
    assert str(error.value).startswith(str(path))


def test_a_case_hands_its_rule_to_every_rank_and_to_the_oracle():
    for scenario, rule in (
        (shipped(POW2_SCENARIO, (4,)), POW2),
        (shipped(AMAX_SCENARIO, (4,)), AMAX),
    ):
        case = build_case(scenario, 4, BACKEND.device)
        assert {launch.inputs.ds_mla_scale for launch in case.ranks} == {rule}
        scales = case.expected.mla_entries[:, 512:528].contiguous().view(torch.float32).cpu()
        mantissa, _ = torch.frexp(scales)
        assert torch.all(mantissa == 0.5) == (rule is POW2)


# ----------------------------------------------------------------------------------------
# Which rule a case demands
# ----------------------------------------------------------------------------------------


class Declares:
    def __init__(self, rule: object) -> None:
        self.ds_mla_scale = rule


@pytest.mark.parametrize(
    ("option", "key", "declared", "effective"),
    [
        (None, None, None, AMAX),  # the op document's default
        (None, None, POW2, POW2),  # the kernel's declaration
        (None, AMAX, POW2, POW2),  # it beats the scenario's key
        (None, POW2, None, POW2),  # the key decides for a kernel that declares nothing
        (POW2, AMAX, None, POW2),  # the option beats the key
        (AMAX, POW2, POW2, AMAX),  # and everything
        (None, None, "pow2", POW2),  # a declaration may be the enum's value
    ],
)
def test_precedence(option, key, declared, effective):
    scenario = dataclasses.replace(shipped(AMAX_SCENARIO), ds_mla_scale=key)
    config = RunConfig(
        "k", None, demands=() if option is None else (("ds-mla-scale", option.value),)
    )
    assert effective_ds_mla_scale(scenario, config, Declares(declared)) is effective
    assert (
        with_effective_ds_mla_scale(scenario, config, Declares(declared)).ds_mla_scale is effective
    )


def test_other_layouts_ignore_the_option_and_the_declaration():
    scenario = shipped("decode-single-dcp4")
    resolved = with_effective_ds_mla_scale(
        scenario, RunConfig("k", None, demands=(("ds-mla-scale", "pow2"),)), always_pow2
    )
    assert resolved is scenario and resolved.ds_mla_scale is None


def test_a_declaration_of_no_known_rule_is_an_error():
    assert declared_ds_mla_scale(object()) is None
    with pytest.raises(ValueError, match="declares ds_mla_scale = 'pow3'"):
        declared_ds_mla_scale(Declares("pow3"))


def test_the_witness_passes_exactly_where_pow2_is_resolved():
    amax_scenario = shipped(AMAX_SCENARIO)
    assert passes(always_pow2, amax_scenario)  # its declaration decides
    assert not passes(load_kernel("mutant/ds-mla-scale-pow2-when-amax"), amax_scenario)
    assert not passes(
        always_pow2, amax_scenario, RunConfig("w", None, demands=(("ds-mla-scale", "amax"),))
    )
    assert passes(always_pow2, dataclasses.replace(amax_scenario, ds_mla_scale=AMAX))
    assert passes(always_pow2, shipped(POW2_SCENARIO))


def test_an_isolated_kernel_carries_its_workers_declaration():
    with IsolatedKernel(WITNESS, "auto", BACKEND) as isolated:
        assert isolated.ds_mla_scale is POW2
        assert passes(isolated, shipped(AMAX_SCENARIO))
        assert not passes(
            isolated,
            shipped(AMAX_SCENARIO),
            RunConfig("w", None, demands=(("ds-mla-scale", "amax"),)),
        )


# ----------------------------------------------------------------------------------------
# The command line and saved failures
# ----------------------------------------------------------------------------------------


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.mark.parametrize("isolate", ["--isolate", "--no-isolate"])
def test_run_option_beats_the_declaration_and_the_saved_file_names_the_rule(tmp_path, isolate):
    common = ["--scenario", AMAX_SCENARIO, "--dcp", "1", "--no-tokens", "--kernel", WITNESS,
              isolate, "--home", str(tmp_path)]  # fmt: skip
    assert invoke("run", *common).exit_code == 0
    failed = invoke("run", *common, "--ds-mla-scale", "amax")
    assert failed.exit_code == 1
    assert f"--kernel {WITNESS} --ds-mla-scale amax" in failed.output  # the replay line
    (saved,) = (tmp_path / "failures").glob("*.toml")
    assert 'ds_mla_scale = "amax"' in saved.read_text()
    # The replay line, as printed, fails again; without the option the witness's own
    # declaration decides again, and the project's kernel follows the file.
    repro = ["repro", str(saved), "--kernel", WITNESS, "--no-isolate"]
    assert invoke(*repro, "--ds-mla-scale", "amax").exit_code == 1
    assert invoke(*repro).exit_code == 0
    assert invoke("repro", str(saved)).exit_code == 0


def test_run_rejects_an_unknown_rule_and_a_kernel_declaring_one():
    result = invoke("run", "--ds-mla-scale", "pow3")
    assert result.exit_code == 2 and "pow3" in result.output
    result = invoke("run", "--kernel", "tests.fixtures.declared_encoding:declares_no_known_rule",
                    "--scenario", AMAX_SCENARIO, "--dcp", "1", "--no-tokens")  # fmt: skip
    assert result.exit_code == 125 and "declares ds_mla_scale = 'pow3'" in result.output


def test_the_property_search_saves_the_rule_it_failed_under(tmp_path):
    """A kernel that writes pow2 scales, declaring nothing, fails a drawn fp8_ds_mla
    scenario (amax by default); the shrunk file names ``amax``, so a replay with the
    option absent still demands it, while a kernel that declares ``pow2`` is judged by its
    own rule. Under ``--ds-mla-scale pow2`` the same search finds nothing."""
    space = {"profile": search.PROFILES["smoke"], "examples": 20, "home": tmp_path}
    found = search.search(oracle_writing_pow2, search.SearchConfig("w", **space), BACKEND)
    assert not found.passed
    assert found.shrunk.cache_layout is CacheLayout.FP8_DS_MLA
    assert found.shrunk.ds_mla_scale is AMAX
    assert 'ds_mla_scale = "amax"' in found.saved_path.read_text()
    assert found.replay and any(r.status == "fail" for r in found.replay)
    assert passes(always_pow2, load_scenario(found.saved_path))
    asked_pow2 = search.SearchConfig("w", **space, demands=(("ds-mla-scale", "pow2"),))
    assert search.search(oracle_writing_pow2, asked_pow2, BACKEND).passed


def test_the_selftest_runs_fp8_ds_mla_under_each_rule():
    """The selftest runs the shipped scenarios with the project's kernels, which declare no
    rule: an fp8_ds_mla scenario of each effective rule must be among them, or one of the
    two tile-scale mutants could pass every named scenario."""
    config = RunConfig("default", None)
    rules = {
        with_effective_ds_mla_scale(s, config, load_kernel("default")).ds_mla_scale
        for s in selftest_scenarios(SELFTEST_PROFILES["ci"], BACKEND)
        if s.cache_layout is CacheLayout.FP8_DS_MLA
    }
    assert rules == {AMAX, POW2}
    names = [m.name for m in MUTANTS]
    assert {"mutant/ds-mla-scale-pow2-when-amax", "mutant/ds-mla-scale-amax-when-pow2"} <= set(
        names
    )


def test_list_mutants_shows_both():
    listed = invoke("list", "mutants")
    assert listed.exit_code == 0
    assert "mutant/ds-mla-scale-pow2-when-amax" in listed.output
    assert "mutant/ds-mla-scale-amax-when-pow2" in listed.output


def test_launch_inputs_default_to_amax():
    assert FusedOpInputs.__dataclass_fields__["ds_mla_scale"].default is AMAX


# ----------------------------------------------------------------------------------------
# A scales finding that is the other rule says so
# ----------------------------------------------------------------------------------------


def _scales_findings(kernel_name: str, scenario: str) -> list[str]:
    [result] = run_scenario(
        load_kernel(kernel_name), shipped(scenario), RunConfig("k", (1,)), BACKEND
    )
    return [
        f.detail
        for c in result.failed_checks
        if c.check == "cache_owned"
        for f in c.findings
        if f.field == "mla_cache.scales"
    ]


@pytest.mark.parametrize(
    ("writer", "scenario", "other"),
    [
        ("mutant/ds-mla-scale-pow2-when-amax", AMAX_SCENARIO, "pow2"),
        ("mutant/ds-mla-scale-amax-when-pow2", POW2_SCENARIO, "amax"),
    ],
)
def test_a_scales_finding_names_the_rule_the_stored_scales_follow(writer, scenario, other):
    [detail] = _scales_findings(writer, scenario)
    assert f"follow the {other} rule in every owned entry" in detail
    assert f"--ds-mla-scale {other}" in detail


def test_scales_wrong_by_both_rules_get_no_such_note():
    [detail] = _scales_findings("mutant/ds-mla-row-scale", AMAX_SCENARIO)
    assert "rule" not in detail
