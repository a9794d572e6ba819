"""Every op dcpcheck judges, by the name ``--op``, scenario files (``op = "..."``) and
reports use, and the files of a vLLM wheel each op judges. A scenario file without an
``op`` key is the fused op's."""

from __future__ import annotations

from dataclasses import dataclass

FUSED_NORM_ROPE = "fused-norm-rope"
SLOT_MAPPING = "slot-mapping"
LSE_COMBINE = "lse-combine"
SPARSE_TOPK_REMAP = "sparse-topk-remap"
RESHAPE_AND_CACHE_FLASH = "reshape-and-cache-flash"

DEFAULT_OP = FUSED_NORM_ROPE
"""The op ``mutate``, ``bisect`` and the pytest plugin judge when ``--op`` names none."""


PACKAGE_RUN_OPTIONS = frozenset(
    {
        "op", "property-only", "examples", "seed", "dcp", "kernel", "scenario",
        "scenario-dir", "device", "json", "junit", "home", "fail-fast", "launcher",
        "rank-timeout",
    }
)  # fmt: skip
"""The ``run`` options (``dcpcheck.cases.options``) an op package's runs take: its named
scenarios, its own property search (``--seed`` seeds it), its real-rank mode where it has
one, the reports and the run directory. The rest belong to the fused op's harness."""

PACKAGE_REPRO_OPTIONS = frozenset({"kernel", "dcp", "device", "json"})
"""The ``repro`` options a replay of an op package's scenario file takes."""


@dataclass(frozen=True)
class Op:
    """What ``dcpcheck list ops`` says of an op, the files its released kernels come from
    (their paths in a vLLM wheel, which one download of a release keeps for every op,
    ``dcpcheck.kernels.releases``), and the options its ``run`` and ``repro`` take (None:
    every option of the command; ``run --op OP`` refuses the others, naming each)."""

    description: str
    wheel_members: tuple[str, ...]
    function: str  # the routine a release is judged by (``vllm==X`` names no other)
    package: str  # the module of its OpPackage (``dcpcheck.ops``)
    # whether its cases run through dcpcheck.workflows.session (worker isolation, the
    # sanitizer, ownership maps, the token streams) rather than its package's runner
    judged_by_session: bool = False
    run_options: frozenset[str] | None = PACKAGE_RUN_OPTIONS
    repro_options: frozenset[str] | None = PACKAGE_REPRO_OPTIONS

    def takes(self, command: str, option: str) -> bool:
        """Whether this op's ``command`` (``run`` or ``repro``) takes ``option``."""
        declared = self.run_options if command == "run" else self.repro_options
        return declared is None or option in declared


OPS: dict[str, Op] = {
    FUSED_NORM_ROPE: Op(
        "fused MLA norm + RoPE + cache write (docs/fused-norm-rope.md)",
        # where it lived, oldest first: 0.25.0 - 0.26.0 kept it beside the NVIDIA model
        # code, 0.27.0 on in the code the platforms share
        (
            "vllm/models/deepseek_v32/nvidia/kernels.py",
            "vllm/models/deepseek_v32/common/kernels.py",
        ),
        "fused_norm_rope",
        "dcpcheck.ops.fused_norm_rope",
        judged_by_session=True,
        run_options=None,
        repro_options=None,
    ),
    SLOT_MAPPING: Op(
        "per-rank slot mappings of every cache group and local sequence lengths "
        "(docs/dcp-contract.md)",
        # the GPU model runner's kernel and its caller, which says how it sizes the rows;
        # the runner's local sequence lengths; the attention backends' function; the V1
        # runner's block table; the MLA metadata builder, which computed the local lengths
        # itself before the function; the V1 runner, which says which interleave it builds
        # its block tables with; where the MLA attention moved from 0.15.0, and the sparse
        # indexer, which ask the function for every rank at once
        (
            "vllm/v1/worker/gpu/block_table.py",
            "vllm/v1/worker/gpu/model_runner.py",
            "vllm/v1/worker/gpu/cp_utils.py",
            "vllm/v1/attention/backends/utils.py",
            "vllm/v1/worker/block_table.py",
            "vllm/v1/attention/backends/mla/common.py",
            "vllm/v1/worker/gpu_model_runner.py",
            "vllm/model_executor/layers/attention/mla_attention.py",
            "vllm/v1/attention/backends/mla/indexer.py",
        ),
        "_compute_slot_mappings_kernel",
        "dcpcheck.ops.slot_mapping",
    ),
    LSE_COMBINE: Op(
        "the merge of the ranks' partial attentions by their LSE (docs/lse-combine.md)",
        # where cp_lse_ag_out_rs and dcp_a2a_lse_reduce lived, oldest first; then where
        # the Triton decode attention that produces the partials lived, and
        # merge_attn_states
        (
            "vllm/attention/ops/common.py",
            "vllm/v1/attention/ops/common.py",
            "vllm/v1/attention/ops/dcp_alltoall.py",
            "vllm/v1/attention/ops/dcp.py",
            "vllm/attention/ops/triton_decode_attention.py",
            "vllm/v1/attention/ops/triton_decode_attention.py",
            "vllm/attention/ops/triton_merge_attn_states.py",
            "vllm/v1/attention/ops/triton_merge_attn_states.py",
        ),
        "cp_lse_ag_out_rs",
        "dcpcheck.ops.lse_combine",
    ),
    SPARSE_TOPK_REMAP: Op(
        "each rank's local slots of a sparse attention's top-k token picks "
        "(docs/sparse-topk-remap.md)",
        # where the converters lived, oldest first: beside the FlashMLA sparse backend,
        # then in the sparse backends' shared utilities
        (
            "vllm/v1/attention/backends/mla/flashmla_sparse.py",
            "vllm/v1/attention/backends/mla/sparse_utils.py",
        ),
        "triton_convert_req_index_to_global_index",
        "dcpcheck.ops.sparse_topk_remap",
    ),
    RESHAPE_AND_CACHE_FLASH: Op(
        "the paged K/V cache write of non-MLA attention (docs/reshape-and-cache-flash.md)",
        # where triton_reshape_and_cache_flash lived, oldest first
        (
            "vllm/attention/ops/triton_reshape_and_cache_flash.py",
            "vllm/v1/attention/ops/triton_reshape_and_cache_flash.py",
        ),
        "triton_reshape_and_cache_flash",
        "dcpcheck.ops.reshape_and_cache_flash",
    ),
}
"""Name -> the op (``Op``)."""


@dataclass(frozen=True)
class DecodeChain:
    """Which op plays each stage of the tiny model's DCP decode path
    (``dcpcheck.e2e.chain``): each named op's package provides that stage in its
    ``decode_chain`` module (``dcpcheck.ops.decode_stages``). A stage's name is its field's, with
    ``-`` for ``_`` (``--stage slot-mapping=SPEC``); ``cache_write``'s kernel is the one under
    test, named by ``--kernel``."""

    cache_write: str
    slot_mapping: str
    attention: str
    merge: str


DECODE_CHAIN = DecodeChain(
    cache_write=FUSED_NORM_ROPE,
    slot_mapping=SLOT_MAPPING,
    attention=LSE_COMBINE,
    merge=LSE_COMBINE,
)
"""The ops of the decode chain, by stage."""
