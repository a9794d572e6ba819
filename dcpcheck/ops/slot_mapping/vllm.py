"""vLLM's routines as routines of the op: the slot mappings of the GPU model runner
(``_compute_slot_mappings_kernel`` in ``vllm/v1/worker/gpu/block_table.py``, every release
from 0.12.0), launched as ``BlockTables.compute_slot_mappings`` launches it, and the local
sequence lengths (:class:`VllmLocalSeqLens`).

The kernel's parameters changed over the releases; the adapter reads them from the
signature and gives each the value the release's caller gives it:

* ``num_tokens`` (0.12.0 - 0.17.1): the rows of ``positions`` the caller passes, from which
  the kernel pads. How many that is the signature does not say, so it is read from the
  caller, ``vllm/v1/worker/gpu/model_runner.py`` (:func:`rows_the_caller_passes`): the
  scheduled tokens (``positions[:num_tokens]``) or every row after CUDA-graph padding
  (``positions[:num_tokens_after_padding]``);
* ``cu_num_tokens`` / ``query_start_loc``, ``pos``, ``idx_mapping`` (0.15.0 on): the batch;
  before ``idx_mapping`` the kernel reads block-table row ``i`` for request ``i``, as the
  caller hands it the tables gathered by request (``input_block_tables``);
* ``block_table_ptrs``, ``block_table_strides``: one table per cache group, by address;
* ``page_sizes`` / ``block_sizes``, ``kernel_block_sizes`` (0.29.0 - 0.31.0): the groups'
  block sizes and their kernel block sizes, the tables then in kernel blocks as the runner
  writes them (:func:`in_kernel_blocks`). Without ``kernel_block_sizes``, what
  ``BlockTables`` stores in the tensor it passes as ``block_sizes`` says
  (:func:`blocks_the_caller_passes`): the kernel blocks' sizes, the tables in kernel blocks
  (0.22.0 - 0.28.0, whose kernel then deals positions to the ranks by the kernel block,
  vLLM #51031), or the cache's, the tables in cache blocks (0.12.0 - 0.21.0, 0.32.0 on),
  which is never asked a kernel block smaller than the cache's;
* ``slot_mapping_enabled`` (0.29.0 on): every group writes the cache (a group that does
  not, a recurrent state's, has no slots to judge);
* ``dcp_sharded`` (0.31.0 on): the op's sharded flags. Before them the kernel shards
  every group it is handed, but 0.17.0 - 0.30.0 hand it no replicated group whose slots
  are read (``kept_whole``: a sliding-window group is refused under DCP, the KV cache
  manager shards every other group but, from 0.26.0, a recurrent state's, whose reader
  takes it by block and never by slot), so a replicated group under DCP is not applicable
  there, with those lines; a kernel named by its file, with no release's callers, is
  judged on it;
* ``cp_rank``, ``CP_SIZE``, ``CP_INTERLEAVE`` (0.17.0 on): the rank, DCP size, interleave.

What a release's API cannot be asked is ``not_applicable`` with the reason
(:meth:`VllmSlotMappings.not_applicable`), each one a thing that release's caller never
passes: DCP before the kernel took a rank, a kernel block smaller than the cache's where
the tables are in cache blocks, a request without blocks before it read one.

The local sequence lengths come in two routines: the GPU runner's Triton kernel
(``_dcp_local_seq_lens_kernel`` in ``vllm/v1/worker/gpu/cp_utils.py``, 0.17.0 on), launched
as ``prepare_dcp_local_seq_lens`` launches it, only under DCP; and the attention backends'
torch function (``get_dcp_local_seq_lens`` in ``vllm/v1/attention/backends/utils.py``,
0.11.1 on), called as the runners call it, on the CPU, for one rank. The function's module
imports half of vLLM, so the function alone is taken from it (:func:`torch_function`): it
uses torch and nothing else. Before the function, the MLA metadata builder computed them
itself (``dcpcheck.ops.slot_mapping.vllm_mla``). The function is asked two ways: for
one rank, as the runners ask it, and for every rank at once (``dcp_rank=None``: a
``[requests, dcp_size]`` tensor), as the MLA metadata builder asks it for a chunked
prefill's context lengths (``dcpcheck.ops.slot_mapping.every_rank``); both are judged
where the release has the second caller.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dcpcheck.adapters.protocol import AdapterError
from dcpcheck.kernels.loading import definitions_alone, source_of
from dcpcheck.op_registry import OPS, SLOT_MAPPING
from dcpcheck.ops.slot_mapping.contract import (
    PAD_SLOT,
    LocalSeqLensInputs,
    LocalSeqLensKernel,
    SlotMappingInputs,
)
from dcpcheck.ops.slot_mapping.every_rank import SEQ_LENS_FUNCTION, EveryRankAsk, EveryRankCallers
from dcpcheck.ops.slot_mapping.kept_whole import (
    MANAGER_SHARDS,
    OTHER_GROUPS_SHARDED,
    RECURRENT_SLOTS_UNREAD,
    SLIDING_WINDOW_REFUSED,
    declared,
)
from dcpcheck.ops.slot_mapping.vllm_mla import BuilderLengths

MEMBER, CALLER_MEMBER, SEQ_LENS_KERNEL_MEMBER, SEQ_LENS_FUNCTION_MEMBER = OPS[
    SLOT_MAPPING
].wheel_members[:4]
FUNCTION = OPS[SLOT_MAPPING].function
SEQ_LENS_KERNEL = "_dcp_local_seq_lens_kernel"
V1_FUNCTION = "compute_slot_mapping"
V1_MEMBER, MLA_MEMBER, V1_RUNNER_MEMBER = OPS[SLOT_MAPPING].wheel_members[4:7]

CALLER_BLOCK = 1024
"""The rows per step every release's caller launches the kernel with."""

KNOWN = {
    "num_tokens",
    "max_num_tokens",
    "cu_num_tokens",
    "query_start_loc",
    "idx_mapping",
    "pos",
    "block_table_ptrs",
    "block_table_strides",
    "page_sizes",
    "block_sizes",
    "kernel_block_sizes",
    "slot_mapping_enabled",
    "dcp_sharded",
    "slot_mappings_ptr",
    "slot_mappings_stride",
    "cp_rank",
    "CP_SIZE",
    "CP_INTERLEAVE",
    "PAD_ID",
    "BLOCK_SIZE",
    "TRITON_BLOCK_SIZE",
}
"""Every parameter a release's kernel has had (module docstring)."""

PADDED_NAMES = ("padding", "padded")
"""Words by which the caller names a row count that includes CUDA-graph padding."""


@dataclass(frozen=True)
class CallerRows:
    """How many rows of ``positions`` the caller passes: all of them after CUDA-graph
    padding (``padded``) or the scheduled tokens only; ``evidence`` quotes the lines."""

    padded: bool
    evidence: str


def _slice_bound(node: ast.AST) -> str | None:
    """``x[:n]`` -> the source of ``n``; None for anything else."""
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice):
        upper = node.slice.upper
        if node.slice.lower is None and upper is not None:
            return ast.unparse(upper)
    return None


def rows_the_caller_passes(source: str, where: str) -> CallerRows:
    """Read from the model runner's source how many rows of ``positions`` its
    ``compute_slot_mappings`` call passes (module docstring): the slice bound of the
    ``positions`` argument, or of the ``positions=`` the batch is built with when the call
    passes ``input_batch.positions``; padded when that bound, or what it was assigned,
    says padding. ``AdapterError`` when the source does not say."""
    tree = ast.parse(source)
    calls = sorted(
        (
            node
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "compute_slot_mappings"
        ),
        key=lambda node: node.lineno,
    )
    if not calls:
        raise AdapterError(f"{where}: no compute_slot_mappings call to read the rows from")
    call = calls[0]
    rows = [arg for arg in call.args if "positions" in ast.unparse(arg)]
    if len(rows) != 1:
        raise AdapterError(f"{where}:{call.lineno}: cannot tell which argument is positions")
    evidence = [f"{where}:{call.lineno}: {ast.unparse(rows[0])}"]
    bound = _slice_bound(rows[0])
    if bound is None:
        built = [
            keyword
            for keyword in ast.walk(tree)
            if isinstance(keyword, ast.keyword)
            and keyword.arg == "positions"
            and _slice_bound(keyword.value) is not None
        ]
        if not built:
            raise AdapterError(f"{where}:{call.lineno}: cannot tell how many rows it passes")
        bound = _slice_bound(built[0].value)
        evidence.append(f"{where}:{built[0].value.lineno}: positions={ast.unparse(built[0].value)}")
    assert bound is not None
    said = bound
    enclosing = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef)
        and node.lineno <= call.lineno <= (node.end_lineno or node.lineno)
    ]
    scope = max(enclosing, key=lambda node: node.lineno) if enclosing else tree
    assigned = [
        node
        for node in ast.walk(scope)
        if isinstance(node, ast.Assign)
        and node.lineno < call.lineno
        and any(ast.unparse(target) == bound for target in node.targets)
    ]
    if assigned:
        last = max(assigned, key=lambda node: node.lineno)
        said += " " + ast.unparse(last.value)
        evidence.append(f"{where}:{last.lineno}: {ast.unparse(last)}")
    padded = any(word in said for word in PADDED_NAMES)
    return CallerRows(padded, "; ".join(evidence))


SEPARATE_SIZES = "separate"
KERNEL_BLOCKS_AS_SIZES = "kernel blocks as block sizes"
CACHE_BLOCKS = "cache blocks"
TABLE_SIZES = "self.block_sizes_tensor"
"""What ``BlockTables.compute_slot_mappings`` hands the kernel as its block sizes."""


@dataclass(frozen=True)
class CallerBlocks:
    """Which block sizes the caller's tables are in (``blocks_the_caller_passes``):
    ``SEPARATE_SIZES`` (the kernel takes the cache's and the kernel blocks' sizes),
    ``KERNEL_BLOCKS_AS_SIZES`` (the tables in kernel blocks, whose size the kernel is given
    as its block size) or ``CACHE_BLOCKS``; ``evidence`` quotes the line that says."""

    kind: str
    evidence: str


def defined_at(tree: ast.Module, where: str) -> str:
    """``where:line`` of the kernel's ``def`` in its module's ``tree``."""
    lines = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.name == FUNCTION
    ]
    return f"{where}:{lines[0]}" if lines else where


def blocks_the_caller_passes(
    tree: ast.Module, where: str, parameters: tuple[str, ...]
) -> CallerBlocks:
    """Read from the kernel's own module (``tree``, of the file ``where``) which block
    sizes ``BlockTables`` hands it: a kernel with ``kernel_block_sizes`` is given both;
    else what ``BlockTables`` stores in the tensor it passes as ``block_sizes``, the kernel
    blocks' sizes (its tables then in kernel blocks, ``append_block_ids``) or the cache's.
    ``AdapterError`` when the module does not say."""
    if "kernel_block_sizes" in parameters:
        return CallerBlocks(
            SEPARATE_SIZES, f"{defined_at(tree, where)}: {FUNCTION}(..., kernel_block_sizes"
        )
    stored = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and any(ast.unparse(target) == TABLE_SIZES for target in node.targets)
    ]
    if not stored:
        raise AdapterError(f"{where}: no {TABLE_SIZES} to read the block sizes it passes from")
    said = ast.unparse(stored[0].value)
    kind = KERNEL_BLOCKS_AS_SIZES if "kernel_block_sizes" in said else CACHE_BLOCKS
    return CallerBlocks(kind, f"{where}:{stored[0].lineno}: {TABLE_SIZES} = {said}")


@dataclass(frozen=True)
class Askable:
    """Which of the op's inputs a release's kernel can be asked at all."""

    dcp: bool  # DCP sizes above 1
    replicated: bool  # replicated cache groups under DCP
    without_blocks: bool  # requests that own no blocks
    interleave: bool = True  # interleaves above 1
    kernel_blocks: bool = True  # kernel blocks smaller than the cache's


def in_kernel_blocks(table: torch.Tensor, per_block: int) -> torch.Tensor:
    """``table`` (``[rows, blocks]``) in kernel blocks, as the GPU runner writes it
    (``BlockTables.append_block_ids``: cache block ``b`` is kernel blocks ``b * per_block +
    k``, ``k`` in ``0 .. per_block - 1``); the table itself when a kernel block is a
    cache block."""
    if per_block == 1:
        return table
    steps = torch.arange(per_block, dtype=table.dtype, device=table.device)
    expanded = table.unsqueeze(-1) * per_block + steps
    return expanded.reshape(table.shape[0], -1).contiguous()


class VllmSlotMappings:
    """A release's ``_compute_slot_mappings_kernel`` under the op's protocol (module
    docstring); ``name`` is what reports call it."""

    def __init__(
        self, kernel: object, name: str, caller_file: Path | None, version: str | None = None
    ) -> None:
        function = getattr(kernel, "fn", None)
        if function is None or not callable(kernel.__getitem__):  # type: ignore[attr-defined]
            raise AdapterError(f"{name}: {FUNCTION} is not a Triton kernel")
        self.parameters = tuple(inspect.signature(function).parameters)
        unknown = [p for p in self.parameters if p not in KNOWN]
        if unknown:
            raise AdapterError(
                f"{name}: {FUNCTION} takes {', '.join(unknown)}, which the slot-mapping "
                "adapter does not know how its caller fills"
            )
        self.caller: CallerRows | None = None
        if "num_tokens" in self.parameters:
            if caller_file is None or not caller_file.is_file():
                raise AdapterError(
                    f"{name}: {FUNCTION} takes num_tokens, and how many rows its caller "
                    f"passes is read from the caller ({CALLER_MEMBER}), which is not there"
                )
            self.caller = rows_the_caller_passes(source_of(caller_file), caller_file.name)
        kernel_file = Path(function.__code__.co_filename)
        tree = ast.parse(source_of(kernel_file))
        self.defined_at = defined_at(tree, kernel_file.name)
        self.blocks = blocks_the_caller_passes(tree, kernel_file.name, self.parameters)
        self.kernel = kernel
        self.name = name
        self.version = version  # a release's, whose callers ``kept_whole`` describes

    @property
    def askable(self) -> Askable:
        """What the property search may draw for this release (``not_applicable``)."""
        return Askable(
            dcp="cp_rank" in self.parameters,
            replicated="dcp_sharded" in self.parameters or self.never_replicated is None,
            without_blocks="dcp_sharded" in self.parameters,
            kernel_blocks=self.blocks.kind != CACHE_BLOCKS,
        )

    def not_applicable(self, inputs: SlotMappingInputs) -> str | None:
        """What the release's kernel cannot be asked for these inputs, because its caller
        never asks it (module docstring); None when it can run them."""
        if inputs.dcp_size > 1 and "cp_rank" not in self.parameters:
            return (
                f"{FUNCTION} of this release takes no DCP rank ({self.defined_at}): its GPU "
                "model runner has no context parallelism"
            )
        smaller = inputs.kernel_blocks != inputs.block_sizes
        if smaller and self.blocks.kind == CACHE_BLOCKS:
            return (
                f"{FUNCTION} of this release is given no kernel block size: its runner's "
                f"block tables are in cache blocks ({self.blocks.evidence})"
            )
        replicated = inputs.dcp_size > 1 and not all(inputs.sharded)
        if replicated and "dcp_sharded" not in self.parameters and self.never_replicated:
            return self.never_replicated
        if bool((inputs.idx_mapping < 0).any()) and "dcp_sharded" not in self.parameters:
            return (
                f"{FUNCTION} of this release reads every request's block-table row "
                f"({self.defined_at}, no sharded flags): its runner gives every request one "
                "(a request without blocks, idx_mapping -1, first reaches the kernel in 0.31.0)"
            )
        return None

    @property
    def never_replicated(self) -> str | None:
        """Why this release's runner never hands the kernel a replicated group whose slots
        are read, with the lines (``kept_whole``); None for a kernel with no release's
        callers or a release the facts do not cover."""
        refused = declared(SLIDING_WINDOW_REFUSED, self.version)
        shards = declared(MANAGER_SHARDS, self.version)
        others = declared(OTHER_GROUPS_SHARDED, self.version)
        unread = declared(RECURRENT_SLOTS_UNREAD, self.version)
        if refused is None or (shards is None and (others is None or unread is None)):
            return None
        if shards is not None:
            groups = (
                "the KV cache manager shards every group, a recurrent state's included "
                f"(single_type_kv_cache_manager.py:{shards}: the block size times the DCP size)"
            )
        else:
            groups = (
                "the KV cache manager shards every group but a recurrent state's "
                f"(single_type_kv_cache_manager.py:{others}), whose reader never takes its "
                f"slots (mamba_attn.py:{unread}: update_block_table leaves slot_mapping unread)"
            )
        return (
            f"{FUNCTION} of this release shards every group it is handed ({self.defined_at}, "
            f"no sharded flags), and its runner hands it no replicated group whose slots are "
            f"read: {groups}; a sliding-window group is refused at start-up under DCP "
            f"(kv_cache_interface.py:{refused})"
        )

    def __call__(self, inputs: SlotMappingInputs, slot_mappings: torch.Tensor) -> None:
        groups, max_num_tokens = slot_mappings.shape
        device = slot_mappings.device
        tables = inputs.block_tables
        if "idx_mapping" not in self.parameters:
            # the caller hands the tables gathered by request: row i is request i's
            tables = tables[:, inputs.idx_mapping.long()].contiguous()
        per_group = [
            in_kernel_blocks(tables[group], size // kernel)
            for group, (size, kernel) in enumerate(
                zip(inputs.block_sizes, inputs.kernel_blocks, strict=True)
            )
        ]
        scheduled = int(inputs.query_start_loc[-1])
        assert self.caller is not None or "num_tokens" not in self.parameters
        values = {
            "num_tokens": max_num_tokens if self.caller and self.caller.padded else scheduled,
            "max_num_tokens": max_num_tokens,
            "cu_num_tokens": inputs.query_start_loc,
            "query_start_loc": inputs.query_start_loc,
            "idx_mapping": inputs.idx_mapping,
            "pos": inputs.positions,
            "block_table_ptrs": torch.tensor(
                [t.data_ptr() for t in per_group], dtype=torch.uint64, device=device
            ),
            "block_table_strides": torch.tensor(
                [t.stride(0) for t in per_group], dtype=torch.int64, device=device
            ),
            "page_sizes": torch.tensor(inputs.block_sizes, dtype=torch.int32, device=device),
            "slot_mapping_enabled": torch.ones(groups, dtype=torch.bool, device=device),
            "dcp_sharded": torch.tensor(inputs.sharded, dtype=torch.bool, device=device),
            "slot_mappings_ptr": slot_mappings,
            "slot_mappings_stride": slot_mappings.stride(0),
            "cp_rank": inputs.dcp_rank,
            "CP_SIZE": inputs.dcp_size,
            "CP_INTERLEAVE": inputs.interleave,
            "PAD_ID": PAD_SLOT,
            "BLOCK_SIZE": CALLER_BLOCK,
            "TRITON_BLOCK_SIZE": CALLER_BLOCK,
        }
        values["kernel_block_sizes"] = torch.tensor(
            inputs.kernel_blocks, dtype=torch.int32, device=device
        )
        # the block sizes the caller's BlockTables hands the kernel (blocks_the_caller_passes)
        given = "kernel_block_sizes" if self.blocks.kind == KERNEL_BLOCKS_AS_SIZES else "page_sizes"
        values["block_sizes"] = values[given]
        arguments = [values[name] for name in self.parameters]
        self.kernel[(groups, inputs.num_requests + 1)](*arguments)  # type: ignore[index]
        # the tables stay alive until here: the kernel reads them by address
        del per_group, tables


def beside(kernel_file: Path) -> Path:
    """Where a vLLM checkout keeps the caller of the kernel in ``kernel_file``."""
    return kernel_file.with_name(Path(CALLER_MEMBER).name)


SEQ_LENS_BLOCK = 128
"""The requests per program ``prepare_dcp_local_seq_lens`` launches the kernel with."""

SEQ_LENS_PARAMETERS = (
    "out_ptr",
    "seq_lens_ptr",
    "dcp_size",
    "dcp_rank",
    "cp_interleave",
    "num_reqs",
    "max_num_reqs",
    "BLOCK_SIZE",
)
"""``_dcp_local_seq_lens_kernel``'s parameters in every release that has it."""

PADDING_BY_CALLER = (
    f"{SEQ_LENS_FUNCTION} returns the requests' lengths only; its callers fill the padded "
    "requests' entries themselves"
)

BUILDER_PADDING = (
    "the MLA builder rewrites its decode requests' lengths only ({where}); padded requests "
    "are not among them"
)


def torch_function(path: Path, name: str, where: str) -> Callable[..., torch.Tensor]:
    """The function ``name`` of the file at ``path``, compiled alone with ``torch`` as its
    only global (module docstring; ``loading.definitions_alone``); ``AdapterError`` when
    the file has no such function or it needs anything else."""
    return definitions_alone(path, name, {"torch": torch}, where)[name]  # type: ignore[return-value]


@dataclass(frozen=True)
class VllmLocalSeqLens:
    """A release's local-sequence-length routine under the op's protocol (module
    docstring): its Triton kernel (``of_kernel``), its torch function (``of_function``), or
    the MLA builder's statement before the function (``of_builder``,
    ``dcpcheck.ops.slot_mapping.vllm_mla``). ``skips``: checks that do not apply to it, with
    the reason; ``unasked``: what its release never asks it (``not_applicable``);
    ``every_rank``: the function asked for every rank at once, where a caller of its
    release asks it so (:meth:`asks`)."""

    routine: object
    name: str
    is_kernel: bool
    skips: dict[str, str] = field(default_factory=dict)
    unasked: Callable[[LocalSeqLensInputs], str | None] | None = None
    every_rank: EveryRankAsk | None = None

    @classmethod
    def of_kernel(cls, kernel: object, name: str) -> VllmLocalSeqLens:
        function = getattr(kernel, "fn", None)
        parameters = tuple(inspect.signature(function).parameters) if function else ()
        if parameters != SEQ_LENS_PARAMETERS:
            raise AdapterError(
                f"{name}: {SEQ_LENS_KERNEL} takes ({', '.join(parameters)}), not the "
                f"({', '.join(SEQ_LENS_PARAMETERS)}) the adapter knows how its caller fills"
            )
        return cls(kernel, name, True)

    @classmethod
    def of_function(
        cls, function: object, name: str, callers: EveryRankCallers | None = None
    ) -> VllmLocalSeqLens:
        """The torch function, asked for one rank and, where ``callers`` has a call, for
        every rank at once."""
        every_rank = EveryRankAsk(function, callers) if callers else None  # type: ignore[arg-type]
        skips = {"seq_lens_padding": PADDING_BY_CALLER}
        return cls(function, name, False, skips, every_rank=every_rank)

    @classmethod
    def of_builder(cls, builder: BuilderLengths, name: str) -> VllmLocalSeqLens:
        skips = {"seq_lens_padding": BUILDER_PADDING.format(where=builder.evidence)}
        return cls(builder, name, False, skips, builder.not_applicable)

    @property
    def asks(self) -> tuple[tuple[str, LocalSeqLensKernel], ...]:
        """Each way its release's callers ask it, with a label its findings carry: one,
        unlabelled, or the function for one rank and for every rank at once."""
        if self.every_rank is None:
            return (("", self),)
        return (("asked for one rank", self), (self.every_rank.label, self.every_rank))

    def not_applicable(self, inputs: LocalSeqLensInputs) -> str | None:
        """The runner's kernel is launched only under DCP (its caller returns, or asserts,
        at DCP1); the function is called at any size; the builder's statement as its
        release asks it (``unasked``)."""
        if self.is_kernel and inputs.dcp_size == 1:
            return (
                f"{SEQ_LENS_KERNEL} runs only under DCP: its caller, "
                "prepare_dcp_local_seq_lens, does not launch it at DCP1"
            )
        return self.unasked(inputs) if self.unasked else None

    def __call__(self, inputs: LocalSeqLensInputs, local_seq_lens: torch.Tensor) -> None:
        if self.is_kernel:
            max_num_reqs = local_seq_lens.shape[0]
            grid = (-(-max_num_reqs // SEQ_LENS_BLOCK),)
            self.routine[grid](  # type: ignore[index]
                local_seq_lens,
                inputs.seq_lens,
                inputs.dcp_size,
                inputs.dcp_rank,
                inputs.interleave,
                inputs.num_reqs,
                max_num_reqs,
                SEQ_LENS_BLOCK,
            )
            return
        lengths = inputs.seq_lens[: inputs.num_reqs].cpu()  # the runners pass CPU lengths
        call = self.routine  # positional, as the runners call it
        computed = call(lengths, inputs.dcp_size, inputs.dcp_rank, inputs.interleave)  # type: ignore[operator]
        local_seq_lens[: inputs.num_reqs] = computed.to(local_seq_lens.device)


ALONE = {
    SEQ_LENS_FUNCTION: SEQ_LENS_FUNCTION_MEMBER,
    SEQ_LENS_KERNEL: SEQ_LENS_KERNEL_MEMBER,
    V1_FUNCTION: V1_MEMBER,
}
"""The routines a spec names alone (``vllm==X:NAME``), by the wheel member each is in."""


def members_of(function: str, named: bool) -> tuple[str, ...]:
    """The wheel members a release spec of the op judges (``vllm==X`` or ``vllm==X:NAME``),
    those its wheel lacks among them; the V1 table's with its runner, which says the
    interleave it is built with; ``vllm==X``, every routine's but the local-length file's,
    which the release says (``kernels.lengths_member``)."""
    if function == V1_FUNCTION:
        return (V1_MEMBER, V1_RUNNER_MEMBER)
    if function in ALONE:
        return (ALONE[function],)
    if named:
        return (MEMBER, CALLER_MEMBER)
    return (MEMBER, CALLER_MEMBER, SEQ_LENS_KERNEL_MEMBER, V1_MEMBER, V1_RUNNER_MEMBER)
