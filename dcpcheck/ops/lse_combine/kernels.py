"""The kernels of the op dcpcheck can name (``contract.CombineKernel``):

* ``default``: the project's merge (``kernel``); ``mutant/NAME``: it with one bug;
* ``vllm==X.Y.Z``: a released vLLM's ``cp_lse_ag_out_rs``, from whichever of its files
  the release has (``dcpcheck.ops.lse_combine.vllm``), fetched and cached by
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
from dcpcheck.op_registry import LSE_COMBINE
from dcpcheck.ops.lse_combine import kernel as project_kernel
from dcpcheck.ops.lse_combine import mutants, vllm
from dcpcheck.ops.lse_combine.contract import CombineKernel


def _mutant_name(function: object) -> str:
    return "mutant/" + function.__name__.replace("_", "-")  # type: ignore[attr-defined]


KERNELS: dict[str, CombineKernel] = {
    "default": project_kernel.combine,
    **{_mutant_name(m): m for m in mutants.MUTANTS},
}

DESCRIPTIONS: dict[str, str] = {
    "default": "the project's merge: all-gathered LSEs, a Triton correction, reduce-scatter",
    **{_mutant_name(m): m.__doc__.split("\n")[0] for m in mutants.MUTANTS},  # type: ignore[union-attr]
}
"""What each kernel of ``KERNELS`` is, as ``dcpcheck list kernels`` and the selftest say."""


def release_of(spec: str) -> releases.ReleaseSpec | None:
    """``spec`` as a vLLM release of this op; ``KernelSpecError`` for a version that is
    no version, or a function the op does not know."""
    release = loading.release_of(spec, vllm.FUNCTION)
    if release is not None and release.function != vllm.FUNCTION:
        raise KernelSpecError(f"{spec}: the {LSE_COMBINE} op judges {vllm.FUNCTION} only")
    return release


def _release_file(version: str, name: str) -> JudgedFile:
    """The file of release ``version`` that defines the routine: the newest of the op's
    files it has that does (a moved routine can leave its old file behind)."""
    for member in reversed(vllm.MEMBERS):
        if releases.lacks(version, member):
            continue
        try:
            kept = loading.fetch_release(version, member)
        except KernelLoadError:
            if releases.lacks(version, member):  # learnt by this fetch
                continue
            raise
        if f"def {vllm.FUNCTION}(" in kept.path.read_text(encoding="utf-8"):
            return JudgedFile(str(kept.path), kept.sha256)
    raise KernelLoadError(f"{name}: none of {', '.join(vllm.MEMBERS)} defines {vllm.FUNCTION}")


def load(spec: str) -> CombineKernel:
    """The kernel ``spec`` names (module docstring); ``KernelLoadError`` with one line."""
    if spec in KERNELS:
        return KERNELS[spec]
    release = release_of(spec)
    if release is not None:
        path = Path(_release_file(release.version, release.name).path)
        try:
            return vllm.VllmMerge(vllm.routine_of(path, release.name), release.name)
        except AdapterError as exc:  # the revision's: bisect skips it
            raise KernelLoadError(str(exc)) from None
    return loading.load_callable(spec, list(KERNELS))  # type: ignore[return-value]


def judged_files(spec: str) -> tuple[JudgedFile, ...]:
    """The files ``spec``'s kernel comes from, with their SHA256: the project's kernel
    and mutant modules for a registry name, else what ``dcpcheck.kernels.loading`` names."""
    if spec in KERNELS:
        sources = (project_kernel.__file__, mutants.__file__)
        return tuple(loading.judged_file(Path(source)) for source in sources)
    release = release_of(spec)
    if release is not None:
        return (_release_file(release.version, release.name),)
    return loading.judged_files(spec)


def canonical(spec: str) -> str:
    """``spec`` as reports and replays spell it: a release's version normalised."""
    release = release_of(spec)
    return spec if release is None else release.name
