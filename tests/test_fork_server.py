"""Processes forked from a server that imported torch (dcpcheck.fork_server): each runs its
module as ``python -m`` would, with the caller's environment, working directory, import
path, arguments and descriptors, ends with the status a fresh interpreter would give it,
and leaves no server behind its caller."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dcpcheck import fork_server
from tests.test_faults import process_gone

CHILD = """
import json, os, sys

preloaded = "torch" in sys.modules  # before this module imported anything of its own
server_threads = len(os.listdir(f"/proc/{os.getppid()}/task"))
import dcpcheck
import torch

out = int(sys.argv[1])
facts = {
    "argv": sys.argv[2:],
    "cwd": os.getcwd(),
    "marker": os.environ.get("FORK_TEST_MARKER"),
    "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd")),
    "preloaded": preloaded,
    "server_threads": server_threads,
    "torch_threads": torch.get_num_threads(),
    "session": os.getsid(0) == os.getpid(),
    "pgid": os.getpgid(0),
    "dcpcheck": dcpcheck.__file__,
    "parent": os.getppid(),
    "pid": os.getpid(),
}
print("to stdout", flush=True)  # before the facts: a test may stop reading stdout then
os.write(out, json.dumps(facts).encode())
os.close(out)
if sys.argv[2:3] == ["hang"]:
    import time
    time.sleep(600)
raise SystemExit(int(sys.argv[2]) if sys.argv[2:3] and sys.argv[2].isdigit() else None)
"""


@pytest.fixture
def child_module(tmp_path) -> dict[str, object]:
    """``fork_test_child`` (``CHILD``) importable through ``PYTHONPATH``."""
    (tmp_path / "fork_test_child.py").write_text(CHILD)
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "FORK_TEST_MARKER": "from the caller"}


def run_child(env, *args: str, server=None, **popen) -> tuple[dict, object, str]:
    """Start ``fork_test_child``; its facts, the process, and what it printed."""
    facts_read, facts_write = os.pipe()
    out_read, out_write = os.pipe()
    try:
        process = (server or fork_server).start(
            "fork_test_child",
            [str(facts_write), *args],
            env=env,
            pass_fds=(facts_write,),
            stdout=out_write,
            **popen,
        )
    finally:
        os.close(facts_write)
        os.close(out_write)
    with os.fdopen(facts_read, "rb") as facts, os.fdopen(out_read, "rb") as out:
        said = facts.read()
        printed = out.read().decode() if args[:1] != ("hang",) else ""
    return json.loads(said), process, printed


def test_a_child_runs_its_module_with_the_callers_environment_arguments_and_status(
    child_module, tmp_path
):
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    facts, process, printed = run_child(child_module, "7", "x", cwd=cwd)
    assert process.wait(timeout=60) == 7
    assert facts["argv"] == ["7", "x"]
    assert facts["cwd"] == str(cwd)
    assert facts["marker"] == "from the caller"
    assert printed == "to stdout\n"
    _, process, _ = run_child(child_module)  # SystemExit(None): 0, as for a fresh interpreter
    assert process.wait(timeout=60) == 0


def test_a_child_is_spared_torchs_import_and_forked_with_one_thread(child_module):
    facts, process, _ = run_child(child_module, threads=1)
    assert process.wait(timeout=60) == 0
    assert facts["preloaded"] is True
    # What it forks: one thread. Torch's import starts a CPU pool's thread unless told one
    # thread (that thread may be gone by the time a child looks: the environment says).
    assert facts["server_threads"] == 1
    server_env = Path(f"/proc/{facts['parent']}/environ").read_bytes().split(b"\0")
    assert b"OMP_NUM_THREADS=1" in server_env
    assert facts["torch_threads"] == 1
    facts, process, _ = run_child(child_module, threads=3)
    assert process.wait(timeout=60) == 0
    assert facts["torch_threads"] == 3


def test_a_child_keeps_only_its_passed_descriptors(child_module):
    stray = os.open(os.devnull, os.O_RDONLY)  # open here, not passed: closed in the child
    try:
        facts, process, _ = run_child(child_module)
        assert process.wait(timeout=60) == 0
    finally:
        os.close(stray)
    assert facts["fds"][:3] == [0, 1, 2]
    # the facts pipe at its number in this process, and the child's listing of /proc
    assert len(facts["fds"]) == 5


def test_a_child_imports_dcpcheck_from_its_own_path_not_the_servers(child_module, tmp_path):
    tree = tmp_path / "tree"
    (tree / "dcpcheck").mkdir(parents=True)
    (tree / "dcpcheck" / "__init__.py").write_text("")
    env = {**child_module, "PYTHONPATH": f"{tree}{os.pathsep}{child_module['PYTHONPATH']}"}
    facts, process, _ = run_child(env, cwd=tmp_path)  # not the checkout, first on the path
    assert process.wait(timeout=60) == 0
    assert facts["dcpcheck"] == str(tree / "dcpcheck" / "__init__.py")


def test_a_session_is_the_childs_own_only_when_asked(child_module):
    facts, process, _ = run_child(child_module, start_new_session=True)
    assert process.wait(timeout=60) == 0
    assert facts["session"] is True
    facts, process, _ = run_child(child_module)
    assert process.wait(timeout=60) == 0
    assert (facts["session"], facts["pgid"]) == (False, os.getpgid(0))


def test_a_running_child_can_be_waited_on_polled_and_killed(child_module):
    _, process, _ = run_child(child_module, "hang", start_new_session=True)
    assert process.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        process.wait(timeout=0.2)
    os.killpg(process.pid, signal.SIGKILL)
    assert process.wait(timeout=60) == -signal.SIGKILL
    assert process.poll() == -signal.SIGKILL


TRITON_CHILD = """
import os
os.environ["TRITON_INTERPRET"] = "1"  # as dcpcheck.backend chooses the interpreter
import torch
import triton
import triton.language as tl


@triton.jit
def largest(x_ptr, out_ptr, N: tl.constexpr):
    tl.store(out_ptr, tl.max(tl.load(x_ptr + tl.arange(0, N)), axis=0))


x, out = torch.arange(8, dtype=torch.float32), torch.zeros(1)
largest[(1,)](x, out, N=8)
raise SystemExit(0 if out.item() == 7.0 else 3)
"""


def test_a_child_chooses_tritons_interpreter_after_the_fork(tmp_path, monkeypatch):
    """Triton's own library (``tl.max``) is interpreted or compiled as Triton is imported:
    the server must leave that import to a child that chose its backend, whatever the
    server's environment said (``dcpcheck mutate`` starts its server before choosing)."""
    (tmp_path / "triton_child.py").write_text(TRITON_CHILD)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the server's environment
    server = fork_server.ForkServer()
    try:
        env = {**os.environ, "PYTHONPATH": str(tmp_path)}
        process = server.start("triton_child", [], env=env, threads=1)
        assert process.wait(timeout=120) == 0
    finally:
        server.close()


def test_a_module_that_does_not_exist_exits_1(child_module):
    process = fork_server.start("no_such_module_here", [], env=child_module)
    assert process.wait(timeout=60) == 1


def test_the_server_ends_with_its_callers_socket_and_a_lost_server_is_said(child_module):
    server = fork_server.ForkServer()
    facts, process, _ = run_child(child_module, server=server)
    assert process.wait(timeout=60) == 0
    server_pid = facts["parent"]
    assert server_pid != os.getpid()
    server.close()
    deadline = time.monotonic() + 10
    while not process_gone(server_pid):
        assert time.monotonic() < deadline, "the server outlived its socket"
        time.sleep(0.05)
    with pytest.raises(fork_server.ForkServerError):
        server.start("fork_test_child", [], env=child_module)


def test_the_server_leaves_when_its_caller_is_killed(child_module):
    """Its children run on, as a killed caller's ``Popen`` children would."""
    caller = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, time\n"
            "from dcpcheck import fork_server\n"
            "r, w = os.pipe()\n"
            "fork_server.start('fork_test_child', [str(w), 'hang'], env=dict(os.environ),"
            " pass_fds=(w,), stdout=-3)\n"  # subprocess.DEVNULL
            "os.close(w)\n"
            "print(os.read(r, 1 << 16).decode(), flush=True)\n"
            "time.sleep(600)\n",
        ],
        env=child_module,
        stdout=subprocess.PIPE,
        cwd=Path(__file__).parents[1],
    )
    facts = json.loads(caller.stdout.readline())
    caller.kill()
    caller.wait()
    caller.stdout.close()
    try:
        deadline = time.monotonic() + 10
        while not process_gone(facts["parent"]):
            assert time.monotonic() < deadline, "the server outlived its caller"
            time.sleep(0.05)
        assert not process_gone(facts["pid"])
    finally:
        os.kill(facts["pid"], signal.SIGKILL)
