"""``benchmarks/suite_split.py`` splits each test's wall time into the pytest worker's CPU,
its waited-for processes' CPU, and the rest."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

TESTS = """\
import subprocess, sys, time

def test_sleeps():
    time.sleep(0.6)

def test_spins_in_a_child():
    spin = "import time\\nend = time.process_time() + 0.6\\nwhile time.process_time() < end: pass"
    subprocess.run([sys.executable, "-c", spin], check=True)

def test_spins_itself():
    end = time.process_time() + 0.6
    while time.process_time() < end:
        pass
"""


def test_the_split_puts_a_childs_cpu_a_sleep_and_the_workers_cpu_apart(tmp_path, monkeypatch):
    (tmp_path / "test_three.py").write_text(TESTS)
    folder = tmp_path / "split"
    env = {**os.environ, "PYTHONPATH": str(REPO), "DCPCHECK_SUITE_SPLIT": str(folder)}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p"]
    done = subprocess.run(
        [*command, "benchmarks.suite_split", "-p", "no:xdist", str(tmp_path / "test_three.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr

    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import suite_split

    text = suite_split.summary(folder, top=3)
    rows = {line.split()[-1].split("::")[-1]: [float(x) for x in line.split()[:3]]
            for line in text.splitlines() if "::test_" in line}
    wall, own, children = rows["test_sleeps"]
    assert wall >= 0.6 and own < 0.3 and children < 0.1
    wall, own, children = rows["test_spins_in_a_child"]
    assert children >= 0.6 and own < 0.3
    wall, own, children = rows["test_spins_itself"]
    assert own >= 0.6 and children < 0.1
    assert text.startswith("3 tests: ")
