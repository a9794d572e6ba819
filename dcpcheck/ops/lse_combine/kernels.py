"""The kernels of the op dcpcheck can name (``contract.CombineKernel``):

* ``default``: the project's merge (``kernel``); ``mutant/NAME``: it with one bug;
* ``package.module:function`` or ``path/to/file.py:function``: a callable with the op's
  protocol.

vLLM's released merges (``vllm==X``) are not loaded by this op yet: such a spec is refused
with one line (exit 2), never judged as something else.

Import only once the backend is chosen (it defines Triton kernels).
"""

from __future__ import annotations

from pathlib import Path

from dcpcheck.kernels import loading
from dcpcheck.kernels.loading import JudgedFile, KernelSpecError
from dcpcheck.op_registry import LSE_COMBINE
from dcpcheck.ops.lse_combine import kernel as project_kernel
from dcpcheck.ops.lse_combine import mutants
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


def _refuse_release(spec: str) -> None:
    if loading.release_of(spec) is not None:
        raise KernelSpecError(
            f"{spec}: the {LSE_COMBINE} op does not load vLLM releases yet; name the "
            "project's kernels or a callable of the op's protocol (module:function)"
        )


def load(spec: str) -> CombineKernel:
    """The kernel ``spec`` names (module docstring); ``KernelLoadError`` with one line."""
    if spec in KERNELS:
        return KERNELS[spec]
    _refuse_release(spec)
    return loading.load_callable(spec, list(KERNELS))  # type: ignore[return-value]


def judged_files(spec: str) -> tuple[JudgedFile, ...]:
    """The files ``spec``'s kernel comes from, with their SHA256: the project's kernel
    and mutant modules for a registry name, else what ``dcpcheck.kernels.loading`` names."""
    if spec in KERNELS:
        sources = (project_kernel.__file__, mutants.__file__)
        return tuple(loading.judged_file(Path(source)) for source in sources)
    _refuse_release(spec)
    return loading.judged_files(spec)


def canonical(spec: str) -> str:
    """``spec`` as reports and replays spell it."""
    return spec
