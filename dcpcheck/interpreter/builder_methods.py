"""Replace methods of Triton's ``InterpreterBuilder`` by wrappers, once per process: what
the corrections that change how the interpreter builds a value (``masks``, ``dots``,
``bf16_casts``) share."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

Wrap = Callable[[Callable[..., Any], Any], Callable[..., Any]]
"""``wrap(original, interpreter)``: the replacement of a builder method, given Triton's
method and its interpreter module."""


def wrap_builder_methods(wraps: Mapping[str, Wrap], mark: str, needs: tuple[str, ...] = ()) -> None:
    """Replace each method of ``InterpreterBuilder`` named in ``wraps`` by its wrapper,
    marked with the attribute ``mark``, unless the method there is so marked already
    (installing twice wraps once; Triton's method stays reachable as the wrapper's
    ``__wrapped__``). ``needs``: names the wrappers use from the interpreter module.
    ``ImportError`` or ``AttributeError`` when Triton's internals have moved, raised
    before anything is replaced."""
    interpreter = importlib.import_module("triton.runtime.interpreter")
    builder = interpreter.InterpreterBuilder
    originals = {name: getattr(builder, name) for name in wraps}
    for name in needs:
        getattr(interpreter, name)
    for name, original in originals.items():
        if getattr(original, mark, False):
            continue
        wrapped = wraps[name](original, interpreter)
        setattr(wrapped, mark, True)
        setattr(builder, name, wrapped)
