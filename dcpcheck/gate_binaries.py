"""The gate's Triton binaries, compiled before its cases by processes of their own.

A cold gate (an empty Triton cache: a fresh GPU box, a new Triton, an edited kernel)
spends most of its time in Triton's compiler: about sixty binaries, which the op packages
and the token streams compile one after the other as their cases first launch them, and
the fused op on threads where Triton's front end holds the GIL (``compile_ahead``). But
the plain gate judges the project's own kernels on its shipped scenarios, so which
binaries it launches is known before it starts: :data:`GATE_LAUNCHES`, the launches the
gate makes, recorded from the gate itself by ``python -m dcpcheck.gpu_fit record``, with
its token streams' at the model widths a GPU runs them at (the CPU's are smaller; the
README's test of ``dcpcheck run --dcp 4`` fails when the gate makes a launch the list
lacks).

:func:`compile_gate_binaries` asks Triton, for each listed launch, for its binary without
launching anything: it calls the kernel with stand-in arguments that Triton specializes
exactly as the recorded launch (a pointer's dtype and 16-byte alignment, an integer's
divisibility by 16, the constexprs and options; ``launch_arguments``), under an
``AsyncCompileMode`` whose executor holds every compile back. Triton keys each request by
its own cache key, so the binaries its on-disk cache lacks are known without
reimplementing that key; those are compiled into the cache by worker processes
(``python -m dcpcheck.gate_binaries``, one a core, no GIL shared). Then every held
request runs, now a load, and the binaries sit in the kernels' in-memory caches, where the
cases' launches find them. With a warm cache no worker starts and the requests load only
what the cases would have loaded.

Nothing here decides a verdict: a listed launch the kernels no longer make (an edited
launcher) is compiled for nothing, a launch the list lacks compiles when its case launches
it, as without the list, and a binary a worker fails to compile is compiled by the run
itself. Under the interpreter nothing is compiled.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dcpcheck import line_workers
from dcpcheck.backend import Backend
from dcpcheck.gpu_fit import GATE_LAUNCHES, LaunchConfig, read_manifest

WORKERS_MAX = 16
"""Compile processes at most (and at most one per core and per binary to compile): each
holds a CUDA context, about half a GiB of device memory."""

_POINTEE = {
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp32": torch.float32,
    "fp64": torch.float64,
    "fp8e4nv": torch.float8_e4m3fn,
    "fp8e5": torch.float8_e5m2,
    "i1": torch.bool,
    "i8": torch.int8,
    "i16": torch.int16,
    "i32": torch.int32,
    "i64": torch.int64,
    "u8": torch.uint8,
}
"""A pointer argument's Triton element type -> the torch dtype Triton names so."""

_SCALAR = {"i32": 1 << 4, "i64": 1 << 36, "u64": 1 << 63, "fp32": 0.5, "fp64": 0.5, "i1": True}
"""A scalar argument's Triton type -> a value Triton types so; an integer one (``i1`` is a
bool) is divisible by 16, and 3 more where the launch's was not."""

_INTEGERS = ("i32", "i64", "u64")


class _StandInTensor:
    """What Triton reads of a tensor argument at a compile (its dtype and address), for a
    pointer whose alignment is known (Triton's ``MockTensor`` is always aligned)."""

    def __init__(self, dtype: torch.dtype, aligned: bool) -> None:
        self.dtype = dtype
        self._address = 0 if aligned else 8

    def data_ptr(self) -> int:
        return self._address


@dataclass(frozen=True)
class GateBinaries:
    """What :func:`compile_gate_binaries` did: the launches listed, how many binaries the
    worker processes compiled (the rest were in Triton's cache), and the launches it could
    not ask Triton for, or whose compile failed, each with why."""

    listed: int
    compiled: int
    problems: tuple[str, ...] = ()
    seconds: float = 0.0

    def describe(self) -> str:
        """One line for the console."""
        said = (
            f"{self.compiled} of the gate's {self.listed} binaries, in worker processes "
            f"(the rest loaded from Triton's cache; {self.seconds:.1f} s)"
        )
        if self.problems:
            said += f"; {len(self.problems)} left to their cases ({self.problems[0]})"
        return said


def kernel_of(config: LaunchConfig) -> Any:
    """The ``@triton.jit`` function ``config`` launches."""
    module, qualname = config.kernel.split(":")
    found: Any = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


def launch_arguments(config: LaunchConfig, kernel: Any) -> tuple[list[Any], dict[str, Any]]:
    """Arguments and options with which ``kernel`` is specialized as ``config`` records
    (module docstring); ``ValueError`` for an argument type it cannot stand in for."""
    types, codes, values = dict(config.signature), dict(config.attrs), dict(config.constexprs)
    args: list[Any] = []
    for name in kernel.arg_names:
        kind = types[name]
        aligned = codes.get(name) == "D"
        if kind == "constexpr":
            args.append(values[name])
        elif kind.startswith("*") and kind[1:] in _POINTEE:
            args.append(_StandInTensor(_POINTEE[kind[1:]], aligned))
        elif kind in _SCALAR:
            misaligned = kind in _INTEGERS and not aligned
            args.append(_SCALAR[kind] + 3 if misaligned else _SCALAR[kind])
        else:
            raise ValueError(f"{config.kernel}: no stand-in for argument {name} of type {kind}")
    return args, dict(config.options)


def request_binary(config: LaunchConfig) -> None:
    """Ask Triton for ``config``'s binary: compiled (or loaded from its cache), never
    launched."""
    kernel = kernel_of(config)
    args, options = launch_arguments(config, kernel)
    kernel.run(*args, grid=(1,), warmup=True, **options)


@dataclass
class _HeldBack:
    """A compile Triton requested of the executor of :func:`_compiles_held_back`, not run
    until :meth:`run`; ``key`` is the cache key Triton handed its compile mode with it,
    whose exit waits on the future."""

    compile: Callable[[], Any]
    future: Future = field(default_factory=Future)
    config: LaunchConfig | None = None
    key: str = ""

    def in_cache(self) -> bool:
        """Whether Triton's on-disk cache holds the binary: Triton hashes that key and
        looks the kernel's metadata up under the hash, by the kernel's name."""
        from triton.runtime.cache import get_cache_manager

        assert self.config is not None
        manager = get_cache_manager(hashlib.sha256(self.key.encode("utf-8")).hexdigest())
        name = self.config.kernel.split(":")[1].split(".")[-1][:150]
        return manager.get_group(f"{name}.json") is not None

    def run(self) -> None:
        """Triton's compile: a load where its cache holds the binary, else a compile here."""
        if self.future.done():
            return
        try:
            self.future.set_result(self.compile())
        except Exception as error:  # the launch gets it, as it would from its own compile
            self.future.set_exception(error)


class _Holding:
    """An executor that runs nothing: each compile submitted is held (``held``) with the
    future handed back, which :meth:`_HeldBack.run` settles."""

    def __init__(self) -> None:
        self.held: list[_HeldBack] = []

    def submit(self, fn: Callable[[], Any]) -> Future:
        self.held.append(_HeldBack(fn))
        return self.held[-1].future


@contextlib.contextmanager
def _compiles_held_back() -> Iterator[tuple[Callable[[LaunchConfig], None], list[_HeldBack]]]:
    """Inside: ``request(config)`` asks Triton for a binary, and its compile is held in
    the list rather than run. The caller runs every held compile before leaving, where
    Triton puts each binary in its kernel's cache (one that failed is left out, and the case
    that launches it compiles it again)."""
    from triton.runtime._async_compile import AsyncCompileMode

    executor = _Holding()
    asking: list[LaunchConfig] = []

    class HoldingMode(AsyncCompileMode):
        def submit(self, key, compile_fn, *finalize):  # the finalizers vary by version
            known = len(executor.held)
            answer = super().submit(key, compile_fn, *finalize)
            if len(executor.held) > known:
                executor.held[-1].config, executor.held[-1].key = asking[-1], key
            return answer

    def request(config: LaunchConfig) -> None:
        asking.append(config)
        request_binary(config)

    mode = HoldingMode(executor)
    mode.__enter__()
    try:
        yield request, executor.held
    finally:
        with contextlib.suppress(Exception):  # a failed compile: its case compiles it
            mode.__exit__(None, None, None)


def compile_gate_binaries(backend: Backend, launches: Path = GATE_LAUNCHES) -> GateBinaries | None:
    """Every binary ``launches`` lists, compiled by worker processes where Triton's cache
    lacks it, and loaded into the kernels (module docstring); None under the interpreter or
    with no list. Never raises for a launch: one that cannot be asked for or compiled is
    left to its case and named in ``problems``."""
    if backend.interpreted or not launches.is_file():
        return None
    started = time.perf_counter()
    configs = read_manifest(launches)
    problems: list[str] = []
    with _compiles_held_back() as (request, held):
        for config in configs:
            try:
                request(config)
            except Exception as error:
                problems.append(f"{config.kernel}: {type(error).__name__}: {error}".splitlines()[0])
        missing = [h.config for h in held if h.config is not None and not h.in_cache()]
        failed = compile_in_workers(missing)
        for compile_request in held:
            compile_request.run()  # a load, or (its worker failed) a compile here
    return GateBinaries(
        len(configs),
        len(missing) - len(failed),
        (*problems, *failed),
        time.perf_counter() - started,
    )


def compile_in_workers(configs: Sequence[LaunchConfig]) -> list[str]:
    """``configs`` compiled into Triton's on-disk cache by worker processes (one a core, at
    most :data:`WORKERS_MAX`), a binary at a time each, the largest first; what failed, a
    line each (``compile KERNEL: why``)."""
    ordered = sorted(configs, key=lambda c: -len(c.signature))
    package_root = str(Path(__file__).resolve().parents[1])
    path = os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))
    answers = line_workers.answered(
        [sys.executable, "-m", "dcpcheck.gate_binaries"],
        [config.to_json() for config in ordered],
        jobs=min(WORKERS_MAX, os.cpu_count() or 1),
        env={**os.environ, "PYTHONPATH": path},  # Triton's key reads the environment
        stderr=subprocess.DEVNULL,  # what it could say, its one line per binary says
    )
    failed = []
    for config, answer in zip(ordered, answers, strict=True):
        error = answer if isinstance(answer, str) else answer["error"]
        if error:
            failed.append(f"compile {config.kernel}: {error}")
    return failed


def _worker() -> None:
    """A compile worker: one launch config a line on stdin, its binary compiled into
    Triton's cache, one ``{"error": ...}`` line on stdout (every line, where no CUDA
    backend can be had here)."""
    from dcpcheck.backend import BackendError, select_backend

    def said(exc: Exception) -> str:
        return f"{type(exc).__name__}: {exc}".splitlines()[0]

    try:
        select_backend("cuda")
        unusable = None
    except BackendError as exc:
        unusable = said(exc)
    for line in sys.stdin:
        error = unusable
        if error is None:
            try:
                request_binary(LaunchConfig.from_json(json.loads(line)))
            except Exception as exc:
                error = said(exc)
        print(json.dumps({"error": error}), flush=True)


if __name__ == "__main__":
    _worker()
