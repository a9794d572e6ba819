"""The modules that define the project's Triton kernels.

Two parts of the tool need the list and neither may import the other's side: the backend
(``dcpcheck.backend``), which refuses to switch once one of them is imported, since
Triton fixes a kernel as compiled or interpreted when it is defined; and the GPU-fit
recorder (``dcpcheck.gpu_fit``), which records the launches of exactly these kernels.
"""

from dcpcheck.op_registry import OPS

KERNEL_MODULES = (
    "dcpcheck.ops.fused_norm_rope.kernel",
    "dcpcheck.ops.fused_norm_rope.fp8_codes",
    "dcpcheck.ops.fused_norm_rope.launch_checks",
    "dcpcheck.ops.fused_norm_rope.tolerance_kernel",
    "dcpcheck.cases.seeded_kernel",
    # every op package's, as its line in the registry names them
    *(f"{op.package}.{name}" for op in OPS.values() if op.package for name in op.kernel_modules),
)
"""Once one is imported, its ``@triton.jit`` functions are defined, compiled or
interpreted for good (the registry and the loaders define none)."""
