"""The CPU writes the GPU's fp8 bytes: Triton's interpreter, corrected by
``dcpcheck.interpreter.fp8``, casts fp32, fp16 and bf16 to ``tl.float8e4nv`` exactly as
Hopper's ``cvt.rn.satfinite.e4m3x2`` does.

What is compared with what: a tiny ``@triton.jit`` kernel storing ``x.to(tl.float8e4nv)``
as bytes, run through the interpreter, against an independent oracle (the nearest of the
253 finite e4m3 values by exhaustive search in float64, ties to the even code, magnitudes
clamped to 448, every NaN 0x7F) and against ``e4m3_bytes_like_gpu`` (torch's cast,
clamped). Inputs cover every class the interpreter got wrong: exact ties with even and odd
lower neighbours, carries into the next binade, saturation, the subnormal/normal boundary,
signed zeros, NaN, and 4,096 N(0, 16) samples. The same kernel with Triton's original
conversion put back writes wrong bytes, so these tests fail without the correction.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from dcpcheck.backend import Backend
from dcpcheck.interpreter import fp8 as interpreter_fp8
from dcpcheck.interpreter.fp8 import (
    Fp8CastCorrection,
    e4m3_bytes_like_gpu,
    install_fp8_cast_correction,
    probe_mistakes,
)
from tests.conftest import BACKEND

pytestmark = pytest.mark.skipif(
    not BACKEND.interpreted, reason="checks Triton's CPU interpreter; this run compiles for CUDA"
)

SOURCES = (torch.float32, torch.float16, torch.bfloat16)
BLOCK = 1024


@triton.jit
def _store_e4m3_bytes(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(src_ptr + offsets, mask=mask)
    tl.store(dst_ptr + offsets, x.to(tl.float8e4nv).to(tl.uint8, bitcast=True), mask=mask)


def kernel_bytes(values: torch.Tensor) -> torch.Tensor:
    """What the interpreter stores for ``values.to(tl.float8e4nv)``, as uint8."""
    out = torch.empty(values.shape, dtype=torch.uint8)
    _store_e4m3_bytes[(triton.cdiv(values.numel(), BLOCK),)](values, out, values.numel(), BLOCK)
    return out


def _e4m3_table() -> np.ndarray:
    """The value of every non-negative finite e4m3 code 0..126, in float64."""
    codes = np.arange(127)
    exponent, mantissa = codes >> 3, codes & 7
    normal = (1 + mantissa / 8) * np.exp2(exponent - 7.0)
    return np.where(exponent == 0, mantissa * 2.0**-9, normal)


E4M3_VALUES = _e4m3_table()


def oracle_bytes(values: torch.Tensor) -> torch.Tensor:
    """The satfinite, round-to-nearest-even e4m3 byte of each value, by exhaustive search
    (no bit tricks and no torch fp8 cast, so it shares nothing with the code under test)."""
    wide = values.to(torch.float64).numpy()
    sign = torch.signbit(values.to(torch.float32)).numpy().astype(np.uint8) << 7
    magnitude = np.minimum(np.abs(np.nan_to_num(wide, nan=0.0)), 448.0)
    distance = np.abs(magnitude[:, None] - E4M3_VALUES[None, :])
    nearest = distance == distance.min(axis=1, keepdims=True)
    even_first = 2 - (np.arange(127) & 1)  # a tie is two neighbours: one code is even
    code = np.argmax(nearest * even_first, axis=1).astype(np.uint8)
    code = np.where(np.isnan(wide), 0x7F, code | sign).astype(np.uint8)
    return torch.from_numpy(code)


def midpoints() -> torch.Tensor:
    """Every exact tie between neighbouring e4m3 values (both signs), and 464, the tie
    between 448 and the first value past it; exact in fp32, fp16 and bf16 alike."""
    ties = np.append((E4M3_VALUES[:-1] + E4M3_VALUES[1:]) / 2, 464.0)
    return torch.tensor(np.concatenate([ties, -ties]), dtype=torch.float32)


SPECIAL_VALUES = torch.tensor(
    [
        1.9897, 7.77, 15.9, -1.9897, 1.999, 3.9, 0.49560991,  # carries into the next binade
        448.0, 464.0, 465.0, 480.0, 500.0, 1e6, 3e38, float("inf"), float("-inf"), -500.0,
        2.0**-6, 2.0**-7, 2.0**-9, 2.0**-10, 3 * 2.0**-10, 15 * 2.0**-10,  # 15/2^10: 2^-6 tie
        7 * 2.0**-9, 0.001, 0.0035672870, 1e-40, -1e-40, 2.0**-11,
        0.0, -0.0, float("nan"), 1.0, -1.0, 0.1, 3.3,
    ],
    dtype=torch.float32,
)  # fmt: skip


def gaussian_samples(count: int = 4096) -> torch.Tensor:
    return torch.randn(count, generator=torch.Generator().manual_seed(16)) * 4.0


def neighbours_of_ties() -> torch.Tensor:
    """One fp32 ulp either side of every tie: must round away from the tie's even choice."""
    ties = midpoints().numpy()
    up = np.nextafter(ties, np.float32(np.inf), dtype=np.float32)
    down = np.nextafter(ties, np.float32(-np.inf), dtype=np.float32)
    return torch.from_numpy(np.concatenate([up, down]))


def all_inputs(dtype: torch.dtype) -> torch.Tensor:
    parts = [SPECIAL_VALUES, midpoints(), gaussian_samples()]
    if dtype == torch.float32:
        parts.append(neighbours_of_ties())
    return torch.cat(parts).to(dtype)


def first_difference(got: torch.Tensor, want: torch.Tensor, values: torch.Tensor) -> str:
    where = (got != want).nonzero().flatten()
    if where.numel() == 0:
        return ""
    i = int(where[0])
    return (
        f"{where.numel()} of {values.numel()} differ; first: {values[i].item()!r} "
        f"-> {int(got[i]):#04x}, expected {int(want[i]):#04x}"
    )


def original_create_fp_to_fp():
    """Triton's own ``create_fp_to_fp``, from under the installed correction."""
    from triton.runtime.interpreter import InterpreterBuilder

    return InterpreterBuilder.create_fp_to_fp.__wrapped__


# ---- the oracle and torch's cast agree: torch rounds ties to even -------------------------


def test_the_oracle_knows_the_format():
    assert E4M3_VALUES[126] == 448.0 and E4M3_VALUES[1] == 2.0**-9 and E4M3_VALUES[8] == 2.0**-6
    values = torch.tensor([1.9897, 7.77, 500.0, 0.001, 2.0**-10, 3 * 2.0**-10, -0.0, 464.0])
    assert oracle_bytes(values).tolist() == [0x40, 0x50, 0x7E, 0x01, 0x00, 0x02, 0x80, 0x7E]


@pytest.mark.parametrize("dtype", SOURCES, ids=str)
def test_torch_clamped_cast_rounds_ties_to_even_like_the_oracle(dtype):
    values = all_inputs(dtype)
    got, want = e4m3_bytes_like_gpu(values), oracle_bytes(values)
    assert torch.equal(got, want), first_difference(got, want, values)


def test_e4m3_bytes_like_gpu_takes_only_what_the_gpu_casts():
    with pytest.raises(TypeError, match="float64"):
        e4m3_bytes_like_gpu(torch.zeros(2, dtype=torch.float64))


# ---- the corrected interpreter writes the GPU's bytes -------------------------------------


@pytest.mark.parametrize("dtype", SOURCES, ids=str)
def test_the_interpreters_cast_writes_the_gpus_bytes(dtype):
    values = all_inputs(dtype)
    got = kernel_bytes(values)
    want = oracle_bytes(values)
    assert torch.equal(got, want), first_difference(got, want, values)
    assert torch.equal(got, e4m3_bytes_like_gpu(values))


def test_every_nan_is_0x7f_and_infinities_saturate():
    """As the H200's instruction writes them (``tests/test_fp8_codes.py``); torch's own cast
    would give 0xFF for the negative NaN."""
    values = torch.tensor([float("nan"), -float("nan"), float("inf"), -float("inf")])
    assert kernel_bytes(values).tolist() == [0x7F, 0x7F, 0x7E, 0xFE]


# ---- without the correction the same kernel is wrong ---------------------------------------


def test_the_probe_finds_this_tritons_cast_wrong():
    mistakes = probe_mistakes(original_create_fp_to_fp())
    assert "fp32 1.9897 -> 0x38 (GPU 0x40)" in mistakes, (
        "Triton's interpreter now casts to fp8e4nv correctly: dcpcheck.interpreter.fp8 and "
        f"this test can go ({triton.__version__})"
    )
    assert {m.split()[0] for m in mistakes} == {"fp32", "fp16", "bf16"}


def test_without_the_correction_the_kernel_writes_wrong_bytes(monkeypatch):
    from triton.runtime.interpreter import InterpreterBuilder

    monkeypatch.setattr(InterpreterBuilder, "create_fp_to_fp", original_create_fp_to_fp())
    values = torch.tensor([1.9897, 7.77, 500.0, 0.001])
    assert kernel_bytes(values).tolist() == [0x38, 0x48, 0x78, 0x00]  # 1.0, 4.0, 256, 0
    assert oracle_bytes(values).tolist() == [0x40, 0x50, 0x7E, 0x01]  # 2.0, 8.0, 448, 2^-9


# ---- installation: once, only where needed, loud when impossible ---------------------------


def test_the_backend_installed_the_correction_and_says_so():
    from triton.runtime.interpreter import InterpreterBuilder

    status = install_fp8_cast_correction()
    assert status.state == "corrected" and status.mistakes
    assert "fp8e4nv cast corrected" in BACKEND.describe()
    assert getattr(InterpreterBuilder.create_fp_to_fp, interpreter_fp8._MARK, False)
    assert not getattr(original_create_fp_to_fp(), interpreter_fp8._MARK, False)  # one layer
    assert install_fp8_cast_correction() is status


def test_other_conversions_go_through_tritons_code():
    from triton.runtime import interpreter

    rtne, rtz = interpreter._ir.ROUNDING_MODE.RTNE, interpreter._ir.ROUNDING_MODE.RTZ
    builder = interpreter.interpreter_builder
    fp32 = interpreter.TensorHandle(gaussian_samples(256).numpy(), tl.float32)
    codes = interpreter.TensorHandle(np.arange(256, dtype=np.uint8), tl.float8e4nv)
    cases = [
        (fp32, tl.float8e5, rtne),
        (fp32, tl.float8e4nv, rtz),
        (fp32, tl.float16, rtne),
        (fp32, tl.bfloat16, rtne),
        (codes, tl.float32, None),
        (codes, tl.float16, None),
    ]
    for src, dst, rounding in cases:
        patched = builder.create_fp_to_fp(src, dst, rounding).data
        original = original_create_fp_to_fp()(builder, src, dst, rounding).data
        assert np.array_equal(patched.view(np.uint8), original.view(np.uint8)), (dst, rounding)


def test_a_triton_that_is_already_right_is_left_alone(monkeypatch):
    from triton.runtime.interpreter import InterpreterBuilder

    original = original_create_fp_to_fp()
    monkeypatch.setattr(interpreter_fp8, "_installed", None)
    monkeypatch.setattr(InterpreterBuilder, "create_fp_to_fp", original)
    monkeypatch.setattr(interpreter_fp8, "probe_mistakes", lambda create_fp_to_fp: ())
    assert install_fp8_cast_correction() == Fp8CastCorrection("not needed")
    assert InterpreterBuilder.create_fp_to_fp is original


def test_moved_internals_are_reported_not_guessed(monkeypatch):
    from triton.runtime import interpreter

    def renamed(self, src, dst_ty, rounding):  # a future signature
        raise AssertionError("must not be called")

    monkeypatch.setattr(interpreter_fp8, "_installed", None)
    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_fp_to_fp", renamed)
    status = install_fp8_cast_correction()
    assert status.state == "unavailable" and "dst_ty" in status.detail
    assert interpreter.InterpreterBuilder.create_fp_to_fp is renamed
    line = Backend(torch.device("cpu"), interpreted=True, fp8_cast=status.summary()).describe()
    assert "fp8e4nv cast NOT corrected" in line and "\n" not in line

    monkeypatch.setattr(interpreter_fp8, "_installed", None)
    monkeypatch.setattr(interpreter_fp8, "_interpreter", lambda: object())
    status = install_fp8_cast_correction()
    assert status.state == "unavailable" and "InterpreterBuilder" in status.detail
