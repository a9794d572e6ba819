"""Compile a run's Triton binaries ahead of its cases, many at once.

On a GPU, a cold run spends most of its time in Triton's compiler: one binary per
specialization of each kernel, about 0.7 s each on an H200, one after the other as the
cases first launch them (9.1 s for the gate's 13 binaries, on an H200). Triton compiles
on threads where asked (``AsyncCompileMode``, Triton >= 3.4), and a good part of its
pipeline (LLVM, ``ptxas``) leaves the GIL: the same 13 binaries took 4.4 s on 16 threads.
What it needs is the launches up front, which only the cases know. So before the named
scenarios run, :func:`compile_ahead` goes through each of them once *dry*: it builds the
scenario's cases (DCP1 and each requested size) and calls the kernel under test on every
rank as a case would, while every Triton launch in the process is turned into a compile
request (``warmup=True``: Triton compiles, or loads from its cache, and launches nothing).
The binaries land in Triton's in-memory cache, where the cases' real launches find them.

Why dry runs rather than a list of specializations: the kernel under test is anyone's
(vLLM's, through an adapter, or a file), and only its own launch path knows which
constexprs and argument specializations it compiles; calling it is the one way that
holds for every kernel. What the dry pass does not cover, a case compiles when it
launches, as without it: nothing it does changes what a case computes or checks.

Only a kernel that declares ``triton_launches_only = True`` is run dry: one whose call
does nothing on the device but launch ``@triton.jit`` kernels (dcpcheck's own, made by
``launcher.make_kernel``). Any other kernel would run for real before its first case: a
kernel that hangs or crashes outside Triton would then do so before any case is
reported, and where isolation exists to report exactly that. vLLM's released files do not
qualify (one has a CuTe DSL path); they compile as their cases launch them.

The dry pass also launches the checks' own Triton kernel (``tolerance_kernel``) on each
scenario's DCP1 case, so its few binaries compile on the same threads. On a GPU the
seeded values are a Triton kernel too (``seeded_kernel``), so inside the dry pass they
are never drawn: its buffers hold whatever memory they were given. Nothing of the dry pass
is read for a verdict.

What it leaves alone besides, and why:

* Under Triton's interpreter (the CPU) there is nothing to compile.
* The plain gate on a GPU, once ``dcpcheck.gate_binaries`` has loaded every binary its
  list holds (the checks' kernels among them): the run does not call the dry pass.
* An autotuned kernel (``triton.autotune``) picks its configuration by timing real
  launches; a dry launch would time nothing and fix a wrong choice, so its dry call is
  stopped at the autotuner and it compiles as its cases launch it.
* A dry call that raises is left to its case to report (nothing of the dry pass is).
* A Triton older than 3.4 (no ``AsyncCompileMode``) compiles as the cases launch.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

from dcpcheck.backend import Backend
from dcpcheck.cases.verdicts import RunConfig
from dcpcheck.ops.fused_norm_rope import fused_checks
from dcpcheck.ops.fused_norm_rope.case import (
    build_case,
    make_activations,
    oracle_for,
    scenario_inputs,
)
from dcpcheck.ops.fused_norm_rope.contract import Kernel
from dcpcheck.ops.fused_norm_rope.runner import (
    KernelUnderTest,
    case_not_applicable,
    not_applicable_results,
    with_effective_ds_mla_scale,
)
from dcpcheck.ops.fused_norm_rope.scenario import Scenario
from dcpcheck.ops.session_cases import CaseRunner

COMPILE_THREADS = 8
"""Threads Triton compiles on (at most, and at most the CPUs): on the H200's 16 cores,
16 threads took the gate's 13 binaries in 4.4 s, 4 threads in 4.8 s, one in 9.1 s."""


TRITON_ONLY = "triton_launches_only"
"""The attribute by which a kernel declares that calling it only launches Triton kernels
(module docstring)."""


class _AutotunedLaunch(Exception):
    """Raised in place of an autotuner's run during the dry pass (module docstring)."""


def compile_ahead(
    kernel: KernelUnderTest, scenarios: Sequence[Scenario], config: RunConfig, backend: Backend
) -> None:
    """Compile, on threads, the Triton binaries the cases of ``scenarios`` will launch
    (module docstring); in the worker of an isolated kernel, there. Never raises for the
    kernel: a launch the dry pass cannot make is left to its case."""
    if isinstance(kernel, CaseRunner):
        kernel.compile_ahead(scenarios, config)
        return
    if backend.interpreted or not scenarios or not getattr(kernel, TRITON_ONLY, False):
        return
    with _launches_compile_only() as available:
        if available:
            for scenario in scenarios:
                _dry_run(kernel, scenario, config, backend)


def _dry_run(kernel: Kernel, scenario: Scenario, config: RunConfig, backend: Backend) -> None:
    """Every case of ``scenario`` built and every rank called once, as
    ``runner.run_scenario`` would, the outcome dropped."""
    scenario = with_effective_ds_mla_scale(scenario, config, kernel)
    seed = scenario.seed if config.seed is None else config.seed
    act = make_activations(scenario, seed, backend.device)
    inputs = scenario_inputs(scenario, act)
    sizes = sorted({1, *config.sizes_of(scenario)})
    if not_applicable_results(kernel, scenario, config, inputs, sizes):
        return
    expected = oracle_for(inputs)
    for dcp_size in sizes:
        case = build_case(
            scenario, dcp_size, backend.device, seed=seed, activations=act, expected=expected
        )
        if dcp_size != 1 and case_not_applicable(kernel, case):
            continue  # never launched by the run either
        for rank in case.ranks:
            try:
                kernel(rank.inputs, rank.outputs, rank.caches)
            except _AutotunedLaunch:
                return
            except (Exception, SystemExit):  # as runner.launch_all: its case reports it
                continue
        if dcp_size == 1:  # the checks' own binaries: one per output format
            fused_checks.launch_output_tolerances(case)


@contextlib.contextmanager
def _launches_compile_only() -> Iterator[bool]:
    """Inside: every Triton launch is a compile request on ``COMPILE_THREADS`` threads, an
    autotuner's raises ``_AutotunedLaunch``; on leaving, every requested binary is
    compiled. Yields False, changing nothing, where Triton has no ``AsyncCompileMode``."""
    from triton.runtime import autotuner, jit

    try:
        from triton.runtime._async_compile import AsyncCompileMode
    except ImportError:  # Triton < 3.4
        yield False
        return
    launch = jit.JITFunction.run
    tuned = autotuner.Autotuner.run

    def compile_only(self, *args, grid, warmup, **kwargs):
        return launch(self, *args, grid=grid, warmup=True, **kwargs)

    def stop_autotuner(self, *args, **kwargs):
        raise _AutotunedLaunch(f"{self.fn} is autotuned: compiled when its cases launch it")

    threads = min(COMPILE_THREADS, os.cpu_count() or 1)
    with ThreadPoolExecutor(threads, thread_name_prefix="dcpcheck-compile") as pool:
        compiling = AsyncCompileMode(pool)
        compiling.__enter__()
        jit.JITFunction.run, autotuner.Autotuner.run = compile_only, stop_autotuner
        try:
            yield True
        finally:
            jit.JITFunction.run, autotuner.Autotuner.run = launch, tuned
            # Waits for every compile. A binary that fails to compile is left pending in
            # Triton's cache; the case that launches it gets the error, as it would have.
            with contextlib.suppress(Exception):
                compiling.__exit__(None, None, None)
