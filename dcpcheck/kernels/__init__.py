"""The project's kernels under test: the correct fused kernel and its known-bad variants.

Every kernel here is the *same* Triton kernel (``dcpcheck.kernels.fused_norm_rope``)
compiled with a different ``MUTATION`` constexpr, so a variant differs from the correct
kernel by exactly the control flow it reproduces and by nothing else.

Adding a mutant is a few-line change:

1. add a member to :class:`Mutation` (the integer becomes the kernel's ``MUTATION``),
2. add a ``tl.constexpr`` alias for it and the ``if MUTATION == ...`` branch in
   ``fused_norm_rope.py`` (or, for launch-level bugs, a check in its host wrapper),
3. add a :class:`KernelVariant` to ``VARIANTS`` below; the registry picks it up.

Kernel modules are imported lazily, by the loaders of :data:`KERNELS`, after
``dcpcheck.backend.current_backend()`` has fixed ``TRITON_INTERPRET``: Triton decides
between compiling and interpreting when a ``@triton.jit`` function is defined. This module
itself imports no Triton code, which is why the variant types live here rather than in a
submodule (importing any ``dcpcheck.kernels.*`` module counts as "kernels loaded" to the
backend).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from dcpcheck.contract import Kernel


class Mutation(enum.IntEnum):
    """A deliberate deviation from the DCP contract, compiled in as the ``MUTATION`` constexpr."""

    NONE = 0
    Q_NORM_SKIPPED_WITHOUT_LOCAL_SLOT = 1
    """vLLM before PR 50005: the early-out on a missing local slot also covered the Q
    RMSNorm, so ``q_out`` rows of tokens owned by another rank stay unwritten."""
    KV_OUTPUTS_SKIPPED_WITHOUT_LOCAL_SLOT = 2
    """vLLM before PR 54908: ``kv_out`` and ``kpe_out`` were produced only alongside the
    cache write, so tokens without a local slot get no KV/k_pe outputs (their cache write
    is, correctly, skipped too)."""


@dataclass(frozen=True)
class KernelVariant:
    """One build of the project's kernel: a registry name and the mutation compiled in."""

    name: str
    description: str
    mutation: Mutation = Mutation.NONE


DEFAULT_VARIANT = KernelVariant(
    "default", "the project's fused norm + RoPE + cache-write Triton kernel (DESIGN §2)"
)

VARIANTS: tuple[KernelVariant, ...] = (
    DEFAULT_VARIANT,
    KernelVariant(
        "regress/pre-50005",
        "Q RMSNorm skipped for tokens without a local slot (vLLM before PR 50005)",
        Mutation.Q_NORM_SKIPPED_WITHOUT_LOCAL_SLOT,
    ),
    KernelVariant(
        "regress/pre-54908",
        "kv_out / kpe_out skipped for tokens without a local slot, cache write correctly "
        "skipped (vLLM before PR 54908)",
        Mutation.KV_OUTPUTS_SKIPPED_WITHOUT_LOCAL_SLOT,
    ),
)


@dataclass(frozen=True)
class KernelEntry:
    """A registered kernel: its name, a one-line description and a lazy loader."""

    name: str
    description: str
    load: Callable[[], Kernel]


class UnknownKernelError(KeyError):
    """No kernel is registered under the requested name."""

    def __str__(self) -> str:  # KeyError would repr() the message, quotes and all
        return str(self.args[0])


def _variant_loader(variant: KernelVariant) -> Callable[[], Kernel]:
    def load() -> Kernel:
        from dcpcheck.backend import current_backend

        current_backend()  # fix TRITON_INTERPRET before the @triton.jit module is imported
        from dcpcheck.kernels.fused_norm_rope import make_kernel

        return make_kernel(variant)

    return load


KERNELS: dict[str, KernelEntry] = {
    v.name: KernelEntry(v.name, v.description, _variant_loader(v)) for v in VARIANTS
}


def load_kernel(name: str) -> Kernel:
    """The kernel registered as ``name``, ready to call as ``kernel(inputs, outputs, caches)``."""
    entry = KERNELS.get(name)
    if entry is None:
        raise UnknownKernelError(
            f"unknown kernel {name!r}; known kernels: {', '.join(sorted(KERNELS))}"
        )
    return entry.load()
