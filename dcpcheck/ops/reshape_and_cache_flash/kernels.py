"""The kernels of the op dcpcheck can name (``contract.CacheWriteKernel``):

* ``default``: the project's Triton kernel (``kernel``); ``mutant/NAME``: it with one bug
  (``mutants``);
* ``vllm==X.Y.Z``: a released vLLM's ``triton_reshape_and_cache_flash`` as its attention
  backend calls it (``dcpcheck.ops.reshape_and_cache_flash.vllm``), fetched and cached by
  ``dcpcheck.kernels.releases``;
* ``package.module:function`` or ``path/to/file.py:function``: a callable with the op's
  protocol.

Import only once the backend is chosen (it defines Triton kernels).
"""

from __future__ import annotations

from pathlib import Path

from dcpcheck.adapters.protocol import AdapterError
from dcpcheck.kernels import loading, releases
from dcpcheck.kernels.loading import JudgedFile, KernelLoadError, KernelSpecError
from dcpcheck.op_registry import RESHAPE_AND_CACHE_FLASH
from dcpcheck.ops.reshape_and_cache_flash import kernel as project_kernel
from dcpcheck.ops.reshape_and_cache_flash import mutants, vllm
from dcpcheck.ops.reshape_and_cache_flash.contract import CacheWriteKernel

KERNELS: dict[str, CacheWriteKernel] = {
    "default": project_kernel.write,
    **{loading.mutant_name(m): m for m in mutants.MUTANTS},
}

DESCRIPTIONS: dict[str, str] = {
    "default": "the project's paged K/V cache write, in Triton",
    **{loading.mutant_name(m): loading.summary(m) for m in mutants.MUTANTS},
}
"""What each kernel of ``KERNELS`` is, as ``dcpcheck list kernels`` and the selftest say."""


def release_of(spec: str) -> releases.ReleaseSpec | None:
    """``spec`` as a vLLM release of this op; ``KernelSpecError`` for a version that is no
    version, or a function the op does not judge."""
    release = loading.release_of(spec, vllm.FUNCTION)
    if release is not None and release.function != vllm.FUNCTION:
        raise KernelSpecError(
            f"{spec}: the {RESHAPE_AND_CACHE_FLASH} op judges {vllm.FUNCTION} only"
        )
    return release


def _file(release: releases.ReleaseSpec) -> JudgedFile:
    return loading.release_file(release.version, release.name, vllm.FUNCTION, vllm.MEMBERS)


def load(spec: str) -> CacheWriteKernel:
    """The kernel ``spec`` names (module docstring); ``KernelLoadError`` with one line."""
    if spec in KERNELS:
        return KERNELS[spec]
    release = release_of(spec)
    if release is None:
        return loading.load_callable(spec, list(KERNELS))  # type: ignore[return-value]
    judged = _file(release)
    try:
        return vllm.VllmCacheWrite.of(Path(judged.path), release.name, release.version)
    except AdapterError as exc:  # the revision's: bisect skips it
        raise KernelLoadError(str(exc)) from None


def judged_files(spec: str) -> tuple[JudgedFile, ...]:
    """The files ``spec``'s kernel comes from, with their SHA256: the project's kernel and
    mutant modules for a registry name, a release's file, else what ``loading.spec_files``
    names."""
    if spec in KERNELS:
        sources = (project_kernel.__file__, mutants.__file__)
        return tuple(loading.judged_file(Path(source)) for source in sources)
    release = release_of(spec)
    if release is None:
        return loading.spec_files(spec)
    return (_file(release),)


def canonical(spec: str) -> str:
    """``spec`` as reports and replays spell it: a release's version normalised."""
    release = release_of(spec)
    return spec if release is None else release.name
