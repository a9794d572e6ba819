"""The fused op's kernels by ``--kernel``: every build of the project's kernel under its
name (``dcpcheck list kernels``), each loaded lazily, and any other spec - a vLLM release
(``vllm==0.29.0``), a ``package.module:function``, a ``path/to/file.py:function`` - loaded
by ``dcpcheck.kernels.loading`` and fitted to the protocol by an adapter (``adapters``:
``auto`` recognises vLLM's ``fused_norm_rope`` by its signature and otherwise takes the
callable as following the protocol itself; ``vllm`` and ``native`` force the choice).

A loader imports the kernel module only after ``dcpcheck.backend.current_backend()`` has
fixed ``TRITON_INTERPRET``: Triton decides between compiling and interpreting when a
``@triton.jit`` function is defined.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dcpcheck.adapters.protocol import AdapterError
from dcpcheck.backend import current_backend
from dcpcheck.kernels import loading, releases
from dcpcheck.kernels.loading import (
    JudgedFile,
    KernelLoadError,
    KernelSpecError,
    judged_file,
    load_callable,
    load_file,
    release_of,
)
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


def check_spec(spec: str, adapter: str = "auto") -> None:
    """What :func:`load_kernel` would refuse of ``spec`` under ``adapter`` before running
    any of the kernel's code: ``KernelSpecError`` for a spec wrong in itself (an unknown
    adapter, one that does not apply, a misspelt registry name, a file without
    ``:function``, a release version that is no version or not published, a release cache
    that cannot be trusted); ``KernelLoadError`` for a file that is not there or does not
    parse, or a release that cannot be fetched. A release is fetched into the cache here,
    checked against its wheel's RECORD. The parent of an isolated run asks this and no
    more; its worker loads the kernel (``dcpcheck.harness.isolation``)."""
    if adapter not in adapters.ADAPTER_NAMES:
        raise KernelSpecError(
            f"unknown adapter {adapter!r} (expected {', '.join(adapters.ADAPTER_NAMES)})"
        )
    if spec in KERNELS:
        if adapter not in ("auto", "native"):
            raise KernelSpecError(
                f"{spec}: a registry kernel follows dcpcheck's protocol; "
                f"the {adapter} adapter does not apply"
            )
        return
    release = release_of(spec)
    if release is None:
        loading.check_callable_spec(spec, list(KERNELS))
        return
    if adapter not in ("auto", "vllm"):
        raise KernelSpecError(f"{release.name}: a vLLM release runs through the vllm adapter")
    _release_file(release)


def load_kernel(spec: str, adapter: str = "auto") -> Kernel:
    """The kernel named by ``spec``, fitted to the protocol by ``adapter`` (module docstring),
    once :func:`check_spec` finds nothing to refuse.

    ``adapter`` is one of :data:`adapters.ADAPTER_NAMES`; registry kernels
    follow the protocol already and accept only ``auto`` or ``native``.
    """
    check_spec(spec, adapter)
    current_backend()  # fix interpreted vs compiled before any @triton.jit is defined
    if spec in KERNELS:
        return KERNELS[spec].load()
    release = release_of(spec)
    if release is not None:
        return _load_release(release)
    target = load_callable(spec, list(KERNELS))
    try:
        return adapters.adapt(target, adapter)
    except AdapterError as exc:
        raise KernelLoadError(f"{spec}: {exc}") from exc


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
    target = getattr(load_file(path), release.function, None)
    if target is None or not callable(target):
        raise KernelLoadError(f"{release.name}: {path} has no function {release.function!r}")
    try:
        kernel = vllm_adapter.adapt(target)
    except AdapterError as exc:
        raise KernelLoadError(f"{release.name}: {exc}") from exc
    called_as = release.version if release.function == releases.DEFAULT_FUNCTION else None
    return dataclasses.replace(kernel, name=release.name, release=called_as)


def judged_files(spec: str) -> tuple[JudgedFile, ...]:
    """The files ``spec``'s kernel (loaded already, by :func:`load_kernel`) comes from, and
    their SHA256 now: the project's kernel modules for a registry name
    (:data:`KERNEL_SOURCES`), a release's cached file (checked against the lock file or its
    wheel's RECORD once more), else what ``dcpcheck.kernels.loading.spec_files`` names."""
    if spec in KERNELS:
        return tuple(judged_file(path) for path in KERNEL_SOURCES)
    release = release_of(spec)
    if release is not None:
        return (_release_file(release),)
    return loading.spec_files(spec)
