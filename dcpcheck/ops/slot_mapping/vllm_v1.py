"""vLLM's V1 model runner's slot mappings as a routine of the op: ``BlockTable`` of
``vllm/v1/worker/block_table.py`` (every release from 0.10.2, where DCP first shipped),
built and asked as the runner builds and asks it (``--kernel vllm==X:compute_slot_mapping``).

The V1 runner keeps one ``BlockTable`` per cache group and rank. Its constructor asks the
DCP group for the rank (the stand-in answers with the rank being built,
``dcpcheck.adapters.shims.vllm.v1_runner``) and takes the group's block size, the table's
sizes and, from 0.11.1, the group's kernel block size (the table then maps each cache block
to its kernel blocks itself) and the interleave; every request's block ids go in with
``add_row``, at the request's row of the persistent batch, and ``compute_slot_mapping`` is
called as the runner calls it:
``(req_indices, positions)`` as numpy arrays up to 0.18.1, ``(num_reqs, query_start_loc,
positions)`` from 0.19.0, where it is a Triton kernel reading the table's device copy
(``commit_block_table`` first, as the runner does). The slots are read from the table's
own buffer, rows ``0 .. scheduled tokens``.

The interleave the table is built with is the runner's (:func:`rebuild_of`, read from
``vllm/v1/worker/gpu_model_runner.py``). The runner first builds its ``InputBatch`` (and
the tables in it) with the configured interleave, at one cache group of the configured
block size whose kernel block is the cache block; once it knows the cache groups it builds
the batch again (``may_reinitialize_input_batch``) when they are not that: more than one
group, or a kernel block smaller than the cache block. From 0.11.1 to 0.25.1 that rebuild
passes no interleave, so the tables take ``InputBatch``'s default, 1, while the runner
still computes the local sequence lengths, which the attention reads, at the configured
interleave (``get_dcp_local_seq_lens``): the slots and the lengths disagree (vLLM #45528;
0.26.0 on passes the interleave). Such a case is run as the runner runs it, the table at
interleave 1, and judged against the contract at the configured interleave; each failing
check's findings quote the runner's lines (:meth:`VllmV1SlotMappings.as_called`). A case of
one group is taken at the configured block size.

What the V1 routine is not asked, by its release's runner, is skipped with the reason:

* the rows after the scheduled tokens: the runner fills them with -1 itself
  (``slot_mapping[num_tokens:].fill_(-1)`` in every release), and so does the adapter, so
  ``padding`` is not the routine's to pass or fail;
* ``guard``: the table owns its slot buffer, so a write past the rows is not seen;
* a request that owns no blocks, or rows not in batch order (the persistent batch keeps
  request ``i`` at row ``i``), an interleave above 1 or a kernel block smaller than the
  cache's before 0.11.1 (no such setting): the case is not applicable;
* a replicated cache group under DCP (:meth:`VllmV1SlotMappings.replicated`): the table
  shards every group it is built for (its constructor asks the DCP group for the rank and
  size, whatever the group), and no V1 release asks it for a replicated group's slots. A
  sliding-window group, which DCP would shard, is refused at start-up in every release
  (``SlidingWindowSpec.max_memory_usage_bytes`` asserts DCP 1, taken for every group the
  engine plans; from 0.31.0 unless the spec is marked replicated, which nothing the V1
  runner builds is, a ring that reads no slots aside). Up to 0.25.1 the KV cache manager
  shards every other group, a recurrent state's and a chunked-local one included (each
  group's block size times the DCP size): there is no replicated group. From 0.26.0 the
  recurrent state is kept whole on every rank, and the runner builds its table to compute
  no slots (``SlotMappingMode.NONE``, read from the runner: :func:`slotless_of`). From
  0.32.0 a model may plan one more group kept whole, GLM-5-Next's kpool-tail ring, whose
  table computes slots; its metadata builder replaces them, mapping every token to the ring
  itself. The lines of the files the release cache does not hold (``kv_cache_interface.py``,
  ``single_type_kv_cache_manager.py``, ``attention/backends/mla/indexer.py``) are declared
  per release in ``dcpcheck.ops.slot_mapping.kept_whole``, read from the wheels.

0.29.0's kernel class derives from vLLM's JIT warm-up base (a stand-in: the launch is the
file's own); from 0.30.0 the class returns a launch specification that vLLM's
``kernel_launcher`` runs, whose code is not in the file: its stand-in
(``dcpcheck.adapters.shims.vllm.jit_warmup``) does what vLLM's does.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from dcpcheck.adapters.protocol import AdapterError
from dcpcheck.kernels.loading import source_of
from dcpcheck.ops.slot_mapping.contract import PAD_SLOT, SlotMappingInputs
from dcpcheck.ops.slot_mapping.kept_whole import (
    FLAGGED_WINDOWS,
    MANAGER_SHARDS,
    RING_REMAPPED,
    SLIDING_WINDOW_REFUSED,
    declared,
)
from dcpcheck.ops.slot_mapping.vllm import SEQ_LENS_FUNCTION, V1_FUNCTION, V1_RUNNER_MEMBER, Askable

INTERLEAVE_PARAMETERS = ("dcp_kv_cache_interleave_size", "cp_kv_cache_interleave_size")

REBUILD = "may_reinitialize_input_batch"
BATCH = "InputBatch"
REBUILT_ON = {"block_sizes", "kernel_block_sizes"}
"""What the runner's rebuild without the interleave compares with the configured one (module
docstring): the groups' block sizes and their kernel block sizes."""

SKIPS = {
    "padding": (
        "BlockTable.compute_slot_mapping writes the scheduled tokens' slots; the V1 "
        "runner fills the rows after them with -1 itself, as the adapter does"
    ),
    "guard": (
        "BlockTable keeps its slots in a buffer of its own, so a write past the case's "
        "rows is not seen"
    ),
}


@dataclass(frozen=True)
class Rebuild:
    """How the V1 runner builds its ``InputBatch`` again once it knows the cache groups
    (module docstring): with the configured interleave (``keeps_interleave``) or without;
    ``evidence`` quotes the lines that say, and where it computes the local lengths."""

    keeps_interleave: bool
    evidence: str


SLOT_MODE = "SlotMappingMode"


def _calls_named(tree: ast.AST, name: str) -> list[ast.Call]:
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] == name
    ]


def rebuild_of(source: str, where: str) -> Rebuild:
    """Read from the V1 runner's source (of the file ``where``) whether its rebuild of the
    ``InputBatch`` (``REBUILD``) passes the interleave, and when it does not, on what it
    rebuilds (``REBUILT_ON``) and with what interleave it computes the local lengths.
    ``AdapterError`` when the source does not say."""
    tree = ast.parse(source)
    functions = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.name == REBUILD
    ]
    calls = [call for function in functions for call in _calls_named(function, BATCH)]
    if len(calls) != 1:
        raise AdapterError(
            f"{where}: {len(calls)} {BATCH}(...) in {REBUILD}, not the one the adapter reads "
            "the interleave its block tables are rebuilt with from"
        )
    [call] = calls
    passed = [k for k in call.keywords if k.arg in INTERLEAVE_PARAMETERS]
    if passed:
        return Rebuild(True, f"{where}:{passed[0].lineno}: {BATCH}(..., {passed[0].arg}=...)")
    guards = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and any(inner is call for inner in ast.walk(node))
    ]
    test = guards[-1].test if guards else None  # the innermost: ast.walk goes outside in
    compared = {
        ast.unparse(node.left)
        for node in (ast.walk(test) if test else ())
        if isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.NotEq)
    }
    either = isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or)
    if test is None or not either or compared != REBUILT_ON:
        said = f"on {ast.unparse(test)}" if test else "always"
        raise AdapterError(
            f"{where}:{call.lineno}: the runner rebuilds its {BATCH} without the interleave "
            f"{said}, which the adapter does not know how to ask"
        )
    lengths = [
        call
        for call in _calls_named(tree, SEQ_LENS_FUNCTION)
        if len(call.args) == 4 and "interleave" in ast.unparse(call.args[3])
    ]
    if not lengths:
        raise AdapterError(
            f"{where}: no {SEQ_LENS_FUNCTION}(..., interleave) call to say which interleave "
            "the runner's local lengths take"
        )
    return Rebuild(
        False,
        f"{where}:{guards[-1].lineno}: if {ast.unparse(test)}; {where}:{call.lineno}: "
        f"{BATCH}(...) with no interleave; {where}:{lengths[0].lineno}: "
        f"{SEQ_LENS_FUNCTION}(..., {ast.unparse(lengths[0].args[3])})",
    )


def slotless_of(source: str, where: str) -> str | None:
    """``file:line: SlotMappingMode.NONE if <test>``: where the V1 runner's source (of the
    file ``where``) builds a cache group's table to compute no slots, and for which groups;
    None where it builds every table to compute them (before 0.26.0). ``AdapterError`` when
    it does so in more than one place or unguarded."""
    tree = ast.parse(source)
    marks = [
        call
        for call in _calls_named(tree, "append")
        if call.args and ast.unparse(call.args[0]) == f"{SLOT_MODE}.NONE"
    ]
    if not marks:
        return None
    guards = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.If)
        and any(
            inner is mark
            for mark in marks
            for statement in node.body
            for inner in ast.walk(statement)
        )
    ]
    if len(marks) != 1 or not guards:
        raise AdapterError(
            f"{where}: {len(marks)} tables built with {SLOT_MODE}.NONE, "
            f"{'guarded' if guards else 'unguarded'}: not the one place the adapter reads "
            "which cache groups the runner asks no slots from"
        )
    return f"{where}:{marks[0].lineno}: {SLOT_MODE}.NONE if {ast.unparse(guards[-1].test)}"


def _stand_in_groups():
    return importlib.import_module("dcpcheck.adapters.shims.vllm.v1_runner")


@dataclass
class VllmV1SlotMappings:
    """A release's V1 ``BlockTable`` under the op's slot-mapping protocol (module
    docstring)."""

    table_class: type
    name: str
    runner_file: Path | None
    version: str | None = None
    skips: dict[str, str] = field(default_factory=lambda: dict(SKIPS))

    def __post_init__(self) -> None:
        if not inspect.isclass(self.table_class) or not hasattr(self.table_class, V1_FUNCTION):
            raise AdapterError(f"{self.name}: BlockTable has no {V1_FUNCTION}")
        self.init_parameters = tuple(inspect.signature(self.table_class.__init__).parameters)
        method = getattr(self.table_class, V1_FUNCTION)
        self.call_parameters = tuple(inspect.signature(method).parameters)[1:]
        if self.call_parameters not in (
            ("req_indices", "positions"),
            ("num_reqs", "query_start_loc", "positions"),
        ):
            raise AdapterError(
                f"{self.name}: BlockTable.{V1_FUNCTION}({', '.join(self.call_parameters)}) is "
                "not a signature the adapter knows how the V1 runner calls"
            )
        self.rebuild: Rebuild | None = None
        self.slotless: str | None = None
        if self.runner_file is not None and self.runner_file.is_file():
            self.slotless = slotless_of(source_of(self.runner_file), self.runner_file.name)
        if self.interleave_parameter is not None:
            if self.runner_file is None or not self.runner_file.is_file():
                raise AdapterError(
                    f"{self.name}: BlockTable takes an interleave, and which one its runner "
                    f"builds it with is read from the runner ({V1_RUNNER_MEMBER}), which is "
                    "not there"
                )
            self.rebuild = rebuild_of(source_of(self.runner_file), self.runner_file.name)

    @property
    def interleave_parameter(self) -> str | None:
        found = [p for p in INTERLEAVE_PARAMETERS if p in self.init_parameters]
        return found[0] if found else None

    @property
    def askable(self) -> Askable:
        """What the property search may draw for this release (``not_applicable``)."""
        return Askable(
            dcp=True,
            replicated=False,
            without_blocks=False,
            interleave=bool(self.interleave_parameter),
            kernel_blocks="kernel_block_size" in self.init_parameters,
        )

    def not_applicable(self, inputs: SlotMappingInputs) -> str | None:
        """What the V1 runner never asks its table (module docstring), or None."""
        rows = inputs.idx_mapping.cpu()
        if not torch.equal(rows, torch.arange(rows.shape[0], dtype=rows.dtype)):
            return (
                "the V1 runner keeps request i at block-table row i and gives every "
                "request blocks (no request without blocks)"
            )
        if inputs.dcp_size > 1 and not all(inputs.sharded):
            return self.replicated
        if (
            inputs.kernel_blocks != inputs.block_sizes
            and "kernel_block_size" not in self.init_parameters
        ):
            return (
                "this release's V1 block table has no kernel block size (the cache's only: "
                f"{self.constructor})"
            )
        if inputs.interleave > 1 and self.interleave_parameter is None:
            return (
                "this release's V1 block table has no interleave setting (1 only: "
                f"{self.constructor})"
            )
        return None

    @property
    def replicated(self) -> str:
        """Why the V1 runner of this release never asks its table for a replicated group's
        slots under DCP, with the lines that show it (module docstring)."""
        refused = declared(SLIDING_WINDOW_REFUSED, self.version)
        shards = declared(MANAGER_SHARDS, self.version)
        if refused is None or (shards is None and self.slotless is None):
            raise AdapterError(
                f"{self.name}: which cache groups its vLLM keeps whole under DCP, and what "
                "its runner asks their tables, is declared for the releases 0.10.2 - 0.33.0 "
                "(SLIDING_WINDOW_REFUSED, MANAGER_SHARDS) and read from the runner, not for "
                f"{self.version}"
            )
        flagged = self.version in FLAGGED_WINDOWS
        spared = (
            " for a DCP-sharded spec, which every one the V1 runner plans is" if flagged else ""
        )
        window = (
            f"a sliding-window group is refused at start-up (kv_cache_interface.py:{refused}: "
            "SlidingWindowSpec.max_memory_usage_bytes asserts decode_context_parallel_size == 1"
            f"{spared})"
        )
        if self.slotless is None:
            return (
                "the V1 runner hands its block tables no replicated cache group under DCP: "
                f"its KV cache manager shards every group (single_type_kv_cache_manager.py:"
                f"{shards}: each group's block size times the DCP size, a recurrent state's "
                f"included) and {window}"
            )
        ring = declared(RING_REMAPPED, self.version)
        remapped = (
            ""
            if ring is None
            else (
                "; a self-addressed ring kept whole (CircularBufferSpec, dcp_sharded=False) "
                "has its table's slots replaced: its metadata builder maps every token to the "
                f"ring itself (indexer.py:{ring}: compute_kpool_tail_slot_mapping)"
            )
        )
        return (
            "the V1 runner asks its block tables no replicated cache group's slots under "
            "DCP: the group every rank keeps whole, a recurrent state's, computes none "
            f"({self.slotless}){remapped}; and {window}"
        )

    @property
    def constructor(self) -> str:
        """``file:line: BlockTable(parameters)``: the constructor that shows which settings
        the table takes, for the reasons of what it is never asked."""
        code = self.table_class.__init__.__code__
        parameters = ", ".join(p for p in self.init_parameters if p != "self")
        return f"{Path(code.co_filename).name}:{code.co_firstlineno}: BlockTable({parameters})"

    def built_interleave(self, inputs: SlotMappingInputs) -> int:
        """The interleave the runner builds the tables of ``inputs``' cache groups with
        (module docstring): 1 where its rebuild drops the configured one."""
        rebuilt = len(inputs.block_sizes) != 1 or inputs.kernel_blocks != inputs.block_sizes
        if rebuilt and self.rebuild is not None and not self.rebuild.keeps_interleave:
            return 1
        return inputs.interleave

    def as_called(self, inputs: SlotMappingInputs) -> str | None:
        """How the runner asks its table ``inputs`` other than as they are given, with the
        lines that say (module docstring); None when as given."""
        if self.built_interleave(inputs) == inputs.interleave:
            return None
        assert self.rebuild is not None
        return (
            f"the V1 runner rebuilds its block tables for these cache groups at interleave 1 "
            f"while its local lengths take interleave {inputs.interleave}: "
            f"{self.rebuild.evidence}"
        )

    def _table(self, inputs: SlotMappingInputs, group: int, max_num_tokens: int) -> object:
        """The release's ``BlockTable`` of ``group`` on this rank, every request's row
        added, as the runner builds it."""
        block_size = inputs.block_sizes[group]
        table = inputs.block_tables[group].cpu()
        arguments = {
            "block_size": block_size,
            "max_num_reqs": max(table.shape[0], 1),
            "max_num_blocks_per_req": table.shape[1],
            "max_num_batched_tokens": max_num_tokens,
            "pin_memory": False,
            "device": inputs.positions.device,
            "kernel_block_size": inputs.kernel_blocks[group],
        }
        if self.interleave_parameter is not None:
            arguments[self.interleave_parameter] = self.built_interleave(inputs)
        unknown = [
            p
            for p, spec in inspect.signature(self.table_class.__init__).parameters.items()
            if p != "self" and p not in arguments and spec.default is inspect.Parameter.empty
        ]
        if unknown:
            raise AdapterError(f"{self.name}: BlockTable takes {', '.join(unknown)}, unknown")
        chosen = {k: v for k, v in arguments.items() if k in self.init_parameters}
        with _stand_in_groups().as_rank(inputs.dcp_size, inputs.dcp_rank):
            built = self.table_class(**chosen)
        for row in range(inputs.num_requests):
            built.add_row(table[row].tolist(), row)  # type: ignore[attr-defined]
        return built

    def __call__(self, inputs: SlotMappingInputs, slot_mappings: torch.Tensor) -> None:
        groups, max_num_tokens = slot_mappings.shape
        starts = inputs.query_start_loc.cpu().to(torch.int64)
        scheduled = int(starts[-1])
        lengths = (starts[1:] - starts[:-1]).numpy()
        for group in range(groups):
            table = self._table(inputs, group, max_num_tokens)
            if self.call_parameters == ("req_indices", "positions"):
                req_indices = np.repeat(np.arange(inputs.num_requests), lengths)
                positions = inputs.positions[:scheduled].cpu().numpy()
                table.compute_slot_mapping(req_indices, positions)  # type: ignore[attr-defined]
                buffer = getattr(table, "slot_mapping_np", None)
                if buffer is None:
                    buffer = table.slot_mapping.np  # type: ignore[attr-defined]
                written = torch.from_numpy(np.asarray(buffer[:scheduled]).copy())
            else:
                table.commit_block_table(inputs.num_requests)  # type: ignore[attr-defined]
                qsl = inputs.query_start_loc[: inputs.num_requests + 1]
                table.compute_slot_mapping(  # type: ignore[attr-defined]
                    inputs.num_requests, qsl, inputs.positions[:scheduled]
                )
                written = table.slot_mapping.gpu[:scheduled].cpu()  # type: ignore[attr-defined]
            slot_mappings[group, :scheduled] = written.to(slot_mappings.device)
            slot_mappings[group, scheduled:] = PAD_SLOT  # the runner's own fill
