"""A ``package.module:function`` kernel resolves from the working directory when dcpcheck
runs as the ``dcpcheck`` script, as it does under ``python -m dcpcheck``: the replay
commands the pytest plugin prints for a kernel repository work from where they were
printed.

Each test runs the installed console script in a fresh process over a tiny kernel
package built in ``tmp_path`` (a ``src/`` layout), on one decode token at DCP2.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dcpcheck.exit_codes import EXIT_FAIL, EXIT_KERNEL_LOAD, EXIT_OK

DCPCHECK = Path(sys.executable).with_name("dcpcheck")

pytestmark = pytest.mark.skipif(
    not DCPCHECK.is_file(), reason=f"the dcpcheck console script is not installed ({DCPCHECK})"
)

ORACLE = '''"""The oracle as a kernel (tests/kernels_under_test.py's oracle_kernel)."""
import reference
from dcpcheck.ops.fused_norm_rope.case import oracle_for


def oracle_kernel(inputs, outputs, caches):
    ref = oracle_for(inputs)
    outputs.q_out.copy_(ref.q_out)
    outputs.kv_out.copy_(ref.kv_out)
    outputs.kpe_out.copy_(ref.kpe_out)
    if inputs.index_k is not None:
        outputs.index_k_out.copy_(ref.index_k_out)
        outputs.topk_indices.fill_(-1)
    mla, index = reference.expected_caches(
        caches.mla, caches.index, inputs.slot_mapping, inputs.index_slot_mapping, ref
    )
    caches.mla.copy_(mla)
    if caches.index is not None:
        caches.index.copy_(index)
'''

KERNELS = '''"""A correct kernel and the PR-54908 flaw, built on a sibling module."""
from mykernels.oracle import oracle_kernel


def fused_norm_rope(inputs, outputs, caches):
    oracle_kernel(inputs, outputs, caches)


def fused_norm_rope_broken(inputs, outputs, caches):
    """kv/kpe outputs left unwritten for tokens without a local slot."""
    kv_before, kpe_before = outputs.kv_out.clone(), outputs.kpe_out.clone()
    oracle_kernel(inputs, outputs, caches)
    foreign = inputs.slot_mapping < 0
    outputs.kv_out[foreign] = kv_before[foreign]
    outputs.kpe_out[foreign] = kpe_before[foreign]
'''


@pytest.fixture
def kernel_repo(tmp_path: Path) -> Path:
    """A kernel repository with its package under ``src/``."""
    package = tmp_path / "src" / "mykernels"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "oracle.py").write_text(ORACLE)
    (package / "kernels.py").write_text(KERNELS)
    return tmp_path


def replay(function: str, cwd: Path, pythonpath: str | None = None) -> subprocess.CompletedProcess:
    """The plugin's replay for ``mykernels.kernels:<function>``, run as printed in ``cwd``."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    command = [
        str(DCPCHECK), "run", "--scenario", "decode-single-dcp4", "--dcp", "2",
        "--kernel", f"mykernels.kernels:{function}", "--no-tokens",
    ]  # fmt: skip
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)


@pytest.mark.parametrize(
    ("function", "exit_code"), [("fused_norm_rope", EXIT_OK), ("fused_norm_rope_broken", EXIT_FAIL)]
)
def test_the_script_imports_a_module_spec_from_the_working_directory(
    kernel_repo: Path, function: str, exit_code: int
) -> None:
    done = replay(function, cwd=kernel_repo / "src")
    assert done.returncode == exit_code, done.stderr


def test_from_a_src_layouts_root_the_replay_needs_src_on_pythonpath(kernel_repo: Path) -> None:
    """What the plugin must print when pytest found the package through its ``pythonpath``
    ini (``PYTHONPATH=src dcpcheck run ...``), and why."""
    done = replay("fused_norm_rope", cwd=kernel_repo, pythonpath="src")
    assert done.returncode == EXIT_OK, done.stderr
    without = replay("fused_norm_rope", cwd=kernel_repo)
    assert without.returncode == EXIT_KERNEL_LOAD
    assert "No module named 'mykernels'" in without.stderr


def test_the_plugins_printed_replay_runs_as_printed(kernel_repo: Path) -> None:
    """pytest finds the package through its ``pythonpath`` ini; the plugin's replay line,
    run through a shell from the repository root, fails the case again (exit 1)."""
    (kernel_repo / "pyproject.toml").write_text('[tool.pytest.ini_options]\npythonpath = ["src"]\n')
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    command = [
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
        "--dcpcheck-kernel=mykernels.kernels:fused_norm_rope_broken",
        "--dcpcheck-dcp=2", "--dcpcheck-scenario=decode-single-dcp4", "--dcpcheck-no-tokens",
    ]  # fmt: skip
    done = subprocess.run(
        command,
        cwd=kernel_repo,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    # One distinct line: with CI set, pytest repeats the whole failure text in its summary.
    [line] = {line for line in done.stdout.splitlines() if line.startswith("replay: ")}
    command = line.removeprefix("replay: ")
    assert command.startswith("PYTHONPATH=src dcpcheck run ")
    env["PATH"] = f"{DCPCHECK.parent}{os.pathsep}{env['PATH']}"
    replayed = subprocess.run(
        ["bash", "-c", command], cwd=kernel_repo, env=env, capture_output=True, text=True
    )
    assert replayed.returncode == EXIT_FAIL, replayed.stderr
