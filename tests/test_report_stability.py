"""The fused op's reports stay what they are while the harness around it changes: the JSON
and JUnit reports of the default kernel and of ``regress/pre-54908``, with the oracle on
and off, are byte for byte the ones in ``tests/fixtures/reports/`` (written by this tree
on the CPU, where the reports say ``interpreter``).

Three small shipped scenarios at DCP4 and the token streams stand for the gate: every
check of the op, a failing kernel's findings (foreign and padding rows), the oracle-free
forms. Left out of the comparison, because they change by design and say so: the files
the kernel's code is read from (``kernel_files``: where the project keeps its kernel
modules) and dcpcheck's version; and the fourth digit of the token streams' DCP1 top-2
margin, which comes from torch's CPU matmuls, whose summation order follows the machine's
vector width (0.9012 on one CPU, 0.9011 on another; the verdict and the bound do not move).

A report that differs fails with the first differing line; to accept a change that is
meant, write the fixtures again with ``DCPCHECK_WRITE_REPORT_FIXTURES=1``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.conftest import BACKEND
from tests.forked_commands import run_dcpcheck

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "reports"
SCENARIOS = ("decode-single-dcp4", "mixed-prefill-decode-padding", "fp8-ds-mla-cache")
WRITE = os.environ.get("DCPCHECK_WRITE_REPORT_FIXTURES") == "1"

pytestmark = pytest.mark.skipif(
    not BACKEND.interpreted, reason="the fixtures are the CPU's reports (backend interpreter)"
)


MARGIN = re.compile(r"(DCP1 top-2 margin \d\.\d\d\d)\d")


def _stable_json(text: str) -> str:
    doc = json.loads(text)
    doc.pop("kernel_files")
    doc.pop("dcpcheck")
    return MARGIN.sub(r"\1", json.dumps(doc, indent=2, sort_keys=True) + "\n")


def _stable_junit(text: str) -> str:
    kept = [line for line in text.splitlines(keepends=True) if 'name="kernel_file"' not in line]
    return MARGIN.sub(r"\1", "".join(kept))


@pytest.mark.parametrize("oracle", ["on", "off"])
@pytest.mark.parametrize(("kernel", "code"), [("default", 0), ("regress/pre-54908", 1)])
def test_the_fused_ops_reports_are_byte_for_byte_todays(tmp_path, kernel, code, oracle):
    stem = f"{kernel.replace('/', '-')}-{oracle}"
    json_path, junit_path = tmp_path / f"{stem}.json", tmp_path / f"{stem}.xml"
    command = ["run", "--dcp", "4", "--kernel", kernel]
    command += ["--oracle", oracle, "--json", str(json_path), "--junit", str(junit_path)]
    command += ["--home", str(tmp_path / "home")]
    for scenario in SCENARIOS:
        command += ["--scenario", scenario]
    done = run_dcpcheck(
        command, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=600
    )
    assert done.returncode == code, done.stdout + done.stderr
    for path, stable in ((json_path, _stable_json), (junit_path, _stable_junit)):
        fixture = FIXTURES / path.name
        written = stable(path.read_text(encoding="utf-8"))
        if WRITE:
            fixture.write_text(written, encoding="utf-8")
        expected = fixture.read_text(encoding="utf-8")
        if written != expected:
            lines = zip(written.splitlines(), expected.splitlines(), strict=False)
            first = next((i for i, (a, b) in enumerate(lines) if a != b), None)
            pytest.fail(f"{path.name} differs from {fixture} at line {first}")
