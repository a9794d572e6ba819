"""vLLM's ``triton_reshape_and_cache_flash`` (``dcpcheck.ops.reshape_and_cache_flash.vllm``),
judged in the releases where its file or what it handles changes, as ``dcpcheck run --op
reshape-and-cache-flash --kernel vllm==X`` judges it: 0.10.2 (no such function), 0.11.0
(its first file; contiguous 4-D caches only), 0.14.0 (moved under ``v1/``; the head-major
5-D key cache), 0.20.0 (heads addressed by their stride), 0.34.0. The wheels are the other
ops' (one download keeps every op's files), skipped only where the registry is
unreachable and the release is not cached.
"""

from __future__ import annotations

import functools

import pytest

from dcpcheck.cases.verdicts import CaseResult
from dcpcheck.kernels.loading import KernelLoadError
from dcpcheck.ops.reshape_and_cache_flash import kernels
from dcpcheck.ops.reshape_and_cache_flash.case import CacheWriteBatch
from dcpcheck.ops.reshape_and_cache_flash.runner import run_scenario
from dcpcheck.ops.reshape_and_cache_flash.scenario import CacheWriteScenario
from dcpcheck.ops.reshape_and_cache_flash.vllm import VllmCacheWrite
from tests.conftest import BACKEND, registry_problem

BATCH = CacheWriteBatch(((5, 3), (0, 2)), kv_heads=2, head_size=16, block_size=4, padding=1)


@functools.cache
def release(spec: str) -> VllmCacheWrite:
    """The kernel ``--kernel SPEC`` loads."""
    try:
        kernel = kernels.load(spec)
    except KernelLoadError as exc:
        problem = registry_problem()
        if problem is not None:
            pytest.skip(f"{spec} is not cached and the registry is unreachable: {problem}")
        raise AssertionError(f"the registry answers, yet {spec} did not load: {exc}") from exc
    assert isinstance(kernel, VllmCacheWrite)
    return kernel


def judge(spec: str, batch: CacheWriteBatch, size: int) -> CaseResult:
    scenario = CacheWriteScenario("t", "a test batch", batch, (size,))
    [result] = run_scenario(release(spec), spec, scenario, (size,), BACKEND.device)
    return result


def test_0_10_2_has_no_such_function():
    if registry_problem() is not None:
        pytest.skip("the registry is unreachable")
    with pytest.raises(KernelLoadError, match="defines triton_reshape_and_cache_flash"):
        kernels.load("vllm==0.10.2")


@pytest.mark.parametrize("version", ("0.11.0", "0.14.0", "0.20.0", "0.34.0"))
@pytest.mark.parametrize("kv_cache_dtype", ("auto", "fp8"))
def test_every_release_writes_exactly_its_own_tokens_under_dcp(version, kv_cache_dtype):
    batch = CacheWriteBatch(
        BATCH.requests, 2, 16, "float16", kv_cache_dtype, 0.5, 0.1, "nhd", 4, padding=1
    )
    for size in (1, 2, 4):
        result = judge(f"vllm=={version}", batch, size)
        assert result.status == "pass", result


@pytest.mark.parametrize(
    ("version", "layout", "applies"),
    [
        ("0.11.0", "head-major", False),
        ("0.11.0", "hnd", False),
        ("0.14.0", "head-major", True),
        ("0.14.0", "hnd", False),
        ("0.20.0", "hnd", True),
        ("0.34.0", "head-major", True),
    ],
)
def test_a_layout_is_asked_only_of_releases_whose_function_handles_it(version, layout, applies):
    from dataclasses import replace

    result = judge(f"vllm=={version}", replace(BATCH, layout=layout), 2)
    assert result.status == ("pass" if applies else "not_applicable"), result
