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

What the V1 routine is not asked, by its release's runner, is skipped with the reason:

* the rows after the scheduled tokens: the runner fills them with -1 itself
  (``slot_mapping[num_tokens:].fill_(-1)`` in every release), and so does the adapter, so
  ``padding`` is not the routine's to pass or fail;
* ``guard``: the table owns its slot buffer, so a write past the rows is not seen;
* a request that owns no blocks, or rows not in batch order (the persistent batch keeps
  request ``i`` at row ``i``), a replicated group under DCP (the V1 table shards every
  group), an interleave above 1 or a kernel block smaller than the cache's before 0.11.1
  (no such setting): the case is not applicable.

0.29.0's kernel class derives from vLLM's JIT warm-up base (a stand-in: the launch is the
file's own); from 0.30.0 the class returns a launch specification that vLLM's
``kernel_launcher`` runs, whose code is not in the file: its stand-in
(``dcpcheck.adapters.shims.vllm.jit_warmup``) does what vLLM's does.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field

import numpy as np
import torch

from dcpcheck.adapters.protocol import AdapterError
from dcpcheck.ops.slot_mapping.contract import PAD_SLOT, SlotMappingInputs
from dcpcheck.ops.slot_mapping.vllm import V1_FUNCTION, Askable

INTERLEAVE_PARAMETERS = ("dcp_kv_cache_interleave_size", "cp_kv_cache_interleave_size")

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


def _stand_in_groups():
    return importlib.import_module("dcpcheck.adapters.shims.vllm.v1_runner")


@dataclass
class VllmV1SlotMappings:
    """A release's V1 ``BlockTable`` under the op's slot-mapping protocol (module
    docstring)."""

    table_class: type
    name: str
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
            return "the V1 block table shards every cache group under DCP (no replicated group)"
        if (
            inputs.kernel_blocks != inputs.block_sizes
            and "kernel_block_size" not in self.init_parameters
        ):
            return "this release's V1 block table has no kernel block size (the cache's only)"
        if inputs.interleave > 1 and self.interleave_parameter is None:
            return "this release's V1 block table has no interleave setting (1 only)"
        return None

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
            arguments[self.interleave_parameter] = inputs.interleave
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
