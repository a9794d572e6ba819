"""What the commands check before any work starts, each a one-line error and exit 2
(``InputError``): report paths and directories writable and none of them an input of the
run (the kernel file under test, a scenario file it runs), scenarios loadable and runnable
with the ``--dcp`` / ``--seed`` given, their memory within what the device has (every
op's, by its own estimate), the sanitizer present. A run that passes these fails only
through its kernel or a changed disk.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from dcpcheck import files
from dcpcheck.cases import memory
from dcpcheck.cases.scenario_files import ScenarioError
from dcpcheck.cases.verdicts import NamedScenario
from dcpcheck.cli.common import InputError
from dcpcheck.harness import sanitizer
from dcpcheck.kernels.spec_inputs import spec_inputs
from dcpcheck.ops import OpPackage


def check_sanitizer(sanitize: str | None, backend) -> None:
    """``--sanitize`` needs a CUDA device and compute-sanitizer: else exit 2, before any work."""
    if sanitize is None:
        return
    try:
        sanitizer.worker_prefix(sanitize, backend)
    except sanitizer.SanitizerUnavailable as exc:
        raise InputError(str(exc)) from None


def check_cost(
    op: OpPackage,
    scenarios: Sequence[NamedScenario],
    dcp_sizes: tuple[int, ...] | None,
    device: torch.device,
) -> None:
    """Every scenario's peak memory at ``dcp_sizes`` (None: its own), by the op's own
    estimate, against what ``device`` has free: exit 2, naming the file and the key that
    drives the size, before any work - before the backend is even opened, so a refusal
    costs what a usage error costs."""
    runs = [(scenario, dcp_sizes or scenario.dcp_sizes) for scenario in scenarios]
    _within_budget(runs, op.check_cost, device, dcp_sizes is not None)


def _within_budget(
    runs: list[tuple[Any, Sequence[int]]],
    check: Callable[[Any, Sequence[int], int | None], object],
    device: torch.device,
    dcp_given: bool,
) -> None:
    """``check`` (an op's ``check_cost``) of each (scenario, DCP sizes) of ``runs`` against
    what ``device`` has free: a refusal is exit 2, one line."""
    budget = memory.available_memory(device)
    for scenario, sizes in runs:
        try:
            check(scenario, sizes, budget)
        except ScenarioError as exc:
            given = " (with the --dcp given)" if dcp_given else ""
            raise InputError(f"{exc}{given}") from None


def check_report_paths(*paths: Path | None) -> None:
    """Every report path must be writable, and each its own file (a device such as
    ``/dev/null`` may take both), before any work."""
    given = [path for path in paths if path is not None]
    for path in given:
        try:
            files.ensure_writable(path)
        except files.ReportPathError as exc:
            raise InputError(str(exc)) from None
    files_given = [path for path in given if not files.written_in_place(path)]
    if len({os.path.realpath(path) for path in files_given}) < len(files_given):
        raise InputError(f"--json and --junit name the same file: {given[0]}")


Reports = Sequence[tuple[str, Path | None]]
"""Report paths, each with the option that names it (``("--json", path)``; None: not
given)."""


def run_inputs(
    kernel_specs: Iterable[str], scenario_files: Iterable[Path | None] = ()
) -> list[tuple[str, Path]]:
    """What a run reads that no report may replace, each with what it is: the files of
    every kernel spec that can be named before loading it (``spec_inputs``) and every
    scenario file."""
    found = [("the kernel file", path) for spec in kernel_specs for path in spec_inputs(spec)]
    return found + [("the scenario file", path) for path in scenario_files if path is not None]


def check_reports_spare_inputs(reports: Reports, inputs: Sequence[tuple[str, Path]]) -> None:
    """Exit 2, one line, for a report path that names one of ``inputs`` (``run_inputs``),
    by name, symlink or hard link, before any work."""
    for option, path in reports:
        if path is None:
            continue
        try:
            files.ensure_not_input(path, inputs)
        except files.ReportPathError as exc:
            raise InputError(f"{option} {exc}") from None


def check_home(home: Path) -> None:
    try:
        files.ensure_directory_writable(home)
    except files.ReportPathError as exc:
        raise InputError(f"--home: {exc}") from None


def check_overrides(scenario: Any, dcp_sizes: tuple[int, ...] | None, seed) -> None:
    """``scenario`` (the fused op's, whose seed a run may override) as it will run: it
    validates the layout at each DCP size and every count within its limits when made."""
    try:
        dataclasses.replace(
            scenario,
            dcp_sizes=dcp_sizes or scenario.dcp_sizes,
            seed=scenario.seed if seed is None else seed,
        )
    except ScenarioError as exc:
        raise InputError(f"{exc} (with the --dcp / --seed given)") from None


def check_report_dir(report_dir: Path) -> None:
    try:
        files.ensure_directory_writable(report_dir)
    except files.ReportPathError as exc:
        raise InputError(str(exc)) from None


def named_scenarios(
    op: OpPackage,
    patterns: tuple[str, ...],
    scenario_dir: Path | None,
    dcp_sizes: tuple[int, ...] | None,
    seed,
) -> list:
    """``op``'s scenarios to run (from ``scenario_dir``, else the shipped ones), each checked
    with the ``--dcp`` / ``--seed`` overrides applied, so that a combination that cannot
    run is an error before any work."""
    scenario_dir = op.scenarios if scenario_dir is None else scenario_dir
    if not scenario_dir.is_dir():
        what = "does not exist" if not scenario_dir.exists() else "is not a directory"
        raise InputError(f"--scenario-dir: {scenario_dir} {what}")
    try:
        scenarios = op.load_scenarios(list(patterns), scenario_dir)
    except ScenarioError as exc:
        raise InputError(str(exc)) from None
    except OSError as exc:
        raise InputError(f"{exc.filename}: cannot read: {exc.strerror}") from None
    if not scenarios:
        raise InputError(f"--scenario-dir: no scenario files (*.toml) in {scenario_dir}")
    for scenario in scenarios:
        check_overrides(scenario, dcp_sizes, seed)
    return scenarios
