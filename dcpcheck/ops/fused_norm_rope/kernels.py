"""The fused op's kernels by ``--kernel`` (:data:`REGISTRY`, a
``dcpcheck.kernels.registry.OpKernels`` as every op's): every build of the project's
kernel under its name (``dcpcheck list kernels``), each built when named, and any other
spec - a vLLM release (``vllm==0.29.0``), a ``package.module:function``, a
``path/to/file.py:function`` - loaded by ``dcpcheck.kernels.loading`` and fitted to the
protocol by an adapter (``adapters``: ``auto`` recognises vLLM's ``fused_norm_rope`` by
its signature and otherwise takes the callable as following the protocol itself; ``vllm``
and ``native`` force the choice).

A loader imports the kernel module only after ``dcpcheck.backend.current_backend()`` has
fixed ``TRITON_INTERPRET``: Triton decides between compiling and interpreting when a
``@triton.jit`` function is defined.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from dcpcheck.adapters.protocol import AdapterError
from dcpcheck.backend import current_backend
from dcpcheck.kernels import loading, releases
from dcpcheck.kernels.loading import JudgedFile, KernelLoadError, load_callable, load_file
from dcpcheck.kernels.registry import OpKernels
from dcpcheck.op_registry import FUSED_NORM_ROPE, OPS
from dcpcheck.ops.fused_norm_rope import adapters
from dcpcheck.ops.fused_norm_rope import vllm as vllm_adapter
from dcpcheck.ops.fused_norm_rope.contract import Kernel
from dcpcheck.ops.fused_norm_rope.variants import VARIANTS, KernelVariant


@dataclass(frozen=True)
class KernelEntry:
    """A registered kernel: its name, a one-line description and a lazy loader."""

    name: str
    description: str
    load: Callable[[], Kernel]


def _variant_loader(variant: KernelVariant) -> Callable[[], Kernel]:
    def load() -> Kernel:
        current_backend()  # fix TRITON_INTERPRET before the @triton.jit module is imported
        from dcpcheck.ops.fused_norm_rope.launcher import make_kernel

        return make_kernel(variant)

    return load


KERNELS: dict[str, KernelEntry] = {
    v.name: KernelEntry(v.name, v.description, _variant_loader(v)) for v in VARIANTS
}

KERNEL_SOURCES = tuple(
    Path(__file__).with_name(name)
    for name in (
        "launcher.py",
        "launch_checks.py",
        "variants.py",
        "variant_build.py",
        "kernel.py",
        "fp8_codes.py",
        "index_cache.py",
        "nvfp4_ds_mla.py",
    )
)
"""The files every registry kernel's code comes from (its host side and its Triton
kernels), which the reports name with their SHA256 (:func:`judged_files`)."""


MEMBERS = OPS[FUSED_NORM_ROPE].wheel_members
"""Every path the kernel's file had in a wheel, oldest first (``dcpcheck.op_registry``)."""


def _release_file(release: releases.ReleaseSpec) -> JudgedFile:
    """The release's file that defines the function named, at whichever of its paths
    (:data:`MEMBERS`) the release keeps it."""
    return loading.release_file(release.version, release.name, release.function, MEMBERS)


def _load_release(release: releases.ReleaseSpec) -> Kernel:
    """A released vLLM kernel: its file from the release cache, checked against the lock
    file (or its wheel's RECORD) just before it is compiled from the bytes checked, through
    vLLM's adapter like any vLLM file. ``fused_norm_rope`` carries its version, whose
    callers decide what it is never asked (``indexer_groups``); another function of the
    file has other callers."""
    path = Path(_release_file(release).path)
    current_backend()  # fix interpreted vs compiled before the file's @triton.jit runs
    target = getattr(load_file(path), release.function, None)
    if target is None or not callable(target):
        raise KernelLoadError(f"{release.name}: {path} has no function {release.function!r}")
    try:
        kernel = vllm_adapter.adapt(target)
    except AdapterError as exc:
        raise KernelLoadError(f"{release.name}: {exc}") from exc
    called_as = release.version if release.function == releases.DEFAULT_FUNCTION else None
    return dataclasses.replace(kernel, name=release.name, release=called_as)


def _external(spec: str, adapter: str) -> Kernel:
    """A file's or a module's callable, fitted to the protocol by ``adapter``."""
    current_backend()  # fix interpreted vs compiled before any @triton.jit is defined
    target = load_callable(spec, list(KERNELS))
    try:
        return adapters.adapt(target, adapter)
    except AdapterError as exc:
        raise KernelLoadError(f"{spec}: {exc}") from exc


class _BuiltWhenNamed(Mapping[str, Kernel]):
    """The registry's kernels by name, each built when it is looked up: a build imports the
    Triton module, which waits for the backend to be chosen."""

    def __getitem__(self, name: str) -> Kernel:
        return KERNELS[name].load()

    def __contains__(self, name: object) -> bool:  # by name: nothing built to answer
        return name in KERNELS

    def __iter__(self) -> Iterator[str]:
        return iter(KERNELS)

    def __len__(self) -> int:
        return len(KERNELS)


REGISTRY: OpKernels[Kernel] = OpKernels(
    op=FUSED_NORM_ROPE,
    kernels=_BuiltWhenNamed(),
    descriptions={entry.name: entry.description for entry in KERNELS.values()},
    sources=tuple(str(path) for path in KERNEL_SOURCES),
    function=releases.DEFAULT_FUNCTION,
    judged=(),
    release=lambda release, _named: _load_release(release),
    release_files=lambda release, _named: (_release_file(release),),
    external=_external,
    adapters=adapters.ADAPTER_NAMES,
)
"""The op's kernels by spec (module docstring): a registry name loads as built, a release
through vLLM's adapter, any other callable through the adapter ``--adapter`` names."""

load_kernel = REGISTRY.load
check_spec = REGISTRY.check
judged_files = REGISTRY.judged_files
"""The registry's methods, by the names the op's own modules and tests call them."""
