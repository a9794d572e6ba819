"""Resolve ``--kernel`` to a callable following the kernel protocol (dcpcheck.contract).

Accepted forms: a registry name (``default``, ``regress/pre-54908``), an importable
``package.module:function``, or ``path/to/file.py:function`` loaded straight from a
file without installing the project it belongs to.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from dcpcheck.backend import current_backend
from dcpcheck.contract import Kernel


class KernelLoadError(RuntimeError):
    """The kernel cannot be imported, compiled or found (exit code 125)."""


def _load_file(path: Path):
    if not path.is_file():
        raise KernelLoadError(f"{path}: no such kernel file")
    module_name = f"dcpcheck_external_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise KernelLoadError(f"{path}: not a loadable Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        raise KernelLoadError(f"{path}:{exc.lineno}: syntax error: {exc.msg}") from exc
    except Exception as exc:  # the module's own import-time failure, reported as load error
        raise KernelLoadError(f"{path}: import failed: {type(exc).__name__}: {exc}") from exc
    return module


def _load_module(name: str):
    try:
        return importlib.import_module(name)
    except SyntaxError as exc:
        raise KernelLoadError(
            f"{name}: syntax error at {exc.filename}:{exc.lineno}: {exc.msg}"
        ) from exc
    except ImportError as exc:
        raise KernelLoadError(f"{name}: cannot import: {exc}") from exc
    except Exception as exc:  # the module's own import-time failure, reported as load error
        raise KernelLoadError(f"{name}: import failed: {type(exc).__name__}: {exc}") from exc


def load_kernel(spec: str) -> Kernel:
    """The kernel named by ``spec`` (see module docstring)."""
    current_backend()  # fix interpreted vs compiled before any @triton.jit is defined
    from dcpcheck.kernels import KERNELS

    if spec in KERNELS:
        return KERNELS[spec].load()
    if ":" not in spec:
        known = ", ".join(KERNELS)
        raise KernelLoadError(
            f"unknown kernel {spec!r}: not a registry name ({known}) nor module:function"
        )
    where, function = spec.rsplit(":", 1)
    module = _load_file(Path(where)) if where.endswith(".py") else _load_module(where)
    kernel = getattr(module, function, None)
    if kernel is None:
        raise KernelLoadError(f"{where}: has no function {function!r}")
    if not callable(kernel):
        raise KernelLoadError(f"{where}:{function} is not callable")
    return kernel
