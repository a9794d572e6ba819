"""Wrong merges, each the project's with one bug a DCP deployment has had or could have,
for the checks to be shown catching. Each wraps the merge from outside (what it is asked,
or what it returns), so the kernel a reader studies holds no code that is not the kernel."""

from __future__ import annotations

from dataclasses import replace

from dcpcheck.ops.lse_combine.contract import CombineInputs, Merged
from dcpcheck.ops.lse_combine.kernel import combine


def base_ignored(inputs: CombineInputs) -> Merged:
    """Base-2 LSEs merged as natural ones: weights ``exp`` of what ``exp2`` was owed."""
    return combine(replace(inputs, base_e=True))


def lengths_ignored(inputs: CombineInputs) -> Merged:
    """Empty shards not masked by the local lengths: a shard that left an LSE of 0 weighs
    like a real one."""
    return combine(replace(inputs, seq_lens=None, query_start_loc=None))


class _WrongRank:
    """A group that tells its rank as ``rank_in_group + 1`` and is otherwise the group."""

    def __init__(self, group) -> None:
        self._group = group
        self.world_size = group.world_size
        self.rank_in_group = (group.rank_in_group + 1) % group.world_size

    def __getattr__(self, name: str):
        return getattr(self._group, name)


def own_lse_of_next_rank(inputs: CombineInputs) -> Merged:
    """Each rank's partial weighed by the next rank's LSE."""
    merged = combine(replace(inputs, group=_WrongRank(inputs.group), return_lse=False))
    if not inputs.return_lse:
        return merged
    return Merged(merged.out, combine(inputs).lse)


def lse_in_output_dtype(inputs: CombineInputs) -> Merged:
    """The partial LSEs rounded to the output's dtype before the merge (an LSE buffer
    allocated like the query): a bf16 LSE of 100 is off by up to 0.25."""
    lse = inputs.partial_lse.to(inputs.partial_out.dtype).to(inputs.partial_lse.dtype)
    return combine(replace(inputs, partial_lse=lse))


def lse_of_first_heads(inputs: CombineInputs) -> Merged:
    """The merged LSE of rank 0's heads returned on every rank."""
    merged = combine(inputs)
    if merged.lse is None:
        return merged
    lses = inputs.group.all_gather(merged.lse, dim=1)
    return Merged(merged.out, lses[:, : inputs.heads_per_rank].contiguous())


def all_reduced(inputs: CombineInputs) -> Merged:
    """Every head of the merge on every rank (an all-reduce where the reduce-scatter by
    heads belongs): the rank's output has ``N`` times the heads it is owed."""
    merged = combine(inputs)
    return Merged(inputs.group.all_gather(merged.out, dim=1), merged.lse)


MUTANTS = (
    base_ignored,
    lengths_ignored,
    own_lse_of_next_rank,
    lse_in_output_dtype,
    lse_of_first_heads,
    all_reduced,
)
