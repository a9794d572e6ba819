"""The tiny model's DCP decode path as a chain of the ops' kernels.

A decode step under DCP runs, on every rank, a kernel of each stage in turn:

1. the slot mapping: the rank's slot of each new token (``-1`` where another rank stores
   it) and each request's length on the rank;
2. the cache write: the new token's cache entry, written at its owner's slot;
3. the decode attention: the rank's attention in MLA's latent space over its first
   local-length tokens, read through the block table;
4. the merge: the ranks' partials combined by their LSE, each rank keeping its share of
   the heads; the model, which runs every head on every rank (it has no tensor
   parallelism), all-gathers them back, where vLLM's output projection takes the rank's
   heads only.

``dcpcheck.op_registry.DECODE_CHAIN`` names the op that plays each stage, and the chain
reaches each through that op's ``decode_chain`` module (``dcpcheck.ops.decode_stages``),
never its contract. A wrong kernel anywhere in the chain changes the DCPn token streams
and not the DCP1 ones (which need no merge, and where every slot is the rank's own), so
``dcpcheck hash --dcp 1,4`` sees it.

:class:`Stages` holds the kernels of stages 1, 3 and 4, each with the spec it came from;
the cache write's kernel is the one under test (``--kernel``). :func:`stages_for`
resolves them: for a release (``--kernel vllm==X``) every stage the release has, from it,
called as that release's own model runner and MLA backend call them; for any other kernel
the project's own; ``--stage NAME=SPEC`` names one stage's kernel by that stage's op's
specs. What a release lacks is the project's, and :meth:`Stages.describe` says so.

A release whose MLA layer offers two merges (the all-gather and reduce-scatter, its
default, and the all-to-all) has both: ``Stages.merge`` is the default's,
``Stages.other_merges`` the other's, and :meth:`Stages.by_merge` gives the chain of each,
which the streams judge one by one (``token_streams.compare_paths``).

Prefill steps (chunks longer than a token) keep the model's own attention
(``mla_model``): DCP's merge is a decode path in vLLM.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import torch

from dcpcheck.cases.collectives import Group
from dcpcheck.e2e.mla_model import CacheSpec, DcpStep, LayerWeights, MlaModel, ShardExchange
from dcpcheck.kernels import loading, releases
from dcpcheck.kernels.loading import KernelLoadError, KernelSpecError
from dcpcheck.op_registry import DECODE_CHAIN, OPS
from dcpcheck.ops import package
from dcpcheck.ops.decode_stages import (
    ATTENTION,
    MERGE,
    SLOT_MAPPING,
    Attend,
    AttentionStage,
    ChainError,
    Merge,
    MergeStage,
    SlotMappingStage,
    SlotStep,
    Stage,
    played,
)

STAGE_NAMES = (SLOT_MAPPING, ATTENTION, MERGE)
"""The stages ``--stage NAME=SPEC`` may name (the cache write's kernel is ``--kernel``)."""


def _slot_stage() -> SlotMappingStage:
    return played(SLOT_MAPPING)


def _attention_stage() -> AttentionStage:
    return played(ATTENTION)


def _merge_stage() -> MergeStage:
    return played(MERGE)


def check_heads_shared(heads: int, dcp_size: int) -> None:
    """``ChainError`` unless ``dcp_size`` ranks can share the model's ``heads``: the
    merge's reduce-scatter gives each rank an equal share of them."""
    if heads % dcp_size:
        raise ChainError(
            f"merge: the reduce-scatter shares the model's {heads} heads among the ranks; "
            f"DCP {dcp_size} does not divide them"
        )


@dataclass(frozen=True)
class Stages:
    """The kernels of the chain besides the cache write's (module docstring)."""

    slot_mapping: Stage  # both routines of a slot-mapping kernel
    attention: Stage  # a decode attention
    merge: Stage  # a merge: the release's default path where it offers more
    other_merges: tuple[Stage, ...] = ()  # the release's other merge paths

    def describe(self) -> list[str]:
        stages = (self.slot_mapping, self.attention, self.merge, *self.other_merges)
        return [stage.describe() for stage in stages]

    def by_merge(self) -> tuple[Stages, ...]:
        """The chain of each merge path, the default's first (module docstring)."""
        others = (replace(self, merge=merge, other_merges=()) for merge in self.other_merges)
        return (replace(self, other_merges=()), *others)

    def rank_slots(self, step: SlotStep) -> tuple[torch.Tensor, torch.Tensor]:
        """Every rank's slot mapping ``[N, T]`` and local lengths ``[N, R]`` of ``step``, as
        the slot-mapping stage's kernel computes them."""
        return _slot_stage().rank_slots(self.slot_mapping.kernel, step)

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
        attention, merge = _attention_stage(), _merge_stage()
        ranks = exchange.local_ranks
        device = queries[0].device
        table = step.block_table.to(device)
        partials = [
            attention.attend(
                self.attention.kernel,
                Attend(
                    q=latent_queries(model, layer, queries[j]),
                    kv_cache=latent_cache(model, caches[j], spec),
                    kv_lora_rank=model.preset.kv_lora_rank,
                    block_table=table,
                    seq_lens=step.local_seq_lens[rank].to(device),
                    scale=model.softmax_scale,
                ),
            )
            for j, rank in enumerate(ranks)
        ]
        rows = queries[0].shape[0]
        query_start_loc = torch.arange(rows + 1, dtype=torch.int32, device=device)

        def merged(group: Group, j: int) -> torch.Tensor:
            out, lse = partials[j]
            if group.world_size == 1:  # vLLM's MLA layer merges only under DCP
                return out.float()
            heads = merge.merge(
                self.merge.kernel,
                Merge(
                    partial_out=out,
                    partial_lse=lse,
                    group=group,
                    seq_lens=step.local_seq_lens[ranks[j]].to(device),
                    query_start_loc=query_start_loc,
                ),
            )
            return group.all_gather(heads.float(), dim=1)

        return [latent_values(model, layer, latent) for latent in exchange.run_group(merged)]


def stages_for(kernel_spec: str, named: Mapping[str, str] | None = None) -> Stages:
    """The stages of the chain whose cache write's kernel is ``kernel_spec`` (module
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
            resolved[name] = played(name).load(named[name])
        elif release is None:
            resolved[name] = played(name).load("default")
        elif name == SLOT_MAPPING:
            resolved[name] = _slot_stage().release(release.version)
        elif name == ATTENTION:
            resolved[name] = _attention_stage().release(release.version)
        else:
            resolved[name], *rest = _merge_stage().release(release.version)
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


def cache_write_kernel(spec: str, adapter: str = "auto") -> Stage:
    """The cache write's kernel of a chain whose ``--kernel`` is ``spec`` (under
    ``adapter``): ``spec``'s, or, for a release whose wheel has none of the op's files,
    the project's, with that note."""
    writer = DECODE_CHAIN.cache_write
    op, release = package(writer), loading.release_of(spec)
    try:
        return Stage(writer, spec, op.kernel(spec, adapter))
    except KernelSpecError:
        raise
    except KernelLoadError:
        members = OPS[writer].wheel_members
        if release is None or not all(releases.lacks(release.version, m) for m in members):
            raise
        note = f"{release.name} has no {OPS[writer].function}"
        return Stage(writer, "default", op.kernel("default"), note)


def default_stages() -> Stages:
    """The project's kernel at every stage."""
    return stages_for("default")


def stage_files(written: Stage, stages: Stages) -> tuple[loading.JudgedFile, ...]:
    """The files every stage's kernel comes from, the cache write's first (each stage's
    op's ``judged_files``; a release's attention file), for the reports."""
    found = {f.path: f for f in package(DECODE_CHAIN.cache_write).judged_files(written.spec)}
    for stage in (stages.slot_mapping, stages.attention, stages.merge, *stages.other_merges):
        found.update((f.path, f) for f in played(stage.name).files(stage.spec))
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
