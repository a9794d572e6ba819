"""End to end (docs/dcp-contract.md): greedy token streams of a tiny MLA model under DCP1 and DCPn.

The seeded model of ``dcpcheck.e2e.mla_model`` generates greedily for a batch of prompts of
different lengths, simulating every DCP rank in one process (``generate_ranks`` also runs
one real rank per process, for ``dcpcheck.distributed.streams``). Each prompt is prefilled in
two chunks (the second attends to the first through the caches), then decoded one token
per step across block boundaries. Each request's block table is allocated once for its
final length and reused at every step.

Each (DCP size, rank) run is summarized by SHA256 digests: one per request over its token
ids as little-endian int32, and one for the whole stream over the concatenation of those
bytes in request order. A correct kernel gives the same digests at every DCP size and on
every rank.

Why streams agree only up to near-ties
--------------------------------------
Within one DCP size every rank merges the same gathered partial attentions in the same
order, so a correct kernel gives bitwise identical ranks. Across DCP sizes the cached
keys are split differently and the log-sum-exp merge adds the shards' fp32 sums in a
different order: hidden states differ by fp32 rounding, which the rounding of the
kernel's inputs to bf16 turns, now and then, into one bf16 step on an element. Logits
then differ by a small noise, and greedy argmax is unchanged unless the top two logits
are closer than that noise.

So every step records its top-2 margin and a bound on that noise computed from the
step's own logits (:func:`margin_bound`): the spread of the margin if *every* element of
the LM head's input moved by one bf16 step, in independent directions (the root sum of
squares of ``ulp_bf16(h_i) * (W[i, top1] - W[i, top2])``). That is more than the
arithmetic of another DCP size does, which moves some elements now and then. The bound
is about
``6e-3 .. 1e-2`` at every width (the sum over ``hidden`` elements of weights of variance
``1/hidden``). Measured with a correct kernel at every stage of the decode chain, margins
of DCP2/4/8 runs stayed within ``0.036`` times the DCP1 step's bound (at most ``3.0e-4``;
oracle kernel on the CPU, small-neox, seed 0, 4 cache layouts x 2 block size /
interleave pairs, 12 steps, 4032 steps compared; the H200's figure is owed), and within
``1.04e-3``, a sixth of the smallest bound seen (``6.1e-3``), over 4 seeds x 3 layouts.

A divergence is a near-tie (rounding can flip it) only where the DCP1 margin is within
its bound and the diverging run's logits are finite: rounding never makes NaN or inf. A
kernel bug shows up with a DCP1 margin past the bound, usually with NaN logits in the
DCPn run (the model's kernel outputs start as NaN). :func:`stream_config_for`'s streams
have no DCP1 step within its bound (``tests/test_token_streams.py``), so no divergence in
them can be excused.
"""

from __future__ import annotations

import hashlib
import random
import struct
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

import reference
from dcpcheck.backend import Backend
from dcpcheck.cases.dcp import Batch, DcpLayout, Request, build_block_tables, num_blocks
from dcpcheck.e2e.chain import Stages, check_heads_shared, default_stages
from dcpcheck.e2e.mla_model import (
    WIDTHS_BY_PRESET,
    CacheSpec,
    InProcessExchange,
    MlaModel,
    ShardExchange,
    plan_step,
)
from dcpcheck.gpu_fit import GPU_STREAM_PRESET
from dcpcheck.ops import OpKernel
from dcpcheck.ops.decode_stages import ChainError, SlotStep, Stage, cache_write

BASELINE_DCP_SIZE = 1
"""Every run is compared with the DCP1 run (rank 0), which every correct setup reproduces."""

MIN_PROMPT_LENGTH = 4
"""Prompts are prefilled in two chunks of at least 2 tokens each, so both chunks take the
dense prefill path (a 1-token step is a decode)."""


@dataclass(frozen=True)
class StreamConfig:
    """What to generate: the model, its cache layout and the batch.

    ``prompts`` requests with distinct prompt lengths in ``[MIN_PROMPT_LENGTH,
    max_prompt_length]``, each generating ``steps`` tokens. Weights, prompts and the
    caches' initial bytes all follow from ``seed``; the block tables are shuffled with it.
    """

    preset: str = "small-neox"
    cache_layout: str = reference.LAYOUT_AUTO  # a name of ``reference.MLA_LAYOUTS``
    mla_scale: float | None = None  # the fp8 layout's per-tensor scale
    dtype: torch.dtype = torch.bfloat16
    prompts: int = 3
    max_prompt_length: int = 9
    steps: int = 8
    block_size: int = 4
    interleave: int = 1
    seed: int = 0
    layers: int = 2

    def __post_init__(self) -> None:
        if self.preset not in cache_write().presets or self.preset not in WIDTHS_BY_PRESET:
            raise ValueError(f"unknown preset {self.preset!r}")
        if self.cache_layout not in reference.MLA_LAYOUTS:
            raise ValueError(f"unknown cache layout {self.cache_layout!r}")
        if (self.cache_layout == reference.LAYOUT_FP8) != (self.mla_scale is not None):
            raise ValueError("mla_scale is required by the fp8 cache layout and only by it")
        if self.prompts < 1 or self.steps < 1 or self.layers < 1:
            raise ValueError("prompts, steps and layers must be >= 1")
        if self.max_prompt_length - MIN_PROMPT_LENGTH + 1 < self.prompts:
            raise ValueError(
                f"{self.prompts} distinct prompt lengths do not fit in "
                f"[{MIN_PROMPT_LENGTH}, {self.max_prompt_length}]"
            )
        DcpLayout(self.block_size, BASELINE_DCP_SIZE, self.interleave)  # validates both

    @property
    def cache_spec(self) -> CacheSpec:
        return CacheSpec(self.cache_layout, self.mla_scale, self.block_size)


FP8_STREAM_SCALE = 0.5
"""Per-tensor scale of the model's fp8 caches: normalized K rows (|x| of a few units) stay
far inside fp8's range and keep several steps of precision."""

STREAM_INTERLEAVE = 4
"""The interleave of ``dcpcheck hash`` and ``dcpcheck run``'s streams: the block size, so a
rank holds whole blocks of four positions and a context of at most ``4 * (N - 1)`` tokens
leaves a rank of DCP ``N`` without one (4 and 8 here): the empty shard every decode
attention and merge must get right. A round-robin of single tokens leaves none once the
prompts are prefilled."""

CPU_PRESET, GPU_PRESET = "small-neox", GPU_STREAM_PRESET
"""Model widths by backend: small on the CPU interpreter, real MLA dims on a GPU (the fit
check records the gate's streams at the GPU's too, so it names them)."""

STREAM_SEED = 1
"""The seed of ``dcpcheck hash`` and ``dcpcheck run``'s streams: with it, every DCP1 step
of the CPU preset's streams, in every cache layout, has a top-2 margin past its
:func:`margin_bound` (at least 1.67 times it; seed 0's ``fp8_ds_mla`` streams have a step
at 0.35 times), so no divergence from them can be excused as a near-tie
(``tests/test_token_streams.py``, which also checks the GPU preset on a GPU)."""


def stream_config_for(
    backend: Backend,
    cache_layout: str = reference.LAYOUT_AUTO,
    *,
    preset: str | None = None,
    prompts: int = 3,
    steps: int = 8,
    interleave: int = STREAM_INTERLEAVE,
    seed: int = STREAM_SEED,
) -> StreamConfig:
    """The configuration ``dcpcheck hash`` and ``dcpcheck run`` use on ``backend``."""
    return StreamConfig(
        preset=preset or (CPU_PRESET if backend.interpreted else GPU_PRESET),
        cache_layout=cache_layout,
        mla_scale=FP8_STREAM_SCALE if cache_layout == reference.LAYOUT_FP8 else None,
        prompts=prompts,
        max_prompt_length=MIN_PROMPT_LENGTH + 2 * prompts + 2,
        steps=steps,
        interleave=interleave,
        seed=seed,
    )


def prompt_tokens(config: StreamConfig) -> tuple[tuple[int, ...], ...]:
    """The seeded prompts: distinct lengths, token ids uniform over the vocabulary."""
    rng = random.Random(config.seed)
    vocab = WIDTHS_BY_PRESET[config.preset].vocab
    lengths = rng.sample(range(MIN_PROMPT_LENGTH, config.max_prompt_length + 1), config.prompts)
    return tuple(tuple(rng.randrange(vocab) for _ in range(length)) for length in lengths)


DIGEST_RULE = (
    "SHA256 of the generated token ids (prompts excluded), each packed as a little-endian "
    "int32 (Python struct '<i', 4 bytes): a request's digest over its tokens in step order, "
    "a stream's over every request's tokens concatenated in request order"
)
"""How :func:`token_digest` serializes tokens, in words: ``dcpcheck hash --json`` states it
(``hash_of``) so a reader can recompute every digest from the tokens beside it."""


def token_digest(tokens: Sequence[int]) -> str:
    """SHA256 (hex) of token ids as little-endian int32 (:data:`DIGEST_RULE`)."""
    return hashlib.sha256(struct.pack(f"<{len(tokens)}i", *tokens)).hexdigest()


@dataclass(frozen=True)
class Streams:
    """What one DCP size generated: ``[rank, request, step]`` token ids and the top-2
    logit margin (top1 - top2) of each of those greedy choices."""

    dcp_size: int
    tokens: torch.Tensor  # [n, R, steps] int64, CPU
    margins: torch.Tensor  # [n, R, steps] fp32, CPU; NaN where the logits were NaN
    bounds: torch.Tensor  # [n, R, steps] fp32, CPU: each margin's margin_bound
    finite: torch.Tensor  # [n, R, steps] bool, CPU: no NaN or inf in that step's logits

    def request_digests(self, rank: int) -> tuple[str, ...]:
        return tuple(token_digest(row.tolist()) for row in self.tokens[rank])

    def stream_digest(self, rank: int) -> str:
        return token_digest(self.tokens[rank].flatten().tolist())


def _greedy(model: MlaModel, hidden: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Greedy choices of the residual-stream rows ``hidden`` ``[R, hidden]``, on the CPU:
    token ids, top-2 margins, their :func:`margin_bound` and whether each logit row was
    finite."""
    head_input = model.head_input(hidden)
    logits = head_input @ model.lm_head
    top = torch.topk(logits, 2, dim=-1)
    margins = top.values[:, 0] - top.values[:, 1]
    bounds = margin_bound(head_input, model.lm_head, top.indices)
    finite = torch.isfinite(logits).all(dim=-1)
    return tuple(t.cpu() for t in (top.indices[:, 0], margins, bounds, finite))


def bf16_ulp(values: torch.Tensor) -> torch.Tensor:
    """The spacing of bf16 numbers (8 significant bits) at each of ``values``' magnitudes:
    ``2**(e - 8)`` for ``|v|`` in ``[2**(e-1), 2**e)``."""
    _, exponent = torch.frexp(values)
    return torch.ldexp(torch.ones_like(values), exponent - 8)


def margin_bound(
    head_input: torch.Tensor, lm_head: torch.Tensor, top: torch.Tensor
) -> torch.Tensor:
    """How far rounding differences between DCP sizes can move each row's top-2 margin
    (module docstring): the spread of the margin when every element ``i`` of the LM head's
    input ``h`` moves by one bf16 step of random sign,
    ``sqrt(sum_i (ulp_bf16(h_i) * (W[i, top1] - W[i, top2]))**2)``. ``top`` ``[R, 2]``:
    each row's two largest logits' token ids."""
    direction = lm_head[:, top[:, 0]] - lm_head[:, top[:, 1]]  # [hidden, R]
    moved = bf16_ulp(head_input.float()) * direction.T
    return moved.square().sum(dim=-1).sqrt()


def writes_k_outputs(kernel: OpKernel) -> bool:
    """Whether ``kernel`` writes the KV and k_pe outputs. A kernel whose API has none
    (vLLM 0.25.0 - 0.28.0's, through its adapter) says so with ``writes_k_outputs = False``; the
    model's prefill then reads K from the caches (mla_model.DcpStep)."""
    return bool(getattr(kernel, "writes_k_outputs", True))


def build_model(config: StreamConfig, device: torch.device) -> MlaModel:
    """The seeded model of ``config`` (the same bits on every device)."""
    preset = cache_write().presets[config.preset]
    return MlaModel(preset, config.layers, config.dtype, config.seed, device)


def generate(
    kernel: OpKernel,
    config: StreamConfig,
    dcp_size: int,
    device: torch.device,
    stages: Stages | None = None,
) -> Streams:
    """Greedy generation of ``config``'s batch with ``dcp_size`` simulated ranks, its
    decode steps through ``stages`` (the project's kernels when None)."""
    return _generate(kernel, build_model(config, device), config, dcp_size, stages)


def _prefill_chunks(prompts: Sequence[Sequence[int]]) -> tuple[tuple[Batch, list[int]], ...]:
    """The two prefill steps and their token ids: the first half of every prompt, then the
    rest, whose tokens find the first half in the caches (a cached prefix)."""
    split = [len(p) // 2 for p in prompts]
    first = Batch(tuple(Request(0, s) for s in split))
    second = Batch(tuple(Request(s, len(p) - s) for p, s in zip(prompts, split, strict=True)))
    return (
        (first, [t for p, s in zip(prompts, split, strict=True) for t in p[:s]]),
        (second, [t for p, s in zip(prompts, split, strict=True) for t in p[s:]]),
    )


def _last_rows(batch: Batch) -> torch.Tensor:
    """Row of each request's last new token: where its next token is read from."""
    return torch.cumsum(torch.tensor([r.new for r in batch.requests]), 0) - 1


def _generate(
    kernel: OpKernel, model: MlaModel, config: StreamConfig, dcp_size: int, stages: Stages | None
) -> Streams:
    exchange = InProcessExchange(dcp_size)
    return Streams(dcp_size, *generate_ranks(kernel, model, config, exchange, dcp_size, stages))


def generate_ranks(
    kernel: OpKernel,
    model: MlaModel,
    config: StreamConfig,
    exchange: ShardExchange,
    dcp_size: int,
    stages: Stages | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Greedy generation on the ranks ``exchange.local_ranks`` of a DCP group of
    ``dcp_size``: their token ids, top-2 margins, margin bounds and finite flags,
    ``[local rank, request, step]`` on the CPU (the fields of :class:`Streams` after
    ``dcp_size``, for those ranks). Every step's slot mappings and a
    decode step's attention run through ``stages`` (``dcpcheck.e2e.chain``; the project's
    kernels when None)."""
    stages = stages if stages is not None else default_stages()
    spec = config.cache_spec
    layout = DcpLayout(config.block_size, dcp_size, config.interleave)
    ranks = exchange.local_ranks
    prompts = prompt_tokens(config)
    # The last generated token is never fed back: a request ends with len + steps - 1 tokens.
    final = Batch(tuple(Request(len(p) + config.steps - 2, 1) for p in prompts))
    tables = build_block_tables(final, config.block_size, dcp_size, shuffle_seed=config.seed)
    # Every rank's caches are drawn, in rank order, from one seeded generator: a rank's
    # initial bytes are the same whether it runs alone in a process or with the others.
    all_caches = model.allocate_caches(spec, num_blocks(tables), dcp_size, config.seed)
    caches = [all_caches[rank] for rank in ranks]

    width = max(len(table) for table in tables)
    table = torch.tensor([[*t, *[0] * (width - len(t))] for t in tables], dtype=torch.int32)

    def run(batch: Batch, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        step = plan_step(batch, layout, tables, k_from_caches=not writes_k_outputs(kernel))
        slots, local = stages.rank_slots(
            SlotStep(
                positions=step.mappings.positions.to(model.device),
                lengths=[request.length for request in batch.requests],
                new=[request.new for request in batch.requests],
                block_table=table,
                block_size=config.block_size,
                dcp_size=dcp_size,
                interleave=config.interleave,
            )
        )
        mappings = replace(step.mappings, per_rank=slots.cpu())
        step = replace(step, mappings=mappings, block_table=table, local_seq_lens=local)
        inputs = [t.to(model.device) for t in inputs]
        return model.forward(kernel, step, inputs, caches, spec, exchange, stages)

    (first, first_ids), (batch, ids) = _prefill_chunks(prompts)
    run(first, [torch.tensor(first_ids)] * len(ranks))  # a partial prefill: logits unused
    inputs = [torch.tensor(ids)] * len(ranks)
    shape = (len(ranks), len(prompts), config.steps)
    tokens = torch.empty(shape, dtype=torch.int64)
    margins, bounds = torch.empty(shape), torch.empty(shape)
    finite = torch.empty(shape, dtype=torch.bool)
    for step in range(config.steps):
        hidden = run(batch, inputs)
        rows = _last_rows(batch).to(model.device)
        for j in range(len(ranks)):
            choices = _greedy(model, hidden[j][rows])
            for recorded, chosen in zip((tokens, margins, bounds, finite), choices, strict=True):
                recorded[j, :, step] = chosen
        # Each rank feeds back its own choice: a rank that diverged keeps diverging.
        batch = Batch(tuple(Request(r.length, 1) for r in batch.requests))
        inputs = [tokens[j, :, step] for j in range(len(ranks))]
    return tokens, margins, bounds, finite


@dataclass(frozen=True)
class StreamDigests:
    """SHA256 digests of one rank's streams at one DCP size."""

    dcp_size: int
    rank: int
    requests: tuple[str, ...]
    stream: str


@dataclass(frozen=True)
class Divergence:
    """The first token where a run left the DCP1 stream.

    ``baseline_margin`` is the DCP1 run's top-2 margin at that step and ``bound`` its
    :func:`margin_bound`, how far the arithmetic of another DCP size can move it: a margin
    within the bound is a near-tie (rounding can flip it), wider means a genuine
    difference. ``margin`` is the diverging run's own margin there (NaN when its logits
    were NaN) and ``finite`` whether its logit row there was free of NaN and inf; rounding
    never makes NaN or inf, so a non-finite row is genuine whatever the margins.
    """

    dcp_size: int
    rank: int
    request: int
    step: int
    baseline_token: int
    token: int
    baseline_margin: float
    margin: float
    bound: float
    finite: bool

    @property
    def near_tie(self) -> bool:
        return self.finite and self.baseline_margin <= self.bound

    def describe(self) -> str:
        verdict = "near-tie" if self.near_tie else "genuine divergence"
        logits = "" if self.finite else " with non-finite logits"
        return (
            f"DCP{self.dcp_size} rank {self.rank}, request {self.request}, step {self.step}: "
            f"token {self.token} where DCP1 chose {self.baseline_token} (DCP1 top-2 margin "
            f"{self.baseline_margin:.4g}, rounding bound {self.bound:.3g}, here "
            f"{self.margin:.4g}{logits}): {verdict}"
        )


@dataclass(frozen=True)
class StreamComparison:
    """Digests of every (DCP size, rank) run and where the first one left DCP1."""

    config: StreamConfig
    runs: tuple[Streams, ...]  # DCP1 first, then the other sizes in increasing order
    digests: tuple[StreamDigests, ...]  # every rank of every run, in the order of runs
    first_divergence: Divergence | None

    @property
    def identical(self) -> bool:
        """Every rank of every DCP size hashed to the DCP1 stream."""
        baseline = self.digests[0].stream
        return all(d.stream == baseline for d in self.digests)

    @property
    def min_baseline_margin(self) -> float:
        """The narrowest top-2 margin of the DCP1 run."""
        return float(self.runs[0].margins.min())

    @property
    def min_baseline_clearance(self) -> float:
        """The smallest ratio of a DCP1 step's top-2 margin to its bound: how close the run
        came to a near-tie (above 1 at every step: no divergence can be excused)."""
        baseline = self.runs[0]
        return float((baseline.margins[0] / baseline.bounds[0]).min())


def _first_divergence(baseline: Streams, runs: Sequence[Streams]) -> Divergence | None:
    """The earliest step at which any rank of any run differs from DCP1 rank 0; ties go to
    the smaller DCP size, then rank, then request."""
    found: list[Divergence] = []
    reference_tokens = baseline.tokens[0]
    for run in runs:
        for rank in range(run.dcp_size):
            differs = run.tokens[rank] != reference_tokens  # [R, steps]
            for request, row in enumerate(differs):
                steps = torch.nonzero(row).flatten()
                if not len(steps):
                    continue
                step = int(steps[0])
                found.append(
                    Divergence(
                        dcp_size=run.dcp_size,
                        rank=rank,
                        request=request,
                        step=step,
                        baseline_token=int(reference_tokens[request, step]),
                        token=int(run.tokens[rank, request, step]),
                        baseline_margin=float(baseline.margins[0, request, step]),
                        margin=float(run.margins[rank, request, step]),
                        bound=float(baseline.bounds[0, request, step]),
                        finite=bool(run.finite[rank, request, step]),
                    )
                )
    return min(found, key=lambda d: (d.step, d.dcp_size, d.rank, d.request), default=None)


def check_sizes(config: StreamConfig, dcp_sizes: Sequence[int]) -> None:
    """``ValueError`` for a DCP size that is no integer >= 1, ``ChainError`` for one whose
    ranks cannot share the model's heads (``chain.check_heads_shared``): what a generation
    at ``dcp_sizes`` would otherwise find only once the DCP1 streams are generated."""
    if any(not isinstance(n, int) or n < 1 for n in dcp_sizes):
        raise ValueError(f"DCP sizes must be integers >= 1, got {list(dcp_sizes)}")
    for size in dcp_sizes:
        check_heads_shared(WIDTHS_BY_PRESET[config.preset].heads, size)


def compare_streams(
    kernel: OpKernel,
    config: StreamConfig,
    dcp_sizes: Sequence[int],
    device: torch.device,
    stages: Stages | None = None,
) -> StreamComparison:
    """Generate at DCP1 and at each of ``dcp_sizes`` (DCP1 is always run, as the
    baseline) and compare the token streams by digest, with one model for all of them;
    decode steps run through ``stages`` (the project's kernels when None), with its
    default merge path (:func:`compare_paths` runs every one). Sizes the chain cannot run
    are refused before any run (:func:`check_sizes`)."""
    [default] = compare_paths(kernel, config, dcp_sizes, device, stages, every_merge=False)
    assert default.comparison is not None  # the default path's kernels raise, not record
    return default.comparison


@dataclass(frozen=True)
class PathStreams:
    """The streams through one merge path of the chain against DCP1 (``comparison``), or
    what a kernel of that path raised (``error``)."""

    merge: Stage
    comparison: StreamComparison | None
    error: str | None = None

    @property
    def identical(self) -> bool:
        return self.comparison is not None and self.comparison.identical


def compare_paths(
    kernel: OpKernel,
    config: StreamConfig,
    dcp_sizes: Sequence[int],
    device: torch.device,
    stages: Stages | None = None,
    every_merge: bool = True,
) -> tuple[PathStreams, ...]:
    """:func:`compare_streams` through each merge path of ``stages``
    (``chain.Stages.by_merge``), the default's first; only the default's unless
    ``every_merge``. DCP1 merges nothing, so its run is generated once and is every
    comparison's baseline. What a kernel raises on the default path propagates, as in
    :func:`compare_streams`; on another path it is that path's verdict, so the others are
    still judged (a ``ChainError``, a step the chain cannot ask, always propagates)."""
    check_sizes(config, dcp_sizes)
    sizes = sorted(set(dcp_sizes) - {BASELINE_DCP_SIZE})
    model = build_model(config, device)
    stages = stages if stages is not None else default_stages()
    chains = stages.by_merge() if every_merge else stages.by_merge()[:1]
    baseline = _generate(kernel, model, config, BASELINE_DCP_SIZE, stages)

    def through(chain: Stages) -> StreamComparison:
        runs = [_generate(kernel, model, config, n, chain) for n in sizes]
        return compare_runs(config, [baseline, *runs])

    judged = [PathStreams(chains[0].merge, through(chains[0]))]
    for chain in chains[1:]:
        try:
            judged.append(PathStreams(chain.merge, through(chain)))
        except ChainError:
            raise
        except Exception as exc:  # the path's kernel raised inside the model
            judged.append(PathStreams(chain.merge, None, raised_line(exc)))
    return tuple(judged)


def raised_line(exc: BaseException) -> str:
    """What a kernel raised, in one line: its type and its message's last line, where a
    compiler's message ends (Triton's ``CompilationError`` begins with the source position
    and the lines around it, which follow in brackets, the position alone)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if len(lines) <= 1:
        return f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    return f"{type(exc).__name__}: {lines[-1]} ({lines[0].rstrip(':')})"


def compare_runs(config: StreamConfig, runs: Sequence[Streams]) -> StreamComparison:
    """Digests of ``runs`` (the DCP1 run first, then increasing sizes) and where the first
    one left the DCP1 stream, however the runs were generated (simulated or real ranks)."""
    digests = tuple(
        StreamDigests(run.dcp_size, rank, run.request_digests(rank), run.stream_digest(rank))
        for run in runs
        for rank in range(run.dcp_size)
    )
    return StreamComparison(config, tuple(runs), digests, _first_divergence(runs[0], runs[1:]))
