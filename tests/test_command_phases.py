"""``benchmarks/command_phases.py``, the gate's time by part and phase, runs a command and
splits its time as its docstring says: a row per part (each op's cases apart), the phases
of each summing to the row's total."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

COLUMNS = ("imports", "build", "oracle", "compile", "key", "launches", "checks", "gc", "other")


def phases(*command: str, tmp_path: Path) -> dict[str, dict[str, float]]:
    """The ``[phase]`` rows of ``command_phases.py -- COMMAND``, by part."""
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "command_phases.py"), "--", *command],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO), "DCPCHECK_HOME": str(tmp_path / "home")},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    lines = [line.split()[1:] for line in done.stderr.splitlines() if line.startswith("[phase]")]
    header, *rows, total = lines
    assert header == ["part", *COLUMNS, "total"]
    assert total[:4] == ["total,", "until", "the", "command"]
    table = {}
    for row in rows:
        seconds = [float(cell) for cell in row[-len(COLUMNS) - 1 :]]
        part = " ".join(row[: -len(COLUMNS) - 1])
        assert sum(seconds[:-1]) == pytest.approx(seconds[-1], abs=0.01), row
        table[part] = dict(zip((*COLUMNS, "total"), seconds, strict=True))
    return table


def test_the_fused_ops_cases_split_into_build_oracle_launches_and_checks(tmp_path):
    table = phases(
        "run", "--scenario", "decode-single-dcp4", "--dcp", "4", "--no-tokens",
        "--json", str(tmp_path / "out.json"), tmp_path=tmp_path,
    )  # fmt: skip
    assert table["imports"]["imports"] > 0
    cases = table["fused-norm-rope"]
    assert all(cases[phase] > 0 for phase in ("build", "oracle", "launches", "checks"))
    assert {"command", "preflight", "backend", "report", "console"} <= set(table)


def test_an_op_packages_cases_are_a_part_of_their_own(tmp_path):
    table = phases("run", "--op", "lse-combine", "--scenario", "extreme-lse", "--dcp", "4",
                   tmp_path=tmp_path)  # fmt: skip
    assert table["lse-combine"]["launches"] > 0
    assert "fused-norm-rope" not in table
