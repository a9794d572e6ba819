"""Commands run in a resident server's fork (dcpcheck.resident, ``DCPCHECK_RESIDENT=1``):
what the command prints and its exit status are a direct run's; an edit to dcpcheck is
seen by the next command; Ctrl-C reaches the command and a killed client ends it; the
server is chosen by what torch is imported from, and leaves when idle."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from dcpcheck import resident
from tests.fixtures import faulty_kernels
from tests.test_faults import (
    FAULT_SPARES,
    FILE,
    children_of,
    parents,
    process_gone,
    wait_for_hang,
)

REPO = Path(__file__).parents[1]
STARTED = "dcpcheck: started a resident server"


@pytest.fixture
def runtime() -> Path:
    """A runtime directory of the test's own (``XDG_RUNTIME_DIR``; short: a socket's path
    must fit 108 bytes), whose servers are killed at the end: a test leaves no server
    behind."""
    where = Path(tempfile.mkdtemp(prefix="dcpcheck-rt-"))
    yield where
    for pid in _servers(where):
        os.kill(pid, signal.SIGKILL)
    shutil.rmtree(where)


def _servers(runtime: Path) -> list[int]:
    """The resident servers listening under ``runtime``, read from /proc: the processes
    with a server's command line whose parent has none (a server's child has its command
    line, being its fork)."""
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--listening" in argv and any(str(runtime).encode() in arg for arg in argv):
            found.add(int(entry.name))
    of = parents()
    return sorted(pid for pid in found if of.get(pid) not in found)


def _env(runtime: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "XDG_RUNTIME_DIR": str(runtime), resident.ENV: "1", **extra}


def _dcpcheck(*args: str, env: dict[str, str], cwd: Path = REPO, **popen) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "dcpcheck", *args],
        cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL), **popen,
    )  # fmt: skip


def _ran(*args: str, env: dict[str, str], cwd: Path = REPO) -> subprocess.CompletedProcess:
    proc = _dcpcheck(*args, env=env, cwd=cwd)
    stdout, stderr = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def test_a_command_prints_and_exits_as_a_direct_run(runtime):
    """The first command starts the server and says so; the next one is its fork and says
    nothing of it; each prints what a direct run prints and exits with its status."""
    direct = _ran("run", "--dcp", "0", env={**os.environ, resident.ENV: "0"})
    assert direct.returncode == 2
    first = _ran("run", "--dcp", "0", env=_env(runtime))
    assert first.stderr.splitlines()[0].startswith(STARTED), first.stderr
    second = _ran("run", "--dcp", "0", env=_env(runtime))
    for run in (first, second):
        assert run.returncode == direct.returncode
        assert run.stdout == direct.stdout
    assert first.stderr.splitlines()[1:] == direct.stderr.splitlines()
    assert second.stderr == direct.stderr
    assert len(_servers(runtime)) == 1
    listed = _ran("list", "ops", env=_env(runtime))
    assert (listed.returncode, listed.stdout) == (0, _ran("list", "ops", env=os.environ).stdout)


def test_help_names_the_program_the_user_ran(runtime, tmp_path):
    """A fork runs the command as ``python -m dcpcheck``; its usage line still names what
    the user typed: the ``dcpcheck`` script, or ``python -m dcpcheck``."""
    script = tmp_path / "dcpcheck"
    script.write_text(f"#!{sys.executable}\nfrom dcpcheck.__main__ import main\nmain()\n")
    script.chmod(0o755)
    as_module = [sys.executable, "-m", "dcpcheck"]
    for command, program in (([str(script)], "dcpcheck"), (as_module, "python -m dcpcheck")):
        shown = [
            subprocess.run(
                [*command, "--help"], env=env, cwd=REPO, capture_output=True, text=True,
                timeout=120,
            ).stdout.splitlines()[0]
            for env in (_env(runtime), {**os.environ, resident.ENV: "0"})
        ]  # fmt: skip
        assert shown == [f"Usage: {program} [OPTIONS] COMMAND [ARGS]..."] * 2


def test_an_edit_to_dcpcheck_is_seen_by_the_next_command(runtime, tmp_path):
    """The server holds torch, never dcpcheck: each command imports dcpcheck afresh from
    its own tree, so an edit lands in the next command, through the same server."""
    tree = tmp_path / "tree"
    shutil.copytree(REPO / "dcpcheck", tree / "dcpcheck", ignore=shutil.ignore_patterns("*.pyc"))
    for package in ("reference", "scenarios"):
        shutil.copytree(REPO / package, tree / package, ignore=shutil.ignore_patterns("*.pyc"))
    listing = tree / "dcpcheck" / "op_registry.py"
    before = _ran("list", "ops", env=_env(runtime), cwd=tree)
    assert before.returncode == 0, before.stderr
    assert "fused MLA norm + RoPE + cache write" in before.stdout
    listing.write_text(listing.read_text().replace("fused MLA norm", "EDITED fused MLA norm"))
    after = _ran("list", "ops", env=_env(runtime), cwd=tree)
    assert "EDITED fused MLA norm + RoPE + cache write" in after.stdout
    assert STARTED not in after.stderr
    assert len(_servers(runtime)) == 1


def _hanging(
    runtime: Path, tmp_path: Path, *args: str, **popen
) -> tuple[subprocess.Popen, list[int]]:
    """A resident run whose isolated kernel hangs on ``profiling-call`` (after the cases of
    ``args``' scenarios), once it hangs; and the command's processes then: the server's
    child and its children."""
    marker = tmp_path / "hanging"
    proc = _dcpcheck(
        "run", "--kernel", f"{FILE}:slow_then_hangs_on_profiling_call", "--isolate",
        "--dcp", "2", *args, "--scenario", "profiling-call", "--no-tokens",
        "--home", str(tmp_path / "home"),
        env=_env(runtime, **{faulty_kernels.HANG_MARKER_ENV: str(marker)}), **popen,
    )  # fmt: skip
    wait_for_hang(proc, marker, timeout=90.0)  # the server's start too
    [server] = _servers(runtime)
    [command] = children_of(server)
    return proc, [command, *children_of(command)]


def test_ctrl_c_reaches_the_command_and_keeps_its_partial_report(runtime, tmp_path):
    """The command runs outside the terminal's process group; the client passes Ctrl-C
    on to its session, so the command stops as a direct run stops (its partial report,
    exit 130), and its isolated worker with it."""
    json_path = tmp_path / "r.json"
    proc, session = _hanging(
        runtime, tmp_path, "--scenario", FAULT_SPARES, "--json", str(json_path)
    )
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert stderr.strip().splitlines()[-1] == (
        f"dcpcheck: interrupted after 1 case(s); partial report(s): {json_path}"
    )
    assert json.loads(json_path.read_text())["partial"] is True
    _wait_gone(session)


def test_ctrl_c_before_the_command_starts_is_one_line(runtime):
    """Ctrl-C while a new server still imports torch: no command to pass it on to, so the
    client stops there, exit 130, one line and no traceback; the server, finding its caller
    gone, starts nothing for it, and serves the next command."""
    proc = _dcpcheck("list", "ops", env=_env(runtime))
    assert proc.stderr.readline().startswith(STARTED)  # the server imports torch now
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert (stdout, stderr) == ("", "dcpcheck: interrupted before the command started\n")
    after = _ran("list", "ops", env=_env(runtime))
    assert (after.returncode, after.stderr) == (0, "")


def _state(pid: int) -> str:
    """The process's state letter in /proc (``T``: stopped)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _wait_state(pids: list[int], stopped: bool) -> None:
    deadline = time.monotonic() + 10
    while any((_state(pid) == "T") != stopped for pid in pids):
        assert time.monotonic() < deadline, {pid: _state(pid) for pid in pids}
        time.sleep(0.05)


def test_ctrl_z_stops_the_command_and_its_resumption_resumes_it(runtime, tmp_path):
    """Ctrl-Z stops the client and the command's session with it (which the terminal's
    SIGTSTP never reaches); the SIGCONT of ``fg`` or ``bg`` resumes both, and the command
    still answers Ctrl-C. The client has a process group of its own under this test's
    process, as a shell's job has: one whose stop a shell could undo."""
    proc, session = _hanging(runtime, tmp_path, process_group=0)
    command = session[0]
    try:
        proc.send_signal(signal.SIGTSTP)
        _wait_state([proc.pid, command], stopped=True)
        proc.send_signal(signal.SIGCONT)
        _wait_state([proc.pid, command], stopped=False)
    except BaseException:  # nothing left stopped: the runtime fixture kills servers alone
        for pid in (proc.pid, *session):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        raise
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    _wait_gone(session)


def test_a_server_that_dies_leaves_why_in_its_log(runtime, tmp_path):
    """A server killed by a fatal signal mid-command: the client kills the command's
    session, exits 1 and names the server's log, which holds the server's stack."""
    proc, session = _hanging(runtime, tmp_path)
    [server] = _servers(runtime)
    os.kill(server, signal.SIGSEGV)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 1, stderr
    line = stderr.strip().splitlines()[-1]
    assert line.startswith("dcpcheck: error: the resident server was lost mid-command")
    log = Path(line.rsplit("what it printed: ", 1)[1])
    assert log == resident.server_log(_env(runtime))
    assert "Fatal Python error: Segmentation fault" in log.read_text()
    _wait_gone(session)


def test_a_commands_fault_handler_is_what_its_environment_asks(runtime, tmp_path):
    """The server's own fault handler (on, for its log) is not its children's: each has
    the one ``PYTHONFAULTHANDLER`` gives a fresh interpreter."""
    (tmp_path / "fault_probe.py").write_text(
        "import faulthandler\nprint(faulthandler.is_enabled())\n"
    )
    server, _ = resident.connect(_env(runtime))
    for asked, shown in (("", "False"), ("1", "True")):
        env = {**os.environ, "PYTHONPATH": str(tmp_path), "PYTHONFAULTHANDLER": asked}
        printed = tmp_path / f"printed{asked}"
        with printed.open("w") as out:
            child = server.start("fault_probe", [], env=env, threads=1, stdout=out.fileno())
            assert child.wait(timeout=60) == 0
        assert printed.read_text() == f"{shown}\n"
    server.close()


def test_a_killed_client_ends_its_command(runtime, tmp_path):
    """A client that dies without passing anything on (SIGKILL) closes its connection;
    the server then kills the command's session, as a direct run dies with its process."""
    proc, session = _hanging(runtime, tmp_path)
    [server] = _servers(runtime)
    assert len(session) >= 2  # the command and its isolated worker's server or worker
    proc.kill()
    proc.communicate(timeout=10)
    _wait_gone(session)
    assert _servers(runtime) == [server]  # the server itself stays for the next command


def _wait_gone(pids: list[int]) -> None:
    deadline = time.monotonic() + 10
    while not all(process_gone(pid) for pid in pids):
        assert time.monotonic() < deadline, [p for p in pids if not process_gone(p)]
        time.sleep(0.05)


def test_the_server_is_chosen_by_what_torch_is_imported_from(monkeypatch, tmp_path):
    """Another torch (another file, or the same file rewritten), another option read as it
    loads, another server; the working directory, Triton's mode (each command imports
    Triton itself) and unrelated variables do not matter."""
    env = dict(os.environ)
    key = resident.server_key(env)
    for name in ("HOME", "TRITON_INTERPRET"):
        assert resident.server_key({**env, name: "set by the test"}) == key, name
    monkeypatch.chdir(tmp_path)
    assert resident.server_key(env) == key
    for name in ("PYTHONPATH", "TORCH_LOGS", "LD_LIBRARY_PATH", "CUDA_HOME"):
        assert resident.server_key({**env, name: "set by the test"}) != key, name
    fake = tmp_path / "torch" / "__init__.py"
    fake.parent.mkdir()
    fake.write_text("")
    monkeypatch.setattr(resident, "_origin", lambda module: str(fake))
    moved = resident.server_key(env)
    assert moved != key
    os.utime(fake, ns=(0, 0))  # the same file, rewritten
    assert resident.server_key(env) != moved


def test_commands_run_themselves_where_a_tool_or_a_group_needs_them(monkeypatch):
    """Under a profiler, a tracer or a CUDA tool, or as a torchrun rank, the command must
    be this process (``dcpcheck.observers``)."""
    monkeypatch.setenv(resident.ENV, "1")
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LD_PRELOAD"):
        monkeypatch.delenv(name, raising=False)
    assert resident.wanted()
    monkeypatch.setenv("LD_PRELOAD", "libtool.so")
    assert not resident.wanted()
    monkeypatch.delenv("LD_PRELOAD")
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "x")):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MASTER_PORT", "1")
    assert not resident.wanted()
    monkeypatch.setenv(resident.ENV, "0")
    monkeypatch.delenv("RANK")
    assert not resident.wanted()


def test_an_idle_server_leaves_and_removes_its_socket(runtime, monkeypatch):
    monkeypatch.setattr(resident, "IDLE_S", 1.0)
    server, started = resident.connect(_env(runtime))
    assert started
    child = server.start("json.tool", ["--help"], env=dict(os.environ), threads=1,
                         stdout=subprocess.DEVNULL)  # fmt: skip
    assert child.wait(timeout=60) == 0
    [pid] = _servers(runtime)
    [path] = (runtime / "dcpcheck").glob("*.sock")
    server.close()
    _wait_gone([pid])
    assert not path.exists()
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with pytest.raises(FileNotFoundError):
        probe.connect(str(path))
    probe.close()
