"""``tests/vectors/make_golden_vectors.py`` against the vectors it makes, so it cannot rot.

The script draws the stored inputs exactly, and its CPU dry run (vLLM 0.30.0's kernel on
Triton's interpreter) gives the stored GPU outputs up to the interpreter's known difference
(tests/vectors/README.md): a bf16 value is the GPU's or one step nearer zero (truncation
against round-to-nearest-even), fp16 values, top-k and UE8M0 scales are exact, fp8 bytes
within one step and fp8_ds_mla's fp32 tile scales within the harness's tolerance. It
refuses to run without CUDA unless asked for a dry run, and a dry run never writes over
the stored vectors.
"""

from __future__ import annotations

import functools
import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dcpcheck.exit_codes import EXIT_OK, EXIT_USAGE
from dcpcheck.kernels import releases
from dcpcheck.kernels.loading import KernelLoadError
from dcpcheck.ops.fused_norm_rope.contract import (
    DS_MLA_ENTRY_BYTES,
    DS_MLA_ROPE_OFFSET,
    DS_MLA_SCALES_OFFSET,
    CacheLayout,
)
from dcpcheck.ops.fused_norm_rope.tolerances import (
    DS_MLA_SCALE,
    FP8_VALUE,
    fp8_step_distance,
    ulp_distance,
)
from tests.conftest import registry_problem
from tests.vectors import make_golden_vectors as script

SCRIPT = Path(script.__file__)
CASES = {case.name: case for case in script.CASES}


@functools.cache
def stored_vectors() -> dict[str, dict[str, torch.Tensor]]:
    return torch.load(script.VECTORS, weights_only=True)


def _outputs(case: dict[str, torch.Tensor]) -> set[str]:
    return {key for key in case if key.startswith("out_")}


@pytest.mark.parametrize("name", list(CASES))
def test_the_script_draws_the_stored_inputs(name):
    stored = stored_vectors()[name]
    drawn = script.case_inputs(CASES[name])
    assert set(drawn) == set(stored) - _outputs(stored)
    for key, tensor in drawn.items():
        assert tensor.dtype == stored[key].dtype, key
        assert torch.equal(tensor, stored[key]), key


def test_the_stored_file_holds_the_script_s_cases():
    assert list(stored_vectors()) == list(CASES)


def truncated_or_equal(cpu: torch.Tensor, gpu: torch.Tensor) -> bool:
    """Whether every bf16 element of ``cpu`` is ``gpu``'s, or one step nearer zero with
    the same sign: fp32 truncated where ``gpu`` rounded the same fp32 to nearest even."""
    assert cpu.dtype == gpu.dtype == torch.bfloat16 and cpu.shape == gpu.shape
    a = cpu.contiguous().view(torch.int16).int()
    b = gpu.contiguous().view(torch.int16).int()
    same_sign = (a & 0x8000) == (b & 0x8000)
    one_step_up = (b & 0x7FFF) - (a & 0x7FFF) == 1
    return bool(((a == b) | (same_sign & one_step_up)).all())


def as_interpreted(cpu: torch.Tensor, gpu: torch.Tensor) -> bool:
    """A bf16/fp16 tensor of the dry run against the GPU's (module docstring)."""
    if cpu.dtype == torch.bfloat16:
        return truncated_or_equal(cpu, gpu)
    return cpu.dtype == gpu.dtype and torch.equal(cpu, gpu)


def fp8_within_a_step(cpu: torch.Tensor, gpu: torch.Tensor) -> bool:
    return int(fp8_step_distance(cpu, gpu).max()) <= FP8_VALUE.max_steps


def _floats(raw: torch.Tensor, columns: slice, dtype: torch.dtype) -> torch.Tensor:
    return raw[:, columns].contiguous().view(dtype)


def same_mla_cache(layout: CacheLayout, cpu: torch.Tensor, gpu: torch.Tensor) -> bool:
    """The MLA cache of the dry run against the GPU's, field by field."""
    if layout is CacheLayout.AUTO:
        return as_interpreted(cpu, gpu)
    if layout is CacheLayout.FP8:
        return fp8_within_a_step(cpu, gpu)
    ours = cpu.reshape(-1, DS_MLA_ENTRY_BYTES)
    theirs = gpu.reshape(-1, DS_MLA_ENTRY_BYTES)
    nope, scales = slice(0, DS_MLA_SCALES_OFFSET), slice(DS_MLA_SCALES_OFFSET, DS_MLA_ROPE_OFFSET)
    rope = slice(DS_MLA_ROPE_OFFSET, None)
    scale_ulps = ulp_distance(
        _floats(ours, scales, torch.float32), _floats(theirs, scales, torch.float32)
    )
    return (
        fp8_within_a_step(ours[:, nope], theirs[:, nope])
        and int(scale_ulps.max()) <= DS_MLA_SCALE.max_steps
        and truncated_or_equal(
            _floats(ours, rope, torch.bfloat16), _floats(theirs, rope, torch.bfloat16)
        )
    )


def same_indexer_cache(cpu: torch.Tensor, gpu: torch.Tensor) -> bool:
    """Per block: fp8 values within a step, then the UE8M0 scales exactly."""
    blocks, block_size, entry = cpu.shape
    values = block_size * (entry - 4)
    ours, theirs = cpu.reshape(blocks, -1), gpu.reshape(blocks, -1)
    return fp8_within_a_step(ours[:, :values], theirs[:, :values]) and torch.equal(
        ours[:, values:], theirs[:, values:]
    )


def _release_at_hand() -> None:
    """Skip where the release is neither cached nor downloadable, as the release tests do."""
    try:
        releases.fetch(script.RELEASE)
    except KernelLoadError as exc:
        problem = registry_problem()
        if problem is not None:
            pytest.skip(f"vllm=={script.RELEASE} is not cached and the registry is unreachable")
        raise AssertionError(
            f"the registry answers, yet vllm=={script.RELEASE} did not load: {exc}"
        ) from exc


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory) -> Path:
    """The folder the script's dry run wrote, run as the README says, in a process of its
    own (the interpreter needs its own backend)."""
    _release_at_hand()
    folder = tmp_path_factory.mktemp("dry-run")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--interpreter-dry-run", str(folder)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == EXIT_OK, done.stderr
    return folder


@pytest.mark.parametrize("name", list(CASES))
def test_dry_run_gives_the_stored_vectors_up_to_the_interpreter(dry_run, name):
    made = torch.load(dry_run / script.GOLDEN_FILE, weights_only=True)[name]
    stored = stored_vectors()[name]
    assert set(made) == set(stored)
    for key in set(made) - _outputs(made):
        assert torch.equal(made[key], stored[key]) and made[key].dtype == stored[key].dtype, key
    for key in ("out_q", "out_kv", "out_kpe"):
        assert as_interpreted(made[key], stored[key]), key
    assert torch.equal(made["out_topk"], stored["out_topk"])
    assert same_mla_cache(CASES[name].layout, made["out_mla_cache"], stored["out_mla_cache"])
    if "out_indexer_cache" in stored:
        assert same_indexer_cache(made["out_indexer_cache"], stored["out_indexer_cache"])


def test_dry_run_readme_describes_the_stored_vectors(dry_run):
    """Below its provenance, the README a run writes is the stored one word for word."""
    made = (dry_run / script.README_FILE).read_text(encoding="utf-8")
    stored = script.VECTORS.with_name(script.README_FILE).read_text(encoding="utf-8")
    assert "Triton's CPU interpreter" in made.split(script.CASES_HEADING)[0]
    assert made.split(script.CASES_HEADING)[1] == stored.split(script.CASES_HEADING)[1]


def _stored_digest() -> str:
    return hashlib.sha256(script.VECTORS.read_bytes()).hexdigest()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present: it would run")
def test_refuses_without_cuda_in_one_line(capsys):
    before = _stored_digest()
    assert script.main([]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no CUDA device" in err and "--interpreter-dry-run" in err
    assert _stored_digest() == before


def test_dry_run_never_writes_over_the_stored_vectors(capsys):
    before = _stored_digest()
    assert script.main(["--interpreter-dry-run", str(script.HERE)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "writes elsewhere" in err
    assert _stored_digest() == before
