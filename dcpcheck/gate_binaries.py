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
reimplementing that key; those are compiled into the cache by worker processes (one a
core, no GIL shared), forked from a template that imported torch and Triton once
(``dcpcheck.line_workers``; this module's ``prepare`` and ``answer``). A worker makes
the same call as the request, but with Triton told the device's target rather than asking
a CUDA context for it (:class:`_CompileOnlyDriver`), and builds each launcher Triton will
need once, so the cases' first launches build nothing. Then every held request runs, now
a load, and the binaries sit in the kernels' in-memory caches, where the cases' launches
find them. With a warm cache no worker forks, and the template, started before the
requests so that its imports overlap them, is stopped; the requests load only what the
cases would have loaded.

Nothing here decides a verdict: a listed launch the kernels no longer make (an edited
launcher) is compiled for nothing, a launch the list lacks compiles when its case launches
it, as without the list, and a binary a worker fails to compile is compiled by the run
itself. Under the interpreter nothing is compiled.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import os
import subprocess
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
"""Compile processes at most (and at most one per core and per binary to compile), each a
Triton compiler in host memory of its own: on a 16-core H100 box sixteen compile the
gate's seventy binaries in about 3 s (BENCHMARKS.md, "The gate, cold")."""

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
    not ask Triton for, whose compile failed or whose launcher was not built, each with
    why."""

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
    return _kernel_named(config.kernel)


def _kernel_named(name: str) -> Any:
    """The ``@triton.jit`` function named ``module:qualname``."""
    module, qualname = name.split(":")
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


def request_binary(config: LaunchConfig) -> Any:
    """Ask Triton for ``config``'s binary: compiled (or loaded from its cache), never
    launched; what Triton hands back (the compiled kernel, or under an
    ``AsyncCompileMode`` a stand-in for it)."""
    kernel = kernel_of(config)
    args, options = launch_arguments(config, kernel)
    return kernel.run(*args, grid=(1,), warmup=True, **options)


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
    left to its case and named in ``problems``. The workers' template starts first, so
    that its imports overlap the requests here; a warm cache stops it unasked."""
    if backend.interpreted or not launches.is_file():
        return None
    started = time.perf_counter()
    configs = read_manifest(launches)
    problems: list[str] = []
    with _compile_workers(len(configs)) as workers, _compiles_held_back() as (request, held):
        for config in configs:
            try:
                request(config)
            except Exception as error:
                problems.append(f"{config.kernel}: {type(error).__name__}: {error}".splitlines()[0])
        missing = [h.config for h in held if h.config is not None and not h.in_cache()]
        failed, unbuilt = compile_in_workers(missing, _device_target(), workers)
        for compile_request in held:
            compile_request.run()  # a load, or (its worker failed) a compile here
    return GateBinaries(
        len(configs),
        len(missing) - len(failed),
        (*problems, *failed, *unbuilt),
        time.perf_counter() - started,
    )


def _device_target() -> Any:
    """The target Triton compiles for on this process's device."""
    from triton.runtime.driver import driver

    return driver.active.get_current_target()


def _compile_workers(most: int) -> line_workers.Workers:
    """The template of at most ``most`` compile workers (one a core, at most
    :data:`WORKERS_MAX`), in this environment with this checkout importable (Triton's key
    reads the environment); what they could say, their one answer per binary says."""
    package_root = str(Path(__file__).resolve().parents[1])
    path = os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))
    return line_workers.Workers(
        "dcpcheck.gate_binaries",
        jobs=min(WORKERS_MAX, os.cpu_count() or 1, most),
        env={**os.environ, "PYTHONPATH": path},
        stderr=subprocess.DEVNULL,
    )


def _launcher_shape(config: LaunchConfig) -> tuple[str, ...]:
    """What a binary's launcher is built from, as far as this module tells launchers
    apart: each argument's kind (a pointer of any type, a scalar's type, a constexpr).
    Binaries of one shape share a launcher, which one worker builds and the others find in
    Triton's cache (where two shapes share one, it is built twice; where one shape needs
    two, the run builds the other at its first launch)."""
    return tuple("*" if kind.startswith("*") else kind for _, kind in config.signature)


def compile_in_workers(
    configs: Sequence[LaunchConfig], target: Any, workers: line_workers.Workers | None = None
) -> tuple[list[str], list[str]]:
    """``configs`` compiled for ``target`` (a Triton ``GPUTarget``) into Triton's on-disk
    cache by ``workers`` (by default, a template started here), a binary at a time each,
    the largest first, with one launcher built for each launcher shape; the compiles that
    failed (``compile KERNEL: why``) and the launchers not built (``launcher of KERNEL:
    why``), a line each."""
    ordered = sorted(configs, key=lambda c: -len(c.signature))
    requests, shapes = [], set()
    for config in ordered:
        shape = _launcher_shape(config)
        requests.append(
            {
                "config": config.to_json(),
                "launcher": shape not in shapes,
                "target": [target.backend, target.arch, target.warp_size],
            }
        )
        shapes.add(shape)
    with workers or _compile_workers(len(configs)) as working:
        answers = working.answer(requests)
    failed, unbuilt = [], []
    for config, answered in zip(ordered, answers, strict=True):
        if isinstance(answered, str) or answered["error"]:
            why = answered if isinstance(answered, str) else answered["error"]
            failed.append(f"compile {config.kernel}: {why}")
        elif answered["launcher"]:
            unbuilt.append(f"launcher of {config.kernel}: {answered['launcher']}")
    return failed, unbuilt


# --- A compile worker (``dcpcheck.line_workers``) ----------------------------------------


class _CompileOnlyDriver:
    """Triton's active driver in a compile worker: the gate's device's target, device 0
    and its stream 0, and nothing that touches a device. A kernel called with
    ``warmup=True`` asks its driver for just these and compiles for the target, so the
    binary and its cache key are those of the gate's own launch. A worker that asked CUDA
    for them instead took about 2 s longer over its first binary, sixteen workers at once
    on one H100 (BENCHMARKS.md, "The gate, cold")."""

    def __init__(self, target: Any) -> None:
        self.target = target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self) -> Any:
        return self.target


def _target(request: dict[str, Any]) -> Any:
    from triton.backends.compiler import GPUTarget

    backend, arch, warp_size = request["target"]
    return GPUTarget(backend, arch, warp_size)


@functools.cache
def _device_driver(target: Any) -> Any:
    """The driver of the Triton backend that compiles for ``target``: its launcher class
    builds a binary's launcher with the host's C compiler, touching no device."""
    from triton.backends import backends

    for backend in backends.values():
        if backend.compiler.supports_target(target):
            return backend.driver()
    raise RuntimeError(f"no Triton backend compiles for {target}")


def prepare(requests: Sequence[dict[str, Any]]) -> None:
    """In the template, before its workers fork, what each compile would do first: read
    Triton's version key (``dcpcheck.triton_key``), import the compiler's front end, hash
    each listed kernel's source with what it calls (``JITFunction.cache_key``), and make
    the requests' target Triton's (:class:`_CompileOnlyDriver`)."""
    import triton.compiler.code_generator  # noqa: F401 (what a first compile imports)
    from triton.runtime.driver import driver

    from dcpcheck.triton_key import remember

    remember()
    for name in sorted({request["config"]["kernel"] for request in requests}):
        _kernel_named(name).cache_key  # noqa: B018 (worked out once, kept on the kernel)
    driver.set_active(_CompileOnlyDriver(_target(requests[0])))


def answer(request: dict[str, Any]) -> dict[str, str | None]:
    """A ``{"config", "launcher", "target"}`` request's binary compiled into Triton's
    cache and, where ``launcher`` is set, its launcher built into the same cache (on
    Triton 3.6 a C module, which Triton builds with the host's C compiler at a binary's
    first launch), so that the gate's first launch of it builds nothing: ``{"error": why
    the compile failed, "launcher": why the launcher was not built}``, None for each that
    did not fail."""

    def said(exc: Exception) -> str:
        return f"{type(exc).__name__}: {exc}".splitlines()[0]

    try:
        compiled = request_binary(LaunchConfig.from_json(request["config"]))
    except Exception as exc:
        return {"error": said(exc), "launcher": None}
    if request["launcher"]:
        try:
            _device_driver(_target(request)).launcher_cls(compiled.src, compiled.metadata)
        except Exception as exc:
            return {"error": None, "launcher": said(exc)}
    return {"error": None, "launcher": None}
