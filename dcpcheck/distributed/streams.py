"""Token streams on real ranks: decode attention merged across processes by all-gather.

``dcpcheck.e2e.token_streams`` simulates every DCP rank of the tiny MLA model in one process.
Here each process of a :class:`dcpcheck.distributed.RankGroup` is one rank: it runs the
kernel under test with its own slot mapping and its own caches, attends over its own cache
shard, and all-gathers every rank's partial outputs and log-sum-exps
(:class:`AllGatherExchange`); each rank then merges them in rank order, as a simulated rank
does. Collectives move the fp32 partials bit for bit, so every rank computes exactly what it
computes when simulated: token streams, digests and the first divergence are identical to
the simulated mode's (checked by ``tests/test_distributed.py``).

Rank 0 runs the DCP1 baseline alone (one rank needs no collective), gathers the tokens,
top-2 margins, their bounds and finite flags of every rank and compares them with
``token_streams.compare_runs``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, TypeVar

import torch

from dcpcheck import __version__
from dcpcheck.cases.collectives import Group, TorchGroup
from dcpcheck.cases.verdicts import CaseResult, KernelError, RunConfig
from dcpcheck.e2e.attention import PartialAttention
from dcpcheck.e2e.chain import Stages, default_stages
from dcpcheck.e2e.mla_model import InProcessExchange
from dcpcheck.e2e.stream_case import token_stream_verdict
from dcpcheck.e2e.token_streams import (
    BASELINE_DCP_SIZE,
    StreamComparison,
    StreamConfig,
    Streams,
    build_model,
    compare_runs,
    generate_ranks,
    stream_config_for,
)
from dcpcheck.kernels.loading import JudgedFile
from dcpcheck.ops import OpKernel

if TYPE_CHECKING:
    from dcpcheck.distributed import RankGroup

T = TypeVar("T")


class AllGatherExchange:
    """The :class:`dcpcheck.e2e.mla_model.ShardExchange` of one real rank per process."""

    def __init__(self, group: RankGroup) -> None:
        self.group = group

    @property
    def local_ranks(self) -> Sequence[int]:
        return (self.group.rank,)

    def gather(
        self, partials: Sequence[Sequence[PartialAttention]]
    ) -> list[list[PartialAttention]]:
        """All-gather this rank's partials of every request, ``[request][rank]``.

        Every rank has the same requests with the same query rows, so the partials of all
        requests travel as one output tensor and one LSE tensor per rank, split back by rows.
        """
        (own,) = partials
        rows = [partial.lse.shape[0] for partial in own]
        outputs = self.group.all_gather(
            torch.cat([p.output for p in own]), "the all-gather of attention outputs"
        )
        lses = self.group.all_gather(
            torch.cat([p.lse for p in own]), "the all-gather of attention LSEs"
        )
        per_rank = [
            list(zip(output.split(rows), lse.split(rows), strict=True))
            for output, lse in zip(outputs, lses, strict=True)
        ]
        return [
            [PartialAttention(*per_rank[rank][request]) for rank in range(self.group.world_size)]
            for request in range(len(own))
        ]

    def run_group(self, work: Callable[[Group, int], T]) -> list[T]:
        """``work`` on this process's rank, meeting the other processes in the default
        process group's collectives (``TorchGroup``)."""
        return [work(TorchGroup(), 0)]


class ErrorRecordingKernel:
    """The kernel under test with its first exception recorded instead of raised.

    A rank whose kernel raises must still join every all-gather of the generation, or the
    other ranks would wait for it until the rank timeout; its outputs stay NaN-poisoned, and
    rank 0 reports the recorded error once the streams are gathered.
    """

    def __init__(self, kernel: OpKernel) -> None:
        self.kernel = kernel
        self.error: str | None = None

    def __call__(self, *args: object) -> None:
        try:
            self.kernel(*args)
        except Exception as exc:  # any exception of the kernel under test is its failure
            if self.error is None:
                self.error = f"{type(exc).__name__}: {exc}"


def compare_streams_distributed(
    kernel: OpKernel, config: StreamConfig, group: RankGroup, stages: Stages | None = None
) -> StreamComparison | None:
    """On rank 0: the DCP1 run and the DCP-``world size`` run of the group's ranks, compared
    as ``token_streams.compare_streams`` compares simulated ones. ``None`` on other ranks.

    Raises ``KernelError`` on rank 0 when the kernel raised: in the DCP1 run first (the
    simulated mode's order), else on the lowest rank that raised.
    """
    model = build_model(config, group.backend.device)
    recording = ErrorRecordingKernel(kernel)
    group.progress.working("generating token streams")
    stages = stages if stages is not None else default_stages()
    recorded = generate_ranks(
        recording, model, config, AllGatherExchange(group), group.world_size, stages
    )
    gathered = group.gather_to_root(
        (recorded, recording.error), "the gathering of token streams on rank 0"
    )
    if gathered is None:
        return None
    group.progress.working("generating the DCP1 token streams")
    runs = [
        Streams(
            group.world_size,
            *(torch.cat(field) for field in zip(*(rank for rank, _ in gathered), strict=True)),
        )
    ]
    if group.world_size != BASELINE_DCP_SIZE:
        try:
            baseline = generate_ranks(
                kernel,
                model,
                config,
                InProcessExchange(BASELINE_DCP_SIZE),
                BASELINE_DCP_SIZE,
                stages,
            )
        except Exception as exc:  # the kernel under test raised in the DCP1 run
            raise KernelError(f"{type(exc).__name__}: {exc}") from exc
        runs.insert(0, Streams(BASELINE_DCP_SIZE, *baseline))
    errors = [f"rank {rank}: {error}" for rank, (_, error) in enumerate(gathered) if error]
    if errors:
        raise KernelError(errors[0])
    return compare_runs(config, runs)


def token_stream_case_on_ranks(
    kernel: OpKernel, config: RunConfig, group: RankGroup
) -> CaseResult | None:
    """``stream_case.token_stream_case`` on real ranks: the tiny model's greedy streams at DCP1
    and at the world size must hash identically. The result on rank 0, ``None`` elsewhere."""
    stream_config = stream_config_for(group.backend)
    return token_stream_verdict(
        config,
        group.world_size,
        lambda: compare_streams_distributed(kernel, stream_config, group),
    )


def streams_to_json(
    comparison: StreamComparison,
    *,
    kernel: str,
    backend: str,
    kernel_files: Sequence[JudgedFile] = (),
    chain: dict | None = None,
) -> str:
    """Every digest of a comparison, in full, and its verdict (``hash --json`` of a real-rank
    run); deterministic like ``dcpcheck.output.report``: sorted keys, no times; the
    kernel's files with their SHA256 as the run reports name them; the chain's stages."""
    c = comparison.config
    divergence = comparison.first_divergence
    doc = {
        "dcpcheck": __version__,
        "kernel": kernel,
        "kernel_files": [asdict(f) for f in kernel_files],
        "chain": chain,
        "backend": backend,
        "model": {
            "preset": c.preset,
            "layers": c.layers,
            "cache_layout": c.cache_layout,
            "prompts": c.prompts,
            "steps": c.steps,
            "seed": c.seed,
        },
        "identical": comparison.identical,
        "digests": [asdict(d) for d in comparison.digests],
        "first_divergence": None if divergence is None else asdict(divergence),
    }
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"
