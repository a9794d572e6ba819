"""``benchmarks/torch_op_counts.py``: each torch operation a command makes, counted once at
the innermost frame of dcpcheck or reference/ that made it, views apart."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from tests.forked_commands import run_module

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"


def _two_views_and_an_addition(x: torch.Tensor) -> torch.Tensor:
    return x.view(-1).view(2, 2) + 1


def test_an_operation_counts_at_its_innermost_counted_frame_and_views_apart(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from torch_op_counts import CountedOps

    x = torch.zeros(4)
    here = f"tests/{Path(__file__).name}"
    ops = CountedOps((REPO / "tests",), REPO / "tests" / "fixtures")
    with ops:
        _two_views_and_an_addition(x)
    assert ops.views == {f"{here}:_two_views_and_an_addition": 2}
    assert ops.others == {f"{here}:_two_views_and_an_addition": 1}
    for roots, excluded in (((REPO / "dcpcheck",), REPO / "dcpcheck" / "interpreter"),
                            ((REPO / "tests",), REPO / "tests")):  # fmt: skip
        outside = CountedOps(roots, excluded)  # no counted frame on the stack
        with outside:
            _two_views_and_an_addition(x)
        assert outside.views == {"elsewhere": 2} and outside.others == {"elsewhere": 1}


def test_a_commands_operations_are_tabled_by_module_and_sum_to_the_whole(tmp_path):
    done = run_module(
        "torch_op_counts",
        ["--top", "5", "--", "run", "--op", "slot-mapping", "--scenario", "decode-single"],
        cwd=tmp_path, timeout=300,
        env={**os.environ, "PYTHONPATH": f"{REPO}:{BENCHMARKS}",
             "DCPCHECK_HOME": str(tmp_path / "home")},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert lines[-1] == "the command's exit code: 0"
    start = lines.index(f"{'operations':>10} {'views':>7} {'others':>7}  by module")
    end = lines.index(f"{'operations':>10} {'views':>7} {'others':>7}  by function")
    modules = {row.split()[3]: [int(n) for n in row.split()[:3]] for row in lines[start + 1 : end]}
    total = [int(n) for n in lines[-2].split()[:3]]
    assert lines[-2].endswith("in all")
    assert [sum(column) for column in zip(*modules.values(), strict=True)] == total
    assert all(all_ == views + others for all_, views, others in modules.values())
    assert "reference/slot_mapping.py" in modules  # the oracle's operations are its own
    assert len(lines[end + 1 : -2]) == 5
