"""The two ways a user starts real ranks: `dcpcheck run --launcher torchrun` and plain
`torchrun -m dcpcheck run`, over gloo on the CPU (`--device cpu`) on every machine: a GPU
box may have fewer CUDA devices than ranks, and each rank on CUDA needs its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).parents[1]
SCENARIO = ["--scenario", "decode-single-dcp4", "--no-tokens", "--device", "cpu"]


def dcpcheck(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "dcpcheck", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_launcher_torchrun_passes_the_default_kernel_and_fails_the_regression(tmp_path):
    report = tmp_path / "r.json"
    done = dcpcheck(
        "run",
        "--dcp",
        "2",
        "--launcher",
        "torchrun",
        *SCENARIO,
        "--json",
        str(report),
        tmp_path=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(report.read_text())["summary"]["pass"] == 1
    done = dcpcheck(
        "run",
        "--dcp",
        "2",
        "--launcher",
        "torchrun",
        *SCENARIO,
        "--kernel",
        "regress/pre-54908",
        tmp_path=tmp_path,
    )
    assert done.returncode == 1
    assert "kv_out" in done.stdout


def test_launcher_rejects_what_real_ranks_cannot_do(tmp_path):
    done = dcpcheck("run", "--dcp", "2,4", "--launcher", "torchrun", tmp_path=tmp_path)
    assert done.returncode == 2 and "one size N > 1" in done.stderr
    done = dcpcheck(
        "run", "--dcp", "2", "--launcher", "torchrun", "--examples", "5", tmp_path=tmp_path
    )
    assert done.returncode == 2 and "does not support --examples" in done.stderr


def test_plain_torchrun_runs_dcpcheck_as_ranks(tmp_path):
    """``torchrun`` is ``torch.distributed.run``'s entry point; a virtualenv's scripts are
    often not on PATH (CI runs ``.venv/bin/python -m pytest``), but the module always comes
    with this interpreter's torch, so the test runs wherever the suite does."""
    report = tmp_path / "r.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "-m",
            "dcpcheck",
            "run",
            "--dcp",
            "2",
            *SCENARIO,
            "--json",
            str(report),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(report.read_text())["summary"]["pass"] == 1
