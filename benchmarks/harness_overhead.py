"""Harness overhead: the wall time of one checked case divided by the GPU time of the work
it exists to do (the kernel launches of every rank plus the oracle).

A case here is what ``dcpcheck run --dcp 4`` does for one scenario: the DCP1 baseline and
the four DCP4 ranks launched, the oracle run once, every check of docs/dcp-contract.md applied.
Everything but the kernel and the oracle (seeded values, poisoned and guarded buffers,
snapshots, the checks, moving verdicts to the host) is overhead; the target is at most 3x
for 4096-token cases.

GPU time is read with the torch profiler (CUDA activity): the device time of the kernel's
launches, of the oracle's kernels, and of everything else the case put on the GPU. A second
table times the case's steps one by one (synchronized), to show where the wall time goes,
and a third counts the GPU kernels each step launches (each costs the host about 15 us to
launch, which bounds the small cases) and their GPU time (which bounds the large ones).

    PYTHONPATH=$PWD python3 benchmarks/harness_overhead.py   # on a CUDA device, from the checkout

(``PYTHONPATH``: the checkout is not installed on the GPU box; ``gpu_acceptance.sh`` sets it.)
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Callable
from contextlib import contextmanager

import torch
from torch.profiler import ProfilerActivity, profile

from dcpcheck.backend import select_backend
from dcpcheck.cases.dcp import Batch, Request
from dcpcheck.cases.verdicts import RunConfig
from dcpcheck.ops.fused_norm_rope.case import (
    build_case,
    make_activations,
    oracle_for,
    scenario_inputs,
)
from dcpcheck.ops.fused_norm_rope.case_checks import check_case
from dcpcheck.ops.fused_norm_rope.kernels import load_kernel
from dcpcheck.ops.fused_norm_rope.runner import launch_all, run_scenario
from dcpcheck.ops.fused_norm_rope.scenario import SCENARIOS, load_scenario

TEMPLATE = SCENARIOS / "glm5-prefill-512.toml"
CASES = (
    ("deepseek-v3.2", "fp8_ds_mla", 4096),
    ("glm-5", "auto", 4096),
    ("glm-5", "auto", 512),
    ("deepseek-v3.2", "fp8_ds_mla", 65536),
)
DCP = 4
KERNEL_NAME = "_fused_norm_rope_kernel"


def scenario_for(preset: str, layout: str, tokens: int):
    base = load_scenario(TEMPLATE)
    layout_value = next(c for c in type(base.cache_layout) if c.value == layout)
    return dataclasses.replace(
        base,
        name=f"{preset}-{layout}-{tokens}",
        preset=preset,
        cache_layout=layout_value,
        dcp_sizes=(DCP,),
        batch=Batch((Request(prefix=64, new=tokens),)),
        source=None,
    )


def wall_ms(fn: Callable[[], object]) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3


def device_ms(fn: Callable[[], object]) -> tuple[float, float, int]:
    """(ms in the kernel under test, ms in every other GPU kernel, GPU kernels launched)."""
    with device_profile() as found:
        fn()
    return found()


@contextmanager
def device_profile():
    """Profile the GPU activity inside; yields a function that returns, once left, what
    ``device_ms`` returns."""
    events = []
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Profiler clears events")
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            yield lambda: _split(events)
            torch.cuda.synchronize()
        events += prof.events()


def _split(events) -> tuple[float, float, int]:
    ours = other = 0.0
    count = 0
    for event in events:
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        count += 1
        if KERNEL_NAME in event.name:
            ours += event.device_time
        else:
            other += event.device_time
    return ours / 1e3, other / 1e3, count


def main() -> None:
    backend = select_backend("cuda")
    kernel = load_kernel("default")
    config = RunConfig("default", (DCP,))
    print(f"device: {backend.describe()}; one case = DCP1 baseline + DCP{DCP}, all checks")
    print(
        f"{'case':28} {'wall ms':>8} {'kernel ms':>9} {'oracle ms':>9} {'other ms':>8} "
        f"{'GPU kernels':>11} {'overhead':>8}"
    )
    steps, kernels = {}, {}
    for preset, layout, tokens in CASES:
        scenario = scenario_for(preset, layout, tokens)

        def case(s=scenario):
            return list(run_scenario(kernel, s, config, backend))

        case()  # compile, warm the allocator
        wall = min(wall_ms(case) for _ in range(3))
        kernel_ms, all_other_ms, launched = device_ms(case)
        act = make_activations(scenario, scenario.seed, backend.device)
        _, oracle_ms, _ = device_ms(lambda s=scenario, a=act: oracle_for(scenario_inputs(s, a)))
        print(
            f"{scenario.name:28} {wall:8.1f} {kernel_ms:9.3f} {oracle_ms:9.3f} "
            f"{all_other_ms - oracle_ms:8.3f} {launched:11d} "
            f"{wall / (kernel_ms + oracle_ms):7.1f}x"
        )
        steps[scenario.name] = step_times(kernel, scenario)
        kernels[scenario.name] = step_times(kernel, scenario, profiled=True)

    print("\nwhere the wall time goes (ms, each step synchronized)")
    print_steps(steps, "{:10.1f}")
    print("\nGPU kernels each step launches, and their GPU ms (one profiled run)")
    print_steps(kernels, "{0[0]:>4d} {0[1]:5.2f}")


def print_steps(steps: dict[str, dict], cell: str) -> None:
    names = list(next(iter(steps.values())))
    print(f"{'case':28} " + " ".join(f"{n:>10}" for n in names))
    for name, values in steps.items():
        print(f"{name:28} " + " ".join(f"{cell.format(values[n]):>10}" for n in names))


def step_times(kernel, scenario, profiled: bool = False) -> dict[str, object]:
    """``run_scenario``'s steps for one case, one by one: each step's wall ms, or with
    ``profiled`` (GPU kernels launched, their GPU ms)."""
    device, seed = torch.device("cuda"), scenario.seed
    times: dict[str, object] = {}

    @contextmanager
    def step(name: str):
        if profiled:
            with device_profile() as found:
                yield
            ours, other, count = found()
            times[name] = count, ours + other
            return
        torch.cuda.synchronize()
        start = time.perf_counter()
        yield
        torch.cuda.synchronize()
        times[name] = (time.perf_counter() - start) * 1e3

    with step("values"):
        act = make_activations(scenario, seed, device)
    with step("oracle"):
        expected = oracle_for(scenario_inputs(scenario, act))
    cases = {}
    for size in (1, DCP):
        with step(f"build dcp{size}"):
            cases[size] = build_case(scenario, size, device, activations=act, expected=expected)
        with step(f"launch dcp{size}"):
            launch_all(kernel, cases[size])
    with step("checks"):
        check_case(cases[DCP], cases[1], [])
    return times


if __name__ == "__main__":
    main()
