"""The kernels of the op dcpcheck can name (``contract.CombineKernel``):

* ``default``: the project's merge (``kernel``); ``mutant/NAME``: it with one bug;
* ``vllm==X.Y.Z``: a released vLLM's ``cp_lse_ag_out_rs``, from whichever of its files
  the release has (``dcpcheck.ops.lse_combine.vllm``), fetched and cached by
  ``dcpcheck.kernels.releases``; ``vllm==X.Y.Z:dcp_a2a_lse_reduce`` its all-to-all merge;
  ``vllm==X.Y.Z:merge_attn_states`` its two-partial merge folded over the ranks' partials
  as MLA's prefill folds context chunks (``vllm_state_merge``);
* ``package.module:function`` or ``path/to/file.py:function``: a callable with the op's
  protocol.

The decode attentions that produce the partials (``contract.DecodeAttention``), by the
same kinds of spec (:data:`ATTENTION_REGISTRY`): ``default``, the project's
(``attention``); ``vllm==X.Y.Z``, a release's ``decode_attention_fwd``
(``vllm_attention``); a file's or a module's callable with the protocol.

Import only once the backend is chosen (it defines Triton kernels).
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from dcpcheck.kernels import loading, releases
from dcpcheck.kernels.loading import JudgedFile, KernelLoadError
from dcpcheck.kernels.registry import OpKernels, adapted, described
from dcpcheck.op_registry import LSE_COMBINE
from dcpcheck.ops.lse_combine import kernel as project_kernel
from dcpcheck.ops.lse_combine import mutants, vllm, vllm_attention, vllm_state_merge
from dcpcheck.ops.lse_combine.attention import mla_decode_attention
from dcpcheck.ops.lse_combine.contract import CombineKernel, DecodeAttention


def _neighbours(version: str) -> dict[str, Path]:
    """The op's files release ``version`` has in the cache, by module name: what a
    routine may import from its sibling files."""
    kept = {
        member.removesuffix(".py").replace("/", "."): releases.cached(version, member)
        for member in vllm.MEMBERS
        if not releases.lacks(version, member)
    }
    return {module: file.path for module, file in kept.items() if file is not None}


def _imports(path: Path, neighbours: dict[str, Path]) -> list[Path]:
    """The files of ``neighbours`` the file at ``path`` imports from."""
    tree = ast.parse(loading.source_of(path))
    modules = {n.module for n in tree.body if isinstance(n, ast.ImportFrom) and n.module}
    return [file for module, file in neighbours.items() if module in modules]


def _state_merge_file(release: releases.ReleaseSpec) -> JudgedFile:
    return loading.release_file(
        release.version, release.name, release.function, vllm_state_merge.MEMBERS
    )


def _release_merge(path: Path, version: str, name: str, function: str) -> vllm.VllmMerge:
    """Release ``version``'s ``function``, defined in ``path``, under the op's protocol;
    ``KernelLoadError`` when its API is one the adapter does not know."""
    routine = adapted(vllm.routine_of, path, function, name, _neighbours(version))
    return adapted(vllm.VllmMerge, routine, name, function)


def _release(release: releases.ReleaseSpec, named: bool) -> CombineKernel:
    if release.function == vllm_state_merge.FUNCTION:
        path = Path(_state_merge_file(release).path)
        return vllm_state_merge.load(path, release.version, release.name)
    path = Path(
        loading.release_file(release.version, release.name, release.function, vllm.MEMBERS).path
    )
    merge = _release_merge(path, release.version, release.name, release.function)
    other = next(f for f in vllm.FUNCTIONS if f != release.function)
    found = loading.release_file_defining(release.version, other, vllm.MEMBERS)
    if found is None:
        return merge  # the release has one path
    counterpart = _release_merge(Path(found.path), release.version, release.name, other)
    return dataclasses.replace(merge, counterpart=counterpart)


def _release_files(release: releases.ReleaseSpec, named: bool) -> tuple[JudgedFile, ...]:
    if release.function == vllm_state_merge.FUNCTION:
        return (_state_merge_file(release),)
    judged = loading.release_file(release.version, release.name, release.function, vllm.MEMBERS)
    other = next(f for f in vllm.FUNCTIONS if f != release.function)
    counterpart = loading.release_file_defining(release.version, other, vllm.MEMBERS)
    files = [Path(judged.path)]
    if counterpart is not None:  # the paths checks run it too
        files.append(Path(counterpart.path))
    neighbours = _neighbours(release.version)
    files += [sibling for file in list(files) for sibling in _imports(file, neighbours)]
    unique = dict.fromkeys(files)
    return (judged, *(loading.judged_file(path) for path in list(unique)[1:]))


REGISTRY: OpKernels[CombineKernel] = OpKernels(
    op=LSE_COMBINE,
    kernels={
        "default": project_kernel.combine,
        **{loading.mutant_name(m): m for m in mutants.MUTANTS},
        **{loading.mutant_name(a): mutants.ProducedBy(a) for a in mutants.ATTENTION_MUTANTS},
    },
    descriptions=described(
        "the project's merge: all-gathered LSEs, a Triton correction, reduce-scatter",
        (*mutants.MUTANTS, *mutants.ATTENTION_MUTANTS),
    ),
    sources=(project_kernel.__file__, mutants.__file__),
    function=vllm.FUNCTION,
    judged=(*vllm.FUNCTIONS, vllm_state_merge.FUNCTION),
    release=_release,
    release_files=_release_files,
)
"""The op's kernels by spec (module docstring)."""


def _attention_file(release: releases.ReleaseSpec) -> JudgedFile:
    return loading.release_file(
        release.version, release.name, release.function, vllm_attention.MEMBERS
    )


def _release_attention(release: releases.ReleaseSpec, named: bool) -> DecodeAttention:
    path = Path(_attention_file(release).path)
    function = getattr(loading.load_file(path), release.function, None)
    if not callable(function):
        raise KernelLoadError(f"{release.name}: {path} has no {release.function}")
    return adapted(vllm_attention.VllmDecodeAttention, function, release.name)


ATTENTION_REGISTRY: OpKernels[DecodeAttention] = OpKernels(
    op=LSE_COMBINE,
    kernels={
        "default": mla_decode_attention,
        **{loading.mutant_name(m): m for m in mutants.ATTENTION_MUTANTS},
    },
    sources=(mla_decode_attention.__code__.co_filename, mutants.__file__),
    function=vllm_attention.FUNCTION,
    judged=(),
    release=_release_attention,
    release_files=lambda release, named: (_attention_file(release),),
)
"""The decode attentions by spec (module docstring): the project's by name, the correct
one and its mutants."""
