"""The tiny model's DCP decode path as a chain of the ops' kernels.

A decode step under DCP runs, on every rank, a kernel of each op in turn:

1. ``slot-mapping``: the rank's slot of each new token (``-1`` where another rank stores
   it) and each request's length on the rank;
2. ``fused-norm-rope``: the new token's cache entry, written at its owner's slot;
3. the decode attention (``lse-combine``'s producer): the rank's attention in MLA's latent
   space over its first local-length tokens, read through the block table;
4. ``lse-combine``'s merge: the ranks' partials combined by their LSE, each rank keeping
   its share of the heads; the model, which runs every head on every rank (it has no
   tensor parallelism), all-gathers them back, where vLLM's output projection takes the
   rank's heads only.

A wrong kernel anywhere in the chain changes the DCPn token streams and not the DCP1 ones
(which need no merge, and where every slot is the rank's own), so ``dcpcheck hash --dcp
1,4`` sees it.

:class:`Stages` holds the kernels of stages 1, 3 and 4, each with the spec it came from;
the fused op's kernel is the one under test (``--kernel``). :func:`stages_for` resolves
them: for a release (``--kernel vllm==X``) every stage the release has, from it, called as
that release's own model runner and MLA backend call them; for any other kernel the
project's own; ``--stage NAME=SPEC`` names one stage's kernel by that stage's op's specs.
What a release lacks is the project's, and :meth:`Stages.describe` says so.

A release whose MLA layer offers two merges (``merge_paths``: the all-gather and
reduce-scatter, its default, and the all-to-all) has both: ``Stages.merge`` is the
default's, ``Stages.other_merges`` the other's, and :meth:`Stages.by_merge` gives the chain
of each, which the streams judge one by one (``token_streams.compare_paths``).

Prefill steps (chunks longer than a token) keep the model's own attention
(``mla_model``): DCP's merge is a decode path in vLLM.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from dcpcheck.cases.collectives import Group
from dcpcheck.e2e import merge_paths
from dcpcheck.e2e.mla_model import CacheSpec, DcpStep, LayerWeights, MlaModel, ShardExchange
from dcpcheck.kernels import loading, releases
from dcpcheck.kernels.loading import KernelLoadError, KernelSpecError
from dcpcheck.op_registry import FUSED_NORM_ROPE, OPS
from dcpcheck.ops import package
from dcpcheck.ops.lse_combine.contract import (
    AttentionInputs,
    CombineInputs,
    CombineKernel,
    DecodeAttention,
)
from dcpcheck.ops.slot_mapping.contract import (
    PAD_SLOT,
    LocalSeqLensInputs,
    Routines,
    SlotMappingInputs,
)

FUSED, SLOT_MAPPING, ATTENTION, MERGE = "fused-norm-rope", "slot-mapping", "attention", "merge"
STAGE_NAMES = (SLOT_MAPPING, ATTENTION, MERGE)
"""The stages ``--stage NAME=SPEC`` may name (the fused op's kernel is ``--kernel``)."""


class ChainError(RuntimeError):
    """A stage's kernel cannot run a step of the chain (one line: the stage and why)."""


def check_heads_shared(heads: int, dcp_size: int) -> None:
    """``ChainError`` unless ``dcp_size`` ranks can share the model's ``heads``: the
    merge's reduce-scatter gives each rank an equal share of them."""
    if heads % dcp_size:
        raise ChainError(
            f"merge: the reduce-scatter shares the model's {heads} heads among the ranks; "
            f"DCP {dcp_size} does not divide them"
        )


@dataclass(frozen=True)
class Stage:
    """One stage's kernel and where it came from."""

    name: str
    spec: str
    kernel: Any
    note: str = ""  # why this spec, where it is not the one asked for
    path: str = ""  # a release's merge: its path (``merge_paths``)
    default: bool = False  # a release's merge: the path the release runs by default

    def describe(self) -> str:
        label = self.name
        if self.path:
            label += f" {self.path}" + (" (the release's default)" if self.default else "")
        return f"{label}: {self.spec}" + (f" ({self.note})" if self.note else "")


@dataclass(frozen=True)
class Stages:
    """The kernels of the chain besides the fused op's (module docstring)."""

    slot_mapping: Stage  # a slot-mapping op's Routines, both routines present
    attention: Stage  # a DecodeAttention
    merge: Stage  # a CombineKernel: the release's default path where it offers more
    other_merges: tuple[Stage, ...] = ()  # the release's other merge paths

    def describe(self) -> list[str]:
        stages = (self.slot_mapping, self.attention, self.merge, *self.other_merges)
        return [stage.describe() for stage in stages]

    def by_merge(self) -> tuple[Stages, ...]:
        """The chain of each merge path, the default's first (module docstring)."""
        others = (replace(self, merge=merge, other_merges=()) for merge in self.other_merges)
        return (replace(self, other_merges=()), *others)

    @property
    def routines(self) -> Routines:
        return self.slot_mapping.kernel

    @property
    def attend_kernel(self) -> DecodeAttention:
        return self.attention.kernel

    @property
    def merge_kernel(self) -> CombineKernel:
        return self.merge.kernel

    def attend(
        self,
        model: MlaModel,
        layer: LayerWeights,
        step: DcpStep,
        queries: Sequence[torch.Tensor],
        caches: Sequence[torch.Tensor],
        spec: CacheSpec,
        exchange: ShardExchange,
    ) -> list[torch.Tensor]:
        """Each local rank's attention output ``[T, H, v]`` of a step of decodes, through
        the attention and the merge (module docstring; ``mla_model.DecodeChain``)."""
        if step.block_table is None or step.local_seq_lens is None:
            raise ChainError("a decode step without the chain's block table and lengths")
        check_heads_shared(queries[0].shape[1], step.dcp_size)
        ranks = exchange.local_ranks
        kv_lora = model.preset.kv_lora_rank
        device = queries[0].device
        table = step.block_table.to(device)
        partials = []
        for j, rank in enumerate(ranks):
            inputs = AttentionInputs(
                q=latent_queries(model, layer, queries[j]),
                kv_cache=latent_cache(model, caches[j], spec),
                kv_lora_rank=kv_lora,
                block_table=table,
                seq_lens=step.local_seq_lens[rank].to(device),
                scale=model.softmax_scale,
            )
            partials.append(self.attend_kernel(inputs))
        rows = queries[0].shape[0]
        query_start_loc = torch.arange(rows + 1, dtype=torch.int32, device=device)

        def merged(group: Group, j: int) -> torch.Tensor:
            out, lse = partials[j]
            if group.world_size == 1:  # vLLM's MLA layer merges only under DCP
                return out.float()
            heads = self.merge_kernel(
                CombineInputs(
                    partial_out=out,
                    partial_lse=lse,
                    group=group,
                    base_e=True,
                    return_lse=False,
                    seq_lens=step.local_seq_lens[ranks[j]].to(device),
                    query_start_loc=query_start_loc,
                )
            )
            return group.all_gather(heads.out.float(), dim=1)

        return [latent_values(model, layer, latent) for latent in exchange.run_group(merged)]


def _lse_combine_kernels():
    from dcpcheck.ops.lse_combine import kernels

    return kernels


def _first(
    candidates: list[str], load: Callable[[str], Any], what: Callable[[Any], Any]
) -> tuple[str, Any] | None:
    """The first of ``candidates`` that loads and has ``what`` of it; None if none does. A
    spec that is wrong in itself (``KernelSpecError``) is raised, never skipped."""
    for spec in candidates:
        try:
            loaded = load(spec)
        except KernelSpecError:
            raise
        except KernelLoadError:
            continue
        if what(loaded) is not None:
            return spec, what(loaded)
    return None


def _release_slot_mapping(version: str) -> Stage:
    """A release's slot mappings and local lengths, as its default model runner (the V1
    runner: its ``BlockTable``; the GPU model runner's kernels where it has no V1 table)
    and its attention backends (``get_dcp_local_seq_lens``) compute them."""
    load = package(SLOT_MAPPING).kernel
    name = f"vllm=={version}"
    slots = _first([f"{name}:compute_slot_mapping", name], load, lambda r: r.slot_mappings)
    lengths = _first([f"{name}:get_dcp_local_seq_lens", name], load, lambda r: r.local_seq_lens)
    project = load("default")
    notes = []
    if slots is None:
        notes.append(f"{name} has no slot-mapping routine: the project's")
        slots = ("default", project.slot_mappings)
    if lengths is None:
        notes.append(f"{name} has no local-length routine: the project's")
        lengths = ("default", project.local_seq_lens)
    spec = slots[0] if slots[0] == lengths[0] else f"{slots[0]} + {lengths[0]}"
    return Stage(SLOT_MAPPING, spec, Routines(slots[1], lengths[1]), "; ".join(notes))


def _release_stage(
    name: str, spec: str, load: Callable[[str], Any], path: str = "", default: bool = False
) -> Stage:
    try:
        return Stage(name, spec, load(spec), path=path, default=default)
    except KernelSpecError:
        raise
    except KernelLoadError as exc:
        return Stage(name, "default", load("default"), f"{spec}: {exc}", path, default)


def _release_merges(version: str) -> tuple[Stage, ...]:
    """Release ``version``'s merge on every path its MLA layer offers, the default's
    first (``merge_paths``)."""
    load = _lse_combine_kernels().REGISTRY.load
    return tuple(
        _release_stage(MERGE, merge_paths.spec_of(version, path), load, path, i == 0)
        for i, path in enumerate(merge_paths.offered(version))
    )


def _named_stage(name: str, spec: str) -> Stage:
    """Stage ``name``'s kernel by a spec of its op (``KernelLoadError`` with one line)."""
    if name == SLOT_MAPPING:
        routines = package(SLOT_MAPPING).kernel(spec)
        if routines.slot_mappings is None or routines.local_seq_lens is None:
            raise KernelSpecError(
                f"--stage {name}={spec}: the chain needs both the slot mappings and the "
                f"local lengths ({routines.absent})"
            )
        return Stage(name, spec, routines)
    kernels = _lse_combine_kernels()
    registry = kernels.ATTENTION_REGISTRY if name == ATTENTION else kernels.REGISTRY
    return Stage(name, spec, registry.load(spec))


def stages_for(kernel_spec: str, named: Mapping[str, str] | None = None) -> Stages:
    """The stages of the chain whose fused op's kernel is ``kernel_spec`` (module
    docstring); ``named`` maps stage names to specs of their ops. Call once the backend
    is chosen (the project's kernels are Triton kernels)."""
    named = dict(named or {})
    unknown = set(named) - set(STAGE_NAMES)
    if unknown:
        raise KernelSpecError(
            f"unknown stage {sorted(unknown)[0]!r} (known: {', '.join(STAGE_NAMES)})"
        )
    release = loading.release_of(kernel_spec)
    resolved: dict[str, Stage] = {}
    others: tuple[Stage, ...] = ()
    for name in STAGE_NAMES:
        if name in named:
            resolved[name] = _named_stage(name, named[name])
        elif release is None:
            resolved[name] = _named_stage(name, "default")
        elif name == SLOT_MAPPING:
            resolved[name] = _release_slot_mapping(release.version)
        elif name == ATTENTION:
            load = _lse_combine_kernels().ATTENTION_REGISTRY.load
            resolved[name] = _release_stage(name, f"vllm=={release.version}", load)
        else:
            resolved[name], *rest = _release_merges(release.version)
            others = tuple(rest)
    return Stages(resolved[SLOT_MAPPING], resolved[ATTENTION], resolved[MERGE], others)


def parse_stages(texts: Sequence[str]) -> dict[str, str]:
    """``--stage NAME=SPEC`` options as ``{name: spec}``; ``KernelSpecError`` (one line)
    for a malformed one, an unknown stage or a stage named twice."""
    named: dict[str, str] = {}
    for text in texts:
        name, equals, spec = text.partition("=")
        if not equals or not spec:
            raise KernelSpecError(f"--stage {text!r}: expected NAME=SPEC")
        if name not in STAGE_NAMES:
            raise KernelSpecError(
                f"--stage {text!r}: unknown stage {name!r} (known: {', '.join(STAGE_NAMES)})"
            )
        if name in named:
            raise KernelSpecError(f"--stage {name} given twice")
        named[name] = spec
    return named


def fused_stage(spec: str, adapter: str = "auto") -> Stage:
    """The fused op's kernel of a chain whose ``--kernel`` is ``spec`` (under ``adapter``):
    ``spec``'s, or, for a release whose wheel has no ``fused_norm_rope`` (before 0.25.0),
    the project's, with that note."""
    op = package(FUSED_NORM_ROPE)
    release = loading.release_of(spec)
    try:
        return Stage(FUSED, spec, op.kernel(spec, adapter))
    except KernelSpecError:
        raise
    except KernelLoadError:
        members = OPS[FUSED_NORM_ROPE].wheel_members
        if release is None or not all(releases.lacks(release.version, m) for m in members):
            raise
        note = f"{release.name} has no fused_norm_rope"
        return Stage(FUSED, "default", op.kernel("default"), note)


def default_stages() -> Stages:
    """The project's kernel at every stage."""
    return stages_for("default")


def stage_files(fused: Stage, stages: Stages) -> tuple[loading.JudgedFile, ...]:
    """The files every stage's kernel comes from, the fused op's first (each stage's op's
    ``judged_files``; a release's attention file), for the reports."""
    found = {f.path: f for f in package(FUSED_NORM_ROPE).judged_files(fused.spec)}
    slots, lse = package(SLOT_MAPPING), _lse_combine_kernels()
    for spec in stages.slot_mapping.spec.split(" + "):
        found.update((f.path, f) for f in slots.judged_files(spec))
    found.update((f.path, f) for f in lse.ATTENTION_REGISTRY.judged_files(stages.attention.spec))
    for merge in (stages.merge, *stages.other_merges):
        found.update((f.path, f) for f in lse.REGISTRY.judged_files(merge.spec))
    return tuple(found.values())


# -- the model in MLA's latent space ---------------------------------------------------


def latent_queries(model: MlaModel, layer: LayerWeights, queries: torch.Tensor) -> torch.Tensor:
    """``queries`` ``[T, H, nope + rope]`` in MLA's latent space, ``[T, H, kv_lora + rope]``
    in the activation dtype: each head's no-RoPE part absorbed into the latent
    (``q_nope @ W_uk[h]^T``), its RoPE part as it is. The scores are the model's own."""
    widths = model.widths
    k_up = layer.k_up.view(model.preset.kv_lora_rank, widths.heads, widths.nope_head_dim)
    absorbed = torch.einsum("thn,khn->thk", queries[..., : widths.nope_head_dim], k_up)
    latent = torch.cat([absorbed, queries[..., widths.nope_head_dim :]], dim=-1)
    return latent.to(model.dtype)


def latent_cache(model: MlaModel, cache: torch.Tensor, spec: CacheSpec) -> torch.Tensor:
    """Every entry of one rank's cache decoded, ``[blocks, block_size, kv_lora + rope]`` in
    the activation dtype: what a decode attention over the latent reads (a cache in an fp8
    layout is read dequantized)."""
    blocks, block_size, _ = cache.shape
    slots = torch.arange(blocks * block_size, device=cache.device)
    kv, kpe = model.read_cache(cache, slots, spec)
    latent = torch.cat([kv.float(), kpe.float()], dim=-1).to(model.dtype)
    return latent.view(blocks, block_size, -1)


def latent_values(model: MlaModel, layer: LayerWeights, latent: torch.Tensor) -> torch.Tensor:
    """A latent attention output ``[T, H, kv_lora]`` projected to each head's values,
    ``[T, H, v]`` (``@ W_uv[h]``)."""
    widths = model.widths
    v_up = layer.v_up.view(model.preset.kv_lora_rank, widths.heads, widths.v_head_dim)
    return torch.einsum("thk,khv->thv", latent.float(), v_up)


# -- stage 1: the slot mappings of one step -----------------------------------------------


def _refused(stage: str, kernel: Any, inputs: Any) -> None:
    ask = getattr(kernel, "not_applicable", None)
    why = ask(inputs) if callable(ask) else None
    if why is not None:
        raise ChainError(f"{stage}: {why}")


def rank_slots(
    routines: Routines,
    positions: torch.Tensor,
    lengths: list[int],
    new: list[int],
    block_table: torch.Tensor,
    block_size: int,
    dcp_size: int,
    interleave: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every rank's slot mapping ``[N, T]`` (int64) and local lengths ``[N, R]`` (int32)
    of one step, as the stage's routines compute them: ``positions`` ``[T]`` of the new
    tokens, each request's length and new tokens, the requests' block table ``[R, W]``
    (one cache group, sharded). At DCP1 the local lengths are the lengths: every release
    rewrites them under DCP only (0.10.2's MLA builder inside ``if dcp_world_size > 1``)."""
    device = positions.device
    starts = torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()], dtype=torch.int32)
    slots, local = [], []
    for rank in range(dcp_size):
        inputs = SlotMappingInputs(
            query_start_loc=starts.to(device),
            positions=positions,
            idx_mapping=torch.arange(len(new), dtype=torch.int32, device=device),
            block_tables=block_table[None].to(device),
            block_sizes=(block_size,),
            sharded=(True,),
            dcp_size=dcp_size,
            dcp_rank=rank,
            interleave=interleave,
        )
        _refused(SLOT_MAPPING, routines.slot_mappings, inputs)
        out = torch.full((1, positions.shape[0]), PAD_SLOT - 1, dtype=torch.int64, device=device)
        routines.slot_mappings(inputs, out)
        slots.append(out[0])
        if dcp_size == 1:  # every release rewrites the lengths under DCP only
            local.append(torch.tensor(lengths, dtype=torch.int32, device=device))
            continue
        seq_lens = LocalSeqLensInputs(
            seq_lens=torch.tensor(lengths, dtype=torch.int32, device=device),
            num_reqs=len(lengths),
            dcp_size=dcp_size,
            dcp_rank=rank,
            interleave=interleave,
        )
        _refused(SLOT_MAPPING, routines.local_seq_lens, seq_lens)
        lens = torch.full((len(lengths),), -1, dtype=torch.int32, device=device)
        routines.local_seq_lens(seq_lens, lens)
        local.append(lens)
    return torch.stack(slots), torch.stack(local)
