"""The slot-mapping op's stage in the tiny model's decode path (``dcpcheck.ops.decode_stages``):
each rank's slot of every new token (-1 where another rank stores it) and each request's
length on the rank, on the chain's one sharded cache group.

A release's routines are the ones its default model runner uses (the V1 runner's
``BlockTable``; the GPU model runner's kernels where it has no V1 table) and its
attention backends' ``get_dcp_local_seq_lens``; what a release lacks is the project's,
with a note.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dcpcheck.kernels import releases
from dcpcheck.kernels.loading import JudgedFile, KernelLoadError, KernelSpecError
from dcpcheck.ops.decode_stages import (
    SLOT_MAPPING,
    SlotMappingStage,
    SlotStep,
    Stage,
    refuse_what_it_cannot_run,
)
from dcpcheck.ops.slot_mapping.contract import (
    PAD_SLOT,
    EachRoutine,
    LocalSeqLensInputs,
    Routines,
    SlotMappingInputs,
)


def _registry():
    from dcpcheck.ops.slot_mapping import kernels  # Triton kernels: once the backend is chosen

    return kernels.REGISTRY


def load(spec: str) -> Stage:
    """The routines ``spec`` names; ``KernelSpecError`` unless it has both, as the chain
    runs both. A release named whole whose routines of a kind are several
    (``EachRoutine``) is the routines of its default model runner (:func:`release`): a
    decode step runs one of each."""
    routines = _registry().load(spec)
    if routines.slot_mappings is None or routines.local_seq_lens is None:
        raise KernelSpecError(
            f"--stage {SLOT_MAPPING}={spec}: the chain needs both the slot mappings and the "
            f"local lengths ({routines.absent})"
        )
    several = (routines.slot_mappings, routines.local_seq_lens)
    named = releases.parse_spec(spec)
    if named is not None and any(isinstance(r, EachRoutine) for r in several):
        return release(named.version)
    return Stage(SLOT_MAPPING, spec, routines)


def _first(candidates: list[str], what: Callable[[Routines], Any]) -> tuple[str, Any] | None:
    """The first of ``candidates`` that loads and has ``what`` of it; None if none does. A
    spec that is wrong in itself (``KernelSpecError``) is raised, never skipped."""
    for spec in candidates:
        try:
            loaded = _registry().load(spec)
        except KernelSpecError:
            raise
        except KernelLoadError:
            continue
        if what(loaded) is not None:
            return spec, what(loaded)
    return None


def release(version: str) -> Stage:
    """Release ``version``'s slot mappings and local lengths (module docstring)."""
    name = f"vllm=={version}"
    slots = _first([f"{name}:compute_slot_mapping", name], lambda r: r.slot_mappings)
    lengths = _first([f"{name}:get_dcp_local_seq_lens", name], lambda r: r.local_seq_lens)
    project = _registry().load("default")
    notes = []
    if slots is None:
        notes.append(f"{name} has no slot-mapping routine: the project's")
        slots = ("default", project.slot_mappings)
    if lengths is None:
        notes.append(f"{name} has no local-length routine: the project's")
        lengths = ("default", project.local_seq_lens)
    spec = slots[0] if slots[0] == lengths[0] else f"{slots[0]} + {lengths[0]}"
    return Stage(SLOT_MAPPING, spec, Routines(slots[1], lengths[1]), "; ".join(notes))


def files(spec: str) -> tuple[JudgedFile, ...]:
    """The files the routines of ``spec`` (one spec, or a release's two joined by ``+``)
    come from."""
    found: dict[str, JudgedFile] = {}
    for part in spec.split(" + "):
        found.update((f.path, f) for f in _registry().judged_files(part))
    return tuple(found.values())


def rank_slots(routines: Routines, step: SlotStep) -> tuple[torch.Tensor, torch.Tensor]:
    """Every rank's slot mapping ``[N, T]`` (int64) and local lengths ``[N, R]`` (int32)
    of ``step``, as ``routines`` compute them. At DCP1 the local lengths are the lengths:
    every release rewrites them under DCP only (0.10.2's MLA builder inside ``if
    dcp_world_size > 1``)."""
    positions, lengths, new = step.positions, step.lengths, step.new
    device = positions.device
    starts = torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()], dtype=torch.int32)
    slots, local = [], []
    for rank in range(step.dcp_size):
        inputs = SlotMappingInputs(
            query_start_loc=starts.to(device),
            positions=positions,
            idx_mapping=torch.arange(len(new), dtype=torch.int32, device=device),
            block_tables=step.block_table[None].to(device),
            block_sizes=(step.block_size,),
            sharded=(True,),
            dcp_size=step.dcp_size,
            dcp_rank=rank,
            interleave=step.interleave,
        )
        refuse_what_it_cannot_run(SLOT_MAPPING, routines.slot_mappings, inputs)
        out = torch.full((1, positions.shape[0]), PAD_SLOT - 1, dtype=torch.int64, device=device)
        routines.slot_mappings(inputs, out)
        slots.append(out[0])
        if step.dcp_size == 1:  # every release rewrites the lengths under DCP only
            local.append(torch.tensor(lengths, dtype=torch.int32, device=device))
            continue
        seq_lens = LocalSeqLensInputs(
            seq_lens=torch.tensor(lengths, dtype=torch.int32, device=device),
            num_reqs=len(lengths),
            dcp_size=step.dcp_size,
            dcp_rank=rank,
            interleave=step.interleave,
        )
        refuse_what_it_cannot_run(SLOT_MAPPING, routines.local_seq_lens, seq_lens)
        lens = torch.full((len(lengths),), -1, dtype=torch.int32, device=device)
        routines.local_seq_lens(seq_lens, lens)
        local.append(lens)
    return torch.stack(slots), torch.stack(local)


STAGES = {
    SLOT_MAPPING: SlotMappingStage(load=load, release=release, files=files, rank_slots=rank_slots)
}
"""The stage the op plays, by name (``dcpcheck.op_registry.DECODE_CHAIN``)."""
