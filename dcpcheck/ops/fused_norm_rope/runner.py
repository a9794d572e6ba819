"""Run a kernel over scenarios x DCP sizes, one simulated rank at a time, and check it.

For each scenario the DCP1 run is the baseline (checks 3 and 4 compare with it); each
requested DCP size then runs every rank with that rank's slot mapping, in one process
and on one device. The oracle runs once per scenario: its answer does not depend on the
DCP size. With ``RunConfig.oracle`` off (``--oracle off``) it still runs, cheap next to
the kernel, but whether a case passes never rests on it (``check_case``;
``checks.TokenEncodings`` says where it still names the token a stray write holds).

The kernel under test is either a protocol ``Kernel``, run in this process, or a
``session_cases.CaseRunner`` (``dcpcheck.harness.isolation.IsolatedKernel``) that runs
each whole case in a worker process and hands back its ``CaseResult`` s. ``run_scenario`` and
``dcpcheck.e2e.stream_case.token_stream_case`` take either, so every caller (the run, the
property search) gets isolation without knowing about it.

Each scenario runs with its fp8_ds_mla tile-scale rule resolved first
(:func:`effective_ds_mla_scale`, baked into the scenario by
:func:`with_effective_ds_mla_scale`), so the oracle, every rank's inputs, a saved failure
and its replay all use one rule.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TypeVar

import torch

from dcpcheck.backend import Backend
from dcpcheck.cases.verdicts import (
    OWNERSHIP_SHAPES,
    CaseResult,
    Finding,
    KernelError,
    RunConfig,
)
from dcpcheck.ops.fused_norm_rope import checks, determinism
from dcpcheck.ops.fused_norm_rope.adapters import kernel_limitations, kernel_not_applicable
from dcpcheck.ops.fused_norm_rope.case import (
    Case,
    build_case,
    make_activations,
    oracle_for,
    scenario_inputs,
)
from dcpcheck.ops.fused_norm_rope.case_checks import check_case
from dcpcheck.ops.fused_norm_rope.contract import (
    CacheLayout,
    DsMlaScale,
    FusedOpInputs,
    FusedOpOutputs,
    Kernel,
)
from dcpcheck.ops.fused_norm_rope.input_snapshot import snapshot_inputs
from dcpcheck.ops.fused_norm_rope.limitations import apply_limitations
from dcpcheck.ops.fused_norm_rope.scenario import Scenario
from dcpcheck.ops.session_cases import CaseRunner, LaunchWatcher


def declared_ds_mla_scale(kernel: object) -> DsMlaScale | None:
    """The fp8_ds_mla tile-scale rule ``kernel`` says it writes, or None if it says none.

    A kernel declares it with a ``ds_mla_scale`` attribute (a ``DsMlaScale`` or its value):
    a release adapter sets it for the releases it wraps, since a kernel's API does not say
    which rule its code writes. ``ValueError`` for anything else, so a typo in a
    declaration is not quietly read as "no rule".
    """
    declared = getattr(kernel, "ds_mla_scale", None)
    if declared is None or isinstance(declared, DsMlaScale):
        return declared
    try:
        return DsMlaScale(declared)
    except ValueError:
        known = ", ".join(repr(rule.value) for rule in DsMlaScale)
        raise ValueError(
            f"the kernel declares ds_mla_scale = {declared!r}; expected one of {known}"
        ) from None


DS_MLA_SCALE_OPTION = "ds-mla-scale"
"""The run's option naming the rule (its value in ``RunConfig.demands``)."""


def effective_ds_mla_scale(scenario: Scenario, config: RunConfig, kernel: object) -> DsMlaScale:
    """The fp8_ds_mla tile-scale rule a case of ``scenario`` demands of ``kernel``.

    Precedence, first that names one: the run's ``--ds-mla-scale`` (``config``), the
    kernel's own declaration (:func:`declared_ds_mla_scale`), the scenario's
    ``ds_mla_scale`` key, then the op document's default ``amax``. The option is the user's explicit
    ask for this run. A declaration is a fact of the kernel - a released vLLM kernel writes
    the rule its source writes (dcpcheck.kernels.releases), so the release is judged by its own
    rule on every scenario. A scenario's key (written to test a rule, or saved from a
    failure) decides for the kernels that write whatever they are asked, as the project's
    kernel does.

    ``kernel`` is what the runner holds: a protocol kernel, or an ``IsolatedKernel``,
    which carries its worker's kernel's declaration (``dcpcheck.harness.isolation``), so the
    parent and the worker resolve alike.
    """
    asked = dict(config.demands).get(DS_MLA_SCALE_OPTION)
    option = None if asked is None else DsMlaScale(asked)
    for rule in (option, declared_ds_mla_scale(kernel), scenario.ds_mla_scale):
        if rule is not None:
            return rule
    return DsMlaScale.AMAX


def with_effective_ds_mla_scale(scenario: Scenario, config: RunConfig, kernel: object) -> Scenario:
    """``scenario`` as it runs: an fp8_ds_mla one with its effective tile-scale rule written
    into ``ds_mla_scale`` (so the cases, a saved failure and its replay use that rule); a
    scenario of another layout unchanged (it has no tile scales, and may not name a rule)."""
    if scenario.cache_layout is not CacheLayout.FP8_DS_MLA:
        return scenario
    rule = effective_ds_mla_scale(scenario, config, kernel)
    if scenario.ds_mla_scale is rule:
        return scenario
    return dataclasses.replace(scenario, ds_mla_scale=rule)


KernelUnderTest = Kernel | CaseRunner
"""What the runner accepts: a protocol kernel run here, or a ``CaseRunner``."""

Buffers = TypeVar("Buffers", FusedOpInputs, FusedOpOutputs)


def own_handles(buffers: Buffers) -> Buffers:
    """A copy of ``buffers`` (inputs or outputs) whose tensors are new objects over the
    same memory, for the kernel to be called with.

    The kernel reads and writes through them exactly as through the originals, but
    rebinding a field (``outputs.kv_out = ...``) or changing a tensor's shape in place
    (``resize_``) changes only its copy. The checks read the harness's own tensors, so such
    a kernel fails them (its outputs unwritten) instead of breaking them. Each keeps its
    strides exactly (``view_as`` would make a one-row slice's row stride its width, which
    a kernel reading ``stride(0)`` would see; ``activation_rows``).
    """
    tensors = {
        name: value.as_strided(value.shape, value.stride(), value.storage_offset())
        for name, value in vars(buffers).items()
        if isinstance(value, torch.Tensor)
    }
    return dataclasses.replace(buffers, **tensors)


LAUNCH_WATCHER: LaunchWatcher = ContextVar("LAUNCH_WATCHER", default=None)
"""Called as ``watcher(case_label, rank, started)`` right before (``started`` True) and
right after each rank's kernel call, when set: how a tool that watches the process from
outside (compute-sanitizer, in the isolated worker) learns which case and rank each of its
reports belongs to."""


def launch_all(kernel: Kernel, case: Case) -> list[Finding]:
    """Launch every rank in order; return the inputs any launch modified (then restored)."""
    changes = []
    watcher = LAUNCH_WATCHER.get()
    for launch in case.ranks:
        before = snapshot_inputs(launch.inputs)
        if watcher is not None:
            watcher(case.label, launch.rank, True)
        try:
            kernel(own_handles(launch.inputs), own_handles(launch.outputs), launch.caches)
        # Any exception of the kernel under test is its failure, sys.exit() included; only
        # Ctrl-C (KeyboardInterrupt) stops the run.
        except (Exception, SystemExit) as exc:
            raise KernelError(f"rank {launch.rank}: {type(exc).__name__}: {exc}") from exc
        finally:
            if watcher is not None:
                watcher(case.label, launch.rank, False)
        found = checks.input_changes(launch, before)
        for finding in found:
            getattr(launch.inputs, finding.field).copy_(before.original(finding.field))
        changes += found
    return changes


def _ownership_shapes(case: Case) -> dict[str, int]:
    """How many rank launches saw an all-negative, mixed or fully-owned slot mapping."""
    shapes = dict.fromkeys(OWNERSHIP_SHAPES, 0)
    real = case.mappings.owner >= 0
    for rank in range(case.dcp_size):
        owned = (case.mappings.per_rank[rank] >= 0) & real
        if not owned.any():
            shapes["all_negative"] += 1
        elif bool(owned.sum() == real.sum()):
            shapes["fully_owned"] += 1
        else:
            shapes["mixed"] += 1
    return shapes


@dataclass
class Launched:
    """A case after its launch: what :func:`judge` reads. ``error`` is the kernel's
    exception as ``launch_all`` words it (then ``changes`` is empty); ``moved``, once the
    case was run again (:func:`run_again`), what differed from its first run."""

    case: Case
    changes: list[Finding]
    error: str | None
    seconds: float
    moved: list[Finding] = field(default_factory=list)


CONFIRMING_RUNS = 3
"""How many more times a failing case, and its baseline, are run before the failure is
reported as the kernel's DCP behaviour. One more run is not enough: a kernel that moves
one element in one call of ten repeats its own nudge on a rerun often enough (one case in
fourteen at DCP4) that a whole run of such a kernel usually reports a false DCP divergence
somewhere; three reruns of the case and of its baseline, each compared byte for byte with
the first, bring that below one run in a hundred. Only failing cases pay for it."""


def run_again(first: Launched, again: Callable[[], Launched], times: int = 1) -> Launched:
    """``first`` with what moved when its case was built and launched ``again``, up to
    ``times`` more times (``determinism.launch_differences`` against the first run; the
    first run that differs ends it). A rerun that raises where the first did not is a
    difference too. ``first`` unchanged if it raised (nothing to compare)."""
    if first.error is not None:
        return first
    seconds = first.seconds
    moved: list[Finding] = []
    for _ in range(times):
        rerun = again()
        seconds += rerun.seconds
        if rerun.error is not None:
            moved = [Finding("launch", None, f"a second run raised: {rerun.error}")]
        else:
            moved = determinism.launch_differences(first.case, rerun.case)
        if moved:
            break
    return dataclasses.replace(first, moved=first.moved + moved, seconds=seconds)


def launch(kernel: Kernel, case: Case) -> Launched:
    """Launch every rank of ``case`` (``launch_all``), timed, the kernel's error kept."""
    start = time.perf_counter()
    try:
        changes = launch_all(kernel, case)
    except KernelError as exc:
        return Launched(case, [], str(exc), time.perf_counter() - start)
    return Launched(case, changes, None, time.perf_counter() - start)


def judge(
    kernel: object, scenario: Scenario, config: RunConfig, launched: Launched, baseline: Launched
) -> CaseResult:
    """The verdict of one launched case against its DCP1 ``baseline``: the one place a case
    is judged, whether its ranks ran here (:func:`run_scenario`, the isolated worker, the
    pytest plugin) or in separate processes (``dcpcheck.distributed``).

    The contract checks (``check_case``), with what ``kernel``'s adapter cannot express
    reported as skipped, then ``deterministic``: what moved between two runs of the
    baseline and, if the case was run twice, of the case. Anything moved makes the case
    ``nondeterministic`` whatever else failed: its other findings may be that noise. An
    error of this case or of its baseline is the verdict instead.
    """
    case = launched.case
    result = CaseResult(
        scenario.name,
        case.dcp_size,
        "pass",
        replay=config.replay_command(scenario, case.dcp_size),
        ownership=_ownership_shapes(case),
    )
    start = time.perf_counter()
    if launched.error is not None:
        result.status, result.error = "error", launched.error
    elif baseline.error is not None:
        result.status = "error"
        result.error = f"the DCP1 baseline run failed: {baseline.error}"
    else:
        result.checks = apply_limitations(
            check_case(case, baseline.case, launched.changes, config.oracle),
            kernel_limitations(kernel, [rank.inputs for rank in case.ranks]),
        )
        moved = baseline.moved + (launched.moved if launched is not baseline else [])
        result.checks.append(determinism.check_deterministic(moved))
        if moved:
            result.status = "nondeterministic"
            result.error = determinism.describe(moved)
        elif result.failed_checks:
            result.status = "fail"
    result.seconds = launched.seconds + time.perf_counter() - start
    return result


def not_applicable_results(
    kernel: object,
    scenario: Scenario,
    config: RunConfig,
    inputs: FusedOpInputs,
    sizes: Sequence[int],
) -> list[CaseResult]:
    """One ``not_applicable`` result per DCP size when ``kernel`` cannot run ``scenario``
    on this machine (``adapters.protocol.kernel_not_applicable``), else none: the case is
    then never built nor launched, whether its ranks run here or apart."""
    reason = kernel_not_applicable(kernel, inputs)
    if reason is None:
        return []
    return [not_applicable_result(scenario, config, n, reason) for n in sizes]


def not_applicable_result(
    scenario: Scenario, config: RunConfig, dcp_size: int, reason: str
) -> CaseResult:
    """The case of ``scenario`` at ``dcp_size`` reported ``not_applicable`` for ``reason``:
    never launched, never a pass."""
    return CaseResult(
        scenario.name,
        dcp_size,
        "not_applicable",
        error=reason,
        replay=config.replay_command(scenario, dcp_size),
    )


def case_not_applicable(kernel: object, case: Case) -> str | None:
    """Why ``kernel`` cannot be asked ``case`` as its ranks' launches stand, or None: an
    adapter's ``not_applicable`` on any rank's inputs, which carry that rank's slot mappings
    (what a release's callers never pass may lie there, as an indexer mapping whose ranks
    differ from the MLA mapping's). The baseline is launched all the same: the other DCP
    sizes are judged against it."""
    reasons = (kernel_not_applicable(kernel, rank.inputs) for rank in case.ranks)
    return next((reason for reason in reasons if reason is not None), None)


def run_scenario(
    kernel: KernelUnderTest, scenario: Scenario, config: RunConfig, backend: Backend
) -> Iterator[CaseResult]:
    """Yield one ``CaseResult`` per DCP size of ``scenario`` (DCP1 baseline run first)."""
    scenario = with_effective_ds_mla_scale(scenario, config, kernel)
    if isinstance(kernel, CaseRunner):
        yield from kernel.run_cases(scenario, config)
        return
    seed = scenario.seed if config.seed is None else config.seed
    act = make_activations(scenario, seed, backend.device)
    inputs = scenario_inputs(scenario, act)
    skipped = not_applicable_results(kernel, scenario, config, inputs, config.sizes_of(scenario))
    if skipped:
        yield from skipped
        return
    expected = oracle_for(inputs)

    def built(dcp_size: int) -> tuple[float, Case]:
        start = time.perf_counter()  # a case's time includes building its buffers
        case = build_case(
            scenario, dcp_size, backend.device, seed=seed, activations=act, expected=expected
        )
        return start, case

    def launched(dcp_size: int, ready: tuple[float, Case] | None = None) -> Launched:
        start, case = built(dcp_size) if ready is None else ready
        return dataclasses.replace(launch(kernel, case), seconds=time.perf_counter() - start)

    # The baseline runs twice; a failing case, and its baseline, CONFIRMING_RUNS more times
    # before it is reported: a kernel whose runs differ is nondeterministic, not
    # DCP-dependent (``determinism``).
    baseline = run_again(launched(1), lambda: launched(1))
    baseline_confirmed = False
    for dcp_size in config.sizes_of(scenario):
        ready = None if dcp_size == 1 else built(dcp_size)
        reason = case_not_applicable(kernel, baseline.case if ready is None else ready[1])
        if reason is not None:
            yield not_applicable_result(scenario, config, dcp_size, reason)
            continue
        case = baseline if ready is None else launched(dcp_size, ready)
        result = judge(kernel, scenario, config, case, baseline)
        if result.status == "fail" and case is not baseline:
            if not baseline_confirmed and not baseline.moved:
                baseline = run_again(baseline, lambda: launched(1), CONFIRMING_RUNS)
                baseline_confirmed = True
            case = run_again(case, lambda size=dcp_size: launched(size), CONFIRMING_RUNS)
            if case.moved or baseline.moved:
                result = judge(kernel, scenario, config, case, baseline)
        yield result


def run(
    kernel: KernelUnderTest,
    scenarios: Sequence[Scenario],
    config: RunConfig,
    backend: Backend,
    on_result: Callable[[CaseResult], None] | None = None,
) -> list[CaseResult]:
    """Run every scenario; ``on_result`` sees each result as it lands (progress, partial
    reports). Stops after the first failing case when ``config.fail_fast``."""
    results: list[CaseResult] = []
    for scenario in scenarios:
        for result in run_scenario(kernel, scenario, config, backend):
            results.append(result)
            if on_result is not None:
                on_result(result)
            if config.fail_fast and result.failed:
                return results
    return results
