"""The plain gate's binaries compiled ahead (``dcpcheck.gate_binaries``): each listed launch
is asked of Triton with stand-in arguments it specializes exactly as the recorded launch,
so the binary compiled is the one the case launches; on a GPU, what Triton's cache lacks is
compiled by worker processes and a second run finds it all there. (That the list is what
the gate launches is held by the README's test of ``dcpcheck run --dcp 4``.)"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dcpcheck.backend import current_backend
from dcpcheck.gate_binaries import compile_in_workers, kernel_of, launch_arguments
from dcpcheck.gpu_fit import GATE_LAUNCHES, LaunchConfig, Recorder, json_key, read_manifest
from dcpcheck.kernel_modules import kernel_modules

REPO = Path(__file__).resolve().parents[1]
INTERPRETED = pytest.mark.skipif(
    not current_backend().interpreted,
    reason="the recorder binds interpreted kernels (a GPU run asks Triton itself: below)",
)


def _keyed(configs) -> set[str]:
    return {json_key(c) for c in configs}


def _specialized(config: LaunchConfig) -> set[str]:
    """The launch Triton's binder for a CUDA target makes of ``config``'s stand-ins, as the
    recorder keys launches."""
    recorder = Recorder(kernel_modules())
    kernel = kernel_of(config)
    args, options = launch_arguments(config, kernel)
    recorder.saw(kernel, tuple(args), options)
    return _keyed(recorder.configs)


def test_the_list_holds_every_op_packages_kernel():
    kernels = {c.kernel.split(":")[0] for c in read_manifest(GATE_LAUNCHES)}
    assert {
        "dcpcheck.ops.fused_norm_rope.kernel",
        "dcpcheck.ops.slot_mapping.kernel",
        "dcpcheck.ops.lse_combine.kernel",
        "dcpcheck.ops.lse_combine.attention",
        "dcpcheck.ops.sparse_topk_remap.kernel",
        "dcpcheck.ops.reshape_and_cache_flash.kernel",
    } <= kernels


@INTERPRETED
def test_stand_in_arguments_specialize_as_each_listed_launch():
    for config in read_manifest(GATE_LAUNCHES):
        assert _specialized(config) == _keyed([config]), config.describe()


@INTERPRETED
def test_a_misaligned_pointer_and_an_integer_not_divisible_by_16_stand_in_as_such():
    """A stand-in always aligned (Triton's own ``MockTensor``) would ask for another binary
    than a launch whose pointer, or integer, is not a multiple of 16."""

    def aligned(config: LaunchConfig, pointer: bool) -> list[str]:
        types = dict(config.signature)
        return [
            name
            for name, code in config.attrs
            if code == "D" and (types[name].startswith("*") if pointer else types[name] == "i32")
        ]

    config = next(c for c in read_manifest(GATE_LAUNCHES) if aligned(c, True) and aligned(c, False))
    pointer, integer = aligned(config, True)[0], aligned(config, False)[0]
    unaligned = dataclasses.replace(
        config, attrs=tuple((n, c) for n, c in config.attrs if n not in (pointer, integer))
    )
    assert _specialized(unaligned) == _keyed([unaligned]) != _keyed([config])


def test_a_boolean_scalar_stands_in_as_a_boolean_and_a_float_as_a_float():
    config = read_manifest(GATE_LAUNCHES)[0]
    kernel = kernel_of(config)
    first, second = [n for n, t in config.signature if t == "i32"][:2]
    retyped = dataclasses.replace(
        config,
        signature=tuple((n, {first: "i1", second: "fp32"}.get(n, t)) for n, t in config.signature),
        attrs=tuple((n, c) for n, c in config.attrs if n not in (first, second)),
    )
    args, _ = launch_arguments(retyped, kernel)
    by_name = dict(zip(kernel.arg_names, args, strict=True))
    assert by_name[first] is True and by_name[second] == 0.5


def test_an_argument_type_without_a_stand_in_is_refused_by_name():
    config = read_manifest(GATE_LAUNCHES)[0]
    name = next(n for n, t in config.signature if t.startswith("*"))
    odd = dataclasses.replace(
        config, signature=tuple((n, "*u1024" if n == name else t) for n, t in config.signature)
    )
    with pytest.raises(ValueError, match=f"{name} of type \\*u1024"):
        launch_arguments(odd, kernel_of(odd))


def test_workers_compile_for_the_target_they_are_handed_with_no_device(tmp_path, monkeypatch):
    """A worker makes no CUDA context: handed sm_90, it compiles each binary into Triton's
    cache on a box with no GPU. Only a launcher may fail there (Triton links it against
    libcuda, which such a box may lack), and that is named as a launcher's, never a
    compile's, with nothing printed."""
    from triton.backends.compiler import GPUTarget

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    configs = sorted(read_manifest(GATE_LAUNCHES), key=lambda c: len(c.signature))[:3]
    failed, unbuilt = compile_in_workers(configs, GPUTarget("cuda", 90, 32))
    assert failed == []
    assert all(line.startswith("launcher of ") for line in unbuilt), unbuilt
    names = {c.kernel.split(":")[1].split(".")[-1] for c in configs}
    assert {p.stem for p in tmp_path.glob("*/*.cubin")} == names


COMPILE_AHEAD = (
    "import json\n"
    "from dcpcheck.backend import select_backend\n"
    "from dcpcheck.gate_binaries import compile_gate_binaries\n"
    "done = compile_gate_binaries(select_backend('cuda'))\n"
    "print(json.dumps([done.listed, done.compiled, list(done.problems)]))\n"
)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_workers_compile_what_the_cache_lacks_and_a_second_run_finds_it(tmp_path):
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "triton"), "PYTHONPATH": str(REPO)}
    env.pop("TRITON_INTERPRET", None)
    said = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", COMPILE_AHEAD], capture_output=True, text=True, env=env
        )
        assert done.returncode == 0, done.stderr[-2000:]
        said.append(json.loads(done.stdout.splitlines()[-1]))
    listed = len(read_manifest(GATE_LAUNCHES))
    assert said == [[listed, listed, []], [listed, 0, []]]
