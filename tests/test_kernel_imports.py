"""A kernel module whose import exits, crashes or hangs is never a green run: exit 0 means
cases ran and passed (``dcpcheck.exit_codes``), and the reports say why none did.

Under isolation only the worker imports the module (``dcpcheck.harness.isolation``); in
process, a child imports it first (``dcpcheck.kernels.import_probe``). The commands run
as real processes here: an import that ends its process would end this one too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from dcpcheck.cases.verdicts import RunConfig
from dcpcheck.exit_codes import EXIT_FAIL, EXIT_KERNEL_LOAD, EXIT_OK
from dcpcheck.harness.isolation import IsolatedKernel
from dcpcheck.kernels import substitution
from dcpcheck.ops.fused_norm_rope.runner import run
from dcpcheck.ops.fused_norm_rope.scenario import load_scenarios
from tests.conftest import BACKEND
from tests.test_launcher_cli import dcpcheck

REPO = Path(__file__).parents[1]
ONE_CASE = ("--scenario", "decode-single-dcp4", "--dcp", "1", "--no-tokens")
KERNEL = "from tests.kernels_under_test import oracle_kernel as fused\n"

SYS_EXIT = f"import sys\n{KERNEL}sys.exit(0)\n"
OS_EXIT = f"import os\n{KERNEL}os._exit(0)\n"
SEGFAULT = f"import os, signal\n{KERNEL}os.kill(os.getpid(), signal.SIGSEGV)\n"
HANG = "import time\ntime.sleep(600)\n"


def kernel_file(tmp_path: Path, source: str) -> str:
    path = tmp_path / "kernel.py"
    path.write_text(source)
    return f"{path}:fused"


def run_reports(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict, str]:
    """``dcpcheck run ARGS`` with both reports: the process, the JSON, the JUnit text."""
    json_path, junit_path = tmp_path / "r.json", tmp_path / "r.xml"
    done = dcpcheck(
        "run", *args, "--json", str(json_path), "--junit", str(junit_path),
        "--home", str(tmp_path / "home"), tmp_path=tmp_path,
    )  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr
    assert json_path.is_file(), f"no report written; exit {done.returncode}: {done.stderr}"
    return done, json.loads(json_path.read_text()), junit_path.read_text()


def load_record(report: dict) -> tuple[str, str]:
    """The one case of a report whose kernel never loaded: its status and error."""
    [case] = report["cases"]
    assert case["scenario"] == "dcpcheck-kernel-load" and report["partial"] is True
    return case["status"], case["error"]


@pytest.mark.parametrize("isolation", ["--isolate", "--no-isolate"])
def test_sys_exit_at_import_is_a_load_error_with_its_reports(tmp_path, isolation):
    done, report, junit = run_reports(
        tmp_path, *ONE_CASE, "--kernel", kernel_file(tmp_path, SYS_EXIT), isolation
    )
    assert done.returncode == EXIT_KERNEL_LOAD, done.stderr
    status, error = load_record(report)
    assert status == "error" and error.endswith("import failed: SystemExit: 0")
    assert "; no case was judged; partial report(s): " in done.stderr
    assert ET.fromstring(junit).find("testcase/error").get("type") == "error"


@pytest.mark.parametrize(
    ("source", "isolation", "how"),
    [
        (OS_EXIT, "--isolate", "its worker died loading it (exited with status 0"),
        (SEGFAULT, "--isolate", "its worker died loading it (killed by SIGSEGV)"),
        (OS_EXIT, "--no-isolate", "its import ended the process running it (exited with status 0"),
    ],
)
def test_an_import_that_ends_its_process_is_the_kernels_crash(tmp_path, source, isolation, how):
    done, report, _ = run_reports(
        tmp_path, *ONE_CASE, "--kernel", kernel_file(tmp_path, source), isolation
    )
    assert done.returncode == EXIT_FAIL, done.stderr
    status, error = load_record(report)
    assert status == "crash" and how in error
    assert f"{how}" in done.stderr and "no case was judged" in done.stderr


def test_an_import_that_hangs_is_the_kernels_timeout_under_case_timeout(tmp_path):
    kernel = kernel_file(tmp_path, HANG)
    done, report, _ = run_reports(tmp_path, *ONE_CASE, "--kernel", kernel, "--case-timeout", "5")
    assert done.returncode == EXIT_FAIL, done.stderr
    status, error = load_record(report)
    assert status == "timeout" and "loading it took over 5 s (--case-timeout)" in error


def test_the_parent_of_an_isolated_run_never_imports_the_kernel(tmp_path):
    """The module notes every process that imports it: the worker, not ``dcpcheck run``
    itself; the report still names the module's file, found without importing it."""
    pids = tmp_path / "pids"
    package = tmp_path / "mykernels"
    package.mkdir()
    (package / "__init__.py").write_text("")
    module = package / "fused.py"
    module.write_text(f"import os\n{KERNEL}open({str(pids)!r}, 'a').write(f'{{os.getpid()}}\\n')\n")
    report_path = tmp_path / "r.json"
    command = [
        sys.executable,
        "-m",
        "dcpcheck",
        "run",
        *ONE_CASE,
        "--kernel",
        "mykernels.fused:fused",
    ]
    parent = subprocess.Popen(
        [*command, "--json", str(report_path)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    _, stderr = parent.communicate(timeout=300)
    assert parent.returncode == EXIT_OK, stderr
    importers = [int(line) for line in pids.read_text().split()]
    assert importers and parent.pid not in importers
    [judged] = json.loads(report_path.read_text())["kernel_files"]
    assert judged["path"] == str(module.resolve())


@pytest.mark.parametrize(
    ("source", "code", "words"),
    [
        (SYS_EXIT, EXIT_KERNEL_LOAD, "import failed: SystemExit: 0"),
        (OS_EXIT, EXIT_FAIL, "its import ended the process running it (exited with status 0"),
    ],
)
def test_hash_reports_a_module_that_exits_at_import(tmp_path, source, code, words):
    report = tmp_path / "streams.json"
    kernel = kernel_file(tmp_path, source)
    done = dcpcheck(
        "hash", "--kernel", kernel, "--steps", "1", "--json", str(report), tmp_path=tmp_path
    )
    assert done.returncode == code, done.stderr
    assert words in done.stderr and "no stream was generated" in done.stderr
    document = json.loads(report.read_text())
    assert words in document["error"] and document["identical"] is False


def test_a_kernel_whose_import_crashes_its_worker_is_imported_once(tmp_path):
    """Every later start (each pytest item asks) answers with the same error at once,
    without another worker importing the module again."""
    from dcpcheck.kernels.import_probe import KernelImportLost

    imports = tmp_path / "imports"
    source = SEGFAULT.replace("os.kill", f"open({str(imports)!r}, 'a').write('x')\nos.kill")
    isolated = IsolatedKernel(kernel_file(tmp_path, source), "auto", BACKEND, 60.0)
    try:
        for _ in range(2):
            with pytest.raises(KernelImportLost, match="killed by SIGSEGV") as lost:
                isolated.start()
            assert lost.value.status == "crash"
    finally:
        isolated.close()
    assert imports.read_text() == "x"


def test_the_worker_loads_the_substitute_of_the_kernels_file(tmp_path, monkeypatch):
    """``dcpcheck mutate`` substitutes a mutant for the file in the process that runs the
    gate; the worker that imports the kernel must load the mutant too."""
    monkeypatch.setattr(substitution, "_SUBSTITUTES", {})
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    original = tmp_path / "kernel.py"
    original.write_text(KERNEL)
    mutant = tmp_path / "mutant.py"
    mutant.write_text("def fused(inputs, outputs, caches):\n    raise RuntimeError('mutant')\n")
    substitution.substitute(original, mutant)
    spec = f"{original}:fused"
    with IsolatedKernel(spec, "auto", BACKEND, 60.0) as isolated:
        [result] = run(
            isolated, load_scenarios(["decode-single-dcp4"]), RunConfig(spec, (1,)), BACKEND
        )
    assert result.status == "error" and "RuntimeError: mutant" in (result.error or ""), result
