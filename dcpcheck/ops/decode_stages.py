"""What the tiny model's DCP decode path asks of the ops that play its stages.

``dcpcheck.op_registry.DECODE_CHAIN`` names the op of each stage; that op's package
provides the stage in its ``decode_chain`` module (``STAGES``, by stage name), as one of
the records below, and ``dcpcheck.e2e.chain`` reaches it through
``OpPackage.decode_stage``. A record speaks the chain's terms (tensors, layout names from
``reference``, a DCP group) and builds its op's own inputs from them, so the chain and
the model never see an op's contract, and an op that can play a stage plays it by
providing the record.

Each record of a stage whose kernel ``--stage NAME=SPEC`` may name also loads it
(:class:`NamedStage`): ``load(spec)``, the kernel a spec of its op names, and
``release(version)``, the release's kernel as the release's own model runner or
attention layer calls it (the project's, with a note saying why, where the release has
none).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Protocol

import torch

from dcpcheck.op_registry import DECODE_CHAIN
from dcpcheck.ops import package

if TYPE_CHECKING:
    from dcpcheck.cases.collectives import Group
    from dcpcheck.kernels.loading import JudgedFile


CACHE_WRITE, SLOT_MAPPING, ATTENTION, MERGE = (
    field.name.replace("_", "-") for field in fields(DECODE_CHAIN)
)
"""The stages' names (``DecodeChain``: a field's name, ``-`` for ``_``)."""


def played(stage: str) -> Any:
    """Stage ``stage``'s record (below), from the op ``DECODE_CHAIN`` names for it."""
    return package(getattr(DECODE_CHAIN, stage.replace("-", "_"))).decode_stage(stage)


class ChainError(RuntimeError):
    """A stage's kernel cannot run a step of the chain (one line: the stage and why)."""


@dataclass(frozen=True)
class Stage:
    """One stage's kernel and where it came from."""

    name: str
    spec: str
    kernel: Any
    note: str = ""  # why this spec, where it is not the one asked for
    path: str = ""  # a release's merge: its path (``lse_combine.merge_paths``)
    default: bool = False  # a release's merge: the path the release runs by default

    def describe(self) -> str:
        label = self.name
        if self.path:
            label += f" {self.path}" + (" (the release's default)" if self.default else "")
        return f"{label}: {self.spec}" + (f" ({self.note})" if self.note else "")


def refuse_what_it_cannot_run(stage: str, kernel: Any, inputs: Any) -> None:
    """``ChainError`` naming ``stage`` when ``kernel`` says it cannot be asked ``inputs``
    (a release kernel's ``not_applicable``)."""
    ask = getattr(kernel, "not_applicable", None)
    why = ask(inputs) if callable(ask) else None
    if why is not None:
        raise ChainError(f"{stage}: {why}")


# -- the cache write: the kernel under test -----------------------------------------------


class ModelShape(Protocol):
    """The published MLA widths of a model the tiny one stands for."""

    name: str
    q_lora_rank: int
    kv_lora_rank: int
    rope_dim: int
    max_position: int
    topk: int  # the width of the indexer's top-k buffer
    rope_base: float
    eps: float


@dataclass(frozen=True)
class CacheWrite:
    """One rank's cache write of one layer's new tokens: the down-projections, the
    norms' weights, the RoPE table and the rank's slot of each token (-1: another rank
    stores it), into ``cache`` (bytes, ``layout`` a name of ``reference.MLA_LAYOUTS``)."""

    q_c: torch.Tensor
    q_weight: torch.Tensor
    kv_c: torch.Tensor
    kv_weight: torch.Tensor
    k_pe: torch.Tensor
    positions: torch.Tensor
    cos_sin: torch.Tensor
    eps: float
    block_size: int
    layout: str
    mla_scale: float | None  # the fp8 layout's per-tensor scale
    slot_mapping: torch.Tensor
    cache: torch.Tensor
    topk: int


@dataclass(frozen=True)
class Written:
    """What the cache write returns of every token, whatever its slot: the normed query,
    the normed latent and the rotated ``k_pe``. A row the kernel leaves unwritten is NaN,
    so it poisons everything downstream."""

    q_out: torch.Tensor
    kv_out: torch.Tensor
    kpe_out: torch.Tensor


@dataclass(frozen=True)
class CacheWriteStage:
    """The stage whose kernel is the one under test (``--kernel``)."""

    presets: Mapping[str, ModelShape]  # the model shapes the op's scenarios name
    write: Callable[[Any, CacheWrite], Written]


def cache_write() -> CacheWriteStage:
    """The cache write's record, of the op that plays it."""
    return played(CACHE_WRITE)


# -- the stages ``--stage`` names ----------------------------------------------------------


@dataclass(frozen=True)
class SlotStep:
    """One step's new tokens on the chain's single sharded cache group: their positions
    ``[T]``, each request's length and new tokens, the requests' block table ``[R, W]``."""

    positions: torch.Tensor
    lengths: list[int]
    new: list[int]
    block_table: torch.Tensor
    block_size: int
    dcp_size: int
    interleave: int


@dataclass(frozen=True)
class NamedStage:
    """What every stage ``--stage`` may name has: its kernels, loaded by spec."""

    load: Callable[[str], Stage]  # the kernel a spec of the op names, as a stage
    files: Callable[[str], tuple[JudgedFile, ...]]  # the files a spec's kernel comes from


@dataclass(frozen=True)
class SlotMappingStage(NamedStage):
    """Each rank's slot of each new token and each request's length on the rank."""

    release: Callable[[str], Stage]
    # every rank's slot mapping [N, T] (int64) and local lengths [N, R] (int32)
    rank_slots: Callable[[Any, SlotStep], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class Attend:
    """One rank's decode attention in MLA's latent space: queries ``[T, H, kv_lora +
    rope]``, the rank's cache decoded ``[blocks, block_size, kv_lora + rope]`` (the first
    ``kv_lora_rank`` columns are the value), read through ``block_table`` up to each
    request's local length."""

    q: torch.Tensor
    kv_cache: torch.Tensor
    kv_lora_rank: int
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    scale: float


@dataclass(frozen=True)
class AttentionStage(NamedStage):
    """Each rank's partial attention over its shard of the cache."""

    release: Callable[[str], Stage]
    # the rank's output [T, H, kv_lora] and its LSE [T, H] (natural log)
    attend: Callable[[Any, Attend], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class Merge:
    """One rank's part of the merge of the ranks' partials by their LSE (natural log)."""

    partial_out: torch.Tensor
    partial_lse: torch.Tensor
    group: Group
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor


@dataclass(frozen=True)
class MergeStage(NamedStage):
    """The ranks' partials combined, each rank keeping its share of the heads."""

    # the release's merge on every path its MLA layer offers, its default first
    release: Callable[[str], tuple[Stage, ...]]
    merge: Callable[[Any, Merge], torch.Tensor]  # the rank's heads [T, H / N, kv_lora]
