"""vLLM's ``fused_norm_rope`` through the adapter, in its API shapes, on this machine.

The kernels are fixture files written here with vLLM's signatures (tests/fixtures): a
correct one and one with the PR-54908 flaw per shape. The harness's checks judge them
exactly as they judge a native kernel, with the adapter's limitations applied the way
the runner surfaces them (``apply_limitations``): a check an API cannot express
shows up as skipped with its reason. Also: the vLLM stand-ins (dcpcheck/adapters/shims) let the
in-place fixture, which imports ``vllm.platforms`` and ``vllm.triton_utils`` like vLLM's
own file, load without vLLM, and step aside when a real ``vllm`` is importable.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import logging
import sys
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from dcpcheck.adapters.protocol import Limitation
from dcpcheck.adapters.shims.vllm.platforms import StandInPlatform
from dcpcheck.cases.verdicts import CaseResult, CheckResult, Finding, RunConfig
from dcpcheck.op_registry import FUSED_NORM_ROPE
from dcpcheck.ops.fused_norm_rope import adapters, indexer_groups
from dcpcheck.ops.fused_norm_rope.adapters import kernel_limitations
from dcpcheck.ops.fused_norm_rope.case import build_case
from dcpcheck.ops.fused_norm_rope.contract import DsMlaScale
from dcpcheck.ops.fused_norm_rope.input_snapshot import snapshot_inputs
from dcpcheck.ops.fused_norm_rope.kernels import load_kernel
from dcpcheck.ops.fused_norm_rope.limitations import apply_limitations
from dcpcheck.ops.fused_norm_rope.runner import run_scenario
from dcpcheck.ops.fused_norm_rope.scenario import load_scenarios
from dcpcheck.ops.fused_norm_rope.vllm import (
    INDEX_K_OUT_NOT_REQUESTED,
    NO_INDEX_K_OUTPUT,
    NO_KPE_OUTPUT,
    NO_KV_OUTPUTS,
    NO_OUTPUTS_WITHOUT_SLOTS,
    ONE_SLOT_MAPPING,
    ApiShape,
    VllmFusedNormRope,
    api_shape,
    tile_scale_rule,
)
from dcpcheck.output import report
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
        limitations = kernel_limitations(kernel, [r.inputs for r in case.ranks])
        result.checks = apply_limitations(result.checks, limitations)
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
@pytest.mark.parametrize("shape", list(FILES))
def test_correct_vllm_kernel_passes_every_check_it_can_express(shape, scenario):
    for result in judged(vllm_kernel(shape), scenario, (4,)):
        assert result.error is None
        assert failures(result) == set(), result.scenario
        assert result.status == "pass"


@pytest.mark.parametrize("scenario", ["decode-single-dcp4", "mixed-prefill-decode-padding"])
@pytest.mark.parametrize("shape", list(FILES))
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
@pytest.mark.parametrize("shape", list(FILES))
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
    assert torch.equal(launch.inputs.kv_c, before.original("kv_c"))
    assert torch.equal(launch.inputs.k_pe, before.original("k_pe"))
    assert torch.equal(launch.outputs.kv_out, seen["kv_c"])
    assert torch.equal(launch.outputs.kpe_out, seen["k_pe"])


def test_in_place_shape_reports_index_k_out_as_skipped_with_the_reason():
    [dcp4] = judged(vllm_kernel(ApiShape.IN_PLACE), "decode-single-dcp4", (4,))
    by_name = {c.check: c for c in dcp4.checks}
    assert by_name["outputs[index_k_out]"].skipped == NO_INDEX_K_OUTPUT.reason
    assert by_name["ranks_agree[index_k_out]"].skipped == NO_INDEX_K_OUTPUT.reason
    assert by_name["outputs"].passed  # q/kv/kpe were checked and pass
    doc = report.to_json(
        [dcp4], kernel="fixture", backend="interpreter", partial=False, op=FUSED_NORM_ROPE
    )
    assert '"check": "outputs[index_k_out]"' in doc
    assert '"status": "skip"' in doc


def test_one_slot_mapping_shape_skips_the_replicated_indexer_cache_with_the_reason():
    results = judged(vllm_kernel(ApiShape.SEPARATE_OUTPUTS), "indexer-replicated", (1, 2))
    dcp1, dcp2 = sorted(results, key=lambda r: r.dcp_size)
    assert not [c for c in dcp1.checks if "[index_cache]" in c.check]  # one mapping serves both
    skipped = {c.check: c.skipped for c in dcp2.checks if "[index_cache]" in c.check}
    assert set(skipped) >= {"cache_owned[index_cache]", "shards_reassemble[index_cache]"}
    assert set(skipped.values()) == {ONE_SLOT_MAPPING.reason}
    assert dcp2.status == "pass"  # the MLA cache and all outputs were still checked


@pytest.mark.parametrize("dcp_size", [1, 2])
def test_one_slot_mapping_shape_gets_the_indexer_cache_as_its_caller_passes_it(dcp_size):
    [sc] = load_scenarios(["indexer-replicated"])
    launch = build_case(sc, dcp_size, BACKEND.device).ranks[0]
    seen: dict = {}
    kernel = _spy(vllm_kernel(ApiShape.SEPARATE_OUTPUTS), seen)
    kernel(launch.inputs, launch.outputs, launch.caches)
    assert seen["indexer_k_cache"].data_ptr() == launch.caches.index.data_ptr()
    assert seen["slot_mapping"] is launch.inputs.slot_mapping
    # the one mapping addresses the replicated indexer only where the two agree (DCP1)
    assert (ONE_SLOT_MAPPING in kernel.limitations(launch.inputs)) == (dcp_size > 1)


def _by_size(kernel, scenario_name: str, dcp_sizes: tuple[int, ...]) -> dict[int, CaseResult]:
    """One scenario as ``run_scenario`` yields it, by DCP size, statuses as they come."""
    [scenario] = load_scenarios([scenario_name])
    results = run_scenario(kernel, scenario, RunConfig("fixture", dcp_sizes), BACKEND)
    return {result.dcp_size: result for result in results}


def _indexer_gated() -> VllmFusedNormRope:
    return vllm_kernel(ApiShape.IN_PLACE, "fused_norm_rope_indexer_gated")


def test_a_file_that_gates_the_indexer_on_the_mla_slot_fails_a_replicated_indexer():
    """Named by its path, a kernel has no release's callers: it is judged on an indexer
    mapping whose ranks differ from the MLA mapping's, and loses the entries of the tokens
    another rank owns in the MLA cache."""
    gated = _indexer_gated()
    assert gated.release is None
    results = _by_size(gated, "indexer-replicated", (1, 2))
    assert results[1].status == "pass"
    assert results[2].status == "fail"
    found = {(check, field) for check, field, _ in failures(results[2])}
    assert ("cache_owned", "index_cache.values") in found


def test_a_release_is_not_asked_an_indexer_whose_ranks_differ_from_the_mla_mappings():
    """Carrying a release, the same kernel is not asked what that release's callers never
    pass (``indexer_groups``): N/A under DCP with the release's lines, never launched,
    never passed; DCP1, where the two mappings agree, and a sharded indexer are judged."""
    gated = dataclasses.replace(_indexer_gated(), release="0.33.0")
    results = _by_size(gated, "indexer-replicated", (1, 2, 4))
    assert results[1].status == "pass" and results[1].checks
    for size in (2, 4):
        assert results[size].status == "not_applicable"
        assert not results[size].checks and not results[size].failed
        assert results[size].error == indexer_groups.apart_never_passed("0.33.0")
    assert "deepseek_v32/attention.py:326,328" in results[2].error
    assert _by_size(gated, "decode-single-dcp4", (4,))[4].status == "pass"


@pytest.mark.parametrize("version", [None, "0.29.0", "0.35.0"])
def test_only_the_releases_whose_callers_are_read_are_spared_an_indexer_apart(version):
    assert indexer_groups.apart_never_passed(version) is None
    gated = dataclasses.replace(_indexer_gated(), release=version)
    assert _by_size(gated, "indexer-replicated", (2,))[2].status == "fail"


def test_apply_limitations_splits_a_check_by_field_and_never_counts_a_skip_as_passed():
    index_finding = Finding("index_cache.values", 1, "differs")
    mla_finding = Finding("mla_cache.kv", 1, "differs")
    results = [
        CheckResult("cache_owned", (index_finding, mla_finding)),
        CheckResult("topk"),
        CheckResult("ranks_agree", skipped="DCP1 is the baseline"),
    ]
    limitations = [
        Limitation(("cache_owned", "ranks_agree"), "index_cache", "one mapping"),
        Limitation(("topk",), None, "no top-k buffer"),
    ]
    adjusted = {c.check: c for c in apply_limitations(results, limitations)}
    assert adjusted["cache_owned"].findings == (mla_finding,)
    assert adjusted["cache_owned[index_cache]"].skipped == "one mapping"
    assert adjusted["topk"].skipped == "no top-k buffer"
    assert adjusted["ranks_agree"].skipped == "DCP1 is the baseline"
    assert "ranks_agree[index_cache]" not in adjusted
    assert not any(c.passed for c in adjusted.values() if c.skipped)


def test_a_protocol_kernel_has_no_limitations():
    launch = build_case(load_scenarios(["decode-single-dcp4"])[0], 4, BACKEND.device).ranks[0]
    assert kernel_limitations(oracle_kernel, [launch.inputs]) == ()


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
    assert api_shape(_signature_of(*base)) is ApiShape.Q_OUTPUT_ONLY  # 0.28.0: Q output only
    both = _signature_of(*base, "indexer_slot_mapping", "write_kv_output", *separate)
    assert api_shape(both) is None
    assert api_shape(_signature_of(*base[1:], *separate)) is None
    assert api_shape(oracle_kernel) is None


@pytest.mark.skipif(VLLM_INSTALLED, reason="vllm is installed: the real package is used")
def test_stand_ins_load_a_vllm_kernel_file_without_vllm(caplog):
    with caplog.at_level(logging.WARNING, logger="dcpcheck.kernels.loading"):
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
    with caplog.at_level(logging.WARNING, logger="dcpcheck.kernels.loading"):
        kernel = vllm_kernel(ApiShape.IN_PLACE)
    assert caplog.records == []
    platform = kernel.function.__globals__["current_platform"]
    assert type(platform).__module__ == "vllm.platforms"
    assert Path(sys.modules["vllm"].__file__).parent == fake_vllm


SEPARATE = ("kv_c_out", "k_pe_out", "index_k_out")


def _recording(*extra: str) -> tuple[VllmFusedNormRope, list[dict]]:
    """An adapted stand-in with vLLM's common parameters plus ``extra``, recording each
    call's arguments instead of computing anything."""
    common = inspect.signature(vllm_kernel(ApiShape.IN_PLACE).function).parameters
    names = [n for n in common if n not in ("indexer_slot_mapping", "write_kv_output")]
    calls: list[dict] = []

    def record(**kwargs):
        calls.append(kwargs)

    record.__signature__ = _signature_of(*names, *extra).__signature__
    adapted = adapters.adapt(record)
    assert isinstance(adapted, VllmFusedNormRope)
    return adapted, calls


def _launch(scenario: str, dcp_size: int, rank: int = 0):
    [sc] = load_scenarios([scenario])
    return build_case(sc, dcp_size, BACKEND.device).ranks[rank]


@pytest.mark.parametrize(
    ("extra", "shape", "passed"),
    [
        ((), ApiShape.Q_OUTPUT_ONLY, set()),  # 0.28.0
        (SEPARATE, ApiShape.SEPARATE_OUTPUTS, set()),  # 0.29.0
        ((*SEPARATE, "indexer_slot_mapping"), ApiShape.SEPARATE_OUTPUTS, {"indexer_slot_mapping"}),
        (
            (*SEPARATE, "indexer_slot_mapping", "indexer_cache_shuffled"),  # 0.31.0, 0.32.0
            ApiShape.SEPARATE_OUTPUTS,
            {"indexer_slot_mapping", "indexer_cache_shuffled"},
        ),
        (
            (*SEPARATE, "indexer_slot_mapping", "indexer_cache_shuffled", "skip_scale"),  # 0.33.0
            ApiShape.SEPARATE_OUTPUTS,
            {"indexer_slot_mapping", "indexer_cache_shuffled", "skip_scale"},
        ),
    ],
)
def test_each_released_shape_gets_the_optional_arguments_its_caller_passes(extra, shape, passed):
    kernel, calls = _recording(*extra)
    assert kernel.shape is shape
    launch = _launch("indexer-replicated", 2)
    kernel(launch.inputs, launch.outputs, launch.caches)
    [call] = calls
    optional = {"indexer_slot_mapping", "indexer_cache_shuffled", "skip_scale"}
    assert optional & set(call) == passed
    assert call["indexer_k_cache"].data_ptr() == launch.caches.index.data_ptr()  # always
    if "indexer_slot_mapping" in passed:
        assert call["indexer_slot_mapping"] is launch.inputs.index_slot_mapping
    assert (ONE_SLOT_MAPPING in kernel.limitations(launch.inputs)) == (
        "indexer_slot_mapping" not in passed
    )
    if "indexer_cache_shuffled" in passed:
        assert call["indexer_cache_shuffled"] is False  # NVIDIA's indexer reads the plain layout
    if "skip_scale" in passed:
        assert call["skip_scale"] is True  # no fp8 scale: the caller's k_scale is 1.0
    assert call["mla_k_scale"].tolist() == [1.0]
    if shape is ApiShape.Q_OUTPUT_ONLY:
        assert not set(SEPARATE) & set(call)
    else:
        assert call["kv_c_out"] is launch.outputs.kv_out
        assert call["index_k_out"] is None  # the caller asks for it only without slots


def test_skip_scale_follows_the_per_tensor_scale_as_the_caller_sets_it():
    kernel, calls = _recording(*SEPARATE, "indexer_slot_mapping", "skip_scale")
    launch = _launch("fp8-cache", 2)
    kernel(launch.inputs, launch.outputs, launch.caches)
    assert launch.inputs.mla_scale not in (None, 1.0)
    assert calls[0]["skip_scale"] is False
    assert calls[0]["mla_k_scale"].item() == pytest.approx(launch.inputs.mla_scale)


def test_index_k_out_is_requested_on_the_call_without_slot_mapping():
    kernel, calls = _recording(*SEPARATE, "indexer_slot_mapping")
    launch = _launch("profiling-call", 1)
    kernel(launch.inputs, launch.outputs, launch.caches)
    assert calls[0]["index_k_out"] is launch.outputs.index_k_out
    assert calls[0]["mla_kv_cache"] is None and calls[0]["indexer_k_cache"] is None
    assert INDEX_K_OUT_NOT_REQUESTED not in kernel.limitations(launch.inputs)
    with_slots = _launch("decode-single-dcp4", 4)
    assert INDEX_K_OUT_NOT_REQUESTED in kernel.limitations(with_slots.inputs)


def test_q_output_only_shape_declares_what_it_has_no_buffer_for():
    kernel, _ = _recording()
    launch = _launch("decode-single-dcp4", 4)
    assert set(kernel.limitations(launch.inputs)) == {
        NO_KV_OUTPUTS,
        NO_KPE_OUTPUT,
        NO_INDEX_K_OUTPUT,
    }
    profiling = _launch("profiling-call", 1)
    assert NO_OUTPUTS_WITHOUT_SLOTS in kernel.limitations(profiling.inputs)
    assert {lim.field for lim in kernel.limitations(profiling.inputs)} >= {"q_out", "kv_out"}


# -- the fp8_ds_mla tile-scale rule, read from the file --------------------------------

POW2_SOURCE = """
def store(tl, tile_amax, FP8_MAX):
    tile_scale = tl.maximum(tile_amax * (1.0 / FP8_MAX), 1e-4)
    tile_scale = tl.math.exp2(tl.math.ceil(tl.math.log2(tile_scale)))
    return tile_scale
"""
AMAX_SOURCE = """
def store(tl, tile_amax):
    tile_scale = tl.maximum(tile_amax * (1.0 / 448.0), 1.1754944e-38)
    scale = tl.math.exp2(tl.math.ceil(tl.math.log2(tile_amax)))  # another scale: not the tile's
    return tile_scale, scale
"""
NO_TILE_SOURCE = """
def store(tl, amax):
    scale = tl.math.exp2(tl.math.ceil(tl.math.log2(amax)))
    return scale
"""


@pytest.mark.parametrize(
    ("source", "rule"),
    [(POW2_SOURCE, DsMlaScale.POW2), (AMAX_SOURCE, DsMlaScale.AMAX), (NO_TILE_SOURCE, None)],
)
def test_the_tile_scale_rule_is_read_from_what_the_file_computes(tmp_path, source, rule):
    path = tmp_path / f"tile_rule_{abs(hash(source))}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    try:
        spec.loader.exec_module(module)
        assert tile_scale_rule(module.store) is rule
    finally:
        del sys.modules[path.stem]
