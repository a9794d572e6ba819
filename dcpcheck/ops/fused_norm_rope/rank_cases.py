"""The fused op's cases on real ranks: every rank launches its own slot mapping of a case,
rank 0 adopts their buffers and judges the case with the runner's ``judge()``, so the
report is the simulated mode's: same verdicts, same findings, same JSON.

``dcpcheck.distributed.ranks`` runs a scenario list through :func:`scenario_on_ranks`
(``SessionCases.scenario_on_ranks``) on every rank of a ``dcpcheck.distributed.RankGroup``.
"""

from __future__ import annotations

import io
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch

from dcpcheck.cases.verdicts import CaseResult, Finding, KernelError, RunConfig
from dcpcheck.ops.fused_norm_rope.case import (
    Case,
    build_case,
    make_activations,
    oracle_for,
    scenario_inputs,
)
from dcpcheck.ops.fused_norm_rope.contract import Kernel
from dcpcheck.ops.fused_norm_rope.runner import (
    Launched,
    case_not_applicable,
    judge,
    launch,
    launch_all,
    not_applicable_result,
    not_applicable_results,
    run_again,
    with_effective_ds_mla_scale,
)
from dcpcheck.ops.fused_norm_rope.scenario import Scenario
from dcpcheck.ops.session_cases import RanksOfARun


@dataclass
class LaunchedRank:
    """What one rank sends rank 0 after its launch: its ``RankLaunch`` (``torch.save``d), the
    inputs the kernel modified, or the kernel's exception.

    The launch travels whole (outputs inside their guard storages, caches with their initial
    copies: whatever the checks read), less its inputs: ``launch_all`` restores those after
    recording any change, so they equal rank 0's copy, and their shared tables (RoPE
    ``cos_sin``: 42 MB at DeepSeek's max position) would be sent by every rank.
    ``torch.save`` keeps views views (an output inside its guard storage) and lets rank 0
    load the tensors straight onto its device.
    """

    rank: int
    error: str | None  # as ``runner.launch_all`` words it: "rank R: Type: message"
    launch: bytes = b""
    input_changes: list[Finding] = field(default_factory=list)


def _launch_own_rank(kernel: Kernel, case: Case, rank: int) -> LaunchedRank:
    """Launch this process's rank of ``case`` (``runner.launch_all`` on that one rank: the
    same input snapshot and restore, the same error text)."""
    own = case.ranks[rank]
    try:
        changes = launch_all(kernel, replace(case, ranks=[own]))
    except KernelError as exc:
        return LaunchedRank(rank, str(exc))
    saved = io.BytesIO()
    torch.save(replace(own, inputs=None), saved)
    return LaunchedRank(rank, None, saved.getvalue(), changes)


def _adopt(case: Case, launched: Sequence[LaunchedRank]) -> tuple[str | None, list[Finding]]:
    """Put every rank's launch into rank 0's ``case``, on rank 0's device.

    Returns the error of the lowest rank whose kernel raised (``launch_all`` stops there in
    the simulated mode), else every rank's input changes in rank order.
    """
    errors = [r.error for r in launched if r.error is not None]
    if errors:
        return errors[0], []
    device = case.activations.q_c.device
    changes: list[Finding] = []
    for rank in launched:
        # Trusted bytes: another rank of this run pickled its own launch.
        loaded = torch.load(io.BytesIO(rank.launch), map_location=device, weights_only=False)
        case.ranks[rank.rank] = replace(loaded, inputs=case.ranks[rank.rank].inputs)
        changes += rank.input_changes
    return None, changes


def scenario_on_ranks(
    kernel: Kernel,
    scenario: Scenario,
    config: RunConfig,
    group: RanksOfARun,
    sizes: Sequence[int],
) -> list[CaseResult] | None:
    """One scenario on every rank of ``group`` (call it on each), at ``sizes``: the
    group's size and maybe 1; its results (one per size, in order) on rank 0, None on the
    others."""
    scenario = with_effective_ds_mla_scale(scenario, config, kernel)  # as runner.run_scenario
    device = group.backend.device
    seed = scenario.seed if config.seed is None else config.seed
    label = f"{scenario.name}[dcp{group.world_size}]"
    group.progress.working(f"launching {label}")
    start = time.perf_counter()
    act = make_activations(scenario, seed, device)
    inputs = scenario_inputs(scenario, act)
    skipped = not_applicable_results(kernel, scenario, config, inputs, sizes)
    if skipped:  # every rank decides alike: the same kernel, machine and inputs
        return skipped
    expected = oracle_for(inputs)
    case = build_case(
        scenario, group.world_size, device, seed=seed, activations=act, expected=expected
    )

    def dcp1_here() -> Launched:
        start = time.perf_counter()
        base_case = build_case(scenario, 1, device, seed=seed, activations=act, expected=expected)
        return replace(launch(kernel, base_case), seconds=time.perf_counter() - start)

    apart = case_not_applicable(kernel, case) if group.world_size > 1 else None
    if apart is not None:  # every rank decides alike, on the same case, and launches none
        if not group.is_root:
            return None
        baseline = run_again(dcp1_here(), dcp1_here) if 1 in sizes else None
        return [
            judge(kernel, scenario, config, baseline, baseline)
            if n == 1 and baseline is not None
            else not_applicable_result(scenario, config, n, apart)
            for n in sizes
        ]
    own = _launch_own_rank(kernel, case, group.rank)
    gathered = group.gather_to_root(own, f"the gathering of {label} on rank 0")
    if gathered is None:
        return None
    group.progress.working(f"checking {label}")
    error, changes = _adopt(case, gathered)
    distributed = Launched(case, changes, error, time.perf_counter() - start)

    # Rank 0 is a whole DCP1 group by itself; it runs the baseline twice, as the simulated
    # mode does (runner.run_again). A failing DCPn case is not run again across the ranks.
    baseline = run_again(distributed if group.world_size == 1 else dcp1_here(), dcp1_here)
    if group.world_size == 1:
        distributed = baseline
    by_size = {1: baseline, group.world_size: distributed}
    return [judge(kernel, scenario, config, by_size[n], baseline) for n in sizes]
