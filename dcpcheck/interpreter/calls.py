"""Make Triton's CPU interpreter patch ``triton.language`` once per launch, not once per
call of every ``@triton.jit`` helper.

What it costs. Under ``TRITON_INTERPRET=1`` a launch first swaps every builtin of
``triton.language`` (and of ``tl.tensor``, ``tl.math``, ``tl.core``) for its interpreted
form, runs the grid, and swaps them back (``triton/runtime/interpreter.py``,
``_patch_lang``, called from ``GridExecutor.__call__``). But every call of a jit helper
inside the kernel (``InterpretedFunction.__call__``) calls ``_patch_lang`` again: five
``inspect.getmembers`` scans of those modules, about 0.15 ms, for a patch that is already
in place. The project's kernel calls 40 to 50 helpers per program, so on 2 cores this was
a fifth of a property search's time (14.5 s of 72 s under cProfile, triton 3.9).

Why skipping it changes nothing. The repeated patch finds the builtins already replaced:
the interpreted forms are plain functions, not builtins, so it wraps none of them again;
what it does re-set (``tl.tensor``'s ``__bool__`` and the like, the reduce and scan ops)
it sets to the same behaviour; and its scope is never restored (the launch's restores
the originals). So a helper whose module sees only language modules the running launch
already patched skips the call; any other call (a helper whose globals hold a language
module the launch did not patch, or a call outside a launch) goes to Triton's own
``_patch_lang`` unchanged. (A launch is known by wrapping ``GridExecutor.__call__``.)

If Triton's internals have moved (no ``_patch_lang`` taking one function, no
``GridExecutor``), nothing is patched and the status says so in the backend's line: the
interpreter is then only slower.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable
from typing import Any

_MARK = "_dcpcheck_patches_once"
_status: str | None = None


def _interpreter() -> Any:
    return importlib.import_module("triton.runtime.interpreter")


@functools.cache
def _language_modules(fn: Callable[..., Any]) -> frozenset[int]:
    """The ``triton.language`` modules ``fn``'s module can reach, by id: what Triton's
    ``_patch_lang`` patches for it (read once per function: module imports stay put)."""
    import triton.language as tl

    wanted = (tl, tl.core)
    return frozenset(
        id(value)
        for value in fn.__globals__.values()
        if inspect.ismodule(value) and any(value is module for module in wanted)
    )


class _NothingPatched:
    """What a skipped call returns (Triton discards a helper call's scope)."""

    def restore(self) -> None:
        pass


class _Launches:
    """The language modules patched by the launch running now (``None``: no launch)."""

    def __init__(self) -> None:
        self.patched: set[int] | None = None

    def launch(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``GridExecutor.__call__``, with the launch's patched modules tracked."""

        @functools.wraps(original)
        def call(executor: Any, *args: Any, **kwargs: Any) -> Any:
            outer, self.patched = self.patched, set()
            try:
                return original(executor, *args, **kwargs)
            finally:
                self.patched = outer

        return call

    def patch_lang(self, original: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """``_patch_lang``, skipped for a helper whose modules the launch patched."""

        @functools.wraps(original)
        def patch_lang(fn: Any) -> Any:
            if self.patched is None:  # outside a launch: Triton's own behaviour
                return original(fn)
            modules = _language_modules(fn)
            if modules and modules <= self.patched:
                return _NothingPatched()
            scope = original(fn)  # the launch's own patch, or a module it did not patch
            self.patched |= modules
            return scope

        return patch_lang


def install_language_patch_once() -> str:
    """Patch the running interpreter (module docstring), once per process; the status as
    the backend's line shows it."""
    global _status
    if _status is not None:
        return _status
    try:
        interpreter = _interpreter()
        current = interpreter._patch_lang
        params = list(inspect.signature(current).parameters)
    except (ImportError, AttributeError, TypeError, ValueError) as exc:
        _status = f"language patched per helper call (no interpreter._patch_lang: {exc})"
        return _status
    if not getattr(current, _MARK, False):
        executor = getattr(interpreter, "GridExecutor", None)
        if len(params) != 1 or executor is None:
            _status = f"language patched per helper call (_patch_lang takes {params})"
            return _status
        launches = _Launches()
        executor.__call__ = launches.launch(executor.__call__)
        interpreter._patch_lang = launches.patch_lang(current)
        setattr(interpreter._patch_lang, _MARK, True)
    _status = "language patched once per launch"
    return _status
