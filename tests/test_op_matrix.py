"""``benchmarks/op_matrix.py``, what every release matrix shares: a routine that does not
load is a row that says so, and a row process that ends without its row makes the matrix
exit 1, so a runbook never takes a table with a lost row for a finished one."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"


def test_a_routine_that_does_not_load_is_said_not_loaded(tmp_path, monkeypatch):
    """A run whose kernel does not load writes its report with the load record in place of
    cases; the matrix reads that as "not loaded", with what the run said, not as a row of
    zero cases whose shape it would then try to load."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from op_matrix import verdict

    module = tmp_path / "raises.py"
    module.write_text("raise ImportError('this revision does not import')\n")
    line, _ = verdict("lse-combine", f"{module}:merge", tmp_path / "out")
    assert line.startswith("not loaded (exit 125): "), line
    assert "this revision does not import" in line


def test_a_lost_row_fails_the_matrix(tmp_path):
    """One row's process dies; the other rows are printed, the lost one's line says how it
    ended, and the matrix exits 1 naming it."""
    script = tmp_path / "matrix.py"
    script.write_text(
        textwrap.dedent(
            """
            import os
            from op_matrix import print_rows, start

            def row(args):
                if args.row == "0.2.0":
                    os._exit(3)
                return [f"| {args.row} | judged |"]

            args = start("A matrix of two rows.", "out", ["0.1.0", "0.2.0"], row)
            print_rows(args.versions, 2)
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(BENCHMARKS)},
        timeout=120,
    )
    assert done.returncode == 1, done
    assert done.stdout.splitlines()[0] == "| 0.1.0 | judged |"
    assert done.stdout.splitlines()[1].startswith("| 0.2.0 | row process exit 3: ")
    assert done.stderr.strip().endswith("1 row(s) lost: 0.2.0")


def test_a_skip_summary_keeps_each_reason_whole(monkeypatch):
    """Reasons are joined with "; ", and a reason's own list of callers uses "; " inside
    parentheses: the summary splits only between reasons, then drops each routine's
    label, so a caller list is never cut into fragments."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from op_matrix import _reasons, _short

    said = (
        "triton_convert_req_index_to_global_index: no caller asks this under DCP: Kimi "
        "(packed, counts; attn_fi.py:241 in 0.34.0); triton_filter_and_convert_dcp_index: "
        "no caller asks this under DCP: FlashInfer (packed, counts; :451 in 0.25.0)"
    )
    assert [_short(r) for r in _reasons(said)] == [
        "no caller asks this under DCP",
        "no caller asks this under DCP",
    ]
    assert _reasons("one; two (a; b); three") == ["one", "two (a; b)", "three"]
