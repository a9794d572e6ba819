"""Make Triton's CPU interpreter cast to ``tl.float8e4nv`` the way the GPU does.

What is wrong. The interpreter (``triton/runtime/interpreter.py``, ``_convert_float``,
reached through ``InterpreterBuilder.create_fp_to_fp``) encodes fp32, fp16 and bf16 as
fp8 e4m3 with its own bit manipulation, and gets these classes of values wrong:

* a round-up that carries out of the 3-bit mantissa is OR-ed into the exponent instead of
  added, so it is lost whenever the exponent field is odd: 1.9897 gives 1.0 (GPU: 2.0),
  7.77 gives 4.0 (GPU: 8.0);
* nothing saturates: 500 gives 256, 464 and 1e6 give NaN (0x7F) and inf gives 256, where
  Hopper's ``cvt.rn.satfinite.e4m3x2.f32`` gives 448;
* results below 2^-6 flush to zero: 0.001 gives 0 (GPU: 2^-9);
* ties round away from zero, not to even (most visible from bf16, whose 7-bit mantissa
  makes exact ties common); and NaN comes out as +-320 (0x7C / 0xFC), not NaN.

Measured on triton 3.9.0 (the development venv): 111 of 4,096 N(0, 16) fp32 samples,
113 fp16 and 226 bf16 ones get a different byte. The GPU box has triton 3.6 but compiles
there and never interprets, so only interpreter versions matter. It is a known upstream
bug (an open Triton pull request rewrites the float downcast). The harness's own kernel
avoids the cast (``dcpcheck/ops/fused_norm_rope/fp8_codes.py`` encodes with integer arithmetic), but
vLLM's released kernels write their fp8 caches with ``.to(tl.float8e4nv)``, so on the CPU
their caches would differ from the bytes the GPU writes.

Why patch, not tolerate. A tolerance wide enough to hide this (eight fp8 steps at 1.99,
448 vs 256 at the top) would also hide real fp8 cache bugs, and docs/dcp-contract.md forbids
widening a tolerance to cover a backend defect. Correcting the cast keeps cache comparisons bitwise
on the CPU, exactly as on the GPU.

How. ``install_fp8_cast_correction`` probes the interpreter's own conversion on a few
values from each class above. Only if it disagrees with the GPU does it wrap
``InterpreterBuilder.create_fp_to_fp`` for the whole process; a Triton that fixes the bug
is left alone. The wrapper reroutes exactly one case: destination ``float8e4nv`` from an
fp32, fp16 or bf16 source, rounding RTNE, which is what NVIDIA's backend lowers to
``cvt.rn.satfinite.e4m3x2`` (fp16 and bf16 widen to fp32 exactly first, so the result is
the same as converting them directly). Everything else (other destinations; fp64 or fp8
sources and RTZ rounding, which the NVIDIA backend refuses to compile for e4m3) goes to
Triton's original code untouched. If Triton's internals have moved so that the probe or
the patch cannot be applied, the returned status says so in one line, which the backend's
``describe()`` shows: never a silent fallback.

GPU semantics chosen (``cvt.rn.satfinite``): round to nearest, ties to even; finite values
beyond +-448 and +-inf saturate to +-448 (0x7E / 0xFE), since ``.satfinite`` clamps to the
largest finite value of the destination; every NaN, whatever its sign and payload,
becomes 0x7F (PTX says only that NaN stays NaN; on the H200 the instruction wrote 0x7F for
every fp32 NaN pattern, ``tests/test_fp8_codes.py``, where torch's own cast keeps the sign
and writes 0xFF for a negative one);
e4m3 subnormals (steps of 2^-9) are produced, not flushed.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

E4M3_MAX = 448.0
"""Largest finite float8_e4m3fn value, where ``.satfinite`` saturates."""

PROBE_VALUES: tuple[float, ...] = (
    1.0,
    1.9897,  # carry into an odd exponent: interpreter 1.0, GPU 2.0
    -1.9897,
    7.77,  # interpreter 4.0, GPU 8.0
    15.9,
    448.0,
    464.0,  # halfway between 448 and the (absent) next value: rounds to 448
    500.0,  # interpreter 256, GPU 448 (satfinite)
    -1e6,
    float("inf"),
    float("-inf"),
    2.0**-6,  # smallest normal
    0.001,  # interpreter 0, GPU 2^-9 (subnormal)
    2.0**-10,  # tie between 0 and 2^-9: even is 0
    3 * 2.0**-10,  # tie between 2^-9 and 2^-8: even is 2^-8
    0.0,
    -0.0,
    float("nan"),
)
"""Inputs on which the interpreter's conversion is checked, one or more per class of error
(module docstring), plus values it already gets right so a regression shows too."""

E4M3_NAN = 0x7F
"""The one NaN byte Hopper's conversion writes (module docstring)."""

_MARK = "_dcpcheck_fp8_cast_correction"
"""Attribute set on the installed wrapper, so installing twice wraps only once."""


def e4m3_bytes_like_gpu(values: torch.Tensor) -> torch.Tensor:
    """The float8_e4m3fn bytes (uint8, same shape) Hopper's ``cvt.rn.satfinite`` writes
    for fp32, fp16 or bf16 ``values``.

    fp16 and bf16 widen to fp32 exactly, so one fp32 path serves all three. torch's cast is
    round-to-nearest-even with subnormals, but what it does beyond 448 has varied between
    releases (NaN in some, saturation in others), so finite overflow and infinities are
    clamped to +-448 first; every NaN is 0x7F, as the H200 writes it (module docstring).
    """
    if values.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"expected fp32, fp16 or bf16 values, got {values.dtype}")
    wide = values.to(torch.float32)
    codes = wide.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
    return codes.masked_fill(wide.isnan(), E4M3_NAN)


@dataclass(frozen=True)
class Fp8CastCorrection:
    """What ``install_fp8_cast_correction`` found and did.

    ``state``: ``corrected`` (the interpreter was wrong and is now rerouted), ``not needed``
    (its conversion agrees with the GPU on every probe), or ``unavailable`` (its internals
    are not where this module expects them; ``detail`` says what is missing).
    ``mistakes``: the probe results that were wrong before the correction, e.g.
    ``fp32 1.9897 -> 0x38 (GPU 0x40)``.
    """

    state: Literal["corrected", "not needed", "unavailable"]
    detail: str = ""
    mistakes: tuple[str, ...] = ()

    def summary(self) -> str:
        """A clause for the backend's one-line description; empty when nothing changed."""
        if self.state == "corrected":
            return "fp8e4nv cast corrected"
        if self.state == "unavailable":
            return f"fp8e4nv cast NOT corrected ({self.detail}): fp8 caches may differ from GPU"
        return ""


_installed: Fp8CastCorrection | None = None


def _interpreter() -> Any:
    """Triton's interpreter module, imported only when the interpreted backend asks."""
    from triton.runtime import interpreter

    return interpreter


def _source_types() -> dict[str, tuple[Any, Callable[[torch.Tensor], np.ndarray]]]:
    """Per rerouted source: its Triton dtype, and how to turn fp32 probe values into the
    numpy array the interpreter would hold for it."""
    import triton.language as tl

    return {
        "fp32": (tl.float32, lambda t: t.to(torch.float32).numpy()),
        "fp16": (tl.float16, lambda t: t.to(torch.float16).numpy()),
        # The interpreter keeps bf16 as its raw 16 bits in a numpy uint16 array. The probe
        # truncates fp32 bits rather than use torch's bf16 cast, which turns +NaN into
        # 0xFFFF (a negative NaN); every probe value stays in its class when truncated.
        "bf16": (tl.bfloat16, lambda t: (t.view(torch.int32) >> 16).to(torch.int16).numpy()),
    }


def _as_torch(data: np.ndarray, source: str) -> torch.Tensor:
    """An interpreter value array as a torch tensor of its real dtype (no copy of bits)."""
    array = np.ascontiguousarray(data)
    if source == "bf16":
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def probe_mistakes(create_fp_to_fp: Callable[..., Any]) -> tuple[str, ...]:
    """Run ``create_fp_to_fp`` (an ``InterpreterBuilder`` method, patched or not) on
    ``PROBE_VALUES`` from each rerouted source type, and list where its byte differs from
    ``e4m3_bytes_like_gpu``. Raises whatever Triton raises if its internals have moved."""
    interpreter = _interpreter()
    import triton.language as tl

    rtne = interpreter._ir.ROUNDING_MODE.RTNE
    probe = torch.tensor(PROBE_VALUES, dtype=torch.float32)
    mistakes: list[str] = []
    for source, (tl_type, to_numpy) in _source_types().items():
        data = to_numpy(probe)
        handle = interpreter.TensorHandle(data, tl_type)
        result = create_fp_to_fp(interpreter.interpreter_builder, handle, tl.float8e4nv, rtne)
        got = np.asarray(result.data).view(np.uint8).reshape(-1)
        want = e4m3_bytes_like_gpu(_as_torch(data, source)).numpy()
        for value, g, w in zip(PROBE_VALUES, got, want, strict=True):
            if g != w:
                mistakes.append(f"{source} {value:g} -> {g:#04x} (GPU {w:#04x})")
    return tuple(mistakes)


def _corrected(original: Callable[..., Any]) -> Callable[..., Any]:
    """``create_fp_to_fp`` with fp32/fp16/bf16 -> float8e4nv (RTNE) done as on the GPU and
    every other conversion handed to ``original`` unchanged."""
    interpreter = _interpreter()
    import triton.language as tl

    rtne = interpreter._ir.ROUNDING_MODE.RTNE
    sources = {tl_type: name for name, (tl_type, _) in _source_types().items()}

    @functools.wraps(original)
    def create_fp_to_fp(self: Any, src: Any, dst_type: Any, rounding_mode: Any) -> Any:
        source = sources.get(src.dtype.scalar)
        if dst_type.scalar != tl.float8e4nv or source is None or rounding_mode != rtne:
            return original(self, src, dst_type, rounding_mode)
        data = np.asarray(src.data)
        codes = e4m3_bytes_like_gpu(_as_torch(data, source)).numpy().reshape(data.shape)
        return interpreter.TensorHandle(codes, dst_type.scalar)

    setattr(create_fp_to_fp, _MARK, True)
    return create_fp_to_fp


def _unavailable(detail: str) -> Fp8CastCorrection:
    """Remember (and return) that the correction cannot be installed, in one line."""
    global _installed
    first_line = detail.strip().splitlines()[0] if detail.strip() else "unknown reason"
    _installed = Fp8CastCorrection("unavailable", first_line)
    return _installed


def install_fp8_cast_correction() -> Fp8CastCorrection:
    """Correct the running interpreter's cast to ``float8e4nv`` for the whole process, if
    (and only if) its own conversion is wrong. Idempotent; call only on the interpreted
    backend (it imports Triton's interpreter). Never raises for a Triton whose internals
    differ: the status then says ``unavailable`` and why."""
    global _installed
    if _installed is not None:
        return _installed
    try:
        builder_class = _interpreter().InterpreterBuilder
        current = builder_class.create_fp_to_fp
        params = list(inspect.signature(current).parameters)
    except (ImportError, AttributeError, TypeError, ValueError) as exc:
        return _unavailable(f"no InterpreterBuilder.create_fp_to_fp in Triton: {exc}")
    if getattr(current, _MARK, False):  # already wrapped, e.g. by a reloaded copy of this module
        _installed = Fp8CastCorrection("corrected")
        return _installed
    if params != ["self", "src", "dst_type", "rounding_mode"]:
        return _unavailable(f"create_fp_to_fp takes ({', '.join(params)}), not what was patched")
    try:
        mistakes = probe_mistakes(current)
    except Exception as exc:  # Triton's internals moved: say so instead of guessing
        return _unavailable(f"probing the interpreter's cast failed: {type(exc).__name__}: {exc}")
    if not mistakes:
        _installed = Fp8CastCorrection("not needed")
        return _installed
    corrected = _corrected(current)
    builder_class.create_fp_to_fp = corrected
    try:
        still_wrong = probe_mistakes(corrected)
    except Exception as exc:
        still_wrong = (f"{type(exc).__name__}: {exc}",)
    if still_wrong:
        builder_class.create_fp_to_fp = current
        return _unavailable(f"the correction did not take: {still_wrong[0]}")
    _installed = Fp8CastCorrection("corrected", mistakes=mistakes)
    return _installed
