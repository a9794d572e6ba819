"""Shared fixtures. The backend is fixed before any kernel module is imported (see
dcpcheck.backend): CUDA when present, else Triton's interpreter on the CPU."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch

from dcpcheck.backend import current_backend

BACKEND = current_backend()

# Commands run by the tests save failing cases under DCPCHECK_HOME (default ./.dcpcheck):
# keep them out of the checkout. Subprocesses inherit it.
os.environ.setdefault("DCPCHECK_HOME", tempfile.mkdtemp(prefix="dcpcheck-tests-"))

# The suite runs many tiny tensor ops; on a 2-core CI machine torch's intra-op threads
# cost more in hand-offs than they win (measured: 5 s single-threaded vs 47-79 s busy).
torch.set_num_threads(1)

requires_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device (none visible to torch)"
)


@pytest.fixture(scope="session")
def device() -> torch.device:
    return BACKEND.device


def pytest_report_header(config):
    return f"dcpcheck backend: {BACKEND.describe()}"
