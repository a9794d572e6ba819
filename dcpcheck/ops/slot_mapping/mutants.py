"""Wrong slot-mapping kernels, each the project's kernel with one bug that a DCP
deployment has had or could have, for the checks to be shown catching (``checks``). Each
wraps the kernel from outside (what it is asked, or what it leaves), so the kernel a
reader studies holds no code that is not the kernel."""

from __future__ import annotations

from dataclasses import replace

import torch

from dcpcheck.ops.slot_mapping.contract import SlotMappingInputs
from dcpcheck.ops.slot_mapping.kernel import compute_slot_mappings


def dcp_ignored(inputs: SlotMappingInputs, out: torch.Tensor) -> None:
    """The mapping without DCP under DCP: every rank writes every token's global slot."""
    compute_slot_mappings(replace(inputs, dcp_size=1, dcp_rank=0), out)


def interleave_ignored(inputs: SlotMappingInputs, out: torch.Tensor) -> None:
    """Tokens dealt to the ranks one at a time whatever the interleave."""
    compute_slot_mappings(replace(inputs, interleave=1), out)


def rank_shifted(inputs: SlotMappingInputs, out: torch.Tensor) -> None:
    """Each rank computes the next rank's share: still a partition, the wrong one."""
    compute_slot_mappings(replace(inputs, dcp_rank=(inputs.dcp_rank + 1) % inputs.dcp_size), out)


def replicated_as_sharded(inputs: SlotMappingInputs, out: torch.Tensor) -> None:
    """Every cache group sharded, a replicated one (an indexer's) included."""
    compute_slot_mappings(replace(inputs, sharded=(True,) * len(inputs.sharded)), out)


def padding_left_alone(inputs: SlotMappingInputs, out: torch.Tensor) -> None:
    """The padding rows not written (a CUDA graph then replays the last step's slots)."""
    first_padding = int(inputs.query_start_loc[-1])
    kept = out[:, first_padding:].clone()
    compute_slot_mappings(inputs, out)
    out[:, first_padding:] = kept


def one_row_past_the_end(inputs: SlotMappingInputs, out: torch.Tensor) -> None:
    """The padding loop bounded by the buffer's capacity plus one, not its row count."""
    groups, rows = out.shape
    compute_slot_mappings(inputs, torch.as_strided(out, (groups, rows + 1), out.stride()))


MUTANTS = (
    dcp_ignored,
    interleave_ignored,
    rank_shifted,
    replicated_as_sharded,
    padding_left_alone,
    one_row_past_the_end,
)
