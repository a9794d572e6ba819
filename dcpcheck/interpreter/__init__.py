"""Corrections and speed-ups of Triton's CPU interpreter, installed when a process picks it
(``dcpcheck.backend.select_backend``): each module fixes one place where the interpreter
computes, accepts or costs something other than what a GPU does, and says which
interpreter function it replaces and why. Nothing here runs on a CUDA backend.
"""

from __future__ import annotations


def install() -> dict[str, str]:
    """Install every correction once; return what each says it did, keyed by the field of
    ``dcpcheck.backend.Backend`` that reports it (the backend line shows them)."""
    from dcpcheck.interpreter import (
        bf16_casts,
        binary_ops,
        block_types,
        calls,
        dots,
        dtypes,
        fp8,
        jit,
        masks,
        overflow_checks,
        scalars,
    )

    jit.install_constexprs()
    return {
        "fp8_cast": fp8.install_fp8_cast_correction().summary(),
        "language_patch": calls.install_language_patch_once(),
        "dtype_paths": dtypes.install_dtype_fast_paths(),
        "masks": masks.install_boolean_masks(),
        "dots": dots.install_bf16_dots(),
        "scalars": scalars.install_scalar_index(),
        "bf16_casts": bf16_casts.install_bf16_casts(),
        "overflow_checks": overflow_checks.install_unread_overflow_checks_off(),
        "block_types": block_types.install_block_types_once(),
        "binary_ops": binary_ops.install_binary_ops_unconverted(),
    }
