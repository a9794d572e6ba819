"""The registry: every build of the project's kernel under its name (``dcpcheck list
kernels``), each loaded lazily.

A loader imports the kernel module only after ``dcpcheck.backend.current_backend()`` has
fixed ``TRITON_INTERPRET``: Triton decides between compiling and interpreting when a
``@triton.jit`` function is defined. Any ``--kernel`` (a registry name, a module, a file, a
vLLM release) is loaded by ``dcpcheck.kernels.loading.load_kernel``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dcpcheck.backend import current_backend
from dcpcheck.contract import Kernel
from dcpcheck.kernels.variants import VARIANTS, KernelVariant


@dataclass(frozen=True)
class KernelEntry:
    """A registered kernel: its name, a one-line description and a lazy loader."""

    name: str
    description: str
    load: Callable[[], Kernel]


def _variant_loader(variant: KernelVariant) -> Callable[[], Kernel]:
    def load() -> Kernel:
        current_backend()  # fix TRITON_INTERPRET before the @triton.jit module is imported
        from dcpcheck.kernels.launcher import make_kernel

        return make_kernel(variant)

    return load


KERNELS: dict[str, KernelEntry] = {
    v.name: KernelEntry(v.name, v.description, _variant_loader(v)) for v in VARIANTS
}

KERNEL_SOURCES = tuple(
    Path(__file__).with_name(name)
    for name in (
        "launcher.py",
        "launch_checks.py",
        "variants.py",
        "fused_norm_rope.py",
        "fp8_codes.py",
        "index_cache.py",
        "nvfp4_ds_mla.py",
    )
)
"""The files every registry kernel's code comes from (its host side and its Triton
kernels), which the reports name with their SHA256 (``loading.judged_files``)."""
