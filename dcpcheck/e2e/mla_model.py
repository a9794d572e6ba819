"""A tiny MLA decoder with seeded random weights, run as ``n`` DCP ranks.

The model is DeepSeek's Multi-head Latent Attention with the fused norm + RoPE +
cache-write op (docs/fused-norm-rope.md) in the middle of every layer, and that op is the **kernel
under test**. Per layer and rank::

    h            = RMSNorm(x)
    q_c, kv_c    = h @ W_dq, h @ W_dkv          (the q_lora / kv_lora down-projections)
    k_pe         = h @ W_kr                     (one RoPE key shared by all heads)
    kernel(...)  -> q_out, kv_out, kpe_out      (and this rank's cache entries)
    q            = q_out @ W_uq                 -> per head [nope | rope], rope part RoPE'd
    k, v         = kv @ W_uk | kpe, kv @ W_uv   (per head, from the latent)
    x           += attention(q, k, v) @ W_o
    x           += W_down(silu(W_up(RMSNorm(x))))

then ``logits = RMSNorm(x) @ W_lm``. The query's RoPE part is rotated the way the kernel
rotates ``k_pe`` (interleaved pairs, the preset's table), so positions matter to the
scores. Layers are *shared* MLA layers only: no sparse-attention indexer
(``index_k=None``), so the kernel's indexer path is not exercised here.

Attention under DCP (docs/dcp-contract.md). Every rank runs its own forward pass on its own hidden
states and calls the kernel with its own slot mapping and its own caches. A request
whose step computes one token (decode) attends over its whole context, itself included,
read from the caches: each rank ``s`` attends with its own query over its shard (decoded
with ``reference.decode_mla_entries``), and every rank merges the gathered partials with
log-sum-exp in rank order (``dcpcheck.e2e.attention``). A prefill chunk attends densely and
causally over the ``kv_out`` / ``kpe_out`` / ``q_out`` the kernel produced **on that
rank** for the chunk's tokens, and over its cached prefix through the shards as above.
So a kernel that leaves outputs unwritten for tokens without a local slot poisons the
prefill (NaN-filled outputs) and a wrong cache write poisons decode. Given a
:class:`DecodeChain`, a step of decodes attends through the ops' kernels instead (a decode
attention over each rank's shard and the merge, ``dcpcheck.e2e.chain``). How the ranks
meet is a :class:`ShardExchange`: by default every rank is simulated in this process;
with real ranks each process computes one and the partials travel by all-gather.

Widths: the preset gives ``q_lora_rank``, ``kv_lora_rank`` and ``rope_dim``; the rest
comes from :data:`WIDTHS_BY_PRESET`. Weights are drawn in fp32 on the model's device by
``dcpcheck.cases.seeded`` (one stream per tensor), which gives the same bits on every
device: a DeepSeek-width model is 1.7 GB of fp32, which the CPU generator took 1.7 s to
draw and the copy to the GPU 0.4 s more (on the H200). Projections and
attention run in fp32; only the kernel's inputs and outputs are in the activation dtype.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import torch

import reference
from dcpcheck.cases import seeded
from dcpcheck.cases.collectives import Group, run_ranks
from dcpcheck.cases.dcp import Batch, BlockTables, DcpLayout, Request, SlotMappings, slot_mappings
from dcpcheck.e2e.attention import PartialAttention, merge_partials, partial_attention
from dcpcheck.ops import OpKernel
from dcpcheck.ops.decode_stages import CacheWrite, ModelShape, Written, cache_write

T = TypeVar("T")


@dataclass(frozen=True)
class ModelWidths:
    """The widths the preset does not fix."""

    hidden: int
    heads: int
    nope_head_dim: int
    v_head_dim: int
    mlp_hidden: int
    vocab: int


VOCAB = 256
"""Small on every preset: the LM head only has to turn hidden states into a token id, and
fewer candidates keep the top-2 logit margins wide (a near-tie is rarer)."""

SMALL_WIDTHS = ModelWidths(
    hidden=128, heads=8, nope_head_dim=32, v_head_dim=32, mlp_hidden=256, vocab=VOCAB
)
"""CPU-sized: a forward pass of a few tokens takes milliseconds. Eight heads, so the
merge's reduce-scatter by heads divides them at DCP 1, 2, 4 and 8."""

DEEPSEEK_V3_WIDTHS = ModelWidths(
    hidden=7168, heads=128, nope_head_dim=128, v_head_dim=128, mlp_hidden=2048, vocab=VOCAB
)
"""DeepSeek-V3's attention widths (hidden 7168, 128 heads, qk_nope / v head dims 128); the
MLP is one expert's width (moe_intermediate_size 2048), not the whole MoE."""

WIDTHS_BY_PRESET: dict[str, ModelWidths] = {
    "deepseek-v3.2": DEEPSEEK_V3_WIDTHS,
    # GLM-5.x differs from DeepSeek-V3.2 in q_lora_rank (from its preset); its other
    # attention widths are not in the preset, so DeepSeek-V3's stand in.
    "glm-5": DEEPSEEK_V3_WIDTHS,
    "small-neox": SMALL_WIDTHS,
    "small-interleaved": SMALL_WIDTHS,
}

NORM_WEIGHT_SPREAD = 0.1
"""Norm weights are ``1 + 0.1 * N(0, 1)``: not all ones, so a kernel ignoring its weight
is visible, and close enough to 1 to keep activations O(1)."""


@dataclass(frozen=True)
class LayerWeights:
    """One MLA layer; matrices are ``[in, out]`` fp32, the kernel's norm weights are in
    the activation dtype (as a model checkpoint stores them)."""

    attention_norm: torch.Tensor  # [hidden]
    q_down: torch.Tensor  # [hidden, q_lora]
    q_norm: torch.Tensor  # [q_lora], the kernel's q_weight
    q_up: torch.Tensor  # [q_lora, heads * (nope + rope)]
    kv_down: torch.Tensor  # [hidden, kv_lora]
    kv_norm: torch.Tensor  # [kv_lora], the kernel's kv_weight
    k_rope: torch.Tensor  # [hidden, rope]
    k_up: torch.Tensor  # [kv_lora, heads * nope]
    v_up: torch.Tensor  # [kv_lora, heads * v]
    attention_out: torch.Tensor  # [heads * v, hidden]
    mlp_norm: torch.Tensor  # [hidden]
    mlp_up: torch.Tensor  # [hidden, mlp_hidden]
    mlp_down: torch.Tensor  # [mlp_hidden, hidden]


@dataclass(frozen=True)
class DcpStep:
    """One forward step of a batch under one DCP layout, as the ranks see it.

    ``mappings`` gives each new token's position and every rank's slot for it.
    ``context_slots[i][s]`` are rank ``s``'s slots of the cached context that request
    ``i`` reads this step, in position order: its prefix for a prefill chunk, prefix and
    the new token itself for a decode; ``context_positions[i][s]`` their positions.

    ``k_from_caches``: the kernel has no K outputs (vLLM 0.25.0 - 0.28.0's API), so a prefill chunk
    reads its own tokens' K from the caches too, each from its owner's shard, causally
    masked by position - what a system whose kernel writes K only to the cache must do
    (gather K from the owners). Then ``context_slots`` of a chunk include the chunk.
    """

    batch: Batch
    mappings: SlotMappings
    context_slots: tuple[tuple[torch.Tensor, ...], ...]
    context_positions: tuple[tuple[torch.Tensor, ...], ...]
    k_from_caches: bool = False
    # the decode chain's (``dcpcheck.e2e.chain``): the requests' block table [R, W] and
    # each rank's local lengths [N, R], as the chain's slot-mapping stage computed them
    block_table: torch.Tensor | None = None
    local_seq_lens: torch.Tensor | None = None

    @property
    def dcp_size(self) -> int:
        return self.mappings.dcp_size

    def rows(self, request: int) -> slice:
        """Rows of ``request``'s new tokens in the batch."""
        start = sum(r.new for r in self.batch.requests[:request])
        return slice(start, start + self.batch.requests[request].new)

    def is_decode(self, request: int) -> bool:
        return is_decode(self.batch.requests[request])

    @property
    def decodes_only(self) -> bool:
        return all(is_decode(request) for request in self.batch.requests)


def is_decode(request: Request) -> bool:
    """A one-token step is a decode: it reads its whole context, itself included, from the
    caches, as vLLM's decode path does. Longer steps are prefill chunks."""
    return request.new == 1


def plan_step(
    batch: Batch, layout: DcpLayout, block_tables: BlockTables, k_from_caches: bool = False
) -> DcpStep:
    """Slots of ``batch``'s new tokens and of the context each request reads, per rank
    (``k_from_caches``: see :class:`DcpStep`).

    ``block_tables`` may be longer than this step needs (allocated once for the final
    length of each request): ``slot_mappings`` only reads the entries it needs.
    """
    mappings = slot_mappings(batch, layout, block_tables)
    context_slots, context_positions = [], []
    for request, table in zip(batch.requests, block_tables, strict=True):
        whole = is_decode(request) or k_from_caches
        context = request.prefix + (request.new if whole else 0)
        if context == 0:
            empty = torch.empty(0, dtype=torch.int64)
            context_slots.append((empty,) * layout.dcp_size)
            context_positions.append((empty,) * layout.dcp_size)
            continue
        per_rank = slot_mappings(Batch((Request(0, context),)), layout, (table,)).per_rank
        context_slots.append(tuple(slots[slots >= 0] for slots in per_rank))
        positions = torch.arange(context)
        context_positions.append(tuple(positions[slots >= 0] for slots in per_rank))
    return DcpStep(batch, mappings, tuple(context_slots), tuple(context_positions), k_from_caches)


class ShardExchange(Protocol):
    """How the shard partials of one layer reach every rank (the DCP all-gather).

    ``local_ranks`` are the ranks this process computes, in rank order. ``gather`` takes
    their partials, ``[local rank][request]``, and returns every rank's, ``[request][rank]``
    in rank order, so each rank merges the same partials in the same order. Simulated ranks
    (:class:`InProcessExchange`) just regroup the list; real ranks
    (``dcpcheck.distributed.streams``) all-gather partial outputs and LSEs.
    """

    @property
    def local_ranks(self) -> Sequence[int]: ...

    def gather(
        self, partials: Sequence[Sequence[PartialAttention]]
    ) -> list[list[PartialAttention]]: ...

    def run_group(self, work: Callable[[Group, int], T]) -> list[T]:
        """``work(group, j)`` on every local rank ``j`` (its index in ``local_ranks``),
        the ranks meeting in ``group``'s collectives: what each returned."""
        ...


class DecodeChain(Protocol):
    """The attention of a decode step through the ops' kernels (``dcpcheck.e2e.chain``)."""

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
        """Each local rank's attention output ``[T, H, v]``."""
        ...


@dataclass(frozen=True)
class InProcessExchange:
    """Every rank of a DCP group simulated in this process: gathering is a transpose."""

    dcp_size: int

    @property
    def local_ranks(self) -> Sequence[int]:
        return range(self.dcp_size)

    def gather(
        self, partials: Sequence[Sequence[PartialAttention]]
    ) -> list[list[PartialAttention]]:
        return [list(per_rank) for per_rank in zip(*partials, strict=True)]

    def run_group(self, work: Callable[[Group, int], T]) -> list[T]:
        return run_ranks(self.dcp_size, lambda group: work(group, group.rank_in_group))


@dataclass(frozen=True)
class CacheSpec:
    """How every rank stores MLA cache entries."""

    layout: str  # a name of ``reference.MLA_LAYOUTS``
    mla_scale: float | None
    block_size: int


class _WeightDraws:
    """The model's weights in drawing order, each tensor a ``seeded`` stream of its own."""

    def __init__(self, seed: int, device: torch.device) -> None:
        self.seed, self.device, self.streams = seed, device, itertools.count()

    def normal(self, *shape: int, std: float) -> torch.Tensor:
        values = seeded.normal(self.seed, next(self.streams), shape, self.device)
        return values.mul_(std)  # in place: no second buffer of a 1.7 GB model to fault in

    def linear(self, fan_in: int, fan_out: int) -> torch.Tensor:
        """``N(0, 1/fan_in)``: unit-variance inputs give unit-variance outputs."""
        return self.normal(fan_in, fan_out, std=fan_in**-0.5)

    def norm_weight(self, width: int) -> torch.Tensor:
        return self.normal(width, std=NORM_WEIGHT_SPREAD).add_(1.0)


class MlaModel:
    """Seeded weights of the decoder and its forward pass over ``n`` simulated ranks."""

    def __init__(
        self,
        preset: ModelShape,
        layers: int,
        dtype: torch.dtype,
        seed: int,
        device: torch.device,
    ) -> None:
        if preset.name not in WIDTHS_BY_PRESET:
            raise ValueError(f"no model widths for preset {preset.name!r}")
        self.preset = preset
        self.widths = WIDTHS_BY_PRESET[preset.name]
        self.dtype = dtype
        self.device = device
        w = self.widths
        draw = _WeightDraws(seed, device)
        qk_head_dim = w.nope_head_dim + preset.rope_dim
        self.softmax_scale = qk_head_dim**-0.5

        def layer_weights() -> LayerWeights:
            return LayerWeights(
                attention_norm=draw.norm_weight(w.hidden),
                q_down=draw.linear(w.hidden, preset.q_lora_rank),
                q_norm=draw.norm_weight(preset.q_lora_rank).to(dtype),
                q_up=draw.linear(preset.q_lora_rank, w.heads * qk_head_dim),
                kv_down=draw.linear(w.hidden, preset.kv_lora_rank),
                kv_norm=draw.norm_weight(preset.kv_lora_rank).to(dtype),
                k_rope=draw.linear(w.hidden, preset.rope_dim),
                k_up=draw.linear(preset.kv_lora_rank, w.heads * w.nope_head_dim),
                v_up=draw.linear(preset.kv_lora_rank, w.heads * w.v_head_dim),
                attention_out=draw.linear(w.heads * w.v_head_dim, w.hidden),
                mlp_norm=draw.norm_weight(w.hidden),
                mlp_up=draw.linear(w.hidden, w.mlp_hidden),
                mlp_down=draw.linear(w.mlp_hidden, w.hidden),
            )

        self.embedding = draw.normal(w.vocab, w.hidden, std=1.0)
        self.layers = [layer_weights() for _ in range(layers)]
        self.final_norm = draw.norm_weight(w.hidden)
        self.lm_head = draw.linear(w.hidden, w.vocab)
        self.cos_sin = reference.cos_sin_table(
            preset.max_position, preset.rope_dim, preset.rope_base
        ).to(device)

    # -- caches ---------------------------------------------------------------------------

    def entry_bytes(self, spec: CacheSpec) -> int:
        return reference.mla_entry_bytes(
            spec.layout, self.preset.kv_lora_rank, self.preset.rope_dim, self.dtype
        )

    def allocate_caches(
        self, spec: CacheSpec, num_blocks: int, dcp_size: int, seed: int
    ) -> list[list[torch.Tensor]]:
        """``[rank][layer]`` byte caches ``[num_blocks, block_size, entry_bytes]``, filled
        with seeded random bytes: an entry read before the kernel wrote it is garbage, never
        a plausible zero."""
        gen = torch.Generator().manual_seed(seed)
        shape = (num_blocks, spec.block_size, self.entry_bytes(spec))
        return [
            [
                torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8).to(self.device)
                for _ in self.layers
            ]
            for _ in range(dcp_size)
        ]

    def read_cache(
        self, cache: torch.Tensor, slots: torch.Tensor, spec: CacheSpec
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 ``(kv, kpe)`` of the entries at ``slots`` of one rank's cache."""
        entries = reference.read_mla_cache(cache, slots.to(cache.device))
        return reference.decode_mla_entries(
            entries,
            spec.layout,
            self.preset.kv_lora_rank,
            self.preset.rope_dim,
            self.dtype,
            spec.mla_scale,
        )

    # -- one layer, piece by piece --------------------------------------------------------

    def _cache_write(
        self,
        kernel: OpKernel,
        layer: LayerWeights,
        x: torch.Tensor,
        positions: torch.Tensor,
        slot_mapping: torch.Tensor,
        cache: torch.Tensor,
        spec: CacheSpec,
    ) -> Written:
        """Down-project ``x`` and run the kernel on one rank, through the cache write's
        stage (``dcpcheck.ops.decode_stages``); rows it leaves unwritten are NaN."""
        h = reference.rms_norm(x, layer.attention_norm, self.preset.eps)
        step = CacheWrite(
            q_c=(h @ layer.q_down).to(self.dtype),
            q_weight=layer.q_norm,
            kv_c=(h @ layer.kv_down).to(self.dtype),
            kv_weight=layer.kv_norm,
            k_pe=(h @ layer.k_rope).to(self.dtype),
            positions=positions,
            cos_sin=self.cos_sin,
            eps=self.preset.eps,
            block_size=spec.block_size,
            layout=spec.layout,
            mla_scale=spec.mla_scale,
            slot_mapping=slot_mapping,
            cache=cache,
            topk=self.preset.topk,
        )
        return cache_write().write(kernel, step)

    def _queries(
        self, layer: LayerWeights, q_out: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """Per-head queries ``[T, H, nope + rope]``, the rope part rotated at ``positions``
        (interleaved, like the kernel's ``k_pe``)."""
        w = self.widths
        q = (q_out.float() @ layer.q_up).view(q_out.shape[0], w.heads, -1)
        rows = self.cos_sin[positions]
        half = self.preset.rope_dim // 2
        cos, sin = rows[:, None, :half], rows[:, None, half:]
        q_pe = reference.rope_interleaved(q[..., w.nope_head_dim :], cos, sin)
        return torch.cat([q[..., : w.nope_head_dim], q_pe], dim=-1)

    def _keys_values(
        self, layer: LayerWeights, kv: torch.Tensor, kpe: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-head keys ``[T, H, nope + rope]`` and values ``[T, H, v]`` from the latent
        ``kv`` and the shared RoPE key ``kpe`` (fp32 or the activation dtype)."""
        w = self.widths
        tokens = kv.shape[0]
        k_nope = (kv.float() @ layer.k_up).view(tokens, w.heads, w.nope_head_dim)
        k_pe = kpe.float()[:, None, :].expand(tokens, w.heads, self.preset.rope_dim)
        values = (kv.float() @ layer.v_up).view(tokens, w.heads, w.v_head_dim)
        return torch.cat([k_nope, k_pe], dim=-1), values

    def _after_attention(
        self, layer: LayerWeights, x: torch.Tensor, attended: torch.Tensor
    ) -> torch.Tensor:
        """Output projection and residual, then the MLP block and its residual."""
        x = x + attended.reshape(x.shape[0], -1) @ layer.attention_out
        h = reference.rms_norm(x, layer.mlp_norm, self.preset.eps)
        return x + torch.nn.functional.silu(h @ layer.mlp_up) @ layer.mlp_down

    def head_input(self, x: torch.Tensor) -> torch.Tensor:
        """What the LM head multiplies: the final norm of the residual stream ``x``."""
        return reference.rms_norm(x, self.final_norm, self.preset.eps)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.head_input(x) @ self.lm_head

    # -- the forward pass over all ranks --------------------------------------------------

    def forward(
        self,
        kernel: OpKernel,
        step: DcpStep,
        tokens: Sequence[torch.Tensor],
        caches: Sequence[Sequence[torch.Tensor]],
        spec: CacheSpec,
        exchange: ShardExchange | None = None,
        chain: DecodeChain | None = None,
    ) -> list[torch.Tensor]:
        """The residual stream ``[T, hidden]`` after the last layer, of every local rank, for
        one step (module docstring); :meth:`logits` turns rows of it into logits.

        ``exchange`` says which ranks run here and how their shard partials are gathered;
        ``None`` simulates every rank of ``step`` in this process. ``tokens[j]`` ``[T]`` are
        the input ids of the ``j``-th local rank, which embeds its own; ``caches[j][layer]``
        is that rank's cache of that layer. ``chain``: a step of decodes only attends
        through it (the ops' attention and merge) instead of the model's own attention.
        """
        if exchange is None:
            exchange = InProcessExchange(step.dcp_size)
        ranks = exchange.local_ranks
        positions = step.mappings.positions.to(self.device)
        slot_maps = [step.mappings.per_rank[r].to(self.device) for r in ranks]
        hidden = [self.embedding[t] for t in tokens]
        for index, layer in enumerate(self.layers):
            fused = [
                self._cache_write(
                    kernel, layer, hidden[j], positions, slot_maps[j], caches[j][index], spec
                )
                for j in range(len(ranks))
            ]
            queries = [self._queries(layer, out.q_out, positions) for out in fused]
            if chain is not None and step.decodes_only:
                layer_caches = [caches[j][index] for j in range(len(ranks))]
                attended = chain.attend(self, layer, step, queries, layer_caches, spec, exchange)
                hidden = [
                    self._after_attention(layer, hidden[j], attended[j]) for j in range(len(ranks))
                ]
                continue
            # Each rank attends with its own queries over its own shard; every rank then
            # gathers all ranks' partials, [request][rank].
            gathered = exchange.gather(
                [
                    [
                        self._shard_attention(
                            layer,
                            queries[j][step.rows(i)],
                            caches[j][index],
                            step.context_slots[i][rank],
                            spec,
                            self._visible(step, i, positions, rank),
                        )
                        for i in range(len(step.batch.requests))
                    ]
                    for j, rank in enumerate(ranks)
                ]
            )
            hidden = [
                self._after_attention(
                    layer, hidden[j], self._attend(layer, step, queries[j], fused[j], gathered)
                )
                for j in range(len(ranks))
            ]
        return hidden

    def _attend(
        self,
        layer: LayerWeights,
        step: DcpStep,
        queries: torch.Tensor,
        fused: Written,
        gathered: list[list[PartialAttention]],
    ) -> torch.Tensor:
        """One rank's attention output ``[T, H, v]``: per request, its own dense chunk
        partial (prefill only) merged with the gathered shard partials, in rank order."""
        outputs = []
        for i, shard_partials in enumerate(gathered):
            partials = list(shard_partials)
            if not step.is_decode(i) and not step.k_from_caches:
                rows = step.rows(i)
                chunk = self._chunk_attention(
                    layer, queries[rows], fused.kv_out[rows], fused.kpe_out[rows]
                )
                partials.insert(0, chunk)
            outputs.append(merge_partials(partials).output)
        return torch.cat(outputs)

    @staticmethod
    def _visible(
        step: DcpStep, request: int, positions: torch.Tensor, rank: int
    ) -> torch.Tensor | None:
        """The causal mask of a prefill chunk over rank ``rank``'s shard when the chunk's
        own K is read from the caches; None where every cached position precedes (or,
        for a decode, is) the query's."""
        if not step.k_from_caches or step.is_decode(request):
            return None
        cached = step.context_positions[request][rank].to(positions.device)
        return cached[None, :] <= positions[step.rows(request)][:, None]

    def _shard_attention(
        self,
        layer: LayerWeights,
        queries: torch.Tensor,
        cache: torch.Tensor,
        slots: torch.Tensor,
        spec: CacheSpec,
        visible: torch.Tensor | None = None,
    ) -> PartialAttention:
        """Attention over one rank's shard of a request's cached context (``visible``:
        see :meth:`_visible`)."""
        kv, kpe = self.read_cache(cache, slots, spec)
        keys, values = self._keys_values(layer, kv, kpe)
        return partial_attention(queries, keys, values, self.softmax_scale, visible)

    def _chunk_attention(
        self,
        layer: LayerWeights,
        queries: torch.Tensor,
        kv_out: torch.Tensor,
        kpe_out: torch.Tensor,
    ) -> PartialAttention:
        """Causal attention of a prefill chunk over its own tokens, from this rank's kernel
        outputs."""
        keys, values = self._keys_values(layer, kv_out, kpe_out)
        count = queries.shape[0]
        causal = torch.ones(count, count, dtype=torch.bool, device=queries.device).tril()
        return partial_attention(queries, keys, values, self.softmax_scale, causal)
