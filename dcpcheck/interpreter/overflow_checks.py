"""Stop Triton's CPU interpreter computing integer-overflow checks that nothing reads.

What it costs. The interpreter's options ask for overflow sanitizing
(``InterpreterOptions.sanitize_overflow``, true in Triton 3.9), so every add, sub and mul
of 32-bit integers (each offset, index and mask a kernel computes) is computed a second
time in int64 and compared with int32's bounds, and the result is handed to
``device_assert``. That asserts only when the options' ``debug`` is set, which the
interpreter's options never are: the check is computed and dropped. Under cProfile it was
a quarter of the interpreter's time in ``dcpcheck run --dcp 4`` (11.7 of 44.6 s).

Why nothing changes. A compiled kernel sanitizes overflow only in debug mode too, so
neither backend ever reported an overflow to dcpcheck; an overflowing int32 wraps in
both. Turning the option off removes the discarded computation and nothing else.

Checked, not assumed. Before the option is turned off, a false condition is handed to the
interpreter's own ``device_assert``; only if it is dropped (the interpreter's assert would
raise) is anything changed. Otherwise the option stays on and the status says why in the
backend's line: the interpreter is then only slower.
"""

from __future__ import annotations

import dataclasses
import importlib

_status: str | None = None


def _asserts_are_dropped(interpreter) -> bool:
    """Whether the interpreter's ``device_assert`` drops a false condition, as it does
    while its options' ``debug`` is off."""
    import numpy as np
    import triton.language as tl

    false = tl.tensor(interpreter.TensorHandle(np.array([False]), tl.int1), tl.int1)
    try:
        interpreter.interpreter_semantic.device_assert(false, "dcpcheck's probe", None)
    except AssertionError:
        return False
    return True


def install_unread_overflow_checks_off() -> str:
    """Turn the interpreter's overflow sanitizing off where its asserts are dropped (module
    docstring), once per process; the status as the backend's line shows it."""
    global _status
    if _status is not None:
        return _status
    interpreter = importlib.import_module("triton.runtime.interpreter")
    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    semantic = getattr(interpreter, "interpreter_semantic", None)
    if options is None or not hasattr(options, "sanitize_overflow") or semantic is None:
        _status = "overflow checks as Triton computes them (no interpreter_builder.options)"
    elif not options.sanitize_overflow:
        _status = "no overflow checks (the interpreter's own options)"
    elif not _asserts_are_dropped(interpreter):
        _status = "overflow checks computed (the interpreter's asserts are live)"
    else:
        builder.options = dataclasses.replace(options, sanitize_overflow=False)
        _status = "no overflow checks computed (its asserts are dropped)"
    return _status
