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
same kinds of spec (:func:`load_attention`): ``default``, the project's (``attention``);
``vllm==X.Y.Z``, a release's ``decode_attention_fwd`` (``vllm_attention``); a file's or a
module's callable with the protocol.

Import only once the backend is chosen (it defines Triton kernels).
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from dcpcheck.adapters.protocol import AdapterError
from dcpcheck.kernels import loading, releases
from dcpcheck.kernels.loading import JudgedFile, KernelLoadError, KernelSpecError
from dcpcheck.op_registry import LSE_COMBINE
from dcpcheck.ops.lse_combine import kernel as project_kernel
from dcpcheck.ops.lse_combine import mutants, vllm, vllm_attention, vllm_state_merge
from dcpcheck.ops.lse_combine.attention import mla_decode_attention
from dcpcheck.ops.lse_combine.contract import CombineKernel, DecodeAttention

KERNELS: dict[str, CombineKernel] = {
    "default": project_kernel.combine,
    **{loading.mutant_name(m): m for m in mutants.MUTANTS},
    **{loading.mutant_name(a): mutants.ProducedBy(a) for a in mutants.ATTENTION_MUTANTS},
}

DESCRIPTIONS: dict[str, str] = {
    "default": "the project's merge: all-gathered LSEs, a Triton correction, reduce-scatter",
    **{
        loading.mutant_name(m): loading.summary(m)
        for m in (*mutants.MUTANTS, *mutants.ATTENTION_MUTANTS)
    },
}
"""What each kernel of ``KERNELS`` is, as ``dcpcheck list kernels`` and the selftest say."""


def release_of(spec: str) -> releases.ReleaseSpec | None:
    """``spec`` as a vLLM release of this op; ``KernelSpecError`` for a version that is
    no version, or a function the op does not know."""
    release = loading.release_of(spec, vllm.FUNCTION)
    judged = (*vllm.FUNCTIONS, vllm_state_merge.FUNCTION)
    if release is not None and release.function not in judged:
        raise KernelSpecError(f"{spec}: the {LSE_COMBINE} op judges {', '.join(judged)} only")
    return release


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


def load(spec: str) -> CombineKernel:
    """The kernel ``spec`` names (module docstring); ``KernelLoadError`` with one line."""
    if spec in KERNELS:
        return KERNELS[spec]
    release = release_of(spec)
    if release is not None and release.function == vllm_state_merge.FUNCTION:
        path = Path(_state_merge_file(release).path)
        return vllm_state_merge.load(path, release.version, release.name)
    if release is not None:
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
    return loading.load_callable(spec, list(KERNELS))  # type: ignore[return-value]


def _release_merge(path: Path, version: str, name: str, function: str) -> vllm.VllmMerge:
    """Release ``version``'s ``function``, defined in ``path``, under the op's protocol;
    ``KernelLoadError`` when its API is one the adapter does not know."""
    try:
        routine = vllm.routine_of(path, function, name, _neighbours(version))
        return vllm.VllmMerge(routine, name, function)
    except AdapterError as exc:  # the revision's: bisect skips it
        raise KernelLoadError(str(exc)) from None


def _state_merge_file(release: releases.ReleaseSpec) -> JudgedFile:
    return loading.release_file(
        release.version, release.name, release.function, vllm_state_merge.MEMBERS
    )


def judged_files(spec: str) -> tuple[JudgedFile, ...]:
    """The files ``spec``'s kernel comes from, with their SHA256: the project's kernel
    and mutant modules for a registry name, a release's files, else what
    ``dcpcheck.kernels.loading.spec_files`` names."""
    if spec in KERNELS:
        sources = (project_kernel.__file__, mutants.__file__)
        return tuple(loading.judged_file(Path(source)) for source in sources)
    release = release_of(spec)
    if release is not None and release.function == vllm_state_merge.FUNCTION:
        return (_state_merge_file(release),)
    if release is not None:
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
    return loading.spec_files(spec)


def canonical(spec: str) -> str:
    """``spec`` as reports and replays spell it: a release's version normalised."""
    release = release_of(spec)
    if release is None:
        return spec
    return release.name + (f":{release.function}" if ":" in spec else "")


ATTENTIONS: dict[str, DecodeAttention] = {
    "default": mla_decode_attention,
    **{loading.mutant_name(m): m for m in mutants.ATTENTION_MUTANTS},
}
"""The project's decode attentions by name: the correct one and its mutants."""


def load_attention(spec: str) -> DecodeAttention:
    """The decode attention ``spec`` names (module docstring); ``KernelLoadError`` with
    one line."""
    if spec in ATTENTIONS:
        return ATTENTIONS[spec]
    release = loading.release_of(spec, vllm_attention.FUNCTION)
    if release is not None:
        path = Path(
            loading.release_file(
                release.version, release.name, release.function, vllm_attention.MEMBERS
            ).path
        )
        function = getattr(loading.load_file(path), release.function, None)
        if not callable(function):
            raise KernelLoadError(f"{release.name}: {path} has no {release.function}")
        try:
            return vllm_attention.VllmDecodeAttention(function, release.name)
        except AdapterError as exc:
            raise KernelLoadError(str(exc)) from None
    return loading.load_callable(spec, list(ATTENTIONS))  # type: ignore[return-value]


def attention_files(spec: str) -> tuple[JudgedFile, ...]:
    """The files the decode attention ``spec`` names comes from, with their SHA256."""
    if spec in ATTENTIONS:
        sources = (mla_decode_attention.__code__.co_filename, mutants.__file__)
        return tuple(loading.judged_file(Path(source)) for source in sources)
    release = loading.release_of(spec, vllm_attention.FUNCTION)
    if release is not None:
        return (
            loading.release_file(
                release.version, release.name, release.function, vllm_attention.MEMBERS
            ),
        )
    return loading.spec_files(spec)
