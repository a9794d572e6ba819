"""The contract checks on real ranks: every rank runs each scenario's cases with the
session op's ``scenario_on_ranks`` (the fused op's: every rank launches its own slot
mapping, rank 0 judges), then the token streams; rank 0 gets the simulated mode's
results, in its order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from dcpcheck.cases.verdicts import CaseResult, RunConfig
from dcpcheck.distributed.group import DistributedUsageError, RankGroup
from dcpcheck.distributed.streams import token_stream_case_on_ranks
from dcpcheck.ops import session_op


def distributed_sizes(requested: Sequence[int] | None, world_size: int) -> tuple[int, ...]:
    """The DCP sizes a group of ``world_size`` ranks checks: its own size, and DCP1 (the
    baseline, which rank 0 runs alone) if asked. ``None`` means the world size."""
    if requested is None:
        return (world_size,)
    if world_size not in requested or any(n not in (1, world_size) for n in requested):
        raise DistributedUsageError(
            f"--dcp {','.join(map(str, requested))} on {world_size} rank(s): each process is one "
            f"rank, so the DCP size is the number of processes; use --dcp {world_size} "
            f"(or 1,{world_size})"
        )
    return tuple(requested)


def run_distributed(
    kernel: Any,  # the session op's
    scenarios: Sequence[Any],
    config: RunConfig,
    group: RankGroup,
    *,
    tokens: bool = True,
    on_result: Callable[[CaseResult], None] | None = None,
) -> list[CaseResult] | None:
    """The session op's ``run`` (and, with ``tokens``, ``stream_case.token_stream_case``) on
    real ranks: call it on every rank of ``group``. Rank 0 gets the results, in the
    simulated mode's order, and ``on_result`` sees each as it lands; the other ranks get
    ``None``.

    ``config.dcp_sizes`` may name the world size and 1 (:func:`distributed_sizes`).
    """
    sizes = distributed_sizes(config.dcp_sizes, group.world_size)
    on_ranks = session_op().session_cases().scenario_on_ranks
    results: list[CaseResult] = []
    for scenario in scenarios:
        stop = False
        for result in on_ranks(kernel, scenario, config, group, sizes) or []:
            results.append(result)
            if on_result is not None:
                on_result(result)
            if config.fail_fast and result.failed:
                stop = True
                break
        if config.fail_fast and group.broadcast_from_root(stop, "the fail-fast decision"):
            return results if group.is_root else None
    if tokens and scenarios:
        result = token_stream_case_on_ranks(kernel, config, group)
        if result is not None:
            results.append(result)
            if on_result is not None:
                on_result(result)
    return results if group.is_root else None
