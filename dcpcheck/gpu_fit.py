"""Which launches of the project's Triton kernels the project makes, and whether each fits
a GPU: compiles for sm_90 and sm_100 and stays within their shared memory.

A kernel that runs under Triton's interpreter can still fail to launch on a GPU: the
interpreter has no shared memory, so a tile too large for a GPU program passes every CPU
test. This module closes that gap without a GPU in two halves.

Recording. While a :class:`Recorder` is installed, every successful interpreted launch of a
``@triton.jit`` function defined in one of the project's kernel modules
(``dcpcheck.kernel_modules``) becomes a :class:`LaunchConfig`: what Triton keys a
binary on, computed by Triton's own binder for a CUDA target (each argument's type, a
pointer's or integer's divisibility by 16, an integer equal to 1 as a constexpr, the
constexprs, ``num_warps``, ``num_stages`` with the CUDA backend's defaults filled in).
Setting :data:`RECORD_ENV` to a folder makes every dcpcheck process that picks the
interpreted backend record there (one JSON-lines file per process, a line per new config),
so a test suite's workers and the commands its tests start all record.

A launcher whose GPU launch differs from its interpreted one (wider tiles under the
interpreter, pipeline stages only on a GPU) launches inside :func:`on_gpu_as`, which names
the GPU's values: the record is the launch a GPU would make.

Checking. :func:`check_fit` compiles configs ahead of time for each target in a pool of
worker processes, outside the interpreter, and returns one :class:`FitResult` each: the
shared memory the binary asks, or why it did not compile.

Known results. A compile's figure depends on nothing but what Triton keys its own on-disk
cache by: Triton's own source and version, the kernel's source with every function and
global it reads (``JITFunction.cache_key``), the signature, constexprs and specializations,
the backend (the target and the ``ptxas`` Triton ships) and the options. :data:`RESULTS`
keeps the shared memory of each compile under that key (:func:`cache_key`), so the test
suite compiles only launches whose key it does not hold: a changed kernel, a new launch or
another Triton is compiled, an unchanged one is read. ``python -m dcpcheck.gpu_fit
results`` compiles the manifest afresh and rewrites the file; the suite compiles a sample
of what it reads and holds the file to it.

Margin for older Tritons: the project supports Triton 3.1 onwards, and the same launch asks
different shared memory of different releases (the whole-row attention tile: 327,680 B on
Triton 3.9, 458,880 B on 3.6, 1.4x). Only the installed Triton is compiled with here, so a
launch passes only below :data:`SHARED_MEMORY_LIMIT` / :data:`OLDEST_TRITON_MARGIN`.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import subprocess
import sys
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dcpcheck import line_workers
from dcpcheck.kernel_modules import kernel_modules

RECORD_ENV = "DCPCHECK_RECORD_LAUNCHES"
"""A folder: set, every dcpcheck process that picks the interpreter records its launches of
the project's kernels there (:func:`record_if_asked`)."""

TARGETS = (90, 100)
"""Compute capabilities checked: Hopper (H100, H200) and Blackwell (B200)."""

SHARED_MEMORY_LIMIT = 232_448
"""Shared memory a program may use on sm_90 (H100, H200); sm_100 is held to the same."""

OLDEST_TRITON_MARGIN = 1.5
"""How much more shared memory an older supported Triton may ask for the same launch than
the installed one (3.6 asked 1.4x what 3.9 did): the check's headroom (module docstring)."""

SHARED_MEMORY_BUDGET = int(SHARED_MEMORY_LIMIT / OLDEST_TRITON_MARGIN)
"""The most shared memory a launch may ask of the installed Triton and pass."""

REPO = Path(__file__).resolve().parents[1]
MANIFEST = REPO / "tests" / "fixtures" / "gpu_launches.json"
"""Every distinct launch config the gate and the test suite make, checked by the suite."""

GATE_LAUNCHES = Path(__file__).with_name("gate_launches.json")
"""The launches of the plain gate (``dcpcheck run --dcp 4``) alone, which a GPU run of it
compiles ahead of its cases (``dcpcheck.gate_binaries``); shipped with the package."""

RESULTS = REPO / "tests" / "fixtures" / "gpu_fit_results.json"
"""Shared memory of each compile the manifest needs, by :func:`cache_key` (module
docstring)."""

RESULTS_COMMAND = "python -m dcpcheck.gpu_fit results"
"""Regenerates :data:`RESULTS` from a fresh compile of :data:`MANIFEST`."""

COMPILE_TEST = "tests/test_gpu_fit.py::test_every_recorded_launch_compiles_and_fits_each_target"

RECORD_COMMAND = "python -m dcpcheck.gpu_fit record"
"""Regenerates :data:`MANIFEST`: runs the gate and the test suite, recording."""

GPU_STREAM_PRESET = "deepseek-v3.2"
"""The model widths the token streams run at on a GPU (``dcpcheck.e2e.token_streams``
takes them from here; the CPU's are smaller): ``record`` records the streams at these
too, so that the gate's list and the manifest hold the launches a GPU's gate makes."""


GPU_ONLY_GATE_KERNELS = (
    "dcpcheck.ops.fused_norm_rope.tolerance_kernel:_count_out_of_tolerance",
    "dcpcheck.cases.seeded_kernel:_normal_values",
)
"""Kernels the gate launches on a GPU alone (the outputs check's count, the seeded
values; the CPU runs their torch forms), which its recording on the CPU never sees. The
suite's tests run them under the interpreter, so ``record`` adds their launches there to
the gate's list: the gate's every binary is then loaded before its first case."""


@dataclass(frozen=True)
class LaunchConfig:
    """One launch as Triton compiles it: a binary per distinct config."""

    kernel: str  # "module:qualname"
    signature: tuple[tuple[str, str], ...]  # (argument, Triton type: "*bf16", "i32", "constexpr")
    attrs: tuple[tuple[str, str], ...]  # (argument, Triton's specialization code: "D")
    constexprs: tuple[tuple[str, Any], ...]  # (argument, value)
    options: tuple[tuple[str, Any], ...]  # num_warps, num_stages and any other option given

    def to_json(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel,
            "signature": dict(self.signature),
            "attrs": dict(self.attrs),
            "constexprs": dict(self.constexprs),
            "options": dict(self.options),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LaunchConfig:
        return cls(
            data["kernel"],
            tuple(data["signature"].items()),
            tuple(data["attrs"].items()),
            tuple(data["constexprs"].items()),
            tuple(data["options"].items()),
        )

    def describe(self) -> str:
        """One line: the kernel, its constexprs, options and specialized arguments."""
        values = [f"{k}={v}" for k, v in (*self.constexprs, *self.options)]
        types = [f"{k}:{t}" for k, t in self.signature if t != "constexpr"]
        attrs = [f"{k}%16" for k, code in self.attrs if code == "D"]
        return f"{self.kernel}[{', '.join(values)}]({', '.join(types)}; {', '.join(attrs)})"


def json_key(config: LaunchConfig) -> str:
    """``config`` as one line of JSON, its fields sorted: equal for equal launches whatever
    order their fields were read in (``LaunchConfig`` compares them in order)."""
    return json.dumps(config.to_json(), sort_keys=True)


# --- Recording --------------------------------------------------------------------------

_gpu_values: dict[str, Any] = {}


@contextlib.contextmanager
def on_gpu_as(**values: Any) -> Iterator[None]:
    """Launches inside take ``values`` (constexprs or options such as ``num_stages``) on a
    GPU in place of the interpreter's: what a recorder records (module docstring)."""
    saved = dict(_gpu_values)
    _gpu_values.update(values)
    try:
        yield
    finally:
        _gpu_values.clear()
        _gpu_values.update(saved)


def _plain(value: Any) -> Any:
    """A constexpr or option value as JSON holds it."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(f"cannot record launch value {value!r} ({type(value).__name__})")


class Recorder:
    """Turns interpreted launches of kernels defined in ``modules`` into configs: each new
    one is added to ``configs`` and handed to ``sink``."""

    def __init__(self, modules: Collection[str], sink=None) -> None:
        from triton.backends.compiler import GPUTarget
        from triton.backends.nvidia.compiler import CUDAOptions
        from triton.compiler import make_backend

        self.modules = frozenset(modules)
        self.sink = sink
        self.configs: set[LaunchConfig] = set()
        self._backend = make_backend(GPUTarget("cuda", TARGETS[0], 32))
        self._defaults = {"num_warps": CUDAOptions.num_warps, "num_stages": CUDAOptions.num_stages}
        self._binders: dict[int, Any] = {}

    def _binder(self, function: Any) -> Any:
        """Triton's binder of a compiled twin of ``function``, or None for a kernel defined
        outside ``modules`` (or a copy of one loaded under another name)."""
        key = id(function)
        if key not in self._binders:
            self._binders[key] = None
            fn = function.fn
            owner = sys.modules.get(fn.__module__)
            if fn.__module__ in self.modules and getattr(owner, fn.__name__, None) is function:
                from triton.runtime.jit import JITFunction, create_function_from_signature

                twin = JITFunction(
                    fn,
                    do_not_specialize=function.kwargs.get("do_not_specialize"),
                    do_not_specialize_on_alignment=function.kwargs.get(
                        "do_not_specialize_on_alignment"
                    ),
                )
                binder = create_function_from_signature(twin.signature, twin.params, self._backend)
                self._binders[key] = (f"{fn.__module__}:{fn.__qualname__}", binder)
        return self._binders[key]

    def saw(self, function: Any, args: tuple, kwargs: dict[str, Any]) -> None:
        """Record one launch ``function[grid](*args, **kwargs)``, GPU values applied."""
        known = self._binder(function)
        if known is None:
            return
        name, binder = known
        bound, specialization, options = binder(*args, **{**kwargs, **_gpu_values})
        names = list(bound)
        config = LaunchConfig(
            name,
            tuple(zip(names, (s[0] for s in specialization), strict=True)),
            tuple(
                (n, s[1])
                for n, s in zip(names, specialization, strict=True)
                if s[1] and s[0] != "constexpr"
            ),
            tuple(
                (n, _plain(s[1]))
                for n, s in zip(names, specialization, strict=True)
                if s[0] == "constexpr"
            ),
            tuple(sorted({**self._defaults, **{k: _plain(v) for k, v in options.items()}}.items())),
        )
        if config not in self.configs:
            self.configs.add(config)
            if self.sink is not None:
                self.sink(config)


_recorders: list[Recorder] = []


def _install_hook() -> None:
    """Route every interpreted launch past the installed recorders, once per process."""
    from triton.runtime.interpreter import InterpretedFunction

    launch = InterpretedFunction.run
    if getattr(launch, "records_launches", False):
        return

    def run(self, *args, grid, warmup, **kwargs):
        result = launch(self, *args, grid=grid, warmup=warmup, **kwargs)
        if not warmup:
            for recorder in _recorders:
                recorder.saw(self, args, kwargs)
        return result

    run.records_launches = True
    InterpretedFunction.run = run


@contextlib.contextmanager
def recording(recorder: Recorder) -> Iterator[Recorder]:
    """``recorder`` sees every interpreted launch inside the ``with``."""
    _install_hook()
    _recorders.append(recorder)
    try:
        yield recorder
    finally:
        _recorders.remove(recorder)


def record_if_asked() -> None:
    """Where :data:`RECORD_ENV` names a folder, record every launch of the project's
    kernels in this process there for good, one JSON line per new config; called by the
    backend when it picks the interpreter."""
    folder = os.environ.get(RECORD_ENV)
    if not folder:
        return

    def append(config: LaunchConfig) -> None:
        with open(Path(folder) / f"launches-{os.getpid()}.jsonl", "a", encoding="utf-8") as out:
            out.write(json_key(config) + "\n")

    _install_hook()
    _recorders.append(Recorder(kernel_modules(), append))


def recorded(folder: str | Path) -> set[LaunchConfig]:
    """Every config the processes recording to ``folder`` recorded."""
    return {
        LaunchConfig.from_json(json.loads(line))
        for path in sorted(Path(folder).glob("launches-*.jsonl"))
        for line in path.read_text(encoding="utf-8").splitlines()
        if line
    }


def read_manifest(path: Path = MANIFEST) -> list[LaunchConfig]:
    return [LaunchConfig.from_json(c) for c in json.loads(path.read_text(encoding="utf-8"))]


def write_manifest(configs: Iterable[LaunchConfig], path: Path = MANIFEST) -> None:
    """``configs`` as a sorted JSON list: the same set always writes the same file."""
    rows = sorted({json_key(c) for c in configs})
    path.write_text("[\n" + ",\n".join(rows) + "\n]\n", encoding="utf-8")


# --- Checking ---------------------------------------------------------------------------


@dataclass(frozen=True)
class FitResult:
    """One config compiled for one target: its shared memory, or why it did not compile;
    ``key`` is Triton's key of the compile (None where it cannot be worked out), ``compiled``
    False where the figure was read from the known results under that key."""

    config: LaunchConfig
    arch: int
    shared: int | None
    error: str | None
    key: str | None = None
    compiled: bool = True

    @property
    def problem(self) -> str | None:
        """Why the launch would not run on the target (one line), or None when it fits."""
        where = f"sm_{self.arch}: {self.config.describe()}"
        if self.error is not None:
            return f"does not compile for {where}: {self.error}"
        if self.shared > SHARED_MEMORY_BUDGET:
            return (
                f"needs {self.shared:,} B of shared memory, over {SHARED_MEMORY_BUDGET:,} "
                f"({SHARED_MEMORY_LIMIT:,} / margin {OLDEST_TRITON_MARGIN} for older "
                f"Tritons) for {where}"
            )
        return None


def _source(config: LaunchConfig, arch: int) -> tuple[Any, Any, Any]:
    """``config``'s kernel as Triton compiles it for ``arch``: its source, target and
    backend, in this (uninterpreted) process."""
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend

    module, qualname = config.kernel.split(":")
    fn: Any = importlib.import_module(module)
    for part in qualname.split("."):
        fn = getattr(fn, part)
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    attrs = {(fn.arg_names.index(n),): backend.parse_attr(code) for n, code in config.attrs}
    source = triton.compiler.ASTSource(fn, dict(config.signature), dict(config.constexprs), attrs)
    return source, target, backend


def cache_key(source: Any, backend: Any, options: dict[str, Any]) -> str | None:
    """What Triton keys the binary of ``source`` on (module docstring), hashed; None where
    this Triton's parts of it cannot be found, so that the launch is compiled."""
    import hashlib

    try:
        try:
            from triton.runtime.cache import triton_key
        except ImportError:  # Triton < 3.3
            from triton.compiler.compiler import triton_key
        from triton._C.libtriton import get_cache_invalidating_env_vars

        parsed = backend.parse_options(dict(options, **source.parse_options()))
        env = sorted(get_cache_invalidating_env_vars().items())
        key = f"{triton_key()}-{source.hash()}-{backend.hash()}-{parsed.hash()}-{env}"
    except (ImportError, AttributeError, TypeError):
        return None
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def _compile(config: LaunchConfig, arch: int, known: dict[str, int]) -> dict[str, Any]:
    """``config`` for ``arch`` in this (uninterpreted) process: read from ``known`` under
    its key, or compiled."""
    import triton

    source, target, backend = _source(config, arch)
    key = cache_key(source, backend, dict(config.options))
    if key is not None and key in known:
        return {"shared": known[key], "error": None, "key": key, "compiled": False}
    try:
        kernel = triton.compile(source, target=target, options=dict(config.options))
    except Exception as error:
        first = (str(error).strip().splitlines() or [""])[0]
        return {"shared": None, "error": f"{type(error).__name__}: {first}", "key": key}
    return {"shared": kernel.metadata.shared, "error": None, "key": key}


def read_results(path: Path = RESULTS) -> dict[str, int]:
    """The known results (module docstring): key -> shared memory; none where no file."""
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def write_results(results: Iterable[FitResult], path: Path = RESULTS) -> int:
    """The compiles of ``results`` that fit and have a key, sorted by key; how many."""
    known = {r.key: r.shared for r in results if r.key and r.shared is not None}
    path.write_text(json.dumps(dict(sorted(known.items())), indent=0) + "\n", encoding="utf-8")
    return len(known)


def prepare(requests: Sequence[dict[str, Any]]) -> None:
    """A compile worker's template (``dcpcheck.line_workers``), before its workers fork:
    Triton's version key, which each compile's key begins with, read where another process
    kept it or worked out once for all of them (``dcpcheck.triton_key``)."""
    from dcpcheck.triton_key import remember

    remember()


@functools.cache
def _known(path: str) -> dict[str, int]:
    return read_results(Path(path))


def answer(request: dict[str, Any]) -> dict[str, Any]:
    """A compile worker's answer to one ``{"config", "arch", "known"}`` request: the
    config compiled for the arch, or read from the results file ``known`` (None: none)."""
    known = _known(request["known"]) if request["known"] else {}
    return _compile(LaunchConfig.from_json(request["config"]), request["arch"], known)


def check_fit(
    configs: Iterable[LaunchConfig],
    archs: Iterable[int] = TARGETS,
    jobs: int | None = None,
    pythonpath: Iterable[str] = (),
    known: Path | None = RESULTS,
) -> list[FitResult]:
    """Compile every config for every arch in ``jobs`` worker processes (default: one per
    core) outside the interpreter, but what the results file ``known`` holds under the
    compile's key (None: compile all); Triton's on-disk cache (``TRITON_CACHE_DIR``) keeps
    binaries between calls. ``pythonpath`` adds where kernel modules outside the package
    are imported from."""
    items = [(c, a) for c in sorted(set(configs), key=json_key) for a in archs]
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", RECORD_ENV)}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *pythonpath, env.get("PYTHONPATH", "")])
    answers = line_workers.answered(
        "dcpcheck.gpu_fit",
        [
            {"config": config.to_json(), "arch": arch, "known": str(known) if known else None}
            for config, arch in items
        ],
        jobs=jobs,
        env=env,
        cwd=REPO,
    )
    results = []
    for (config, arch), answer in zip(items, answers, strict=True):
        if isinstance(answer, str):
            raise RuntimeError(f"compile worker died before compiling {config.describe()}")
        shared, error, key = answer["shared"], answer["error"], answer["key"]
        results.append(FitResult(config, arch, shared, error, key, answer.get("compiled", True)))
    return results


# --- Command line -----------------------------------------------------------------------


def _record(jobs: int) -> int:
    """Record the gate (``dcpcheck run --dcp 4``, and its token streams at the GPU's widths)
    into :data:`GATE_LAUNCHES`, then the test suite, and the gate's launches with the
    suite's into the manifest. The gate's list is written before the suite runs, whose
    README test holds the gate to it, and again after it with the suite's launches of
    :data:`GPU_ONLY_GATE_KERNELS`."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="dcpcheck-record-") as folder:
        gate, suite = (os.path.join(folder, part) for part in ("gate", "suite"))
        os.mkdir(gate)
        os.mkdir(suite)
        return _record_into(gate, suite, jobs)


def _record_into(gate: str, suite: str, jobs: int) -> int:
    """:func:`_record` with the gate's launches recorded into ``gate``, the suite's into
    ``suite``."""
    dcpcheck = [sys.executable, "-m", "dcpcheck"]
    commands = (
        (gate, [*dcpcheck, "run", "--dcp", "4"]),
        # The gate's token streams as a GPU runs them: at its model widths, not the CPU's.
        (gate, [*dcpcheck, "hash", "--dcp", "1,4", "--preset", GPU_STREAM_PRESET]),
        # The suite less the compile check, which reads the manifest and launches nothing.
        (
            suite,
            [sys.executable, "-m", "pytest", "-q", "-n", str(jobs), "--deselect", COMPILE_TEST],
        ),
    )
    for folder, command in commands:
        if folder == suite:  # its README test holds the gate to the list: written first
            listed = recorded(gate)
            write_manifest(listed, GATE_LAUNCHES)
            print(f"{len(listed)} launch configs written to {GATE_LAUNCHES.name}")
        done = subprocess.run(command, env={**os.environ, RECORD_ENV: folder}, cwd=REPO)
        if done.returncode != 0:
            print(f"{' '.join(command[1:])} exited {done.returncode}: manifest not written")
            return 1
    in_suite = recorded(suite)
    gpu_only = {c for c in in_suite if c.kernel in GPU_ONLY_GATE_KERNELS}
    write_manifest(listed | gpu_only, GATE_LAUNCHES)
    configs = listed | in_suite
    write_manifest(configs, MANIFEST)
    print(f"{len(configs)} launch configs written to {MANIFEST.name}")
    return 0


def _check(jobs: int, write: bool) -> int:
    """Compile the whole manifest afresh for every target; print what does not fit; with
    ``write``, keep the results (:data:`RESULTS`)."""
    results = check_fit(read_manifest(), jobs=jobs, known=None)
    if write:
        print(f"{write_results(results)} results written to {RESULTS.relative_to(REPO)}")
    problems = [r.problem for r in results if r.problem]
    for problem in problems:
        print(problem)
    largest = max((r for r in results if r.shared is not None), key=lambda r: r.shared)
    print(
        f"{len(results)} compiles, {len(problems)} not fitting; largest {largest.shared:,} B "
        f"at sm_{largest.arch}: {largest.config.describe()}"
    )
    return 1 if problems else 0


def main(argv: list[str]) -> int:
    """``record`` (regenerate the manifest), ``check`` (compile it afresh), ``results``
    (compile it afresh and keep the results)."""
    usage = "usage: python -m dcpcheck.gpu_fit {record|check|results} [jobs]"
    if not argv or argv[0] not in ("record", "check", "results") or len(argv) > 2:
        print(usage)
        return 2
    if len(argv) == 2 and not argv[1].isdigit():
        print(f"{usage}\njobs must be a number of processes, not {argv[1]!r}")
        return 2
    jobs = int(argv[1]) if len(argv) == 2 else os.cpu_count() or 1
    if argv[0] == "record":
        return _record(jobs)
    return _check(jobs, write=argv[0] == "results")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
