"""vLLM's converters of top-k picks to cache slots, release by release, under the op's
protocol, called as the release's sparse MLA backends call them.

The converters: ``triton_convert_req_index_to_global_index`` (0.11.0 on; in
``vllm/v1/attention/backends/mla/flashmla_sparse.py``, from 0.17.0 in
``sparse_utils.py`` beside it), which knows DCP only from 0.30.0 (``dcp_size``,
``dcp_rank``, ``cp_kv_cache_interleave_size``), and ``triton_filter_and_convert_dcp_index``
(0.25.0 on, ``sparse_utils.py``), which keeps a rank's own picks. Each is taken alone from
its file with what it needs of the file (``loading.definitions_alone``); from 0.30.0 its
kernel lives in a warm-up class whose launcher ``dcpcheck.adapters.shims.vllm.jit_warmup``
stands in for, and the names only its warm-up reads (``cdiv``, ``get_block_table_width``,
``get_dcp_group``) refuse to be called.

**Who calls them under DCP.** A release runs a sparse backend under DCP only if its impl
returns its LSE for decode: the start-up check refuses every other
(``gpu_model_runner.py:4007`` in 0.11.0, ``worker/cp_utils.py:31`` from 0.17.0). Read in
each release (``DCP_CALLERS``): none before 0.25.0; FlashInfer's sparse MLA from 0.25.0,
which calls the filter with its counts, packed (``flashinfer_mla_sparse.py:451`` in 0.25.0,
``sparse_mla_attention.py:756`` in 0.33.0); FlashMLA's sparse from 0.29.0, on its fp8
mixed-batch path only (it refuses the others under DCP), which calls the filter in place,
without counts (``flashmla_sparse.py:794`` in 0.29.0, ``:1222`` in 0.33.0). Both pass the
rows' request ids, the rank's block table, the picks, the DCP size, rank and interleave,
the block size and the top-k width. Not judged here: the prefill workspace offsets that
0.30.0's FlashMLA computes with the converter under PCP and DCP (offsets into a gathered
workspace, not cache slots), and ROCm's own converter (``rocm_aiter_mla_sparse.py``).

``vllm==X`` judges what the release's callers call: at DCP1 the converter (every
backend's non-DCP path; the filter is called only under DCP), under DCP the filter as a
caller calls it. A case its callers never ask is not applicable, with the reason: DCP
where no sparse backend runs under it, a packing and counting no caller asks, a top-k that
is not a multiple of the converters' column tile (128: their callers pass the model's
``index_topk``, 2048 for DeepSeek V3.2). ``vllm==X:FUNCTION`` judges one converter alone
with whatever its API can be asked, reachable or not: ``triton_convert_req_index_to_global_index``
under DCP before 0.30.0 is the converter that does not know DCP.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import triton
import triton.language as tl

from dcpcheck.adapters.protocol import AdapterError
from dcpcheck.adapters.shims.vllm import jit_warmup
from dcpcheck.kernels import releases
from dcpcheck.kernels.loading import definitions_alone
from dcpcheck.op_registry import OPS, SPARSE_TOPK_REMAP
from dcpcheck.ops.sparse_topk_remap.contract import RemapInputs

CONVERT = "triton_convert_req_index_to_global_index"
FILTER = "triton_filter_and_convert_dcp_index"
FUNCTIONS = (CONVERT, FILTER)

MEMBERS = OPS[SPARSE_TOPK_REMAP].wheel_members
"""The files the converters lived in, oldest first."""

COLUMN_TILE = 128
"""The converters' default ``BLOCK_N``, which every caller leaves: the top-k width must be
a multiple of it (their own assertion)."""


@dataclass(frozen=True)
class DcpCaller:
    """A sparse backend that runs under DCP, and how it calls the filter there."""

    backend: str
    since: str
    compact: bool
    count: bool
    where: str


DCP_CALLERS = (
    DcpCaller("FlashInfer sparse MLA", "0.25.0", True, True, "flashinfer_mla_sparse.py:451"),
    DcpCaller(
        "FlashMLA sparse (fp8, mixed batch)", "0.29.0", False, False, "flashmla_sparse.py:794"
    ),
)
"""Read in every release (module docstring); ``where`` is the call in the first release."""


def dcp_callers(version: str) -> tuple[DcpCaller, ...]:
    """The sparse backends release ``version`` runs under DCP."""
    key = releases.version_key(version)
    return tuple(c for c in DCP_CALLERS if key >= releases.version_key(c.since))


def _warmup_only(name: str) -> Callable[..., object]:
    def refuse(*args: object, **kwargs: object) -> object:
        raise RuntimeError(f"{name}: only vLLM's warm-up calls it, and the harness warms nothing")

    return refuse


WARMUP_ONLY = ("cdiv", "get_block_table_width", "get_dcp_group")
"""Names of vLLM's that only the converters' warm-up class reads (from 0.30.0)."""


def function_of(path: Path, function: str, where: str) -> Callable[..., object]:
    """Release file ``path``'s ``function`` taken alone (module docstring)."""
    provided: dict[str, object] = {
        "torch": torch,
        "triton": triton,
        "tl": tl,
        "dataclass": dataclass,
        "replace": replace,
        **{name: getattr(jit_warmup, name) for name in jit_warmup.STANDS_IN_FOR},
        **{name: _warmup_only(name) for name in WARMUP_ONLY},
    }
    return definitions_alone(path, function, provided, where)[function]  # type: ignore[return-value]


@functools.cache
def _parameters(function: Callable[..., object]) -> tuple[str, ...]:
    """A converter's parameters, read once: every case asks them."""
    return tuple(inspect.signature(function).parameters)


@dataclass(frozen=True)
class VllmRemap:
    """A release's converters under the op's protocol (module docstring). ``named``: the
    function a ``vllm==X:FUNCTION`` spec judges alone (None: as the callers call them)."""

    convert: Callable[..., object]
    filter: Callable[..., object] | None
    name: str
    version: str
    named: str | None = None
    topk_multiple: int = COLUMN_TILE
    """The top-k widths its API takes are multiples of this (the property search draws
    only those)."""

    def __post_init__(self) -> None:
        for function in (self.convert, self.filter):
            if function is None:
                continue
            parameters = _parameters(function)
            if parameters[:3] != ("req_id", "block_table", "token_indices"):
                raise AdapterError(
                    f"{self.name}: {function.__name__} takes ({', '.join(parameters)}), not the "
                    "(req_id, block_table, token_indices, ...) the adapter knows"
                )

    def _routine(self, size: int) -> Callable[..., object]:
        """The converter a case at DCP ``size`` calls (module docstring)."""
        if self.named == FILTER or (self.named is None and size > 1):
            assert self.filter is not None
            return self.filter
        return self.convert

    def not_applicable(self, inputs: RemapInputs) -> str | None:
        """Why the case cannot be asked (module docstring), or None."""
        size, topk = inputs.dcp_size, inputs.topk
        compact, count = inputs.compact, inputs.count_valid
        if topk % self.topk_multiple:
            return (
                f"{self.name}'s converters take a top-k that is a multiple of "
                f"{self.topk_multiple}; "
                "their callers pass the model's index_topk (2048)"
            )
        if self.named == FILTER and size == 1:
            return f"{self.name}'s callers call {FILTER} only under DCP"
        if self.named is None and size > 1:
            callers = dcp_callers(self.version)
            if not callers:
                return (
                    f"{self.name} runs no sparse MLA backend under DCP: none returns its LSE "
                    "for decode, which its start-up check asks"
                )
            if not any((c.compact, c.count) == (compact, count) for c in callers):
                asked = ", ".join(
                    f"{c.backend} ({'packed' if c.compact else 'in place'}, "
                    f"{'counts' if c.count else 'no counts'}; {c.where} in {c.since})"
                    for c in callers
                )
                return f"no caller of {self.name}'s {FILTER} asks this under DCP: {asked}"
        routine = self._routine(size)
        parameters = _parameters(routine)
        if routine is self.convert:
            if count and "return_valid_counts" not in parameters:
                return f"{self.name}'s {CONVERT} has no counts"
            packs = "dcp_size" in parameters  # from 0.30.0 it packs exactly when it counts
            if compact and not packs:
                return f"{self.name}'s {CONVERT} does not pack"
            if packs and compact != count:
                return f"{self.name}'s {CONVERT} packs exactly when it counts"
        return None

    def __call__(
        self, inputs: RemapInputs, out: torch.Tensor, valid_counts: torch.Tensor | None
    ) -> None:
        routine = self._routine(inputs.dcp_size)
        parameters = _parameters(routine)
        given: dict[str, object] = {
            "BLOCK_SIZE": inputs.block_size,
            "NUM_TOPK_TOKENS": inputs.topk,
        }
        if valid_counts is not None:
            given["return_valid_counts"] = True
        if routine is self.filter:
            given.update(
                dcp_size=inputs.dcp_size,
                dcp_rank=inputs.dcp_rank,
                cp_kv_cache_interleave_size=inputs.interleave,
                compact_valid_to_front=inputs.compact,
            )
        elif "dcp_size" in parameters:
            given.update(
                dcp_size=inputs.dcp_size,
                dcp_rank=inputs.dcp_rank,
                cp_kv_cache_interleave_size=inputs.interleave,
            )
        returned = routine(inputs.req_id, inputs.block_table, inputs.token_indices, **given)
        if valid_counts is not None:
            converted, counts = returned  # type: ignore[misc]
            valid_counts.copy_(counts)
        else:
            converted = returned
        out.copy_(converted)
