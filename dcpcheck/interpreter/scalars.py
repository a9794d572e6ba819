"""Make Triton's CPU interpreter take a loaded scalar where Python wants an integer, as a
GPU does.

What goes wrong. Inside the interpreter a scalar loaded from memory (``tl.load(ptr + i)``)
is a NumPy array of one element and one dimension. Where Python needs an integer (the
bounds of a kernel's ``for start in range(begin, end, BLOCK)``), the interpreter calls
``int()`` on that array, which NumPy 2 refuses for any array that is not zero-dimensional
("only 0-dimensional arrays can be converted to Python scalars"). Triton 3.9 squeezes the
array first; Triton 3.6, the GPU box's, does not. There every such kernel errors under the
interpreter: the project's slot-mapping kernel, and with it every ``--device cpu`` run and
the real-rank processes, which interpret on the CPU.

The correction. After Triton sets the interpreted tensor's methods for a launch
(``_patch_lang_tensor``), ``__index__`` converts a one-element array's element; a block
of more elements is refused as before. Where Triton already squeezes, nothing it computes
changes.

If Triton's internals have moved (no ``_patch_lang_tensor``), nothing is patched and the
status says so in the backend's line.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

_MARK = "_dcpcheck_scalar_index"
_status: str | None = None


def scalar_index(tensor: Any) -> int:
    """The integer a one-element interpreted tensor holds (what a GPU's scalar is)."""
    data = tensor.handle.data
    return int(data.reshape(-1)[0]) if data.size == 1 else int(data)


def install_scalar_index() -> str:
    """Patch the running interpreter (module docstring), once per process; the status as
    the backend's line shows it."""
    global _status
    if _status is not None:
        return _status
    interpreter = importlib.import_module("triton.runtime.interpreter")
    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None:
        _status = "loaded scalars as Triton indexes them (no interpreter._patch_lang_tensor)"
        return _status
    if not getattr(original, _MARK, False):

        @functools.wraps(original)
        def patch_lang_tensor(tensor: Any, scope: Any) -> None:
            original(tensor, scope)
            scope.set_attr(tensor, "__index__", scalar_index)

        setattr(patch_lang_tensor, _MARK, True)
        interpreter._patch_lang_tensor = patch_lang_tensor
    _status = "one-element blocks index as integers"
    return _status
