"""What a report path names decides how the report is written (``dcpcheck.files``): a
rename only over a regular file or nothing, a device or FIFO written into as it is, a
symlink followed, a directory or socket refused before any work.

Run as root (as CI jobs often are), a rename over ``/dev/null`` would replace the
machine's null device with a regular file; these tests use the real ``/dev/null`` to show
it stays a device, and a FIFO, a socket and symlinks of their own.
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import threading
from pathlib import Path

import pytest

from dcpcheck import files
from tests import forked_commands
from tests.test_bad_input import REPO

DEV_NULL = Path("/dev/null")


def run_dcpcheck(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return forked_commands.run_dcpcheck(
        args, cwd=cwd, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)}
    )


def test_a_regular_file_is_replaced_atomically(tmp_path):
    path = tmp_path / "r.json"
    path.write_text("old")
    files.write_atomic(path, "new")
    assert path.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temporary file left


def test_a_symlink_is_followed_and_stays_a_symlink(tmp_path):
    target = tmp_path / "reports" / "r.json"
    target.parent.mkdir()
    target.write_text("old")
    link = tmp_path / "latest.json"
    link.symlink_to(target)
    files.ensure_writable(link)
    files.write_atomic(link, "new")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() == "new"


def test_a_dangling_symlink_creates_its_target(tmp_path):
    link = tmp_path / "latest.json"
    link.symlink_to(tmp_path / "made.json")
    files.ensure_writable(link)
    files.write_atomic(link, "new")
    assert link.is_symlink() and (tmp_path / "made.json").read_text() == "new"


def test_a_fifo_is_written_into_not_replaced(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    files.ensure_writable(fifo)
    files.write_atomic(fifo, "report\n")
    reader.join(timeout=30)
    assert received == [b"report\n"]
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_dev_null_stays_a_device(tmp_path):
    files.ensure_writable(DEV_NULL)
    files.write_atomic(DEV_NULL, "report\n")
    assert stat.S_ISCHR(os.stat(DEV_NULL).st_mode)


@pytest.fixture
def a_socket(tmp_path):
    path = tmp_path / "s.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    yield path
    server.close()


def test_a_directory_or_socket_is_refused_up_front(tmp_path, a_socket):
    for path, words in ((tmp_path, "is a directory"), (a_socket, "is a socket")):
        with pytest.raises(files.ReportPathError, match=words):
            files.ensure_writable(path)
        with pytest.raises(OSError):
            files.write_atomic(path, "x")
    assert stat.S_ISSOCK(os.stat(a_socket).st_mode)


def test_run_writes_both_reports_into_dev_null_and_leaves_it_a_device():
    done = run_dcpcheck(
        "run", "--dcp", "1", "--no-tokens", "--scenario", "decode-single-dcp4",
        "--json", "/dev/null", "--junit", "/dev/null",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert stat.S_ISCHR(os.stat(DEV_NULL).st_mode)


def test_hash_json_into_dev_null_leaves_it_a_device():
    done = run_dcpcheck("hash", "--dcp", "1,2", "--json", "/dev/null")
    assert done.returncode == 0, done.stderr
    assert stat.S_ISCHR(os.stat(DEV_NULL).st_mode)


def test_run_refuses_a_socket_before_any_work(a_socket):
    done = run_dcpcheck("run", "--json", str(a_socket))
    assert done.returncode == 2
    assert f"dcpcheck: error: {a_socket}: is a socket" in done.stderr
    assert "backend:" not in done.stderr  # refused before the backend was opened


# -- a report never replaces what the run reads -----------------------------------------

KERNEL_SOURCE = "from tests.kernels_under_test import oracle_kernel as fused\n"


@pytest.fixture
def run_inputs(tmp_path):
    """A kernel file and a scenario folder of one scenario, outside the checkout."""
    from dcpcheck.cases.scenario_files import SCENARIO_DIR

    kernel = tmp_path / "kernel.py"
    kernel.write_text(KERNEL_SOURCE)
    scenarios = tmp_path / "scenarios"
    scenarios.mkdir()
    scenario = scenarios / "decode-single-dcp4.toml"
    scenario.write_bytes((SCENARIO_DIR / "fused-norm-rope" / scenario.name).read_bytes())
    slot_scenarios = tmp_path / "slot-scenarios"
    slot_scenarios.mkdir()
    slot_scenario = slot_scenarios / "decode-single.toml"
    slot_scenario.write_bytes((SCENARIO_DIR / "slot-mapping" / slot_scenario.name).read_bytes())
    triton_file = tmp_path / "slot_kernel.py"
    triton_file.write_bytes((REPO / "dcpcheck" / "ops" / "slot_mapping" / "kernel.py").read_bytes())
    return {"kernel": kernel, "scenario": scenario, "slot": slot_scenario, "triton": triton_file}


def _run_args(kernel: Path, scenario: Path) -> list[str]:
    return ["run", "--no-tokens", "--dcp", "4", "--scenario-dir", str(scenario.parent),
            "--kernel", f"{kernel}:fused"]  # fmt: skip


def _symlink(link: Path, target: Path) -> Path:
    link.parent.mkdir(exist_ok=True)
    link.symlink_to(target)
    return link


def _hard_link(link: Path, target: Path) -> Path:
    os.link(target, link)
    return link


# (id, the command line, the option refused, the input it names)
OVERWRITES = [
    ("run-json-kernel", lambda t, i: [*_run_args(i["kernel"], i["scenario"]), "--json",
     str(i["kernel"])], "--json", "kernel"),
    ("run-junit-scenario", lambda t, i: [*_run_args(i["kernel"], i["scenario"]), "--junit",
     str(i["scenario"])], "--junit", "scenario"),
    ("run-json-symlink-to-kernel", lambda t, i: [*_run_args(i["kernel"], i["scenario"]),
     "--json", str(_symlink(t / "latest.json", i["kernel"]))], "--json", "kernel"),
    ("run-junit-hard-link-to-scenario", lambda t, i: [*_run_args(i["kernel"], i["scenario"]),
     "--junit", str(_hard_link(t / "junit.xml", i["scenario"]))], "--junit", "scenario"),
    ("run-report-dir-page-is-the-kernel", lambda t, i: [*_run_args(i["kernel"], i["scenario"]),
     "--report-dir", str(_symlink(t / "report" / "index.html", i["kernel"]).parent)],
     "--report-dir", "kernel"),
    ("repro-json-the-file-replayed", lambda t, i: ["repro", str(i["scenario"]), "--kernel",
     f"{i['kernel']}:fused", "--json", str(i["scenario"])], "--json", "scenario"),
    ("run-op-json-scenario", lambda t, i: ["run", "--op", "slot-mapping", "--scenario-dir",
     str(i["slot"].parent), "--json", str(i["slot"])], "--json", "slot"),
    ("repro-op-json-the-file-replayed", lambda t, i: ["repro", str(i["slot"]), "--json",
     str(i["slot"])], "--json", "slot"),
    ("hash-json-kernel", lambda t, i: ["hash", "--dcp", "1,2", "--kernel",
     f"{i['kernel']}:fused", "--json", str(i["kernel"])], "--json", "kernel"),
    ("hash-json-a-stage-kernel", lambda t, i: ["hash", "--dcp", "1,2", "--stage",
     f"merge={i['kernel']}:fused", "--json", str(i["kernel"])], "--json", "kernel"),
    ("mutate-junit-kernel", lambda t, i: ["mutate", "--op", "slot-mapping", "--kernel",
     f"{i['triton']}:compute_slot_mappings", "--mutant", "no-such-mutant", "--junit",
     str(i["triton"])], "--junit", "triton"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "option", "input_"), [c[1:] for c in OVERWRITES],
                         ids=[c[0] for c in OVERWRITES])  # fmt: skip
def test_a_report_that_would_replace_an_input_is_refused_up_front(
    tmp_path, run_inputs, args, option, input_
):
    """``--json`` naming the kernel file under test or the scenario file being run replaced
    it with JSON, exit 0: every report option of every command is refused on one line,
    exit 2, before any work, and the input is left as it was."""
    from click.testing import CliRunner

    from dcpcheck.cli import cli

    kept = {path: path.read_bytes() for path in run_inputs.values()}
    done = CliRunner().invoke(cli, args(tmp_path, run_inputs))
    assert done.exit_code == 2, done.output
    said = [line for line in done.output.splitlines() if "which the report would replace" in line]
    assert len(said) == 1, done.output
    assert said[0].startswith(f"Error: {option} ")
    assert f"is the {'scenario' if input_ in ('scenario', 'slot') else 'kernel'} file" in said[0]
    assert str(run_inputs[input_]) in said[0]
    assert "backend:" not in done.output
    assert {path: path.read_bytes() for path in run_inputs.values()} == kept


def test_a_module_spec_s_file_is_an_input_too(tmp_path, monkeypatch, run_inputs):
    from click.testing import CliRunner

    from dcpcheck.cli import cli

    module = tmp_path / "dcpcheck_report_input_kernels.py"
    module.write_text(KERNEL_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    scenarios = str(run_inputs["scenario"].parent)
    args = ["run", "--no-tokens", "--dcp", "4", "--scenario-dir", scenarios,
            "--kernel", "dcpcheck_report_input_kernels:fused", "--json", str(module)]  # fmt: skip
    done = CliRunner().invoke(cli, args)
    assert done.exit_code == 2, done.output
    assert f"Error: --json {module}: is the kernel file {module}" in done.output
    assert module.read_text() == KERNEL_SOURCE


@pytest.fixture
def symlink_loop(tmp_path) -> Path:
    first, second = tmp_path / "loop-a", tmp_path / "loop-b"
    first.symlink_to(second)
    second.symlink_to(first)
    return first


@pytest.mark.parametrize(
    "option", ["--json", "--junit", "--report-dir", "--home"], ids=lambda option: option[2:]
)
def test_a_symlink_loop_as_a_report_path_is_one_line_and_exit_2(symlink_loop, option):
    """Was ``RuntimeError: Symlink loop`` (``--json``) or ``FileExistsError`` (``--report-dir``),
    tracebacks."""
    done = run_dcpcheck("run", "--no-tokens", "--dcp", "4", "--scenario", "decode-single-dcp4",
                        option, str(symlink_loop))  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("dcpcheck: error: ") and "Too many levels of symbolic links" in line


def test_mutate_refuses_a_symlink_loop_as_its_report_before_any_mutant(symlink_loop):
    done = run_dcpcheck("mutate", "--op", "slot-mapping", "--junit", str(symlink_loop))
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"dcpcheck: error: {symlink_loop}: Too many levels of symbolic links"
    ]
