"""Shared fixtures. The backend is fixed before any kernel module is imported (see
dcpcheck.backend): CUDA when present, else Triton's interpreter on the CPU."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import subprocess
import sys
import tempfile

import pytest
import torch

from dcpcheck import gpu_fit
from dcpcheck.backend import current_backend
from dcpcheck.gpu_fit import RECORD_ENV

# Every process of the session records its launches of the project's kernels (the workers
# and the commands tests start inherit the folder); the process that made the folder checks
# them against the manifest at the end (pytest_sessionfinish). A caller that set the folder
# (``python -m dcpcheck.gpu_fit record``) reads the records itself.
CHECKS_LAUNCHES = RECORD_ENV not in os.environ
if CHECKS_LAUNCHES:
    os.environ[RECORD_ENV] = tempfile.mkdtemp(prefix="dcpcheck-launches-")

# Every dcpcheck process a test starts (about 150, isolated workers included) imports the
# package afresh. Where PYTHONDONTWRITEBYTECODE is set (this project's CI machine sets it),
# each would compile its ~80 modules from source again, about 0.2 s of CPU apiece: so
# bytecode is written (to the checkout's __pycache__/, which git ignores), once.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

BACKEND = current_backend()

# Commands run by the tests save failing cases under DCPCHECK_HOME (default ./.dcpcheck):
# keep them out of the checkout. Subprocesses (pytest-xdist's workers too) inherit it; the
# process that made it removes it as it exits.
if "DCPCHECK_HOME" not in os.environ:
    os.environ["DCPCHECK_HOME"] = tempfile.mkdtemp(prefix="dcpcheck-tests-")
    atexit.register(shutil.rmtree, os.environ["DCPCHECK_HOME"], True)

# The suite runs many tiny tensor ops; on a 2-core CI machine torch's intra-op threads
# cost more in hand-offs than they win (measured: 5 s single-threaded vs 47-79 s busy).
# The same for the processes tests start: `run --dcp 4 --no-tokens` takes 8.6-9.2 s of CPU
# on one thread against 10.4-10.6 s on two, with the other test worker busy beside it.
torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")

requires_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device (none visible to torch)"
)


@pytest.fixture(scope="session")
def device() -> torch.device:
    return BACKEND.device


@pytest.fixture(autouse=True)
def _release_cuda_cache():
    """Hand the memory a test's tensors held back to the GPU when it ends. Torch's caching
    allocator keeps a process's peak: a worker that ran the 65,536-token shapes would hold
    tens of GiB through every later test, which processes sharing the GPU (the runbook's
    other jobs, the other workers) then lack."""
    yield
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def pytest_report_header(config):
    return f"dcpcheck backend: {BACKEND.describe()}"


@functools.cache
def registry_problem() -> str | None:
    """Why the package registry cannot be asked about vllm, or None when it can: the
    release tests skip a release only when it is not cached and this says why."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", "vllm", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode == 0:
        return None
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    return lines[-1] if lines else f"pip index exited {done.returncode}"


@functools.cache
def op_selftest(op: str):
    """``package(op).selftest`` on this process's backend, run once for every test that
    reads it: tests/test_op_contract.py reads every op's, an op's own test module may read
    its op's. The same call on the same kernels and shipped scenarios gives the same
    report, and no test changes a report it reads."""
    from dcpcheck.ops import package

    return package(op).selftest(BACKEND)


def pytest_sessionfinish(session, exitstatus):
    """Check the launches the session made that the manifest does not list: each is
    compiled for every target here and fails the session unless it fits (the manifest's
    own launches are ``tests/test_gpu_fit.py``'s). Listed or not, no launch goes unchecked;
    an unlisted one that fits is named so the manifest can be regenerated."""
    if not CHECKS_LAUNCHES:
        return
    recorded = gpu_fit.recorded(os.environ[RECORD_ENV])
    shutil.rmtree(os.environ[RECORD_ENV], ignore_errors=True)  # read once, by its maker
    unlisted = recorded - set(gpu_fit.read_manifest())
    if not unlisted:
        return
    results = gpu_fit.check_fit(unlisted)
    session.config.unlisted_launches = sorted(c.describe() for c in unlisted)
    session.config.unfit_launches = [r.problem for r in results if r.problem]
    if session.config.unfit_launches:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    unlisted = getattr(config, "unlisted_launches", ())
    unfit = getattr(config, "unfit_launches", ())
    if unfit:
        terminalreporter.section("launches that do not fit a GPU", red=True)
        for line in unfit:
            terminalreporter.write_line(line)
    if unlisted:
        terminalreporter.section("launches missing from the GPU-fit manifest", yellow=True)
        for line in unlisted:
            terminalreporter.write_line(line)
        terminalreporter.write_line(
            f"{len(unlisted)} launch config(s) not in {gpu_fit.MANIFEST.name}, "
            f"{len(unfit)} of them not fitting: regenerate it with `{gpu_fit.RECORD_COMMAND}`"
        )
