"""Stand-in for vLLM's workspace manager (``vllm.v1.worker.workspace``): the all-to-all
merge of 0.21.0 - 0.23.0 (``dcp_alltoall.py``) takes its send and receive buffers from it
whenever it is initialized, as it is in a serving engine, and allocates them itself
otherwise.

The manager hands out views of buffers it allocated once and that earlier steps wrote, so
what a kernel finds there is whatever was left. The stand-in says it is initialized and
hands out fresh buffers filled with NaN (integer ones with -1): a merge that reads what it
did not write shows it, where an allocator's fresh memory could hide it.
"""

from __future__ import annotations

import torch

STANDS_IN_FOR = ("current_workspace_manager", "is_workspace_manager_initialized")
"""The names vLLM's kernel files import from ``vllm.v1.worker.workspace``."""


class StandInWorkspaceManager:
    """The one query the merges make of the manager."""

    def get_simultaneous(self, *wanted: tuple[tuple[int, ...], torch.dtype]) -> list[torch.Tensor]:
        """A buffer of each ``(shape, dtype)``, none sharing memory with another, holding
        what a reused buffer may hold (module docstring)."""
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
        buffers = []
        for shape, dtype in wanted:
            stale = float("nan") if dtype.is_floating_point else -1
            buffers.append(torch.full(tuple(shape), stale, dtype=dtype, device=device))
        return buffers


_MANAGER = StandInWorkspaceManager()


def is_workspace_manager_initialized() -> bool:
    return True


def current_workspace_manager() -> StandInWorkspaceManager:
    return _MANAGER
