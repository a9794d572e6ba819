"""The kernels of the op dcpcheck can name (``contract.RemapKernel``):

* ``default``: the project's Triton kernel (``kernel``); ``mutant/NAME``: it with one bug
  (``mutants``);
* ``package.module:function`` or ``path/to/file.py:function``: a callable with the op's
  protocol.

Import only once the backend is chosen (it defines Triton kernels).
"""

from __future__ import annotations

from pathlib import Path

from dcpcheck.kernels import loading
from dcpcheck.kernels.loading import JudgedFile, KernelSpecError
from dcpcheck.op_registry import SPARSE_TOPK_REMAP
from dcpcheck.ops.sparse_topk_remap import kernel as project_kernel
from dcpcheck.ops.sparse_topk_remap import mutants
from dcpcheck.ops.sparse_topk_remap.contract import RemapKernel


def _mutant_name(function: object) -> str:
    return "mutant/" + function.__name__.replace("_", "-")  # type: ignore[attr-defined]


KERNELS: dict[str, RemapKernel] = {
    "default": project_kernel.remap,
    **{_mutant_name(m): m for m in mutants.MUTANTS},
}

DESCRIPTIONS: dict[str, str] = {
    "default": "the project's remap of top-k picks to a rank's local slots, in Triton",
    **{_mutant_name(m): m.__doc__.split("\n")[0] for m in mutants.MUTANTS},  # type: ignore[union-attr]
}
"""What each kernel of ``KERNELS`` is, as ``dcpcheck list kernels`` and the selftest say."""


def _refuse_release(spec: str) -> None:
    """A ``vllm==X`` spec is refused in one line: the op has no adapter of vLLM's
    converters yet, and a spec it cannot honour must not fall through to a file lookup."""
    if loading.release_of(spec, "triton_convert_req_index_to_global_index") is not None:
        raise KernelSpecError(
            f"{spec}: the {SPARSE_TOPK_REMAP} op does not judge vLLM's releases yet; give "
            "the project's kernel, a mutant, or module:function"
        )


def load(spec: str) -> RemapKernel:
    """The kernel ``spec`` names (module docstring); ``KernelLoadError`` with one line."""
    if spec in KERNELS:
        return KERNELS[spec]
    _refuse_release(spec)
    return loading.load_callable(spec, list(KERNELS))  # type: ignore[return-value]


def judged_files(spec: str) -> tuple[JudgedFile, ...]:
    """The files ``spec``'s kernel comes from, with their SHA256: the project's kernel and
    mutant modules for a registry name, else what ``loading.spec_files`` names."""
    if spec in KERNELS:
        sources = (project_kernel.__file__, mutants.__file__)
        return tuple(loading.judged_file(Path(source)) for source in sources)
    _refuse_release(spec)
    return loading.spec_files(spec)


def canonical(spec: str) -> str:
    """``spec`` as reports and replays spell it."""
    return spec
