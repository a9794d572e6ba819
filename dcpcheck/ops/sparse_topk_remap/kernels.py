"""The kernels of the op dcpcheck can name (``contract.RemapKernel``):

* ``default``: the project's Triton kernel (``kernel``); ``mutant/NAME``: it with one bug
  (``mutants``);
* ``vllm==X.Y.Z``: a released vLLM's converters as its sparse backends call them;
  ``vllm==X.Y.Z:FUNCTION`` one of them alone (``dcpcheck.ops.sparse_topk_remap.vllm``),
  fetched and cached by ``dcpcheck.kernels.releases``;
* ``package.module:function`` or ``path/to/file.py:function``: a callable with the op's
  protocol.

Import only once the backend is chosen (it defines Triton kernels).
"""

from __future__ import annotations

from pathlib import Path

from dcpcheck.adapters.protocol import AdapterError
from dcpcheck.kernels import loading, releases
from dcpcheck.kernels.loading import JudgedFile, KernelLoadError, KernelSpecError
from dcpcheck.op_registry import SPARSE_TOPK_REMAP
from dcpcheck.ops.sparse_topk_remap import kernel as project_kernel
from dcpcheck.ops.sparse_topk_remap import mutants, vllm
from dcpcheck.ops.sparse_topk_remap.contract import RemapKernel

KERNELS: dict[str, RemapKernel] = {
    "default": project_kernel.remap,
    **{loading.mutant_name(m): m for m in mutants.MUTANTS},
}

DESCRIPTIONS: dict[str, str] = {
    "default": "the project's remap of top-k picks to a rank's local slots, in Triton",
    **{loading.mutant_name(m): loading.summary(m) for m in mutants.MUTANTS},
}
"""What each kernel of ``KERNELS`` is, as ``dcpcheck list kernels`` and the selftest say."""


def release_of(spec: str) -> releases.ReleaseSpec | None:
    """``spec`` as a vLLM release of this op; ``KernelSpecError`` for a version that is no
    version, or a function the op does not judge."""
    release = loading.release_of(spec, vllm.CONVERT)
    if release is not None and release.function not in vllm.FUNCTIONS:
        raise KernelSpecError(
            f"{spec}: the {SPARSE_TOPK_REMAP} op judges {' and '.join(vllm.FUNCTIONS)} only"
        )
    return release


def _files(release: releases.ReleaseSpec) -> tuple[JudgedFile, JudgedFile | None]:
    """The release's files that define the converter and the filter (None: it has none)."""
    where = (release.version, release.name)
    convert = loading.release_file(*where, vllm.CONVERT, vllm.MEMBERS)
    filtered = loading.release_file_defining(release.version, vllm.FILTER, vllm.MEMBERS)
    if release.function == vllm.FILTER and filtered is None:
        loading.release_file(*where, vllm.FILTER, vllm.MEMBERS)  # raises, one line
    return convert, filtered


def load(spec: str) -> RemapKernel:
    """The kernel ``spec`` names (module docstring); ``KernelLoadError`` with one line."""
    if spec in KERNELS:
        return KERNELS[spec]
    release = release_of(spec)
    if release is None:
        return loading.load_callable(spec, list(KERNELS))  # type: ignore[return-value]
    convert_file, filter_file = _files(release)
    try:
        convert = vllm.function_of(Path(convert_file.path), vllm.CONVERT, release.name)
        filtered = None
        if filter_file is not None:
            filtered = vllm.function_of(Path(filter_file.path), vllm.FILTER, release.name)
        named = release.function if ":" in spec else None
        return vllm.VllmRemap(convert, filtered, release.name, release.version, named)
    except AdapterError as exc:  # the revision's: bisect skips it
        raise KernelLoadError(str(exc)) from None


def judged_files(spec: str) -> tuple[JudgedFile, ...]:
    """The files ``spec``'s kernel comes from, with their SHA256: the project's kernel and
    mutant modules for a registry name, a release's files, else what ``loading.spec_files``
    names."""
    if spec in KERNELS:
        sources = (project_kernel.__file__, mutants.__file__)
        return tuple(loading.judged_file(Path(source)) for source in sources)
    release = release_of(spec)
    if release is None:
        return loading.spec_files(spec)
    files = [f for f in _files(release) if f is not None]
    return tuple(dict.fromkeys(files))


def canonical(spec: str) -> str:
    """``spec`` as reports and replays spell it: a release's version normalised."""
    release = release_of(spec)
    if release is None:
        return spec
    return release.name + (f":{release.function}" if ":" in spec else "")
