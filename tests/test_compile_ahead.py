"""Compiling a run's Triton binaries ahead of its cases
(``dcpcheck.ops.fused_norm_rope.compile_ahead``): the dry pass compiles what the cases will
launch, launches nothing, stays out of an autotuner's way, and leaves Triton as it found it.

The binaries themselves need a GPU; what the dry pass does around them is checked on the
CPU too.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime import autotuner, jit

from dcpcheck.cases.verdicts import RunConfig
from dcpcheck.ops.fused_norm_rope import compile_ahead as ahead
from dcpcheck.ops.fused_norm_rope.kernels import load_kernel
from dcpcheck.ops.fused_norm_rope.runner import run
from dcpcheck.ops.fused_norm_rope.scenario import SCENARIOS, load_scenario
from tests.conftest import BACKEND, requires_cuda
from tests.kernels_under_test import oracle_kernel

SCENARIOS = [
    load_scenario(SCENARIOS / f"{name}.toml")
    for name in ("decode-single-dcp4", "fp16-interleaved-indexer")
]
"""bf16 and fp16 inputs: a kernel specialized on its input dtype compiles two binaries."""

CONFIG = RunConfig("test", (2,))


@triton.jit
def _mark_first_row(src, marks, width, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    inside = offsets < width
    row = tl.load(src + offsets, mask=inside, other=0.0)
    tl.store(marks + offsets, row.to(tl.float32) + 1.0, mask=inside)


@triton.autotune(configs=[triton.Config({}, num_warps=1), triton.Config({}, num_warps=2)], key=[])
@triton.jit
def _mark_first_row_tuned(src, marks, width, BLOCK: tl.constexpr):
    _mark_first_row(src, marks, width, BLOCK)


class MarksItsLaunches:
    """A correct kernel (the oracle's writes) that also launches one Triton kernel per
    call, specialized on the input dtype, which writes ``marks``: nonzero marks mean a
    launch ran."""

    triton_launches_only = True

    def __init__(self, triton_fn) -> None:
        self.triton_fn = triton_fn
        self.marks = torch.zeros(4096, dtype=torch.float32, device=BACKEND.device)

    def __call__(self, inputs, outputs, caches) -> None:
        oracle_kernel(inputs, outputs, caches)
        width = inputs.q_c.shape[-1]
        self.triton_fn[(1,)](inputs.q_c, self.marks, width, BLOCK=triton.next_power_of_2(width))


def binaries(fn) -> int:
    """Binaries in a ``@triton.jit`` function's in-memory cache, every device."""
    return sum(len(caches[0]) for caches in fn.device_caches.values())


@requires_cuda
def test_the_dry_pass_compiles_what_the_cases_launch_and_launches_nothing():
    from dcpcheck.ops.fused_norm_rope.tolerance_kernel import _count_out_of_tolerance

    kernel = MarksItsLaunches(_mark_first_row)
    assert binaries(_mark_first_row) == 0
    ahead.compile_ahead(kernel, SCENARIOS, CONFIG, BACKEND)
    assert binaries(_mark_first_row) == 2  # bf16 and fp16
    # The checks' own, one for bf16 and one for fp16 outputs (an earlier test in this
    # process may have compiled the fp32 one too).
    checks_binaries = binaries(_count_out_of_tolerance)
    assert checks_binaries >= 2
    assert not kernel.marks.any(), "a dry launch ran"
    results = run(kernel, SCENARIOS, CONFIG, BACKEND)
    assert [r.status for r in results] == ["pass", "pass"], [r.error for r in results]
    assert kernel.marks.any()
    assert binaries(_mark_first_row) == 2, "a case compiled a binary the dry pass missed"
    assert binaries(_count_out_of_tolerance) == checks_binaries, "a check compiled one too"


@requires_cuda
def test_an_autotuned_kernel_is_left_to_its_cases():
    """The autotuner is never entered dry (it would time launches that do not run): no
    configuration is chosen until the cases launch it, which then pass."""
    kernel = MarksItsLaunches(_mark_first_row_tuned)
    ahead.compile_ahead(kernel, SCENARIOS, CONFIG, BACKEND)
    assert _mark_first_row_tuned.cache == {}
    assert not kernel.marks.any()
    results = run(kernel, SCENARIOS, CONFIG, BACKEND)
    assert [r.status for r in results] == ["pass", "pass"], [r.error for r in results]
    assert _mark_first_row_tuned.cache


class CountsItsCalls:
    def __init__(self, triton_launches_only: bool) -> None:
        self.triton_launches_only = triton_launches_only
        self.calls = 0

    def __call__(self, inputs, outputs, caches) -> None:
        self.calls += 1
        oracle_kernel(inputs, outputs, caches)


def test_only_a_kernel_that_declares_triton_launches_only_is_run_dry():
    """A kernel that may do anything else is never called before its cases; one that
    declares it is called for every rank of every case, where Triton compiles (a GPU)."""
    undeclared, declared = CountsItsCalls(False), CountsItsCalls(True)
    compiled = dataclasses.replace(BACKEND, interpreted=False)
    ahead.compile_ahead(undeclared, SCENARIOS, CONFIG, compiled)
    assert undeclared.calls == 0
    ahead.compile_ahead(declared, SCENARIOS, CONFIG, compiled)
    assert declared.calls == 2 * (1 + 2)  # DCP1 and DCP2's two ranks, each scenario


def test_under_the_interpreter_nothing_is_run_dry():
    kernel = CountsItsCalls(True)
    interpreted = dataclasses.replace(BACKEND, interpreted=True)
    ahead.compile_ahead(kernel, SCENARIOS, CONFIG, interpreted)
    assert kernel.calls == 0


def test_dcpchecks_own_kernels_declare_triton_launches_only():
    assert load_kernel("default").triton_launches_only is True
    assert load_kernel("regress/pre-54908").triton_launches_only is True


def test_inside_the_dry_pass_an_autotuner_is_stopped_and_triton_is_restored_after():
    launch, tuned = jit.JITFunction.run, autotuner.Autotuner.run
    with (
        pytest.raises(RuntimeError, match="the body broke"),
        ahead._launches_compile_only() as available,
    ):
        if available:
            assert jit.JITFunction.run is not launch
            with pytest.raises(ahead._AutotunedLaunch, match="is autotuned"):
                autotuner.Autotuner.run(SimpleNamespace(fn="tuned_fn"))
        raise RuntimeError("the body broke")
    assert (jit.JITFunction.run, autotuner.Autotuner.run) == (launch, tuned)
