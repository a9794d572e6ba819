"""The local sequence lengths of a case of the op: every rank's inputs, its launch into a
poisoned, guarded buffer, and the checks, each a small function returning a
``CheckResult``:

* ``local_seq_lens``: every rank's length of every request is the oracle's
  (``reference.slot_mapping.local_seq_lens``), exactly;
* ``seq_lens_sum``: a request's lengths over the ranks add up to its length, the
  partition attention relies on, stated without the oracle;
* ``seq_lens_padding``: every padded request's length is 0 on every rank;
* ``seq_lens_guard``: nothing past the last request is written, and the input is left as
  it was.

A case's requests are the batch's, each as long as its cached tokens plus its new ones;
the batch's padding rows stand for as many padded requests (a CUDA graph captured for N
tokens runs up to N requests), whose input entries hold :data:`UNTRUSTED_LENGTH`, so a
kernel that reads them instead of writing 0 is seen.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from dcpcheck.cases.verdicts import CheckResult, Finding
from dcpcheck.ops.slot_mapping.case import SlotMappingBatch
from dcpcheck.ops.slot_mapping.contract import LocalSeqLensInputs, LocalSeqLensKernel
from reference import slot_mapping as oracle

POISON = -7_777_777
"""Every output entry before a launch (a length is never negative)."""

GUARD_ENTRIES = 16
"""Entries after ``max_num_reqs`` in every output buffer, which no launch may write."""

UNTRUSTED_LENGTH = 1_000_003
"""The input length of a padded request: what the kernel must not turn into a length."""

CHECKS = ("local_seq_lens", "seq_lens_sum", "seq_lens_padding", "seq_lens_guard")
"""The checks of this module, in the order reports list them."""


@dataclass(frozen=True)
class SeqLensCase:
    """Every rank's inputs at one DCP size, and what each launch left (``launch_all``)."""

    lengths: tuple[int, ...]  # of the requests
    ranks: tuple[LocalSeqLensInputs, ...]
    buffers: tuple[torch.Tensor, ...] = ()  # per rank: [max_num_reqs + GUARD_ENTRIES]

    @property
    def num_reqs(self) -> int:
        return len(self.lengths)

    def outputs(self, rank: int) -> torch.Tensor:
        return self.buffers[rank][: self.ranks[rank].max_num_reqs]


def build_case(batch: SlotMappingBatch, dcp_size: int, device: torch.device) -> SeqLensCase:
    """Every rank's inputs for ``batch`` at ``dcp_size`` (module docstring)."""
    lengths = tuple(cached + new for cached, new in batch.requests)
    entries = [*lengths, *[UNTRUSTED_LENGTH] * batch.padding]
    shared = LocalSeqLensInputs(
        seq_lens=torch.tensor(entries, dtype=torch.int32, device=device),
        num_reqs=len(lengths),
        dcp_size=dcp_size,
        dcp_rank=0,
        interleave=batch.interleave,
    )
    ranks = tuple(replace(shared, dcp_rank=rank) for rank in range(dcp_size))
    return SeqLensCase(lengths, ranks)


def launch_all(kernel: LocalSeqLensKernel, case: SeqLensCase) -> SeqLensCase:
    """Launch ``kernel`` on every rank, each into its own poisoned, guarded buffer."""
    buffers = []
    for inputs in case.ranks:
        device = inputs.seq_lens.device
        size = inputs.max_num_reqs + GUARD_ENTRIES
        buffer = torch.full((size,), POISON, dtype=torch.int32, device=device)
        kernel(inputs, buffer[: inputs.max_num_reqs])
        buffers.append(buffer)
    return replace(case, buffers=tuple(buffers))


def _finding(rank: int | None, bad: torch.Tensor, detail: str) -> Finding:
    requests = bad.nonzero().flatten().tolist()
    return Finding(
        field="local_seq_lens",
        rank=rank,
        detail=f"{len(requests)} {detail}",
        token=requests[0],
        count=len(requests),
    )


def check_lengths(case: SeqLensCase) -> CheckResult:
    """Every rank's length of every request equals the oracle's."""
    findings = []
    lengths = torch.tensor(case.lengths, dtype=torch.int32)
    for rank, inputs in enumerate(case.ranks):
        got = case.outputs(rank).cpu()[: case.num_reqs]
        expected = oracle.local_seq_lens(lengths, inputs.dcp_size, rank, inputs.interleave)
        bad = got != expected
        if bad.any():
            unwritten = bool((got[bad] == POISON).all())
            why = "never written" if unwritten else "differ from the oracle's"
            findings.append(_finding(rank, bad, f"request(s)' lengths {why}"))
    return CheckResult("local_seq_lens", tuple(findings))


def check_sum(case: SeqLensCase) -> CheckResult:
    """A request's lengths over the ranks add up to its length."""
    lengths = torch.tensor(case.lengths, dtype=torch.int64)
    per_rank = torch.stack([case.outputs(r).cpu()[: case.num_reqs] for r in range(len(case.ranks))])
    bad = per_rank.to(torch.int64).sum(dim=0) != lengths
    if not bad.any():
        return CheckResult("seq_lens_sum")
    return CheckResult(
        "seq_lens_sum", (_finding(None, bad, "request(s)' lengths over the ranks do not sum"),)
    )


def check_padding(case: SeqLensCase) -> CheckResult:
    """Every padded request's length is 0 on every rank."""
    findings = []
    for rank in range(len(case.ranks)):
        padded = case.outputs(rank).cpu()[case.num_reqs :]
        bad = padded != 0
        if bad.any():
            where = torch.cat([torch.zeros(case.num_reqs, dtype=torch.bool), bad])
            findings.append(_finding(rank, where, "padded request(s) have a length, not 0"))
    return CheckResult("seq_lens_padding", tuple(findings))


def check_guard(case: SeqLensCase, before: tuple[torch.Tensor, ...]) -> CheckResult:
    """Nothing written past the last request; the input as it was (``before``: copies)."""
    findings = []
    for rank, (inputs, kept) in enumerate(zip(case.ranks, before, strict=True)):
        guard = case.buffers[rank][inputs.max_num_reqs :].cpu()
        written = int((guard != POISON).sum())
        if written:
            detail = f"{written} length(s) written past the last request"
            findings.append(Finding("local_seq_lens", rank, detail, count=written))
        if not torch.equal(inputs.seq_lens.cpu(), kept.cpu()):
            findings.append(Finding(field="seq_lens", rank=rank, detail="an input was modified"))
    return CheckResult("seq_lens_guard", tuple(findings))


def judge(kernel: LocalSeqLensKernel, case: SeqLensCase) -> tuple[CheckResult, ...]:
    """Launch ``kernel`` on every rank of ``case`` and run every check of this module."""
    before = tuple(inputs.seq_lens.clone() for inputs in case.ranks)
    launched = launch_all(kernel, case)
    return (
        check_lengths(launched),
        check_sum(launched),
        check_padding(launched),
        check_guard(launched, before),
    )


def skipped(reason: str) -> tuple[CheckResult, ...]:
    """Every check of this module, skipped for ``reason`` (reported, never passed)."""
    return tuple(CheckResult(name, skipped=reason) for name in CHECKS)
