"""The process entry point (``dcpcheck.cli.command_line``): every line written, the exit
status kept, the interpreter's teardown skipped except where something needs it.

Each test starts a Python process whose ``atexit`` handler prints ``TEARDOWN``: the
handler runs only if the process exits the ordinary way.
"""

from __future__ import annotations

import os
import subprocess
import sys

from dcpcheck.exit_codes import EXIT_OK, EXIT_USAGE
from dcpcheck.observers import INJECTION_VARIABLES, TORCHRUN_VARIABLES
from dcpcheck.ops.fused_norm_rope.scenario import SCENARIOS

TEARDOWN = "TEARDOWN"


OBSERVERS = (*INJECTION_VARIABLES, *TORCHRUN_VARIABLES)
"""What makes a process exit the ordinary way, left out of each test's environment (a
machine may preload a library for every process) unless the test sets it."""


def entry_point(*args: str, before: str = "", env: dict[str, str] | None = None):
    """``dcpcheck ARGS`` through ``command_line`` in a fresh process; ``before`` runs first."""
    inherited = {name: value for name, value in os.environ.items() if name not in OBSERVERS}
    program = (
        f"import atexit, sys; atexit.register(print, {TEARDOWN!r}); {before}\n"
        f"sys.argv = ['dcpcheck', *{list(args)!r}]\n"
        "from dcpcheck.cli import command_line; command_line()"
    )
    return subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        env={**inherited, **(env or {})},
        timeout=120,
    )


def test_a_command_writes_everything_and_skips_the_teardown():
    done = entry_point("list", "scenarios")
    assert done.returncode == EXIT_OK, done.stderr
    shipped = sorted(path.stem for path in SCENARIOS.glob("*.toml"))
    assert all(name in done.stdout for name in shipped)  # the last line came out too
    assert TEARDOWN not in done.stdout


def test_the_exit_status_and_the_one_line_error_survive():
    done = entry_point("run", "--dcp", "0")
    assert done.returncode == EXIT_USAGE
    assert done.stderr.strip().startswith("dcpcheck: error:"), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert TEARDOWN not in done.stdout


def test_a_profiled_process_exits_the_ordinary_way():
    """cProfile (and coverage) write their results at exit: the teardown must run."""
    done = entry_point("list", "layouts", before="import cProfile; cProfile.Profile().enable()")
    assert done.returncode == EXIT_OK, done.stderr
    assert TEARDOWN in done.stdout


def test_a_rank_of_a_real_rank_run_exits_the_ordinary_way():
    rank = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    done = entry_point("list", "layouts", env=rank)
    assert done.returncode == EXIT_OK, done.stderr
    assert TEARDOWN in done.stdout


def test_a_process_with_an_injected_library_exits_the_ordinary_way():
    """Nsight Systems, Nsight Compute and compute-sanitizer inject a library that may write
    what it gathered at exit (here a harmless one, already loaded: the C math library)."""
    done = entry_point("list", "layouts", env={"LD_PRELOAD": "libm.so.6"})
    assert done.returncode == EXIT_OK, done.stderr
    assert TEARDOWN in done.stdout


def test_the_entry_point_loads_the_command_line_uncollected_and_frozen():
    """``dcpcheck.__main__.uncollected``: the collector off inside, what loaded frozen on
    the way out, the collector's own state (on, or off as a caller left it) kept."""
    program = (
        "import gc\n"
        "from dcpcheck.__main__ import uncollected\n"
        "with uncollected():\n"
        "    inside = gc.isenabled()\n"
        "    import dcpcheck.cli\n"
        "frozen, after = gc.get_freeze_count(), gc.isenabled()\n"
        "gc.disable()\n"
        "with uncollected():\n"
        "    pass\n"
        "print(inside, frozen > 0, after, gc.isenabled())"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert done.stdout.split() == ["False", "True", "True", "False"], done.stderr


def test_python_dash_m_dcpcheck_runs_the_command_line():
    done = subprocess.run(
        [sys.executable, "-m", "dcpcheck", "list", "scenarios"], capture_output=True, text=True
    )
    assert done.returncode == EXIT_OK, done.stderr
    assert all(path.stem in done.stdout for path in SCENARIOS.glob("*.toml"))
