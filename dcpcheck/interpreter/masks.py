"""Make Triton's CPU interpreter take the masks a GPU takes.

What goes wrong. Combining a boolean block with a boolean scalar, as kernels do to fold a
per-program condition into a per-row mask (``rows < end & (table_row >= 0)``,
``~sharded | is_local``), gives the interpreter an int32 block of 0s and 1s where compiled
Triton has an ``i1`` one, and the interpreter's masked load and store refuse it ("mask has
unsupported dtype"; triton 3.9). The values are right, only the type is not: a kernel that
runs on every GPU fails to run on the CPU, and its cases could never be judged there.

The correction. A masked load or store whose mask is an integer block holding only 0 and 1
gets it as booleans, which is what the GPU reads. A mask with any other value is left as
it is, for the interpreter to refuse as before: no value is guessed at.

If Triton's internals have moved (no ``InterpreterBuilder`` with masked loads and stores),
nothing is patched and the status says so in the backend's line.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from dcpcheck.interpreter.builder_methods import wrap_builder_methods

_MARK = "_dcpcheck_boolean_masks"
_status: str | None = None


def _as_boolean(interpreter: Any, mask: Any) -> Any:
    """``mask`` as the boolean block a GPU would see, where it is an integer block of 0s
    and 1s; else ``mask`` itself."""
    import numpy as np
    import triton.language as tl

    data = mask.data
    if data.dtype == np.bool_ or not np.issubdtype(data.dtype, np.integer):
        return mask
    if not ((data == 0) | (data == 1)).all():
        return mask
    return interpreter.TensorHandle(data.astype(np.bool_), tl.int1)


def _loads_boolean(load: Callable[..., Any], interpreter: Any) -> Callable[..., Any]:
    @functools.wraps(load)
    def masked_load(self, ptrs, mask, other, *args, **kwargs):
        return load(self, ptrs, _as_boolean(interpreter, mask), other, *args, **kwargs)

    return masked_load


def _stores_boolean(store: Callable[..., Any], interpreter: Any) -> Callable[..., Any]:
    @functools.wraps(store)
    def masked_store(self, ptrs, value, mask, *args, **kwargs):
        return store(self, ptrs, value, _as_boolean(interpreter, mask), *args, **kwargs)

    return masked_store


def install_boolean_masks() -> str:
    """Have the running interpreter read integer masks of 0s and 1s as booleans (module
    docstring), once per process; the status as the backend's line shows it. Call only on
    the interpreted backend (it imports Triton's interpreter)."""
    global _status
    if _status is None:
        wraps = {"create_masked_load": _loads_boolean, "create_masked_store": _stores_boolean}
        try:  # TensorHandle: the type a corrected mask is made of
            wrap_builder_methods(wraps, _MARK, ("TensorHandle",))
        except (ImportError, AttributeError) as exc:
            _status = f"masks as the interpreter takes them ({exc})"
        else:
            _status = "0/1 integer masks read as booleans"
    return _status
