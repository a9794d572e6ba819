"""Which functions of a stood-in file (``dcpcheck.kernels.substitution``) this process ran,
written where ``$DCPCHECK_RAN_DIR`` says: ``dcpcheck mutate`` asks it of the unedited
kernel's gate, and skips the mutants of functions that nothing the gate ran can reach
(``dcpcheck.mutation.reach``).

A function ran when Python entered it, or when Triton launched it (``JITFunction.run``
and the interpreter's ``run`` both hold the launched function as ``self.fn``): on a GPU a
kernel's body is compiled code that Python never enters. So a jitted function that a
kernel calls ran when Triton's code generator compiled a call to it (the trace sees
``CodeGenerator.call_JitFunction`` begin), in whatever file it lives: only the calls of the
branches a launch's constexprs take are compiled, and a module-level alias is the function
it is bound to in this process (the fused kernel's ``fp8_e4m3_codes`` is the e4m3
conversion instruction on an sm_89+ GPU, the integer encoding under the interpreter). A
binary Triton loads from its cache is not compiled, so the unedited kernel's gate that
records this runs with a Triton cache of its own (``dcpcheck.mutation.runner``).

Each process that stands a file in (the mutation worker, the fused op's isolation
workers) writes its own ``ran-PID.json``, rewritten whenever a function is added, so a
process that leaves through ``os._exit`` or is killed keeps what it saw.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

RAN_DIR_ENV = "DCPCHECK_RAN_DIR"
RAN_FILES_ENV = "DCPCHECK_RAN_FILES"  # more files to watch as they are (os.pathsep between)
COMPILED_CALL = "call_JitFunction"
"""The method of Triton's code generator that compiles a call to a jitted function, its
callee as ``fn`` (module docstring)."""

_WATCHED: dict[str, str] = {}  # the stand-in's path, as code objects name it -> the original's
_RAN: dict[str, set[str]] = {}  # the original's path -> the names of its functions that ran


def _record(original: str, name: str) -> None:
    names = _RAN.setdefault(original, set())
    if name in names:
        return
    names.add(name)
    folder = Path(os.environ[RAN_DIR_ENV])
    text = json.dumps({path: sorted(ran) for path, ran in _RAN.items()})
    scratch = folder / f".ran-{os.getpid()}.json"
    scratch.write_text(text)
    scratch.replace(folder / f"ran-{os.getpid()}.json")


@functools.cache
def _original(filename: str) -> str | None:
    """The watched file a code object's ``co_filename`` is, as its original's path."""
    return _WATCHED.get(filename) or _WATCHED.get(os.path.realpath(filename))


def _ran(function: Any) -> None:
    """Record ``function`` (a Python function, or Triton's wrapper of one) if it lives in
    a watched file."""
    code = getattr(getattr(function, "fn", function), "__code__", None)
    if code is not None and (original := _original(code.co_filename)) is not None:
        _record(original, code.co_name)


def _called(frame: FrameType, event: str, arg: Any) -> None:
    """The trace function: sees each new frame once, and traces nothing inside it."""
    original = _original(frame.f_code.co_filename)
    if original is not None:
        _record(original, frame.f_code.co_name)
    elif frame.f_code.co_name == "run":
        _ran(getattr(frame.f_locals.get("self"), "fn", None))
    elif frame.f_code.co_name == COMPILED_CALL:
        _ran(frame.f_locals.get("fn"))
    return None


def watch(replacement: Path, original: Path) -> None:
    """Record the functions of ``replacement`` that run in this process, under
    ``original``'s path, and those of each file ``$DCPCHECK_RAN_FILES`` names, when
    ``$DCPCHECK_RAN_DIR`` is set (module docstring)."""
    if RAN_DIR_ENV not in os.environ:
        return
    _WATCHED.update({p: p for p in os.environ.get(RAN_FILES_ENV, "").split(os.pathsep) if p})
    _WATCHED[str(replacement)] = str(original)
    _original.cache_clear()
    sys.settrace(_called)
    threading.settrace(_called)


def read(folder: Path) -> dict[str, set[str]]:
    """Every process's record under ``folder``, merged: original path -> function names."""
    merged: dict[str, set[str]] = {}
    for path in sorted(folder.glob("ran-*.json")):
        for original, names in json.loads(path.read_text()).items():
            merged.setdefault(original, set()).update(names)
    return merged
