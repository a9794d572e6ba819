"""vLLM's ``merge_attn_states`` (its Triton kernel), release by release, under the op's
protocol: the merge of two partial attentions by their LSE, which MLA's prefill folds over
the chunks of a request's context.

Its file: ``vllm/attention/ops/triton_merge_attn_states.py`` (0.10.2 - 0.13.x), later
``vllm/v1/attention/ops/triton_merge_attn_states.py``; it imports only torch, Triton and
vLLM's platform query (its fp8 limits, from 0.20.0), which the stand-ins answer, so it
loads as a file. Its dispatcher (``merge_attn_states.py`` beside it) runs vLLM's compiled
CUDA kernel instead on CUDA for fp32, fp16 and bf16 outputs whose head dim is a multiple
of 8 (4 for fp32); the Triton kernel runs on ROCm and for the other dtypes and head dims.
dcpcheck judges the Triton kernel: the CUDA one ships compiled.

**How its DCP caller uses it.** Under DCP the MLA prefill with a cached context
(``_context_parallel_compute_prefill_context``) all-gathers the context's cache entries,
attends over it chunk by chunk, and folds the chunks' partials into one with
``merge_attn_states(output=tmp, output_lse=tmp_lse, prefix_output=running,
prefix_lse=running_lse, suffix_output=chunk, suffix_lse=chunk_lse)``, the first chunk's
partial being the running one. The fold does not care how the context was cut: rank
``r``'s partial here stands for chunk ``r``. So the adapter all-gathers the ranks'
partials (the collectives are its own, not the routine's), keeps the rank's heads of each,
and folds them in rank order exactly so, the LSEs laid out ``[heads, rows]`` as the
prefill backends return them.

What its callers do to a chunk that holds nothing of a request changed, and the adapter
does what each release's caller does (``EMPTIES``):

* to 0.25.x, nothing: the chunk's rows reach the merge as the backend left them (vLLM's
  own later docstring: "uninitialized scratch (which may hold NaN/Inf) even when it
  reports an LSE of -inf"). The caller does hand it such chunks (a request shorter than
  a chunk's start has a length of 0 there, and the chunk is merged whole), but what the
  rows hold is a compiled prefill backend's, and on CUDA the dispatcher runs the compiled
  CUDA merge on MLA's rows instead: a NaN there is the routine's finding alone, reached
  by no traced path (README, "vLLM's merges, release by release", has the lines);
* 0.26.0 - 0.27.x, the release's ``mask_empty_context`` (in the same file) on every chunk
  with an empty request, given the chunk's per-request context offsets: LSE ``-inf`` and
  output zeros for those rows;
* from 0.28.0 a chunk covers only requests it holds context of, and a request that no
  chunk covers is set to a zero output and an LSE of ``-inf``
  (``neutralize_empty_context_partials`` in ``mla_attention.py``): the adapter zeroes and
  sets to ``-inf`` the rows of every request the rank holds nothing of, which merges as
  leaving them out.

The callers know each chunk's context offsets always, so a case whose caller passes no
lengths is not applicable. So is a case with a row that sees none of a rank's positions
while its request has some there (a speculative decode row near the start of a short
context): the chunks are attended without a causal mask, every query row of a request
sees a chunk whole, so its callers never hand it such a row. DCP1 is not applicable: one
partial is nothing to merge.

The routine cannot be told an LSE's base: it merges by ``tl.exp`` and ``tl.log``, natural
LSEs, and its callers are the ones to hand it natural LSEs (unlike ``cp_lse_ag_out_rs``,
which grew ``is_lse_base_on_e`` when a base-2 LSE reached it). So a base-2 case is not
applicable to it. Whether its callers convert is a fact of theirs, read in their source
(README, "vLLM's merges, release by release"): from 0.30.0 the FlashInfer and TRT-LLM
ragged prefills convert FlashInfer's base-2 LSE with ``log2_lse_to_ln``; before, they
handed it on as the library returned it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from dcpcheck.adapters.protocol import AdapterError
from dcpcheck.kernels import loading, releases
from dcpcheck.kernels.loading import KernelLoadError
from dcpcheck.ops.lse_combine.case import Askable, CombineBatch
from dcpcheck.ops.lse_combine.contract import CombineInputs, Merged
from reference import lse_combine as oracle

MEMBERS = (
    "vllm/attention/ops/triton_merge_attn_states.py",
    "vllm/v1/attention/ops/triton_merge_attn_states.py",
)
"""The files ``merge_attn_states`` lived in, oldest first."""

FUNCTION = "merge_attn_states"
MASK_FUNCTION = "mask_empty_context"

PARAMETERS = ("output", "prefix_output", "prefix_lse", "suffix_output", "suffix_lse", "output_lse")
"""The parameters its callers fill, in every release (later ones add optional ones)."""

EMPTIES = ("merged as left", "masked by the release", "neutralized by the caller")
"""What a release's callers do to an empty chunk's rows (module docstring), in order."""

LEFT, MASKED, NEUTRALIZED = EMPTIES

CALLERS_ASK = Askable(base_2=False, unmasked=False, speculative=False, dcp1=False)
"""What its callers ask of it (``VllmStateMerge.not_applicable``)."""

NEUTRALIZED_FROM = "0.28.0"
"""The first release whose caller never merges an empty chunk's rows."""


@dataclass(frozen=True)
class VllmStateMerge:
    """A release's ``merge_attn_states`` folded over the ranks' partials (module
    docstring)."""

    routine: Callable[..., None]
    name: str
    empties: str
    mask: Callable[..., None] | None = None
    """The release's ``mask_empty_context``, where its callers run it."""
    function: str = FUNCTION
    askable: Askable = CALLERS_ASK
    """What its callers ask (``not_applicable``), which the property search draws."""

    def __post_init__(self) -> None:
        parameters = tuple(inspect.signature(self.routine).parameters)
        if parameters[: len(PARAMETERS)] != PARAMETERS:
            raise AdapterError(
                f"{self.name}: {self.function} takes ({', '.join(parameters)}), not the "
                f"({', '.join(PARAMETERS)}, ...) its callers fill"
            )
        if self.empties not in EMPTIES or (self.empties == MASKED) != (self.mask is not None):
            raise AdapterError(f"{self.name}: empties {self.empties!r} and the mask disagree")

    def not_applicable(self, asked: tuple[CombineBatch, int]) -> str | None:
        """Why the fold cannot be asked this case (module docstring), or None."""
        batch, size = asked
        if size == 1:
            return f"{self.function} merges two partials; at DCP1 there is one"
        if not batch.base_e:
            return (
                f"{self.name}'s {self.function} cannot be told an LSE's base: it merges "
                "natural ones, which its callers are to hand it"
            )
        if not batch.masked:
            return (
                f"the callers of {self.name}'s {self.function} always know each chunk's "
                "context lengths"
            )
        if _partly_seen(batch, size):
            return (
                f"a row sees none of a rank's positions of its request; the callers of "
                f"{self.name}'s {self.function} merge chunks every row of a request sees whole"
            )
        return None

    def __call__(self, inputs: CombineInputs) -> Merged:
        assert inputs.seq_lens is not None and inputs.query_start_loc is not None
        group = inputs.group
        heads = slice(
            group.rank_in_group * inputs.heads_per_rank,
            (group.rank_in_group + 1) * inputs.heads_per_rank,
        )
        outs = group.all_gather(inputs.partial_out.unsqueeze(0), dim=0)[:, :, heads]
        lses = group.all_gather(inputs.partial_lse.unsqueeze(0), dim=0)[:, :, heads]
        lengths = group.all_gather(inputs.seq_lens.unsqueeze(0), dim=0)
        running_out = running_lse = None
        for chunk in range(group.world_size):
            out = outs[chunk].contiguous()
            lse = lses[chunk].t().contiguous()  # [heads, rows], as the backends return it
            self._empties(out, lse, lengths[chunk], inputs.query_start_loc)
            if running_out is None:
                running_out, running_lse = out, lse
                continue
            merged_out, merged_lse = torch.empty_like(running_out), torch.empty_like(lse)
            self.routine(
                output=merged_out,
                prefix_output=running_out,
                prefix_lse=running_lse,
                suffix_output=out,
                suffix_lse=lse,
                output_lse=merged_lse,
            )
            running_out, running_lse = merged_out, merged_lse
        assert running_out is not None and running_lse is not None
        return Merged(running_out, running_lse.t().contiguous() if inputs.return_lse else None)

    def _empties(
        self, out: torch.Tensor, lse: torch.Tensor, lengths: torch.Tensor, starts: torch.Tensor
    ) -> None:
        """Do to one chunk's partial what the release's caller does to its empty requests
        (module docstring), in place."""
        if self.empties == LEFT:
            return
        offsets = torch.zeros(len(lengths) + 1, dtype=torch.int32, device=lengths.device)
        offsets[1:] = torch.cumsum(lengths, 0)
        if self.mask is not None:
            if bool((lengths == 0).any()):  # the caller's has_empty_context
                self.mask(lse, out, starts, offsets)
            return
        for request in torch.nonzero(lengths == 0).flatten().tolist():
            rows = slice(int(starts[request]), int(starts[request + 1]))
            out[rows] = 0
            lse[:, rows] = float("-inf")


def _partly_seen(batch: CombineBatch, size: int) -> bool:
    """Whether a row of ``batch`` at DCP ``size`` sees none of the positions some rank
    holds of its request (module docstring)."""
    for context, rows in batch.requests:
        owners = oracle.owner_of(torch.arange(context), size, batch.interleave)
        holding = set(owners.tolist())
        seen = owners[: oracle.visible(context, rows, 0)]  # the first row sees the least
        if holding - set(seen.tolist()):
            return True
    return False


def load(path: Path, version: str, name: str) -> VllmStateMerge:
    """Release ``version``'s (``name``'s) ``merge_attn_states`` from ``path`` under the
    op's protocol; ``KernelLoadError`` with one line."""
    module = loading.load_file(path)
    routine = getattr(module, FUNCTION, None)
    if not callable(routine):
        raise KernelLoadError(f"{name}: {path} has no {FUNCTION}")
    mask = getattr(module, MASK_FUNCTION, None)
    if mask is not None:
        empties = MASKED
    elif releases.version_key(version) >= releases.version_key(NEUTRALIZED_FROM):
        empties = NEUTRALIZED
    else:
        empties = LEFT
    try:
        return VllmStateMerge(routine, name, empties, mask)
    except AdapterError as exc:
        raise KernelLoadError(str(exc)) from None
