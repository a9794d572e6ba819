"""Every op's shipped scenarios lie in ``scenarios/<op>/`` (``SCENARIO_DIR``), each op
reads its own folder, and users name scenarios as they always have: by name on the
command line and in replay lines, by path for any other file."""

from __future__ import annotations

import shutil
from pathlib import Path

from click.testing import CliRunner

from dcpcheck.cases.scenario_files import SCENARIO_DIR, op_of, shipped_scenarios
from dcpcheck.cases.verdicts import RunConfig
from dcpcheck.cli import cli
from dcpcheck.exit_codes import EXIT_USAGE
from dcpcheck.op_registry import FUSED_NORM_ROPE, LSE_COMBINE, OPS, SLOT_MAPPING
from dcpcheck.ops import op_cases, package
from dcpcheck.ops.fused_norm_rope import scenario as fused
from dcpcheck.ops.lse_combine import runner as merge_cases
from dcpcheck.ops.slot_mapping import runner as slot_cases

FINDINGS = shipped_scenarios(LSE_COMBINE) / "findings"
"""Findings against vLLM's releases: the lse-combine op's files, not shipped scenarios."""


def test_every_shipped_scenario_lies_in_the_folder_of_its_op():
    assert sorted(SCENARIO_DIR.glob("*.toml")) == []
    folders = {path.name for path in SCENARIO_DIR.iterdir() if path.is_dir()}
    assert folders == set(OPS)
    for op in OPS:
        files = sorted(shipped_scenarios(op).glob("*.toml"))
        assert files, op
        assert {op_of(path) or FUSED_NORM_ROPE for path in files} == {op}


def test_each_op_reads_its_own_folder():
    assert {p.stem for p in fused.SCENARIOS.glob("*.toml")} >= {"decode-single-dcp4"}
    for op in OPS:
        assert package(op).scenarios == shipped_scenarios(op)
        names = [s.name for s in package(op).load_scenarios([], package(op).scenarios)]
        assert names == sorted(p.stem for p in shipped_scenarios(op).glob("*.toml"))


def test_a_finding_is_the_ops_file_but_not_a_shipped_scenario():
    [finding] = sorted(FINDINGS.glob("*.toml"))
    assert op_of(finding) == LSE_COMBINE
    merge = package(LSE_COMBINE)
    shipped = {s.name for s in merge.load_scenarios([], merge.scenarios)}
    loaded = merge.load_scenario(finding)
    assert loaded.name == finding.stem and loaded.name not in shipped
    assert op_cases.replay_command(merge_cases.OP_CASES, loaded, 2, "vllm==0.33.0") == (
        f"dcpcheck repro {finding} --dcp 2 --kernel vllm==0.33.0"
    )


def test_replays_name_shipped_scenarios_as_before(tmp_path: Path):
    """A shipped scenario of any op replays by name; a copy elsewhere by its file."""
    decode = fused.load_scenario(fused.SCENARIOS / "decode-single-dcp4.toml")
    config = RunConfig("regress/pre-54908", (4,))
    assert config.replay_command(decode, 4) == (
        "dcpcheck run --scenario decode-single-dcp4 --dcp 4 --kernel regress/pre-54908"
    )
    copy = tmp_path / "decode-single-dcp4.toml"
    shutil.copy(decode.source, copy)
    assert config.replay_command(fused.load_scenario(copy), 4) == (
        f"dcpcheck repro {copy} --dcp 4 --kernel regress/pre-54908"
    )
    slots = package(SLOT_MAPPING)
    [single] = slots.load_scenarios(["decode-single"], slots.scenarios)
    assert op_cases.replay_command(slot_cases.OP_CASES, single, 4, "default") == (
        "dcpcheck run --op slot-mapping --scenario decode-single --dcp 4"
    )


def test_another_ops_file_among_the_fused_ops_scenarios_is_refused(tmp_path: Path):
    shutil.copy(shipped_scenarios(SLOT_MAPPING) / "decode-single.toml", tmp_path)
    done = CliRunner().invoke(cli, ["run", "--scenario-dir", str(tmp_path), "--no-tokens"])
    assert done.exit_code == EXIT_USAGE
    assert (
        f"{tmp_path}/decode-single.toml: key 'op': a 'slot-mapping' scenario, not a "
        "fused-norm-rope one: run it with --op slot-mapping, or `dcpcheck repro FILE`"
    ) in done.output


def test_the_fused_ops_files_are_not_another_ops_scenarios():
    done = CliRunner().invoke(
        cli, ["run", "--op", SLOT_MAPPING, "--scenario-dir", str(fused.SCENARIOS)]
    )
    assert done.exit_code == EXIT_USAGE
    assert "key 'preset': unknown key" in done.output
