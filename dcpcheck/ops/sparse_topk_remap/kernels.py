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

from dcpcheck.kernels import loading, releases
from dcpcheck.kernels.loading import JudgedFile
from dcpcheck.kernels.registry import OpKernels, adapted, described
from dcpcheck.op_registry import SPARSE_TOPK_REMAP
from dcpcheck.ops.sparse_topk_remap import kernel as project_kernel
from dcpcheck.ops.sparse_topk_remap import mutants, vllm
from dcpcheck.ops.sparse_topk_remap.contract import RemapKernel


def _files(release: releases.ReleaseSpec) -> tuple[JudgedFile, JudgedFile | None]:
    """The release's files that define the converter and the filter (None: it has none)."""
    where = (release.version, release.name)
    convert = loading.release_file(*where, vllm.CONVERT, vllm.MEMBERS)
    filtered = loading.release_file_defining(release.version, vllm.FILTER, vllm.MEMBERS)
    if release.function == vllm.FILTER and filtered is None:
        loading.release_file(*where, vllm.FILTER, vllm.MEMBERS)  # raises, one line
    return convert, filtered


def _release(release: releases.ReleaseSpec, named: bool) -> RemapKernel:
    convert_file, filter_file = _files(release)
    convert = adapted(vllm.function_of, Path(convert_file.path), vllm.CONVERT, release.name)
    filtered = None
    if filter_file is not None:
        filtered = adapted(vllm.function_of, Path(filter_file.path), vllm.FILTER, release.name)
    function = release.function if named else None
    caller = Path(convert_file.path).with_name(vllm.CALLER_FILE)
    return adapted(
        vllm.VllmRemap, convert, filtered, release.name, release.version, function, caller
    )


def _release_files(release: releases.ReleaseSpec, named: bool) -> tuple[JudgedFile, ...]:
    return tuple(dict.fromkeys(f for f in _files(release) if f is not None))


REGISTRY: OpKernels[RemapKernel] = OpKernels(
    op=SPARSE_TOPK_REMAP,
    kernels={
        "default": project_kernel.remap,
        **{loading.mutant_name(m): m for m in mutants.MUTANTS},
    },
    descriptions=described(
        "the project's remap of top-k picks to a rank's local slots, in Triton", mutants.MUTANTS
    ),
    sources=(project_kernel.__file__, mutants.__file__),
    function=vllm.CONVERT,
    judged=vllm.FUNCTIONS,
    judged_as=" and ".join(vllm.FUNCTIONS),
    release=_release,
    release_files=_release_files,
)
"""The op's kernels by spec (module docstring)."""
