"""The slot-mapping kernels dcpcheck can name: the project's (``default``), its mutants
(``mutant/NAME``), a released vLLM kernel (``vllm==X.Y.Z``: its GPU model runner's, fetched
and cached by ``dcpcheck.kernels.releases``), or any callable with the op's protocol
(``package.module:function``, ``path/to/file.py:function``). A Triton kernel named by path
(a vLLM checkout's ``block_table.py:_compute_slot_mappings_kernel``) is launched as vLLM's
(``dcpcheck.ops.slot_mapping.vllm``). Import only once the backend is chosen (``kernel``)."""

from __future__ import annotations

from pathlib import Path

from dcpcheck.adapters.protocol import AdapterError
from dcpcheck.kernels import loading, releases
from dcpcheck.kernels.loading import JudgedFile, KernelLoadError, KernelSpecError
from dcpcheck.ops.slot_mapping import kernel as project_kernel
from dcpcheck.ops.slot_mapping import mutants, vllm
from dcpcheck.ops.slot_mapping.contract import SlotMappingKernel
from dcpcheck.ops.slot_mapping.kernel import compute_slot_mappings
from dcpcheck.ops.slot_mapping.mutants import MUTANTS

KERNELS: dict[str, SlotMappingKernel] = {
    "default": compute_slot_mappings,
    **{f"mutant/{m.__name__.replace('_', '-')}": m for m in MUTANTS},
}

DESCRIPTIONS: dict[str, str] = {
    "default": "the project's slot-mapping Triton kernel",
    **{f"mutant/{m.__name__.replace('_', '-')}": m.__doc__.split("\n")[0] for m in MUTANTS},
}
"""What each kernel of ``KERNELS`` is, as ``dcpcheck list kernels`` and the selftest say."""


def release_of(spec: str) -> releases.ReleaseSpec | None:
    """``spec`` as a vLLM release of this op's kernel; ``KernelSpecError`` for a version
    that is no version."""
    try:
        return releases.parse_spec(spec, vllm.FUNCTION)
    except releases.MalformedVersion as exc:
        raise KernelSpecError(f"{spec}: {exc}") from None


def _adapted(target: object, name: str, caller: Path | None) -> SlotMappingKernel:
    """vLLM's kernel under the op's protocol; a signature or caller the adapter cannot
    read is a load error (exit 125): it is the revision's, which ``bisect`` skips."""
    try:
        return vllm.VllmSlotMappings(target, name, caller)
    except AdapterError as exc:
        raise KernelLoadError(str(exc)) from None


def load(spec: str) -> SlotMappingKernel:
    """The kernel ``spec`` names (module docstring); ``KernelLoadError`` with one line."""
    if spec in KERNELS:
        return KERNELS[spec]
    release = release_of(spec)
    if release is not None:
        path = loading.fetch_release(release.version, vllm.MEMBER).path
        caller = loading.fetch_release(release.version, vllm.CALLER_MEMBER).path
        target = getattr(loading.load_file(path), release.function, None)
        if target is None:
            raise KernelLoadError(f"{release.name}: {path} has no {release.function!r}")
        return _adapted(target, release.name, caller)
    target = loading.load_callable(spec, list(KERNELS))
    if hasattr(target, "fn") and hasattr(target, "__getitem__"):  # a Triton kernel: vLLM's
        where = Path(spec.rsplit(":", 1)[0])
        return _adapted(target, spec, vllm.beside(where) if where.suffix == ".py" else None)
    return target  # type: ignore[return-value]


def judged_files(spec: str) -> tuple[JudgedFile, ...]:
    """The files ``spec``'s kernel comes from, with their SHA256: the project's kernel
    and mutant modules for a registry name, a release's cached files (checked against its
    wheel's RECORD once more), else what ``dcpcheck.kernels.loading`` names."""
    if spec in KERNELS:
        sources = (project_kernel.__file__, mutants.__file__)
        return tuple(loading.judged_file(Path(source)) for source in sources)
    release = release_of(spec)
    if release is not None:
        members = (vllm.MEMBER, vllm.CALLER_MEMBER)
        kept = [loading.fetch_release(release.version, member) for member in members]
        return tuple(JudgedFile(str(k.path), k.sha256) for k in kept)
    judged = loading.judged_files(spec)
    where = Path(spec.rsplit(":", 1)[0])
    caller = vllm.beside(where)
    if where.suffix == ".py" and caller.is_file() and release is None:
        judged += (loading.judged_file(caller),)
    return judged


def canonical(spec: str) -> str:
    """``spec`` as reports and replays spell it: a release's version normalised."""
    release = release_of(spec)
    if release is None:
        return spec
    suffix = "" if release.function == vllm.FUNCTION else f":{release.function}"
    return release.name + suffix
