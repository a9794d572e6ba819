"""Wrong kernels of the op, each one of the project's with one bug that a DCP deployment
has had or could have, for the checks to be shown catching (``checks``, ``seq_lens``). Each
wraps the kernel from outside (what it is asked, or what it leaves), so the kernel a
reader studies holds no code that is not the kernel."""

from __future__ import annotations

from dataclasses import replace

import torch

from dcpcheck.ops.slot_mapping.contract import LocalSeqLensInputs, SlotMappingInputs
from dcpcheck.ops.slot_mapping.kernel import compute_local_seq_lens, compute_slot_mappings


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


def seq_lens_interleave_ignored(inputs: LocalSeqLensInputs, out: torch.Tensor) -> None:
    """Local lengths counted one position per rank in turn whatever the interleave."""
    compute_local_seq_lens(replace(inputs, interleave=1), out)


def seq_lens_padding_kept(inputs: LocalSeqLensInputs, out: torch.Tensor) -> None:
    """Padded requests' lengths computed from their stale input instead of set to 0."""
    compute_local_seq_lens(replace(inputs, num_reqs=inputs.max_num_reqs), out)


def seq_lens_global(inputs: LocalSeqLensInputs, out: torch.Tensor) -> None:
    """Every rank told the whole length: attention reads positions it does not store."""
    compute_local_seq_lens(replace(inputs, dcp_size=1, dcp_rank=0), out)


SEQ_LENS_MUTANTS = (seq_lens_interleave_ignored, seq_lens_padding_kept, seq_lens_global)
