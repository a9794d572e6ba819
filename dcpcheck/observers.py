"""Who else has a hand in this process: the torchrun group it is a rank of, a profiler, a
tracer or a CUDA tool that watches it.

Both decide how a dcpcheck process starts and leaves: such a process runs its command
itself, never in a resident server's fork (``dcpcheck.resident``: the tool would watch an
empty client, the group would miss its rank), and leaves through the interpreter's
teardown, not ``os._exit`` (``dcpcheck.cli.command_line``: a rank's process group tears
down as torch.distributed expects, a tool writes what it gathered at exit).
"""

from __future__ import annotations

import os
import sys

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
"""What torchrun (and ``dcpcheck.distributed.launcher``) sets in each rank's environment."""

INJECTION_VARIABLES = ("CUDA_INJECTION64_PATH", "LD_PRELOAD")
"""How a CUDA tool puts its library into the process it watches: the driver loads the
first at ``cuInit``, the dynamic linker the second at start."""


def in_torchrun_environment() -> bool:
    """Whether this process was started as one rank of a group (by torchrun or
    ``dcpcheck.distributed.launcher``)."""
    return all(name in os.environ for name in TORCHRUN_VARIABLES)


def watched() -> bool:
    """Whether a profiler, a tracer or an injected library (a CUDA tool's) watches this
    process."""
    monitoring = getattr(sys, "monitoring", None)  # Python 3.12+: coverage's sysmon core
    tools = () if monitoring is None else range(6)  # the ids sys.monitoring hands out
    return (
        sys.getprofile() is not None
        or sys.gettrace() is not None
        or any(monitoring.get_tool(tool) is not None for tool in tools)
        or any(os.environ.get(name) for name in INJECTION_VARIABLES)
    )
