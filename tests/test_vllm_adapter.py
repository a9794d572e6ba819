"""vLLM's ``fused_norm_rope`` through the adapter, in both API shapes, on this machine.

The kernels are fixture files written here with vLLM's signatures (tests/fixtures): a
correct one and one with the PR-54908 flaw per shape. The harness's checks judge them
exactly as they judge a native kernel, with the adapter's limitations applied the way
the runner surfaces them (``adapters.apply_limitations``): a check an API cannot express
shows up as skipped with its reason. Also: the vLLM stand-ins (dcpcheck/shims) let the
in-place fixture, which imports ``vllm.platforms`` and ``vllm.triton_utils`` like vLLM's
own file, load without vLLM, and step aside when a real ``vllm`` is importable.
"""

from __future__ import annotations

import importlib.util
import inspect
import logging
import sys
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from dcpcheck import adapters, report
from dcpcheck.adapters.vllm import (
    NO_INDEX_K_OUTPUT,
    ONE_SLOT_MAPPING,
    ApiShape,
    VllmFusedNormRope,
    api_shape,
)
from dcpcheck.case import build_case, snapshot_inputs
from dcpcheck.checks import CheckResult, Finding
from dcpcheck.kernel_loading import load_kernel
from dcpcheck.runner import CaseResult, RunConfig, run_scenario
from dcpcheck.scenario import load_scenarios
from dcpcheck.shims.vllm.platforms import StandInPlatform
from tests.conftest import BACKEND
from tests.kernels_under_test import oracle_kernel

FIXTURES = Path(__file__).parent / "fixtures"
FILES = {
    ApiShape.IN_PLACE: FIXTURES / "vllm_inplace_api.py",
    ApiShape.SEPARATE_OUTPUTS: FIXTURES / "vllm_separate_outputs_api.py",
}
VLLM_INSTALLED = importlib.util.find_spec("vllm") is not None


def vllm_kernel(shape: ApiShape, function: str = "fused_norm_rope") -> VllmFusedNormRope:
    kernel = load_kernel(f"{FILES[shape]}:{function}")
    assert isinstance(kernel, VllmFusedNormRope)
    assert kernel.shape is shape
    return kernel


def judged(kernel, scenario_name: str, dcp_sizes: tuple[int, ...]) -> list[CaseResult]:
    """Run one scenario and surface the kernel's limitations as the runner does."""
    [scenario] = load_scenarios([scenario_name])
    results = []
    for result in run_scenario(kernel, scenario, RunConfig("fixture", dcp_sizes), BACKEND):
        case = build_case(scenario, result.dcp_size, BACKEND.device)
        limitations = adapters.kernel_limitations(kernel, [r.inputs for r in case.ranks])
        result.checks = adapters.apply_limitations(result.checks, limitations)
        if result.status != "error":
            result.status = "fail" if result.failed_checks else "pass"
        results.append(result)
    return results


def failures(result: CaseResult) -> set[tuple[str, str, str | None]]:
    return {(c.check, f.field, f.ownership) for c in result.failed_checks for f in c.findings}


SCENARIOS = [
    "decode-single-dcp4",
    "mixed-prefill-decode-padding",
    "fp8-cache",
    "fp8-ds-mla-cache",
    "fp16-interleaved-indexer",
    "indexer-replicated",
    "shared-layer-no-indexer",
    "profiling-call",
]


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("shape", list(ApiShape))
def test_correct_vllm_kernel_passes_every_check_it_can_express(shape, scenario):
    for result in judged(vllm_kernel(shape), scenario, (4,)):
        assert result.error is None
        assert failures(result) == set(), result.scenario
        assert result.status == "pass"


@pytest.mark.parametrize("scenario", ["decode-single-dcp4", "mixed-prefill-decode-padding"])
@pytest.mark.parametrize("shape", list(ApiShape))
def test_pr_54908_flaw_fails_outputs_on_kv_and_kpe_of_foreign_tokens(shape, scenario):
    flawed = vllm_kernel(shape, "fused_norm_rope_pre_54908")
    [dcp4] = [r for r in judged(flawed, scenario, (1, 4)) if r.dcp_size == 4]
    found = failures(dcp4)
    assert {check for check, _, _ in found} == {"outputs", "ranks_agree"}
    assert {(field, own) for check, field, own in found if check == "outputs"} == {
        ("kv_out", "foreign"),
        ("kpe_out", "foreign"),
    }


def test_pr_54908_flaw_is_invisible_without_dcp():
    flawed = vllm_kernel(ApiShape.SEPARATE_OUTPUTS, "fused_norm_rope_pre_54908")
    [dcp1] = judged(flawed, "mixed-prefill-decode-padding", (1,))
    assert dcp1.status == "pass"


def _spy(kernel: VllmFusedNormRope, seen: dict) -> VllmFusedNormRope:
    """The same vLLM function, recording the arguments the adapter hands it."""
    real = kernel.function

    def spy(**kwargs):
        seen.update(kwargs)
        return real(**kwargs)

    spy.__signature__ = inspect.signature(real)
    adapted = adapters.adapt(spy)
    assert isinstance(adapted, VllmFusedNormRope) and adapted.shape is kernel.shape
    return adapted


@pytest.mark.parametrize(
    ("scenario", "cache_dtype"),
    [("decode-single-dcp4", "elements"), ("fp8-cache", "bytes"), ("fp8-ds-mla-cache", "bytes")],
)
@pytest.mark.parametrize("shape", list(ApiShape))
def test_caches_are_handed_over_as_views_of_the_harness_buffers(shape, scenario, cache_dtype):
    [sc] = load_scenarios([scenario])
    launch = build_case(sc, 4, BACKEND.device).ranks[1]
    seen: dict = {}
    _spy(vllm_kernel(shape), seen)(launch.inputs, launch.outputs, launch.caches)
    mla = seen["mla_kv_cache"]
    assert mla.data_ptr() == launch.caches.mla.data_ptr()
    if cache_dtype == "elements":  # the kernel stores kv and k_pe as elements
        assert mla.dtype == launch.inputs.kv_c.dtype
        assert mla.shape[-1] == sc.model.kv_lora_rank + sc.model.rope_dim
    else:  # vLLM's wrapper views the bytes as fp8 (and fp32/bf16 for fp8_ds_mla) itself
        assert mla.dtype == torch.uint8
    assert seen["mla_kv_cache_dtype"] == sc.cache_layout.value
    if sc.has_indexer:
        assert seen["indexer_k_cache"].data_ptr() == launch.caches.index.data_ptr()
    assert seen["k_rope_cos_sin_cache"] is launch.inputs.cos_sin


def test_in_place_shape_writes_copies_and_reads_them_back():
    [sc] = load_scenarios(["mixed-prefill-decode-padding"])
    launch = build_case(sc, 2, BACKEND.device).ranks[0]
    before = snapshot_inputs(launch.inputs)
    seen: dict = {}
    _spy(vllm_kernel(ApiShape.IN_PLACE), seen)(launch.inputs, launch.outputs, launch.caches)
    assert seen["write_kv_output"] is True
    assert seen["kv_c"].data_ptr() != launch.inputs.kv_c.data_ptr()
    assert seen["k_pe"].data_ptr() != launch.inputs.k_pe.data_ptr()
    assert seen["indexer_slot_mapping"] is launch.inputs.index_slot_mapping
    assert torch.equal(launch.inputs.kv_c, before["kv_c"])
    assert torch.equal(launch.inputs.k_pe, before["k_pe"])
    assert torch.equal(launch.outputs.kv_out, seen["kv_c"])
    assert torch.equal(launch.outputs.kpe_out, seen["k_pe"])


def test_in_place_shape_reports_index_k_out_as_skipped_with_the_reason():
    [dcp4] = judged(vllm_kernel(ApiShape.IN_PLACE), "decode-single-dcp4", (4,))
    by_name = {c.check: c for c in dcp4.checks}
    assert by_name["outputs[index_k_out]"].skipped == NO_INDEX_K_OUTPUT.reason
    assert by_name["ranks_agree[index_k_out]"].skipped == NO_INDEX_K_OUTPUT.reason
    assert by_name["outputs"].passed  # q/kv/kpe were checked and pass
    doc = report.to_json([dcp4], kernel="fixture", backend="interpreter", partial=False)
    assert '"check": "outputs[index_k_out]"' in doc
    assert '"status": "skip"' in doc


def test_one_slot_mapping_shape_skips_the_replicated_indexer_cache_with_the_reason():
    results = judged(vllm_kernel(ApiShape.SEPARATE_OUTPUTS), "indexer-replicated", (1, 2))
    dcp1, dcp2 = sorted(results, key=lambda r: r.dcp_size)
    assert not [c for c in dcp1.checks if "[" in c.check]  # DCP1: one mapping serves both
    skipped = {c.check: c.skipped for c in dcp2.checks if "[" in c.check}
    assert set(skipped) >= {"cache_owned[index_cache]", "shards_reassemble[index_cache]"}
    assert set(skipped.values()) == {ONE_SLOT_MAPPING.reason}
    assert dcp2.status == "pass"  # the MLA cache and all outputs were still checked


@pytest.mark.parametrize(("dcp_size", "handed_over"), [(1, True), (2, False)])
def test_one_slot_mapping_shape_gets_the_indexer_cache_only_where_its_mapping_fits(
    dcp_size, handed_over
):
    [sc] = load_scenarios(["indexer-replicated"])
    launch = build_case(sc, dcp_size, BACKEND.device).ranks[0]
    seen: dict = {}
    kernel = _spy(vllm_kernel(ApiShape.SEPARATE_OUTPUTS), seen)
    kernel(launch.inputs, launch.outputs, launch.caches)
    assert (seen["indexer_k_cache"] is not None) == handed_over
    assert (ONE_SLOT_MAPPING in kernel.limitations(launch.inputs)) != handed_over


def test_apply_limitations_splits_a_check_by_field_and_never_counts_a_skip_as_passed():
    index_finding = Finding("index_cache.values", 1, "differs")
    mla_finding = Finding("mla_cache.kv", 1, "differs")
    results = [
        CheckResult("cache_owned", (index_finding, mla_finding)),
        CheckResult("topk"),
        CheckResult("ranks_agree", skipped="DCP1 is the baseline"),
    ]
    limitations = [
        adapters.Limitation(("cache_owned", "ranks_agree"), "index_cache", "one mapping"),
        adapters.Limitation(("topk",), None, "no top-k buffer"),
    ]
    adjusted = {c.check: c for c in adapters.apply_limitations(results, limitations)}
    assert adjusted["cache_owned"].findings == (mla_finding,)
    assert adjusted["cache_owned[index_cache]"].skipped == "one mapping"
    assert adjusted["topk"].skipped == "no top-k buffer"
    assert adjusted["ranks_agree"].skipped == "DCP1 is the baseline"
    assert "ranks_agree[index_cache]" not in adjusted
    assert not any(c.passed for c in adjusted.values() if c.skipped)


def test_a_protocol_kernel_has_no_limitations():
    launch = build_case(load_scenarios(["decode-single-dcp4"])[0], 4, BACKEND.device).ranks[0]
    assert adapters.kernel_limitations(oracle_kernel, [launch.inputs]) == ()


def _signature_of(*names: str):
    def function(**kwargs):
        pass

    params = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY) for n in names]
    function.__signature__ = inspect.Signature(params)
    return function


def test_shape_detection_needs_every_common_parameter_and_exactly_one_shape():
    common = inspect.signature(vllm_kernel(ApiShape.IN_PLACE).function).parameters
    base = [n for n in common if n not in ("indexer_slot_mapping", "write_kv_output")]
    assert api_shape(_signature_of(*base, "indexer_slot_mapping", "write_kv_output")) is (
        ApiShape.IN_PLACE
    )
    separate = ("kv_c_out", "k_pe_out", "index_k_out")
    assert api_shape(_signature_of(*base, *separate)) is ApiShape.SEPARATE_OUTPUTS
    assert api_shape(_signature_of(*base)) is None  # cache-only: no KV outputs at all
    both = _signature_of(*base, "indexer_slot_mapping", "write_kv_output", *separate)
    assert api_shape(both) is None
    assert api_shape(_signature_of(*base[1:], *separate)) is None
    assert api_shape(oracle_kernel) is None


@pytest.mark.skipif(VLLM_INSTALLED, reason="vllm is installed: the real package is used")
def test_stand_ins_load_a_vllm_kernel_file_without_vllm(caplog):
    with caplog.at_level(logging.WARNING, logger="dcpcheck.kernel_loading"):
        kernel = vllm_kernel(ApiShape.IN_PLACE)
    [message] = [r.getMessage() for r in caplog.records]
    assert "vllm is not installed" in message
    assert "stand-ins for vllm.platforms, vllm.triton_utils" in message
    bound = kernel.function.__globals__
    assert isinstance(bound["current_platform"], StandInPlatform)
    assert bound["triton"] is triton
    assert bound["tl"] is tl
    assert not [m for m in sys.modules if m.split(".")[0] == "vllm"]


def test_stand_in_platform_answers_launch_questions_from_torch():
    platform = StandInPlatform()
    assert platform.is_arch_support_pdl() is False
    assert platform.is_cuda() == (torch.cuda.is_available() and torch.version.cuda is not None)
    with pytest.raises(AttributeError, match=r"not part of dcpcheck's vllm\.platforms stand-in"):
        platform.get_device_name()


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch):
    """A minimal importable ``vllm`` package, standing for a real install."""
    package = tmp_path / "site" / "vllm"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "platforms.py").write_text(
        "class Platform:\n"
        "    def is_cuda(self):\n        return False\n"
        "    def is_rocm(self):\n        return False\n"
        "current_platform = Platform()\n"
    )
    (package / "triton_utils.py").write_text("import triton\nimport triton.language as tl\n")
    monkeypatch.syspath_prepend(str(package.parent))
    yield package
    for name in [m for m in sys.modules if m.split(".")[0] == "vllm"]:
        del sys.modules[name]


def test_a_real_vllm_install_wins_over_the_stand_ins(fake_vllm, caplog):
    with caplog.at_level(logging.WARNING, logger="dcpcheck.kernel_loading"):
        kernel = vllm_kernel(ApiShape.IN_PLACE)
    assert caplog.records == []
    platform = kernel.function.__globals__["current_platform"]
    assert type(platform).__module__ == "vllm.platforms"
    assert Path(sys.modules["vllm"].__file__).parent == fake_vllm
