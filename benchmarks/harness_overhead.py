"""Harness overhead: the wall time of one checked case divided by the GPU time of the work
it exists to do (the kernel launches of every rank plus the oracle).

Everything else (allocating and poisoning buffers, random cache bytes, snapshots, the
checks, moving verdicts to the host) is overhead; the target is at most 3x for
4096-token cases.

    python3 benchmarks/harness_overhead.py           # on a CUDA device
"""

from __future__ import annotations

import dataclasses
import time

import torch
import triton

from dcpcheck.backend import select_backend
from dcpcheck.case import build_case, make_activations, run_oracle
from dcpcheck.dcp import Batch, Request
from dcpcheck.kernels import load_kernel
from dcpcheck.runner import RunConfig, run_scenario
from dcpcheck.scenario import SCENARIO_DIR, load_scenario

TEMPLATE = SCENARIO_DIR / "glm5-prefill-512.toml"


def scenario_for(preset: str, layout: str, tokens: int, dcp: int):
    base = load_scenario(TEMPLATE)
    layout_value = next(c for c in type(base.cache_layout) if c.value == layout)
    return dataclasses.replace(
        base,
        name=f"{preset}-{layout}-{tokens}",
        preset=preset,
        cache_layout=layout_value,
        dcp_sizes=(dcp,),
        batch=Batch((Request(prefix=64, new=tokens),)),
        source=None,
    )


def gpu_ms(fn) -> float:
    return triton.testing.do_bench(fn)


def main() -> None:
    backend = select_backend("cuda")
    kernel = load_kernel("default")
    print(f"device: {backend.describe()}")
    print(f"{'case':34} {'wall ms':>8} {'kernel ms':>9} {'oracle ms':>9} {'overhead':>8}")
    for preset, layout, tokens, dcp in (
        ("deepseek-v3.2", "fp8_ds_mla", 4096, 4),
        ("glm-5", "auto", 4096, 4),
        ("glm-5", "auto", 512, 4),
    ):
        scenario = scenario_for(preset, layout, tokens, dcp)
        config = RunConfig("default", (dcp,))
        list(run_scenario(kernel, scenario, config, backend))  # compile, warm allocator
        torch.cuda.synchronize()
        start = time.perf_counter()
        list(run_scenario(kernel, scenario, config, backend))
        torch.cuda.synchronize()
        wall = (time.perf_counter() - start) * 1e3

        act = make_activations(scenario, scenario.seed, backend.device)
        expected = run_oracle(scenario, act)
        cases = [
            build_case(scenario, n, backend.device, activations=act, expected=expected)
            for n in (1, dcp)
        ]
        launches = [r for case in cases for r in case.ranks]
        kernel_ms = sum(gpu_ms(lambda r=r: kernel(r.inputs, r.outputs, r.caches)) for r in launches)
        oracle_ms = gpu_ms(lambda s=scenario, a=act: run_oracle(s, a))
        print(
            f"{scenario.name + f'[dcp{dcp}]':34} {wall:8.1f} {kernel_ms:9.3f} "
            f"{oracle_ms:9.3f} {wall / (kernel_ms + oracle_ms):7.1f}x"
        )


if __name__ == "__main__":
    main()
