"""How an op package resolves every ``--kernel`` spec, written once: a name of its registry
(``default`` and its mutants, ``mutant/NAME``), a released vLLM's (``vllm==X.Y.Z``,
``vllm==X.Y.Z:FUNCTION``), else a ``package.module:function`` or
``path/to/file.py:function``. Each op gives only its data (:class:`OpKernels`): its
kernels, the files they come from, the release functions it judges and how a release's
routines are fitted to its protocol (``dcpcheck.ops.<op>.kernels``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from dcpcheck.adapters.protocol import AdapterError
from dcpcheck.kernels import loading
from dcpcheck.kernels.errors import KernelLoadError, KernelSpecError
from dcpcheck.kernels.loading import JudgedFile
from dcpcheck.kernels.releases import ReleaseSpec

K = TypeVar("K")


def described(default: str, mutants: Iterable[Any]) -> dict[str, str]:
    """What each kernel of a registry is: ``default``'s ``default``, each mutant's
    ``loading.summary``, as ``dcpcheck list kernels`` and the selftest say."""
    return {"default": default, **{loading.mutant_name(m): loading.summary(m) for m in mutants}}


def adapted(build: Callable[..., K], *args: Any) -> K:
    """``build(*args)``, an adapter of a release's or a file's routine; one it cannot read
    (a signature, a caller) is a load error (exit 125): it is the revision's, which
    ``bisect`` skips."""
    try:
        return build(*args)
    except AdapterError as exc:
        raise KernelLoadError(str(exc)) from None


@dataclass(frozen=True)
class OpKernels(Generic[K]):
    """An op's kernels by spec (module docstring):

    * ``kernels``: the registry (``default`` and ``mutant/NAME``); ``sources``, the files
      its code comes from; ``descriptions``, what each is (where a command lists them);
    * ``function``: the release function a bare ``vllm==X.Y.Z`` names; ``judged``, the
      functions a ``vllm==X.Y.Z:FUNCTION`` may name (empty: any, the op's ``release``
      says which it fits), ``judged_as`` how a refusal names them (default: by commas);
    * ``release(release, named)`` and ``release_files(release, named)``: a release's kernel
      and the files its code comes from (``named``: the spec names a function);
    * ``external(spec, adapter)`` and ``external_files(spec)``: those of a file's or a
      module's callable, through the adapter named (by default as defined, no adapter);
    * ``adapters``: the adapters ``--adapter`` may name (``auto`` picks one by the
      callable's signature); a registry kernel follows the protocol itself (``auto`` or
      ``native``), a release runs through vLLM's (``auto`` or ``vllm``);
    * ``named_in_canonical``: whether a spec's named function stays in its canonical form.

    ``kernels`` is a mapping, so an op whose kernels are costly to build (compiled
    variants) builds one only when it is named.
    """

    op: str
    kernels: Mapping[str, K]
    sources: tuple[str, ...]
    function: str
    judged: tuple[str, ...]
    release: Callable[[ReleaseSpec, bool], K]
    release_files: Callable[[ReleaseSpec, bool], tuple[JudgedFile, ...]]
    external: Callable[[str, str], K] | None = None
    external_files: Callable[[str], tuple[JudgedFile, ...]] = field(default=loading.spec_files)
    descriptions: dict[str, str] = field(default_factory=dict)
    judged_as: str = ""
    named_in_canonical: bool = True
    adapters: tuple[str, ...] = ("auto",)

    def release_of(self, spec: str) -> ReleaseSpec | None:
        """``spec`` as a vLLM release of this op; ``KernelSpecError`` for a version that is
        no version, or a function the op does not judge."""
        release = loading.release_of(spec, self.function)
        if release is not None and self.judged and release.function not in self.judged:
            judged = self.judged_as or ", ".join(self.judged)
            raise KernelSpecError(f"{spec}: the {self.op} op judges {judged} only")
        return release

    def check(self, spec: str, adapter: str = "auto") -> None:
        """What :meth:`load` would refuse of ``spec`` under ``adapter`` before running any
        of the kernel's code: ``KernelSpecError`` for a spec wrong in itself (an unknown
        adapter or one that does not apply, a misspelt registry name, a file without
        ``:function``, a release version that is no version or not published, a release
        cache that cannot be trusted); ``KernelLoadError`` for a file that is not there or
        does not parse, or a release that cannot be fetched. A release is fetched into the
        cache here, checked against its wheel's RECORD. A run whose kernel loads in a
        worker process asks this in its parent (``dcpcheck.harness.isolation``)."""
        if spec in self.kernels:
            self._check_adapter(spec, adapter, None)
            return
        release = self.release_of(spec)
        self._check_adapter(spec, adapter, release)
        if release is None:
            loading.check_callable_spec(spec, list(self.kernels))
        else:
            self.release_files(release, ":" in spec)

    def _check_adapter(self, spec: str, adapter: str, release: ReleaseSpec | None) -> None:
        """``KernelSpecError`` when ``adapter`` is unknown, or does not apply to what
        ``spec`` names (``release``: the release it names, if it does)."""
        if adapter not in self.adapters:
            raise KernelSpecError(
                f"unknown adapter {adapter!r} (expected {', '.join(self.adapters)})"
            )
        if spec in self.kernels and adapter not in ("auto", "native"):
            raise KernelSpecError(
                f"{spec}: a registry kernel follows dcpcheck's protocol; "
                f"the {adapter} adapter does not apply"
            )
        if release is not None and adapter not in ("auto", "vllm"):
            raise KernelSpecError(f"{release.name}: a vLLM release runs through the vllm adapter")

    def load(self, spec: str, adapter: str = "auto") -> K:
        """The kernel ``spec`` names, through ``adapter``; ``KernelSpecError`` or
        ``KernelLoadError`` with one line (:meth:`check`)."""
        if spec in self.kernels:
            self._check_adapter(spec, adapter, None)
            return self.kernels[spec]
        release = self.release_of(spec)
        self._check_adapter(spec, adapter, release)
        if release is not None:
            return self.release(release, ":" in spec)
        loading.check_callable_spec(spec, list(self.kernels))  # a file that does not parse
        if self.external is not None:
            return self.external(spec, adapter)
        return loading.load_callable(spec, list(self.kernels))  # type: ignore[return-value]

    def judged_files(self, spec: str) -> tuple[JudgedFile, ...]:
        """The files ``spec``'s kernel comes from, with their SHA256: the registry's sources
        for a registry name, a release's files, else a callable's."""
        if spec in self.kernels:
            return tuple(loading.judged_file(Path(source)) for source in self.sources)
        release = self.release_of(spec)
        if release is not None:
            return self.release_files(release, ":" in spec)
        return self.external_files(spec)

    def canonical(self, spec: str) -> str:
        """``spec`` as reports and replays spell it: a release's version normalised."""
        release = self.release_of(spec)
        if release is None:
            return spec
        named = self.named_in_canonical and ":" in spec
        return release.name + (f":{release.function}" if named else "")
