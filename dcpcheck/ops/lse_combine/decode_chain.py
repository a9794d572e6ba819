"""The merge op's two stages in the tiny model's decode path (``dcpcheck.ops.decode_stages``):
each rank's decode attention over its shard of the cache, which produces the partials,
and the merge of the partials by their LSE.

A release's attention is its Triton MLA decode attention, called as its MLA backend calls
it; its merge is the one of every path its MLA layer offers (``merge_paths``), the
default's first. Where a release lacks a stage's kernel, the project's runs, with a note.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from dcpcheck.kernels.loading import JudgedFile, KernelLoadError, KernelSpecError
from dcpcheck.kernels.registry import OpKernels
from dcpcheck.ops.decode_stages import (
    ATTENTION,
    MERGE,
    Attend,
    AttentionStage,
    Merge,
    MergeStage,
    Stage,
)
from dcpcheck.ops.lse_combine import merge_paths
from dcpcheck.ops.lse_combine.contract import (
    AttentionInputs,
    CombineInputs,
    CombineKernel,
    DecodeAttention,
)


def _registry(stage: str) -> OpKernels:
    from dcpcheck.ops.lse_combine import kernels  # Triton kernels: once the backend is chosen

    return kernels.ATTENTION_REGISTRY if stage == ATTENTION else kernels.REGISTRY


def _release_stage(stage: str, spec: str, path: str = "", default: bool = False) -> Stage:
    """The kernel ``spec`` names, or the project's with a note where it does not load."""
    registry = _registry(stage)
    try:
        return Stage(stage, spec, registry.load(spec), path=path, default=default)
    except KernelSpecError:
        raise
    except KernelLoadError as exc:
        return Stage(stage, "default", registry.load("default"), f"{spec}: {exc}", path, default)


def attend(kernel: DecodeAttention, step: Attend) -> tuple[torch.Tensor, torch.Tensor]:
    """One rank's partial output and LSE of ``step`` (``AttentionInputs``)."""
    return kernel(
        AttentionInputs(
            q=step.q,
            kv_cache=step.kv_cache,
            kv_lora_rank=step.kv_lora_rank,
            block_table=step.block_table,
            seq_lens=step.seq_lens,
            scale=step.scale,
        )
    )


def merge(kernel: CombineKernel, step: Merge) -> torch.Tensor:
    """One rank's heads of the merged output, as the MLA layer asks the merge: LSEs in
    base e, no LSE returned, with the lengths and the rows' starts."""
    merged = kernel(
        CombineInputs(
            partial_out=step.partial_out,
            partial_lse=step.partial_lse,
            group=step.group,
            base_e=True,
            return_lse=False,
            seq_lens=step.seq_lens,
            query_start_loc=step.query_start_loc,
        )
    )
    return merged.out


def _release_merges(version: str) -> tuple[Stage, ...]:
    return tuple(
        _release_stage(MERGE, merge_paths.spec_of(version, path), path, i == 0)
        for i, path in enumerate(merge_paths.offered(version))
    )


def _files(stage: str) -> Callable[[str], tuple[JudgedFile, ...]]:
    return lambda spec: _registry(stage).judged_files(spec)


def _load(stage: str) -> Callable[[str], Stage]:
    return lambda spec: Stage(stage, spec, _registry(stage).load(spec))


STAGES = {
    ATTENTION: AttentionStage(
        load=_load(ATTENTION),
        release=lambda version: _release_stage(ATTENTION, f"vllm=={version}"),
        files=_files(ATTENTION),
        attend=attend,
    ),
    MERGE: MergeStage(load=_load(MERGE), release=_release_merges, files=_files(MERGE), merge=merge),
}
"""The stages the op plays, by name (``dcpcheck.op_registry.DECODE_CHAIN``)."""
