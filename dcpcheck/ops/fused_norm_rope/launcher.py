"""The host side of the project's Triton kernel (``kernel``):
check the buffers, plan the launch, launch it.

It exists apart from the kernel so that the Triton source holds the arithmetic only and
this module everything decided on the host (STYLE.md, after Triton's tutorials): the
contract checks of every buffer (``launch_checks``), the tile sizes, the
grid, the constexpr flags each launch compiles in, the warps per program, and
``make_kernel``, which wraps one variant as a harness kernel.

Tokens per program
------------------
On a GPU each program handles one token (``BLOCK_T = 1``), the production shape. Triton's
CPU interpreter runs every program instance as a sequence of numpy calls, so its cost is
per program, not per element: the wrapper gives it wide tiles of up to
``INTERPRETER_TILE_ELEMENTS`` values instead.
"""

from __future__ import annotations

import triton

from dcpcheck.backend import current_backend
from dcpcheck.ops.fused_norm_rope.contract import (
    CacheLayout,
    DsMlaScale,
    FusedOpCaches,
    FusedOpInputs,
    FusedOpOutputs,
    IndexScale,
    Kernel,
)
from dcpcheck.ops.fused_norm_rope.kernel import LAYOUT_CODES, TASK_INDEXER_K, TASK_KV, TASK_Q
from dcpcheck.ops.fused_norm_rope.launch_checks import LaunchShape, check_launch
from dcpcheck.ops.fused_norm_rope.variant_build import kernel_of
from dcpcheck.ops.fused_norm_rope.variants import DEFAULT_VARIANT, KernelVariant

GPU_TOKENS_PER_PROGRAM = 1
"""One token per program on a GPU, as in the production kernels."""

GPU_NUM_WARPS = 2
"""Warps per program on a GPU. A program's work is one row (at most 2,048 lanes), so few
warps suffice, and more resident programs per multiprocessor keep more rows in flight:
on the H200, 2 warps moved 56-68% of HBM peak at 65,536 tokens against 47-57% with
Triton's default 4 and 31-39% with 8 (``benchmarks/kernel_bandwidth.py --num-warps``);
2 tokens per program gained at most one more point, so programs stay one token wide."""

GPU_Q_APART_FROM_TOKENS = 32_768
"""On a GPU, a launch of at least this many tokens runs the Q sub-task in a launch of its
own, after the others (the kernel module's "Grid"). One binary runs at the occupancy of
its widest path, and that is Q's: its whole row in fp32, 42 registers per thread for
deepseek-v3.2 and 55 for glm-5 at sm_90, where the other sub-tasks together need 38-40
(78% occupancy). On the H200 (BENCHMARKS.md), at 65,536 tokens two launches
moved 0.3-1.9 points more of HBM peak than one (77.1-80.6% against 76.1-79.2%); at 32,768
the two plans were within 0.8 points of each other; at 16,384 one launch was ahead by
1.2-2.2 points and at 4,096 by 8-10, and a one-token launch takes 2.4-2.7 us as one launch
and 4.6-5.0 as two: hence the threshold. The interpreter, whose cost is per launch and
per program, keeps one launch."""

GPU_MAXNREG: int | None = None
"""Registers per thread the kernel is compiled for on a GPU (None: the compiler's choice).
Tuning knob for ``benchmarks/kernel_bandwidth.py --maxnreg``; see BENCHMARKS.md."""

INTERPRETER_TILE_ELEMENTS = 1 << 20
"""Under the interpreter, ``BLOCK_T * widest row`` stays within this, which is also
Triton's largest tensor (``TRITON_MAX_TENSOR_NUMEL``). Measured on 2 cores: 4x smaller
tiles made a 2,048-token glm-5 launch 1.5x slower (0.68 s against 0.44 s)."""


def tokens_per_program(num_tokens: int, widest_block: int, interpreted: bool) -> int:
    """``BLOCK_T`` for a launch (module docstring: one token on a GPU, wide tiles when
    interpreted)."""
    if not interpreted:
        return GPU_TOKENS_PER_PROGRAM
    fitting = max(1, INTERPRETER_TILE_ELEMENTS // widest_block)
    return min(triton.next_power_of_2(num_tokens), triton.next_power_of_2(fitting + 1) // 2)


def fused_norm_rope(
    inputs: FusedOpInputs,
    outputs: FusedOpOutputs,
    caches: FusedOpCaches,
    *,
    variant: KernelVariant = DEFAULT_VARIANT,
    block_tokens: int | None = None,
    q_apart: bool | None = None,
) -> None:
    """Run the fused op once: write ``outputs`` for every token and ``caches`` where owned.

    ``variant`` picks the build of the kernel (``variants.VARIANTS``);
    ``block_tokens`` overrides ``BLOCK_T`` (a power of two), e.g. to test tiles that end
    past the last token, and ``q_apart`` the launches (``launch``). Raises ``ValueError``
    naming the first buffer that does not match the contract
    (``launch_checks``).
    """
    shape = check_launch(inputs, outputs, caches, current_backend().device)
    launch(
        shape,
        inputs,
        outputs,
        caches,
        variant=variant,
        block_tokens=block_tokens,
        q_apart=q_apart,
    )


def launch(
    shape: LaunchShape,
    inputs: FusedOpInputs,
    outputs: FusedOpOutputs,
    caches: FusedOpCaches,
    *,
    variant: KernelVariant = DEFAULT_VARIANT,
    block_tokens: int | None = None,
    num_warps: int | None = None,
    maxnreg: int | None = None,
    q_apart: bool | None = None,
) -> None:
    """The launch alone, for buffers ``check_launch`` already accepted as ``shape``.

    ``fused_norm_rope`` is the checked entry point; this one exists so a benchmark can time
    the kernel without the checks' device-to-host copy (and capture it in a CUDA graph).
    ``num_warps`` overrides ``GPU_NUM_WARPS`` and ``maxnreg`` caps the registers per thread
    (CUDA only; default ``GPU_MAXNREG``), for tuning. ``q_apart`` launches the Q sub-task
    on its own (default: from ``GPU_Q_APART_FROM_TOKENS`` tokens on a GPU).
    """
    if shape.num_tokens == 0:
        return
    has_indexer = shape.index_dim > 0
    interpreted = current_backend().interpreted
    block_q = triton.next_power_of_2(shape.q_dim)
    block_kv = triton.next_power_of_2(shape.kv_dim)
    block_rope = triton.next_power_of_2(shape.rope_dim)
    block_index = triton.next_power_of_2(max(shape.index_dim, 1))
    block_topk = triton.next_power_of_2(max(shape.topk, 1))
    if block_tokens is None:
        widest = max(block_q, block_kv, block_index, block_topk)
        block_tokens = tokens_per_program(shape.num_tokens, widest, interpreted)
    elif block_tokens < 1 or block_tokens & (block_tokens - 1):
        raise ValueError(f"block_tokens: expected a power of two, got {block_tokens}")

    # Buffers a launch does not use are still passed (Triton needs a pointer); the
    # constexpr flags compile every access to them away.
    unused = inputs.positions
    index_k = inputs.index_k if has_indexer else inputs.q_c
    index_out = outputs.index_k_out if has_indexer else outputs.q_out
    index_weight = inputs.index_weight if has_indexer else inputs.q_weight
    index_bias = inputs.index_bias if has_indexer else inputs.q_weight
    slots = inputs.slot_mapping if shape.writes_mla_cache else unused
    index_slots = inputs.index_slot_mapping if shape.writes_index_cache else unused
    index_cache = caches.index if shape.writes_index_cache else caches.mla
    if q_apart is None:
        q_apart = not interpreted and shape.num_tokens >= GPU_Q_APART_FROM_TOKENS
    first_task = TASK_INDEXER_K if has_indexer else TASK_KV
    if q_apart:
        task_ranges = [(first_task.value, TASK_KV.value), (TASK_Q.value, TASK_Q.value)]
    else:
        task_ranges = [(first_task.value, TASK_Q.value)]
    # The tile-scale rule only exists for fp8_ds_mla: other layouts compile one variant.
    # DsMlaScale(...) also turns an external caller's "pow2" into the enum (and rejects a typo).
    ds_mla_pow2 = (
        inputs.cache_layout is CacheLayout.FP8_DS_MLA
        and DsMlaScale(inputs.ds_mla_scale) is DsMlaScale.POW2
    )

    programs = triton.cdiv(shape.num_tokens, block_tokens)
    fused_kernel = kernel_of(variant)
    for first, last in task_ranges:
        fused_kernel[(programs * (last - first + 1),)](  # sub-task fastest
            inputs.q_c,
            inputs.q_c.stride(0),
            inputs.q_weight,
            outputs.q_out,
            outputs.q_out.stride(0),
            inputs.kv_c,
            inputs.kv_c.stride(0),
            inputs.kv_weight,
            outputs.kv_out,
            outputs.kv_out.stride(0),
            inputs.k_pe,
            inputs.k_pe.stride(0),
            outputs.kpe_out,
            outputs.kpe_out.stride(0),
            index_k,
            index_k.stride(0),
            index_weight,
            index_bias,
            index_out,
            index_out.stride(0),
            outputs.topk_indices,
            outputs.topk_indices.stride(0),
            inputs.positions,
            inputs.cos_sin,
            inputs.cos_sin.stride(0),
            slots,
            index_slots,
            caches.mla,
            caches.mla.stride(0),
            caches.mla.stride(1),
            caches.mla.shape[0],
            index_cache,
            index_cache.stride(0),
            shape.num_tokens,
            inputs.block_size,
            float(inputs.eps),
            1.0 if inputs.mla_scale is None else float(inputs.mla_scale),
            Q_DIM=shape.q_dim,
            KV_DIM=shape.kv_dim,
            ROPE_DIM=shape.rope_dim,
            INDEX_DIM=max(shape.index_dim, 1),
            TOPK=shape.topk,
            BLOCK_Q=block_q,
            BLOCK_KV=block_kv,
            BLOCK_ROPE=block_rope,
            BLOCK_INDEX=block_index,
            BLOCK_TOPK=block_topk,
            BLOCK_T=block_tokens,
            FIRST_TASK=first,
            LAST_TASK=last,
            CACHE_LAYOUT=LAYOUT_CODES[inputs.cache_layout],
            DS_MLA_POW2=ds_mla_pow2,
            HAS_SLOTS=shape.writes_mla_cache,
            WRITES_INDEX_CACHE=shape.writes_index_cache,
            INDEX_ROPE_NEOX=not inputs.index_rope_interleaved,
            INDEX_SHUFFLED=shape.writes_index_cache and inputs.index_format.shuffled,
            INDEX_SCALE_MX=shape.writes_index_cache and inputs.index_format.scale is IndexScale.MX,
            enable_fp_fusion=False,  # see "Rounding" in the module docstring
            num_warps=GPU_NUM_WARPS if num_warps is None else num_warps,
            **_register_cap(GPU_MAXNREG if maxnreg is None else maxnreg),
        )


def _register_cap(maxnreg: int | None) -> dict[str, int]:
    """The ``maxnreg`` launch option where there is one to give: the interpreter has no
    registers to cap."""
    if maxnreg is None or current_backend().interpreted:
        return {}
    return {"maxnreg": maxnreg}


def make_kernel(variant: KernelVariant) -> Kernel:
    """``variant`` as a harness kernel ``kernel(inputs, outputs, caches) -> None``."""

    def kernel(inputs: FusedOpInputs, outputs: FusedOpOutputs, caches: FusedOpCaches) -> None:
        fused_norm_rope(inputs, outputs, caches, variant=variant)

    kernel.__name__ = kernel.__qualname__ = f"fused_norm_rope[{variant.name}]"
    kernel.__doc__ = variant.description
    # A call launches the Triton kernel and nothing else on the device, so a run may call
    # it dry to compile its binaries ahead (``compile_ahead``).
    kernel.triton_launches_only = True  # type: ignore[attr-defined]
    return kernel
