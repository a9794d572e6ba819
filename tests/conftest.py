"""Shared fixtures. The backend is fixed before any kernel module is imported (see
dcpcheck.backend): CUDA when present, else Triton's interpreter on the CPU."""

from __future__ import annotations

import pytest
import torch

from dcpcheck.backend import current_backend

BACKEND = current_backend()

requires_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device (none visible to torch)"
)


@pytest.fixture(scope="session")
def device() -> torch.device:
    return BACKEND.device


def pytest_report_header(config):
    return f"dcpcheck backend: {BACKEND.describe()}"
