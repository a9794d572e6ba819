"""vLLM's ``triton_reshape_and_cache_flash`` (``dcpcheck.ops.reshape_and_cache_flash.vllm``),
judged in one release of each caller group (``callers.GROUPS``), as ``dcpcheck run --op
reshape-and-cache-flash --kernel vllm==X`` judges it: 0.10.2 (no such function), 0.11.0
(contiguous 4-D caches only), 0.14.0 (ROCm's head-major 5-D key cache), 0.20.0 (the Triton
backend's HND stride order), 0.26.0 (the Triton backend's K and V halves of one cache, no
caller with contiguous heads), 0.34.0 (ROCm's segmented backend's contiguous heads again).
No backend that calls the function runs under DCP: every case above DCP1 is not
applicable. The wheels are the other
ops' (one download keeps every op's files), skipped only where the registry is
unreachable and the release is not cached.
"""

from __future__ import annotations

import functools
from dataclasses import replace

import pytest

from dcpcheck.cases.scenario_files import NamedBatch
from dcpcheck.cases.verdicts import CaseResult
from dcpcheck.kernels.loading import KernelLoadError
from dcpcheck.op_registry import RESHAPE_AND_CACHE_FLASH
from dcpcheck.ops import package
from dcpcheck.ops.reshape_and_cache_flash import kernels
from dcpcheck.ops.reshape_and_cache_flash.case import CacheWriteBatch
from dcpcheck.ops.reshape_and_cache_flash.vllm import VllmCacheWrite
from tests.conftest import BACKEND, registry_problem

BATCH = CacheWriteBatch(((5, 3), (0, 2)), kv_heads=2, head_size=16, block_size=4, padding=1)


@functools.cache
def release(spec: str) -> VllmCacheWrite:
    """The kernel ``--kernel SPEC`` loads."""
    try:
        kernel = kernels.REGISTRY.load(spec)
    except KernelLoadError as exc:
        problem = registry_problem()
        if problem is not None:
            pytest.skip(f"{spec} is not cached and the registry is unreachable: {problem}")
        raise AssertionError(f"the registry answers, yet {spec} did not load: {exc}") from exc
    assert isinstance(kernel, VllmCacheWrite)
    return kernel


def judge(spec: str, batch: CacheWriteBatch, size: int) -> CaseResult:
    scenario = NamedBatch("t", "a test batch", batch, (size,))
    run_scenario = package(RESHAPE_AND_CACHE_FLASH).run_scenario
    [result] = run_scenario(release(spec), spec, scenario, (size,), BACKEND.device)
    return result


def test_0_10_2_has_no_such_function():
    if registry_problem() is not None:
        pytest.skip("the registry is unreachable")
    with pytest.raises(KernelLoadError, match="defines triton_reshape_and_cache_flash"):
        kernels.REGISTRY.load("vllm==0.10.2")


GROUPS = ("0.11.0", "0.14.0", "0.20.0", "0.26.0", "0.34.0")

PASSED = {
    "0.11.0": {"nhd"},
    "0.14.0": {"nhd", "head-major"},
    "0.20.0": {"nhd", "hnd", "head-major"},
    "0.26.0": {"hnd", "head-major"},
    "0.34.0": {"nhd", "hnd", "head-major"},
}
"""The layouts some caller of each group's releases passes (``callers``)."""


@pytest.mark.parametrize("version", GROUPS)
@pytest.mark.parametrize("layout", ("nhd", "hnd", "head-major"))
@pytest.mark.parametrize("kv_cache_dtype", ("auto", "fp8"))
def test_a_layout_its_callers_pass_is_judged_at_dcp1_and_passes(version, layout, kv_cache_dtype):
    batch = replace(BATCH, kv_cache_dtype=kv_cache_dtype, k_scale=0.5, v_scale=0.1, layout=layout)
    result = judge(f"vllm=={version}", batch, 1)
    expected = "pass" if layout in PASSED[version] else "not_applicable"
    assert result.status == expected, result


@pytest.mark.parametrize("version", GROUPS)
def test_no_release_is_asked_a_case_above_dcp1(version):
    layout = sorted(PASSED[version])[0]
    result = judge(f"vllm=={version}", replace(BATCH, layout=layout), 2)
    assert result.status == "not_applicable", result
    assert "can_return_lse_for_decode" in str(result.error), result
