"""Make two of Triton's CPU interpreter's hot spots cheaper without changing a bit: the
conversion between fp32 and bf16, and the lookup of a value's numpy dtype.

What they cost. The project's kernel widens every bf16 row it loads to fp32 and narrows
every fp32 tile it stores to a bf16 output. The interpreter does both in
``triton/runtime/interpreter.py``'s ``_convert_float``, a converter between any two float
formats: it takes sign, exponent and mantissa apart, renormalises subnormals with a loop
over the mantissa bits, and rebuilds the result, about 0.45 ms a call on 2 cores.
``_get_np_dtype`` builds a 20-entry dict on every call (about 17 us; some 54,000 calls in
one ``dcpcheck run --dcp 4``). Under cProfile the two were a seventh of that run (triton
3.9).

Why the fast path gives the same bits. ``cast_impl`` asks ``_convert_float`` for bf16 ->
fp32 and fp32 -> bf16 with no rounding mode (a ``.to()`` between the two). Both formats
have an 8-bit exponent with the same bias, so for any value whose exponent field is not
zero the converter keeps the sign and exponent and shifts the mantissa: widening appends
16 zero bits, narrowing keeps the high 16 bits (truncation, not the GPU's round to
nearest even: docs/dcp-contract.md, "The evidence"). +-0 comes out the same way. A subnormal input
(zero exponent, non-zero mantissa) goes to Triton's own code, whose renormalisation
gives other bits that this module does not try to reproduce, as does every other pair
of formats and any rounding mode.

Checked, not assumed. Before anything is installed, the fast conversions are compared
with Triton's on all 65,536 bf16 bit patterns and on fp32 patterns covering every
exponent of both signs (infinities and NaNs included), and the memoised dtype lookup
with Triton's on every dtype its table holds, alone and as a block. Only if all agree is
anything replaced; otherwise Triton's internals are left alone and the status says why
in the backend's line: the interpreter is then only slower.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

_MARK = "_dcpcheck_dtype_fast_path"
"""Attribute set on an installed replacement, so installing twice replaces only once
(Triton's own function stays reachable as its ``__wrapped__``)."""

_status: str | None = None

BF16_EXPONENT, BF16_MANTISSA = np.uint16(0x7F80), np.uint16(0x007F)
FP32_EXPONENT, FP32_MANTISSA = np.uint32(0x7F800000), np.uint32(0x007FFFFF)

CONVERT_PARAMETERS = ["input", "input_dtype", "output_dtype", "rounding_mode"]
"""``_convert_float``'s parameters in Triton 3.9 (this project's CPU venv; the GPU box's 3.6
compiles and never interprets). Another signature is reported, not guessed at."""


def _interpreter() -> Any:
    from triton.runtime import interpreter

    return interpreter


def _has_subnormal(bits: np.ndarray, exponent: np.integer, mantissa: np.integer) -> bool:
    """Whether any of ``bits`` has a zero exponent field and a non-zero mantissa."""
    return bool(np.any(((bits & exponent) == 0) & ((bits & mantissa) != 0)))


def widen_bf16(data: np.ndarray) -> np.ndarray | None:
    """fp32 bits (uint32) of bf16 bits ``data`` (uint16), or None if any is subnormal."""
    bits = np.ascontiguousarray(data).view(np.uint16)
    if _has_subnormal(bits, BF16_EXPONENT, BF16_MANTISSA):
        return None
    return (bits.astype(np.uint32) << np.uint32(16)).reshape(np.shape(data))


def narrow_fp32(data: np.ndarray) -> np.ndarray | None:
    """bf16 bits (uint16) of fp32 ``data`` truncated, or None if any is subnormal."""
    bits = np.ascontiguousarray(data).view(np.uint32)
    if _has_subnormal(bits, FP32_EXPONENT, FP32_MANTISSA):
        return None
    return (bits >> np.uint32(16)).astype(np.uint16).reshape(np.shape(data))


def _fast_convert(original: Callable[..., Any]) -> Callable[..., Any]:
    """``_convert_float`` with the two conversions above done directly (module docstring)."""
    import triton.language as tl

    @functools.wraps(original)
    def convert_float(input: Any, input_dtype: Any, output_dtype: Any, rounding_mode: Any) -> Any:
        result = None
        if rounding_mode is None and isinstance(input, np.ndarray):
            if input_dtype == tl.bfloat16 and output_dtype == tl.float32 and input.itemsize == 2:
                result = widen_bf16(input)
            elif input_dtype == tl.float32 and output_dtype == tl.bfloat16 and input.itemsize == 4:
                result = narrow_fp32(input)
        if result is None:
            return original(input, input_dtype, output_dtype, rounding_mode)
        return result

    setattr(convert_float, _MARK, True)
    return convert_float


def _memoised_np_dtype(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``_get_np_dtype`` answered from a dict: its answer depends only on the scalar type
    (a block's element type; every pointer type maps alike)."""
    import triton.language as tl

    answers: dict[Any, Any] = {}

    @functools.wraps(original)
    def get_np_dtype(tt_dtype: Any) -> Any:
        scalar = tt_dtype.element_ty if isinstance(tt_dtype, tl.block_type) else tt_dtype
        key = tl.pointer_type if isinstance(scalar, tl.pointer_type) else scalar
        try:
            return answers[key]
        except KeyError:
            answers[key] = answer = original(tt_dtype)
            return answer
        except TypeError:  # an unhashable type: ask Triton each time
            return original(tt_dtype)

    setattr(get_np_dtype, _MARK, True)
    return get_np_dtype


def _probe_fp32_bits() -> np.ndarray:
    """fp32 patterns: every exponent of both signs with a spread of mantissas, and a
    seeded sample of all patterns; subnormals left out (they go to Triton's code)."""
    mantissas = np.array(
        [0, 1, 2, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x10000, 0x400000, 0x3FFFFF, 0x7FFFFF],
        dtype=np.uint32,
    )
    signs = np.array([0, 1 << 31], dtype=np.uint32)
    exponents = np.arange(256, dtype=np.uint32) << np.uint32(23)
    grid = (signs[:, None, None] | exponents[None, :, None] | mantissas[None, None, :]).ravel()
    sample = np.random.default_rng(0).integers(0, 1 << 32, 65_536, dtype=np.uint64)
    bits = np.concatenate([grid, sample.astype(np.uint32)])
    normal = ((bits & FP32_EXPONENT) != 0) | ((bits & FP32_MANTISSA) == 0)
    return bits[normal]


def probe_disagreements(
    convert: Callable[..., Any], get_np_dtype: Callable[[Any], Any]
) -> list[str]:
    """Where the fast paths differ from Triton's ``convert`` and ``get_np_dtype`` (empty:
    they agree everywhere probed). Raises whatever Triton raises if its internals moved."""
    import triton.language as tl

    found: list[str] = []
    bf16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    bf16 = bf16[((bf16 & BF16_EXPONENT) != 0) | ((bf16 & BF16_MANTISSA) == 0)]
    fp32 = _probe_fp32_bits().view(np.float32)
    for name, fast, data, source, target in (
        ("bf16 -> fp32", widen_bf16, bf16, tl.bfloat16, tl.float32),
        ("fp32 -> bf16", narrow_fp32, fp32, tl.float32, tl.bfloat16),
    ):
        want = np.asarray(convert(data, source, target, None))
        got = fast(data)
        if got is None or got.dtype != want.dtype or not np.array_equal(got, want):
            found.append(f"{name} differs from Triton's _convert_float")
    memoised = _memoised_np_dtype(get_np_dtype)
    scalars = [
        getattr(tl, name)
        for name in ("int1", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64",
                     "uint64", "float16", "bfloat16", "float32", "float64", "float8e5",
                     "float8e5b16", "float8e4nv", "float8e4b8", "float8e4b15")
        if hasattr(tl, name)
    ]  # fmt: skip
    scalars += [tl.pointer_type(tl.float32), tl.pointer_type(tl.int8)]
    for scalar in scalars:
        for tt_dtype in (scalar, tl.block_type(scalar, [4]), scalar):  # a miss, then a hit
            if memoised(tt_dtype) != get_np_dtype(tt_dtype):
                found.append(f"numpy dtype of {tt_dtype} differs from Triton's _get_np_dtype")
    return found


def install_dtype_fast_paths() -> str:
    """Replace the running interpreter's ``_convert_float`` and ``_get_np_dtype`` with the
    fast paths (module docstring), once per process; the status as the backend's line
    shows it. Call only on the interpreted backend (it imports Triton's interpreter)."""
    global _status
    if _status is not None:
        return _status
    try:
        interpreter = _interpreter()
        convert, get_np_dtype = interpreter._convert_float, interpreter._get_np_dtype
        parameters = list(inspect.signature(convert).parameters)
    except (ImportError, AttributeError, TypeError, ValueError) as exc:
        _status = f"bf16 casts interpreted bit by bit (no fast path: {exc})"
        return _status
    if not getattr(convert, _MARK, False):
        if parameters != CONVERT_PARAMETERS:
            _status = f"bf16 casts interpreted bit by bit (_convert_float takes {parameters})"
            return _status
        try:
            disagreements = probe_disagreements(convert, get_np_dtype)
        except Exception as exc:  # Triton's internals moved: say so instead of guessing
            disagreements = [f"probing failed: {type(exc).__name__}: {exc}"]
        if disagreements:
            _status = f"bf16 casts interpreted bit by bit ({disagreements[0]})"
            return _status
        interpreter._convert_float = _fast_convert(convert)
        interpreter._get_np_dtype = _memoised_np_dtype(get_np_dtype)
    _status = "bf16 casts vectorized"
    return _status
