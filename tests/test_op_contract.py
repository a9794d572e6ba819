"""The contract every op package keeps, checked the same way for each op of the registry
(``dcpcheck.ops.runner_ops()``), as PyTorch's OpInfo tests every op with one body: the
package follows the convention of ``dcpcheck.ops``; its selftest passes the project's
kernel and catches every mutant; every check of the op fails on some kernel that breaks
it; a saved failing case replays to the same verdict; a report is the same from one run to
the next; a hostile scenario file is refused in one line with exit 2. What is special to
one op (its own checks' findings, its scenario keys, its releases) stays in that op's test
module.

The cases each op runs here are its cheapest shipped scenario by the op's own estimate
(``check_cost``): what is checked (a verdict's stability, a replay's, the refusal of a
file) is the harness's behaviour around a case, the same for a case of any size, so the
smallest case shows it as well as the largest and keeps the suite's time where it was.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import re
import sys
from pathlib import Path

import pytest

from dcpcheck.cases.limits import DCP_SIZE_MAX
from dcpcheck.cases.scenario_files import NamedBatch
from dcpcheck.cases.verdicts import CaseResult, SelftestReport
from dcpcheck.op_registry import OPS as REGISTRY
from dcpcheck.ops import OpPackage, package, runner_ops
from tests.conftest import BACKEND, op_selftest

OPS = runner_ops()

BROKEN_DIRECTLY: dict[str, dict[str, str]] = {
    "slot-mapping": {
        "ownership": "test_slot_mapping:test_each_mutant_fails_the_checks_its_bug_breaks",
        "padding": "test_slot_mapping:test_each_mutant_fails_the_checks_its_bug_breaks",
        "seq_lens_sum": "test_slot_mapping:"
        "test_each_lengths_mutant_fails_the_checks_its_bug_breaks",
        "seq_lens_guard": "test_slot_mapping:"
        "test_a_lengths_kernel_writing_past_the_end_or_into_its_input_fails_the_guard",
    },
    "lse-combine": {
        "paths_agree": "test_lse_combine:"
        "test_paths_agree_and_masks_agree_fail_on_a_path_that_differs_where_it_differs",
        "masks_agree": "test_lse_combine:"
        "test_paths_agree_and_masks_agree_fail_on_a_path_that_differs_where_it_differs",
    },
    "sparse-topk-remap": {
        "partition": "test_sparse_topk_remap:"
        "test_slots_and_partition_fail_the_converter_that_does_not_know_dcp",
        "unused": "test_sparse_topk_remap:test_unused_fails_an_unused_pick_read_as_the_first_token",
        "compaction": "test_sparse_topk_remap:"
        "test_compaction_fails_rows_packed_one_entry_late_and_only_packed_ones",
        "guard": "test_sparse_topk_remap:"
        "test_guard_fails_a_write_past_the_last_row_and_a_modified_input",
        "read_write": "test_sparse_topk_remap:test_read_write_catches_every_reader_mutant",
        "workspace": "test_sparse_topk_remap:"
        "test_workspace_and_partition_fail_each_wrong_prefill_mapping",
    },
    "reshape-and-cache-flash": {
        check: "test_reshape_and_cache_flash:test_every_check_fails_on_a_kernel_broken_its_way"
        for check in ("owned", "stray", "reassembly", "guard")
    },
}
"""Per op, the checks no mutant is first caught by in the selftest (a selftest row names
the first failing check only), and the op's own test, in ``tests/`` (``module:function``),
that fails each on a kernel breaking it: OpInfo's skips, each with where it is covered."""


def invoke(*args: str):
    from click.testing import CliRunner

    from dcpcheck.cli import cli

    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def selftest_of(op: str) -> SelftestReport:
    """The op's selftest, run once for every test that reads it (``op_selftest``)."""
    return op_selftest(op)


def cheapest(op: OpPackage) -> tuple[NamedBatch, int]:
    """The op's cheapest shipped scenario (module docstring) and its smallest DCP size
    above 1 (one where ranks share the work), else its smallest."""
    scenarios = op.load_scenarios([], op.scenarios)
    scenario = min(scenarios, key=lambda s: op.check_cost(s, s.dcp_sizes, None).total)
    sizes = sorted(scenario.dcp_sizes)
    return scenario, next((size for size in sizes if size > 1), sizes[0])


def verdict(result: CaseResult) -> tuple:
    """What a case's verdict says, without its timing or its replay command."""
    return (
        result.status,
        result.error,
        [(c.check, c.skipped, [(f.field, f.rank, f.token, f.detail) for f in c.findings])
         for c in result.checks],
    )  # fmt: skip


# -- the convention ----------------------------------------------------------------------


@pytest.mark.parametrize("op", list(REGISTRY))
def test_the_package_follows_the_convention(op):
    """Every op of the registry, the one the session judges included (it needs no runner
    or search module: ``dcpcheck.workflows.session`` runs its cases)."""
    assert package(op).conformance() == []


def test_a_package_lacking_a_module_or_a_name_is_named(tmp_path, monkeypatch):
    root = tmp_path / "halfop"
    root.mkdir()
    (root / "__init__.py").write_text('"""An op package half written."""\n')
    (root / "scenario.py").write_text("from pathlib import Path\n\nSCENARIOS = Path('.')\n")
    (root / "kernels.py").write_text("")
    (root / "runner.py").write_text("")
    (root / "search.py").write_text("DCP_SIZES = (2,)\n\ndef drawn(kernel, dcp_sizes): ...\n")
    (root / "selftest.py").write_text("DEFAULT_PROFILE = 'ci'\n")  # an own selftest, half
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "halfop", raising=False)
    assert OpPackage("half-op", "halfop").conformance() == [
        "halfop.scenario: lacks load_scenario, load_scenarios, scenario_to_toml",
        "halfop: no module 'cost' (the package needs scenario, cost, kernels, runner, search, "
        "selftest)",
        "halfop.kernels: lacks REGISTRY",
        "halfop.runner: lacks OP_CASES",
        "halfop.selftest: lacks PROFILES, selftest",
    ]


def test_a_session_judged_package_lacking_its_session_cases_is_named(tmp_path, monkeypatch):
    """The op the session judges answers for ``session``, not ``runner`` and ``search``."""
    [session_judged] = [name for name, op in REGISTRY.items() if op.judged_by_session]
    root = tmp_path / "halfsession"
    root.mkdir()
    (root / "__init__.py").write_text('"""A session-judged op package half written."""\n')
    for part in ("scenario", "cost", "kernels"):  # the op's own, whole
        (root / f"{part}.py").write_text(f"from {package(session_judged).module}.{part} import *\n")
    (root / "session.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "halfsession", raising=False)
    assert OpPackage(session_judged, "halfsession").conformance() == [
        "halfsession.session: lacks SESSION_CASES"
    ]


# -- the selftest and the checks ---------------------------------------------------------


@pytest.mark.parametrize("op", OPS)
def test_the_selftest_passes_the_projects_kernel_and_catches_every_mutant(op):
    report = selftest_of(op)
    assert report.passed and report.default.status.value == "passed"
    registry = importlib.import_module(f"{package(op).module}.kernels").REGISTRY
    assert [row.kernel for row in report.mutants] == [k for k in registry.kernels if k != "default"]
    assert {row.status.value for row in report.mutants} == {"caught"}


@pytest.mark.parametrize("op", OPS)
def test_a_mutant_no_scenario_catches_fails_the_selftest(op, monkeypatch):
    """On the op's cheapest scenario alone: what is checked is the selftest's verdict on a
    mutant that passes whatever it is asked."""
    kernels = importlib.import_module(f"{package(op).module}.kernels")
    default = kernels.REGISTRY.kernels["default"]
    harmless = dataclasses.replace(
        kernels.REGISTRY, kernels={"default": default, "mutant/harmless": default}
    )
    monkeypatch.setattr(kernels, "REGISTRY", harmless)
    scenario, _ = cheapest(package(op))
    scenarios = importlib.import_module(f"{package(op).module}.scenario")
    monkeypatch.setattr(scenarios, "load_scenarios", lambda patterns, root: [scenario])
    report = package(op).selftest(BACKEND)
    [missed] = report.mutants
    assert missed.kernel == "mutant/harmless" and missed.status.value == "missed"
    assert not report.passed


@pytest.mark.parametrize("op", OPS)
def test_every_check_fails_on_a_kernel_that_breaks_it(op):
    """Each check a case of the op runs is the first one some mutant fails in the
    selftest, or one the op's own test breaks directly (``BROKEN_DIRECTLY``)."""
    checks = {row.check for row in selftest_of(op).mutants}
    checks |= set(BROKEN_DIRECTLY[op])
    scenarios = package(op).load_scenarios([], package(op).scenarios)
    kernel = package(op).kernel("default")
    every = set()
    for scenario in scenarios:
        for result in package(op).run_scenario(
            kernel, "default", scenario, scenario.dcp_sizes[:1], BACKEND.device
        ):
            every |= {check.check for check in result.checks}
    assert every - checks == set()
    for where in BROKEN_DIRECTLY[op].values():
        module, function = where.split(":")
        tested = importlib.import_module(f"tests.{module}")
        assert callable(getattr(tested, function, None)), where


# -- replays, reports, scenario files ----------------------------------------------------


@pytest.mark.parametrize("op", OPS)
def test_a_saved_failing_case_replays_to_the_same_verdict(op, tmp_path):
    row = selftest_of(op).mutants[0]
    name, size = re.fullmatch(r"(.+)\[dcp(\d+)\]", row.case or "").groups()
    ops = package(op)
    [scenario] = ops.load_scenarios([name], ops.scenarios)
    mutant = ops.kernel(row.kernel)
    [failed] = ops.run_scenario(mutant, row.kernel, scenario, (int(size),), BACKEND.device)
    assert failed.failed
    saved = ops.save_failed_case(scenario, failed, row.kernel, tmp_path)
    replayed = ops.load_scenario(saved)
    [again] = ops.run_scenario(mutant, row.kernel, replayed, replayed.dcp_sizes, BACKEND.device)
    assert verdict(again) == verdict(failed)
    assert invoke("repro", str(saved), "--kernel", row.kernel).exit_code == 1


def _without_timings(report: object) -> object:
    """A JSON report with every key that holds a time taken dropped."""
    if isinstance(report, dict):
        return {k: _without_timings(v) for k, v in report.items() if "seconds" not in k}
    if isinstance(report, list):
        return [_without_timings(item) for item in report]
    return report


@pytest.mark.parametrize("op", OPS)
def test_a_report_is_the_same_from_one_run_to_the_next(op, tmp_path):
    scenario, size = cheapest(package(op))
    reports = []
    for run in ("a", "b"):
        path = tmp_path / f"{run}.json"
        args = ("--scenario", scenario.name, "--dcp", str(size), "--json", str(path))
        done = invoke("run", "--op", op, *args)
        assert done.exit_code == 0, done.output
        reports.append(json.loads(path.read_text()))
    assert reports[0]["op"] == op and reports[0]["cases"]
    assert _without_timings(reports[0]) == _without_timings(reports[1])


HOSTILE = {
    "an unknown key": (lambda text: "colour = 3\n" + text, "key 'colour': unknown key"),
    "a wrong type": (
        lambda text: re.sub(r"(?m)^seed = (\d+)$", r'seed = "\1"', text),
        "key 'seed'",
    ),
    "a size over the limit": (
        lambda text: re.sub(r"(?m)^dcp = \[.*\]$", f"dcp = [{DCP_SIZE_MAX * 2}]", text),
        f"key 'dcp': must name DCP sizes in 1..{DCP_SIZE_MAX}",
    ),
    "a missing required key": (
        lambda text: re.sub(r"(?m)^seed = \d+\n", "", text),
        "key 'seed'",
    ),
}
"""Each edit of a scenario file a reader must refuse, and what its one line says."""


@pytest.mark.parametrize("hostility", HOSTILE)
@pytest.mark.parametrize("op", OPS)
def test_a_hostile_scenario_file_is_refused_in_one_line(op, hostility, tmp_path):
    scenario, _ = cheapest(package(op))
    edit, said = HOSTILE[hostility]
    assert scenario.source is not None
    text = scenario.source.read_text()
    assert edit(text) != text
    (tmp_path / f"{scenario.name}.toml").write_text(edit(text))
    done = invoke("run", "--op", op, "--scenario-dir", str(tmp_path))
    assert done.exit_code == 2, done.output
    [line] = done.output.strip().splitlines()
    assert said in line and str(Path(tmp_path / scenario.name)) in line
