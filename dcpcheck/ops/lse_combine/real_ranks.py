"""The merge on real ranks: one process per rank over torch.distributed (gloo on the CPU),
each running its own rank's merge of every case with a
``dcpcheck.cases.collectives.TorchGroup``, as a deployment does, where the simulated
group runs them as threads of one process.

Every process builds the same case (the partials are the oracle's, from the scenario's
seed), runs its own rank's merge, and the ranks' results are gathered to every process, so
each judges the case alike; rank 0 hands the ``CaseResult`` s back. A kernel that makes
other collective calls on one rank than on another, or raises on one rank only, leaves the
others waiting: the collectives then give up after ``timeout_s`` and the run is an error,
never a hang.
"""

from __future__ import annotations

import socket
from dataclasses import replace
from datetime import timedelta
from functools import partial
from pathlib import Path

import torch.multiprocessing as mp

from dcpcheck.cases.verdicts import CaseResult

DEFAULT_TIMEOUT_S = 120.0
"""Longest a collective waits for the other ranks: a shipped case takes a second or two."""


class RealRanksError(RuntimeError):
    """A rank process failed or the ranks did not finish in time."""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _launch_real(kernel, case) -> list:
    """This process's rank's merge of ``case`` over the real group, and every rank's
    results gathered (``runner.Launch``)."""
    import torch.distributed as dist

    from dcpcheck.cases.collectives import TorchGroup
    from dcpcheck.ops.lse_combine.case import rank_inputs

    group = TorchGroup()
    mine = kernel(rank_inputs(case, group))
    gathered: list = [None] * group.world_size
    dist.all_gather_object(gathered, mine)
    return gathered


def _rank_main(rank: int, world_size: int, port: int, jobs, timeout_s: float, answers) -> None:
    import torch.distributed as dist

    from dcpcheck.backend import select_backend

    backend = select_backend("cpu")
    from dcpcheck.ops import op_cases
    from dcpcheck.ops.lse_combine import kernels, runner, scenario

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
    )
    try:
        real = replace(runner.OP_CASES, judge=partial(runner.judged, launch=_launch_real))
        results = []
        for spec, path in jobs:
            kernel = kernels.REGISTRY.load(spec)
            loaded = scenario.load_scenario(Path(path))
            results += op_cases.run_scenario(
                real, kernel, spec, loaded, (world_size,), backend.device
            )
        if rank == 0:
            answers.put(results)
    finally:
        dist.destroy_process_group()


def run_on_real_ranks(
    world_size: int, jobs: list[tuple[str, Path]], timeout_s: float | None = None
) -> list[CaseResult]:
    """Every ``(kernel spec, scenario file)`` of ``jobs`` at DCP ``world_size``, on that
    many processes (module docstring): rank 0's ``CaseResult`` s, in the jobs' order.
    ``timeout_s`` (``DEFAULT_TIMEOUT_S`` when None) bounds every collective."""
    timeout_s = DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s
    context = mp.get_context("spawn")
    answers = context.SimpleQueue()
    port = _free_port()
    processes = [
        context.Process(target=_rank_main, args=(rank, world_size, port, jobs, timeout_s, answers))
        for rank in range(world_size)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout_s * (len(jobs) + 1))
    alive = [p for p in processes if p.is_alive()]
    for process in alive:
        process.kill()
    failed = [rank for rank, p in enumerate(processes) if p.exitcode != 0]
    if alive or failed or answers.empty():
        raise RealRanksError(
            f"{world_size} real ranks: rank(s) {', '.join(map(str, failed))} did not finish "
            f"cleanly (exit codes {[p.exitcode for p in processes]})"
        )
    return answers.get()
