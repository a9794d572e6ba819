"""Every launch the gate and the test suite make of the project's kernels compiles for sm_90
and sm_100 within their shared memory (``dcpcheck.gpu_fit``); the check rejects a kernel
that does not fit, and the recorder captures launches as Triton keys them."""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import triton
import triton.language as tl

from dcpcheck import gpu_fit
from dcpcheck.e2e.token_streams import GPU_PRESET
from dcpcheck.gpu_fit import LaunchConfig, Recorder, check_fit, read_manifest, recording
from dcpcheck.op_registry import OPS
from tests.conftest import BACKEND


def test_every_recorded_launch_compiles_and_fits_each_target(capsys):
    configs = read_manifest()
    started = time.perf_counter()
    results = check_fit(configs)
    took = time.perf_counter() - started
    problems = [r.problem for r in results if r.problem]
    assert not problems, "\n".join(problems)
    assert {r.arch for r in results} == set(gpu_fit.TARGETS)
    assert len(results) == len(configs) * len(gpu_fit.TARGETS)
    largest = max(results, key=lambda r: r.shared)
    compiled = sum(r.compiled for r in results)
    if compiled:
        # Not a failure: the compiles were checked. But each costs a clean clone's suite
        # about 0.4 s of CPU, and under xdist this warning is what reaches the summary.
        warnings.warn(
            f"{compiled} of {len(results)} compiles are not in {gpu_fit.RESULTS.name} for "
            f"this Triton and were compiled ({took:.0f} s): `{gpu_fit.RESULTS_COMMAND}` "
            "keeps them",
            stacklevel=1,
        )
    with capsys.disabled():
        print(
            f"\n{len(configs)} launch configs x {len(gpu_fit.TARGETS)} targets in {took:.1f} s "
            f"({compiled} compiled, {len(results) - compiled} read from "
            f"{gpu_fit.RESULTS.name}); largest {largest.shared:,} B at sm_{largest.arch}: "
            f"{largest.config.describe()}"
        )


SAMPLE_STRIDE = 150
"""Every this-many-th compile of the manifest, and the largest, is compiled afresh to hold
the known results to: a file that disagrees with Triton anywhere is unlikely to agree on
every sampled compile, and the sample costs a dozen compiles, not 1,800."""


def test_the_known_results_are_what_a_fresh_compile_gives():
    known = gpu_fit.read_results()
    read = check_fit(read_manifest())
    largest = max(read, key=lambda r: r.shared)
    sample = [r for r in [*read[::SAMPLE_STRIDE], largest] if not r.compiled]
    if not sample:
        pytest.skip(
            f"{gpu_fit.RESULTS.name} holds none of this Triton's compiles of the manifest: "
            f"every launch was compiled ({gpu_fit.RESULTS_COMMAND} keeps them)"
        )
    configs = {r.config for r in sample}
    fresh = {(r.config, r.arch): r for r in check_fit(configs, known=None) if r.config in configs}
    for result in sample:
        again = fresh[(result.config, result.arch)]
        assert again.compiled and again.key == result.key
        assert again.shared == known[result.key] == result.shared, result.config.describe()


PLANTED_KERNEL = """
import triton
import triton.language as tl


@triton.jit
def planted(src, dst, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    tl.store(dst + offsets, tl.load(src + offsets) {op} 2.0)
"""


def test_a_changed_kernel_is_compiled_not_read(tmp_path):
    """A figure is read only under the key of the very source it was compiled from: the
    same launch of an edited kernel is compiled again, whatever the file holds."""
    config = LaunchConfig(
        "planted_kernel:planted",
        signature=(("src", "*fp32"), ("dst", "*fp32"), ("BLOCK", "constexpr")),
        attrs=(("src", "D"), ("dst", "D")),
        constexprs=(("BLOCK", 64),),
        options=(("num_stages", 3), ("num_warps", 4)),
    )
    (tmp_path / "planted_kernel.py").write_text(PLANTED_KERNEL.format(op="*"))
    (first,) = check_fit([config], archs=(90,), pythonpath=[str(tmp_path)], known=None)
    assert first.compiled and first.key is not None and first.error is None
    planted = tmp_path / "results.json"
    planted.write_text(f'{{"{first.key}": 12345}}')
    (read,) = check_fit([config], archs=(90,), pythonpath=[str(tmp_path)], known=planted)
    assert not read.compiled and read.shared == 12345  # read, as the file says
    (tmp_path / "planted_kernel.py").write_text(PLANTED_KERNEL.format(op="+"))
    (edited,) = check_fit([config], archs=(90,), pythonpath=[str(tmp_path)], known=planted)
    assert edited.compiled and edited.key != first.key
    assert edited.shared == first.shared  # compiled: the true figure, not the planted one


def test_every_op_packages_kernel_has_recorded_launches():
    recorded = {config.kernel.split(":")[0] for config in read_manifest()}
    packages = {op.package for op in OPS.values()}
    missing = sorted(p for p in packages if f"{p}.kernel" not in recorded)
    assert not missing, (
        f"no launch of these ops' kernels recorded: {missing}; {gpu_fit.RECORD_COMMAND}"
    )


OLD_ATTENTION = LaunchConfig(
    "tests.fixtures.oversized_attention:_decode_kernel",
    signature=(
        *((p, "*fp32") for p in ("q_ptr", "k_ptr", "v_ptr")),
        *((p, "*i32") for p in ("table_ptr", "lens_ptr")),
        *((p, "*fp32") for p in ("out_ptr", "lse_ptr")),
        ("scale", "fp32"),
        ("table_row_stride", "i32"),
        *((p, "constexpr") for p in ("HEADS", "BLOCK_H", "DIM", "BLOCK_D", "PAGE", "BLOCK_N")),
    ),
    attrs=tuple((p, "D") for p in ("q_ptr", "k_ptr", "v_ptr", "table_ptr", "lens_ptr", "out_ptr")),
    constexprs=(
        ("HEADS", 128),
        ("BLOCK_H", 16),
        ("DIM", 576),
        ("BLOCK_D", 1024),
        ("PAGE", 64),
        ("BLOCK_N", 32),
    ),
    options=(("num_stages", 3), ("num_warps", 4)),
)
"""The whole-row decode attention at MLA's width with Triton's default stages."""


def test_the_check_rejects_a_kernel_over_the_shared_memory_of_a_gpu():
    (result,) = check_fit([OLD_ATTENTION], archs=(90,))
    assert result.error is None
    assert result.shared > gpu_fit.SHARED_MEMORY_LIMIT  # 327,680 B with Triton 3.9
    assert result.problem.startswith(f"needs {result.shared:,} B of shared memory, over ")
    assert "sm_90: tests.fixtures.oversized_attention:_decode_kernel[HEADS=128" in result.problem


def test_the_check_reports_a_launch_that_does_not_compile():
    broken = LaunchConfig(
        OLD_ATTENTION.kernel,
        OLD_ATTENTION.signature,
        OLD_ATTENTION.attrs,
        tuple((k, 1000 if k == "BLOCK_D" else v) for k, v in OLD_ATTENTION.constexprs),
        OLD_ATTENTION.options,
    )
    (result,) = check_fit([broken], archs=(90,))
    assert result.shared is None
    assert result.problem.startswith("does not compile for sm_90: ")
    assert "BLOCK_D=1000" in result.problem


@triton.jit
def _scaled_copy(src, dst, n, factor, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + offsets, tl.load(src + offsets, mask=offsets < n) * factor, mask=offsets < n)


@pytest.mark.skipif(not BACKEND.interpreted, reason="the recorder sees interpreted launches only")
def test_the_recorder_captures_a_launch_as_triton_keys_it():
    src = torch.ones(48, dtype=torch.float32, device=BACKEND.device)
    dst = torch.zeros_like(src)
    with recording(Recorder({__name__})) as recorder:
        _scaled_copy[(3,)](src, dst, 48, 2.0, BLOCK=16)
        assert torch.equal(dst, torch.full_like(src, 2.0))  # launched as well as recorded
        _scaled_copy[(3,)](src, dst, 48, 2.0, BLOCK=16)  # the same config again
        with gpu_fit.on_gpu_as(BLOCK=32, num_warps=2):
            _scaled_copy[(3,)](src[1:], dst, 47, 2.0, BLOCK=16)
    name = f"{__name__}:_scaled_copy"
    types = (("src", "*fp32"), ("dst", "*fp32"), ("n", "i32"), ("factor", "fp32"))
    signature = (*types, ("BLOCK", "constexpr"))
    assert recorder.configs == {
        LaunchConfig(
            name,
            signature,
            attrs=(("src", "D"), ("dst", "D"), ("n", "D")),
            constexprs=(("BLOCK", 16),),
            options=(("num_stages", 3), ("num_warps", 4)),
        ),
        LaunchConfig(
            name,
            signature,
            attrs=(("dst", "D"),),  # src + 1 element is 4-byte aligned, 47 is odd
            constexprs=(("BLOCK", 32),),
            options=(("num_stages", 3), ("num_warps", 2)),
        ),
    }


def test_record_writes_the_gates_list_before_it_runs_the_suite(tmp_path, monkeypatch):
    """The suite's README test holds the gate to its list, so ``record`` writes the gate's
    list before the suite runs: a stale list would fail the suite and leave both unwritten."""
    config = read_manifest(gpu_fit.GATE_LAUNCHES)[0]
    monkeypatch.setattr(gpu_fit, "GATE_LAUNCHES", tmp_path / "gate.json")
    monkeypatch.setattr(gpu_fit, "MANIFEST", tmp_path / "manifest.json")
    listed_when_the_suite_ran = []

    ran = []

    def run(command, env, cwd):
        ran.append(command[1:])
        if "pytest" in command:
            listed_when_the_suite_ran.extend(read_manifest(gpu_fit.GATE_LAUNCHES))
        else:
            record = Path(env[gpu_fit.RECORD_ENV]) / "launches-1.jsonl"
            record.write_text(gpu_fit.json_key(config) + "\n")
        return SimpleNamespace(returncode=0)

    monkeypatch.setattr(gpu_fit, "subprocess", SimpleNamespace(run=run))
    assert gpu_fit._record(1) == 0
    # the gate, then its token streams at the widths a GPU runs them at, then the suite
    assert ran[0] == ["-m", "dcpcheck", "run", "--dcp", "4"]
    assert ran[1] == ["-m", "dcpcheck", "hash", "--dcp", "1,4", "--preset", GPU_PRESET]
    assert ran[2][:2] == ["-m", "pytest"]
    assert [gpu_fit.json_key(c) for c in listed_when_the_suite_ran] == [gpu_fit.json_key(config)]
    assert [gpu_fit.json_key(c) for c in read_manifest(tmp_path / "manifest.json")] == [
        gpu_fit.json_key(config)
    ]


def test_record_lists_the_suites_launches_of_the_gates_gpu_only_kernels(tmp_path, monkeypatch):
    """The outputs check's count and the seeded values run on a GPU alone, so the gate's
    recording on the CPU never makes them; ``record`` adds the suite's launches of those
    kernels to the gate's list, and none of the suite's others."""
    manifest = read_manifest(gpu_fit.MANIFEST)
    gate_config = next(c for c in manifest if c.kernel.endswith(":_fused_norm_rope_kernel"))
    gpu_only = [c for c in manifest if c.kernel in gpu_fit.GPU_ONLY_GATE_KERNELS]
    suite_only = next(c for c in manifest if c.kernel.endswith(":_remap_kernel"))
    assert {c.kernel for c in gpu_only} == set(gpu_fit.GPU_ONLY_GATE_KERNELS)
    monkeypatch.setattr(gpu_fit, "GATE_LAUNCHES", tmp_path / "gate.json")
    monkeypatch.setattr(gpu_fit, "MANIFEST", tmp_path / "manifest.json")

    def run(command, env, cwd):
        made = [*gpu_only, suite_only] if "pytest" in command else [gate_config]
        record = Path(env[gpu_fit.RECORD_ENV]) / "launches-1.jsonl"
        record.write_text("".join(gpu_fit.json_key(c) + "\n" for c in made))
        return SimpleNamespace(returncode=0)

    monkeypatch.setattr(gpu_fit, "subprocess", SimpleNamespace(run=run))
    assert gpu_fit._record(1) == 0
    keys = {gpu_fit.json_key(c) for c in read_manifest(tmp_path / "gate.json")}
    assert keys == {gpu_fit.json_key(c) for c in [gate_config, *gpu_only]}
    everything = {gpu_fit.json_key(c) for c in read_manifest(tmp_path / "manifest.json")}
    assert everything == {gpu_fit.json_key(c) for c in [gate_config, *gpu_only, suite_only]}
