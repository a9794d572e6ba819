"""Resolve ``--kernel`` to a callable following the kernel protocol (dcpcheck.contract).

Accepted forms: a registry name (``default``, ``regress/pre-54908``), a released kernel
(``vllm==0.29.0``, fetched and cached by :mod:`dcpcheck.kernels.releases`), an importable
``package.module:function``, or ``path/to/file.py:function`` loaded straight from a
file without installing the project it belongs to. A file's module-level imports of its
host project (vLLM's platform query and Triton re-export) are answered by the stand-ins
of :mod:`dcpcheck.adapters.shims` when that project is not installed; the substitution is logged.

The function found is then fitted to the protocol by an adapter (:mod:`dcpcheck.adapters`):
``auto`` recognises vLLM's ``fused_norm_rope`` by its signature and otherwise takes the
callable as following the protocol itself; ``vllm`` and ``native`` force the choice.

Every way of failing raises :class:`KernelLoadError` with one line naming the cause; the
CLI turns it into exit code 125, which ``git bisect run`` treats as "skip this commit".
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import importlib
import importlib.util
import logging
import sys
from pathlib import Path
from types import ModuleType

from dcpcheck import adapters
from dcpcheck.adapters import shims
from dcpcheck.adapters import vllm as vllm_adapter
from dcpcheck.adapters.protocol import AdapterError
from dcpcheck.backend import current_backend
from dcpcheck.contract import Kernel
from dcpcheck.kernels import releases
from dcpcheck.kernels.registry import KERNELS

log = logging.getLogger(__name__)


class KernelLoadError(RuntimeError):
    """The kernel cannot be imported, compiled or found (exit code 125)."""


def _module_name(path: Path) -> str:
    """A stable module name per file: tracebacks and Triton's caches name the file's
    module, and two files called ``kernels.py`` must not share one."""
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    return f"dcpcheck_external_{path.stem}_{digest}"


def _read_source(path: Path) -> ast.Module:
    if not path.is_file():
        raise KernelLoadError(f"{path}: no such kernel file")
    try:
        source = path.read_bytes()
    except OSError as exc:
        raise KernelLoadError(f"{path}: cannot read: {exc.strerror}") from exc
    try:
        return ast.parse(source, filename=str(path))
    except SyntaxError as exc:
        raise KernelLoadError(f"{path}:{exc.lineno}: syntax error: {exc.msg}") from exc


def _load_file(path: Path) -> ModuleType:
    tree = _read_source(path)
    module_name = _module_name(path)
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise KernelLoadError(f"{path}: not a loadable Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # Triton and dataclasses look the module up by name
    with shims.stand_ins_for(shims.imported_modules(tree)) as stood_in:
        if stood_in:
            log.warning(
                "%s: %s is not installed; loading with dcpcheck's stand-ins for %s "
                "(dcpcheck/adapters/shims)",
                path,
                stood_in[0].split(".")[0],
                ", ".join(stood_in),
            )
        try:
            spec.loader.exec_module(module)
        except ImportError as exc:
            del sys.modules[module_name]
            why = shims.missing_stand_in(exc, stood_in) or f"import failed: {exc}"
            raise KernelLoadError(f"{path}: {why}") from exc
        except Exception as exc:  # the module's own import-time failure, reported as load error
            del sys.modules[module_name]
            raise KernelLoadError(f"{path}: import failed: {type(exc).__name__}: {exc}") from exc
    return module


def _load_module(name: str) -> ModuleType:
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


def _split_spec(spec: str, registry: list[str]) -> tuple[str, str]:
    """``where:function`` -> (where, function), or a one-line error naming what is missing."""
    if ":" not in spec:
        if spec.endswith(".py"):
            raise KernelLoadError(f"{spec}: name the function too, as {spec}:FUNCTION")
        raise KernelLoadError(
            f"unknown kernel {spec!r}: not a registry name ({', '.join(registry)}) "
            "nor module:function"
        )
    where, function = spec.rsplit(":", 1)
    if not where or not function:
        raise KernelLoadError(f"{spec!r}: expected module:function or path/to/file.py:function")
    return where, function


def load_kernel(spec: str, adapter: str = "auto") -> Kernel:
    """The kernel named by ``spec``, fitted to the protocol by ``adapter`` (module docstring).

    ``adapter`` is one of :data:`dcpcheck.adapters.ADAPTER_NAMES`; registry kernels
    follow the protocol already and accept only ``auto`` or ``native``.
    """
    if adapter not in adapters.ADAPTER_NAMES:
        raise KernelLoadError(
            f"unknown adapter {adapter!r} (expected {', '.join(adapters.ADAPTER_NAMES)})"
        )
    current_backend()  # fix interpreted vs compiled before any @triton.jit is defined
    if spec in KERNELS:
        if adapter not in ("auto", "native"):
            raise KernelLoadError(
                f"{spec}: a registry kernel follows dcpcheck's protocol; "
                f"the {adapter} adapter does not apply"
            )
        return KERNELS[spec].load()
    release = releases.parse_spec(spec)
    if release is not None:
        return _load_release(release, adapter)
    where, function = _split_spec(spec, list(KERNELS))
    module = _load_file(Path(where)) if where.endswith(".py") else _load_module(where)
    target = getattr(module, function, None)
    if target is None:
        raise KernelLoadError(f"{where}: has no function {function!r}")
    if not callable(target):
        raise KernelLoadError(f"{where}:{function} is not callable")
    try:
        return adapters.adapt(target, adapter)
    except AdapterError as exc:
        raise KernelLoadError(f"{spec}: {exc}") from exc


def _load_release(release: releases.ReleaseSpec, adapter: str) -> Kernel:
    """A released vLLM kernel: its file from the release cache (fetched on first use),
    through vLLM's adapter, carrying what the release's source says of its encoding."""
    if adapter not in ("auto", "vllm"):
        raise KernelLoadError(f"{release.name}: a vLLM release runs through the vllm adapter")
    try:
        path = releases.fetch(release.version)
    except releases.ReleaseError as exc:
        raise KernelLoadError(str(exc)) from exc
    target = getattr(_load_file(path), release.function, None)
    if target is None or not callable(target):
        raise KernelLoadError(f"{release.name}: {path} has no function {release.function!r}")
    try:
        kernel = vllm_adapter.adapt(target, ds_mla_scale=releases.ds_mla_scale_of(release.version))
    except AdapterError as exc:
        raise KernelLoadError(f"{release.name}: {exc}") from exc
    return dataclasses.replace(kernel, name=release.name)
