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
mixed-batch path only until 0.33.0 (it refuses the others under DCP), which calls the
filter in place, without counts (``flashmla_sparse.py:794`` in 0.29.0, ``:1222`` in
0.33.0), and from 0.34.0 on its bf16 path too (only an fp8 cache is refused, ``:460``),
which calls it packed with counts (``:928``), as its fp8 mixed batch then does on SM100
from 32 rows (``:1268``, ``use_topk_length``). Each passes the rows' request ids, the
rank's block table, the picks, the DCP size, rank and interleave, the block size and the
top-k width. From 0.34.0 Kimi K3.1's specialized decode (``models/kimi_k3/.../dsa``) runs
under DCP too: on FlashMLA it calls the filter packed with counts (``dcp_stage.py:90``), on
FlashInfer the converter itself, packed with counts, into buffers of its own (``out``,
``valid_counts_out``) that it then reads (``attn_fi.py:241``; ``prepared.py:622``, whenever
its top-k merge does not take the step). So from 0.34.0 a case under DCP packed with
counts is asked of both, and ``vllm==X`` judges each function wherever its callers call
it, a way each (``VllmRemap.asks``), the converter's into the case's poisoned buffers. The
other callers of 0.34.0 run only without DCP: the index group (``index_group.py:122``,
``:142``), FlashInfer's SM90 and SM120 paths, XPU's, dots3's attention (their impls return
no LSE for decode, so the start-up check refuses them under DCP). Not judged here: ROCm's
own converter (``rocm_aiter_mla_sparse.py``, a function of its own that writes 0 for an
unused pick and runs only without DCP).

**A prefill chunk over the gathered workspace** (``contract``). With prefill context
parallelism and DCP together, FlashMLA's sparse backend (``pcp_dcp_kv_gather``,
``flashmla_sparse.py:378`` in 0.30.0, ``:446`` in 0.34.0: ``use_pcp and dcp_world_size >
1``) all-gathers each rank's upconverted shard of a prefill chunk and calls the converter
once per chunk with ``HAS_PREFILL_WORKSPACE=True``, the chunk's rows' request ids, every
prefill request's workspace start (chunk-local), ``prefill_workspace_rank_stride`` (the
chunk's shard rows), its DCP size, rank and interleave, and ``return_valid_counts=True``
(``flashmla_sparse.py:860`` in 0.30.0, ``:997`` in 0.34.0); the converter then packs with
its counts. That call converts one chunk's rows, every one a prefill row
(``req_id_per_token[tokens]``, ``:998`` in 0.34.0). Without DCP, from 0.13.0, the fp8
separate prefill/decode path converts the whole batch in one call (``HAS_PREFILL_WORKSPACE``
with the request ids, ``-1`` for its decode rows, and the starts; ``:782`` in 0.13.0,
``:1089`` in 0.34.0): in place without counts before 0.24.0, in place with counts to
0.29.0, packed with counts from 0.30.0 (``return_valid_counts=True``, and the converter
packs when it counts from then). A case with a prefill workspace is asked only as one of
those calls (``prefill_calls``, read from the release's ``flashmla_sparse.py``: the line,
whether it passes DCP, whether it counts) asks it; else it is not applicable, naming the
calls: under DCP before 0.30.0 (no ``prefill_workspace_rank_stride``), a packing or
counting the release's call does not ask, decode rows under DCP.

**The flat row view** (``BLOCK_STRIDE_ROWS``, both converters from 0.29.0). A caller that
reads the cache as one run of rows (``sparse_utils.flat_kv_row_view``: ``kv_cache.stride(0)
// head_dim`` rows per block, more than the block size where other layers' pages sit
between this cache's blocks) passes that stride, and a decode row's entry is then ``block *
stride + offset``. Read in each release's ``flashmla_sparse.py`` (``STRIDE_CALLS``): the
bf16 path passes it at every block size, with counts, from 0.29.0 (``:644``; under DCP,
packed, from 0.34.0, ``:928``); the fp8 mixed batch from 0.32.0 (``:1241`` without DCP,
``:1213`` with, in place, no counts) and the separate prefill/decode call with its
workspace (``:1038``, packed with counts), through ``_fp8_kv_pages`` (``:136-144``), which passes
none at block size 64 (the fp8 kernel's page: it then reads the paged tensor with its own
stride, and the entries are block-size slots). FlashInfer's sparse MLA passes it to the
filter under DCP, packed with counts, at every block size, from 0.29.0
(``flashinfer_mla_sparse.py:386`` in 0.29.0, ``sparse_mla_attention.py:756`` in 0.33.0,
``:826`` in 0.34.0: read in the wheels; the cache does not keep that file). Without DCP,
XPU's sparse MLA (``xpu_mla_sparse.py:268``, 0.29.0 on) and FlashInfer's on SM120
(``flashinfer_mla_sparse_sm120.py:193``, 0.32.0 on) pass the flat view's stride at every
block size, in place, without counts. In 0.34.0 the fp8 mixed batch's call under DCP on
SM100 and Kimi K3.1's filter call pass it through ``_fp8_kv_pages``, packed with counts,
and Kimi's converter call the flat view's. A case whose
blocks lie other than a block apart is asked only as one of those calls asks it; else it
is not applicable, naming them.

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

import ast
import functools
import inspect
from collections.abc import Callable, Iterator
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
CALLER_FILE = "flashmla_sparse.py"
"""The release file of the backend that calls the converter with a prefill workspace,
beside the converter's own file."""
FILTER = "triton_filter_and_convert_dcp_index"
FUNCTIONS = (CONVERT, FILTER)

MEMBERS = OPS[SPARSE_TOPK_REMAP].wheel_members
"""The files the converters lived in, oldest first."""

COLUMN_TILE = 128
"""The converters' default ``BLOCK_N``, which every caller leaves: the top-k width must be
a multiple of it (their own assertion)."""


KIMI_DECODE = "models/kimi_k3/nvidia/specialized_decode/cutedsl/dsa"
"""Where Kimi K3.1's specialized decode calls the converters (0.34.0 on)."""


@dataclass(frozen=True)
class DcpCaller:
    """A sparse backend that runs under DCP, and how it calls a converter there (without a
    prefill workspace: those calls are ``prefill_calls``)."""

    backend: str
    since: str
    compact: bool
    count: bool
    where: str
    function: str = FILTER
    buffers: bool = False  # it passes its own out and valid_counts_out


DCP_CALLERS = (
    DcpCaller("FlashInfer sparse MLA", "0.25.0", True, True, "flashinfer_mla_sparse.py:451"),
    DcpCaller(
        "FlashMLA sparse (fp8, mixed batch)", "0.29.0", False, False, "flashmla_sparse.py:794"
    ),
    DcpCaller("FlashMLA sparse (bf16)", "0.34.0", True, True, "flashmla_sparse.py:928"),
    DcpCaller(
        "FlashMLA sparse (fp8, mixed batch of 32 rows or more on SM100)", "0.34.0", True, True,
        "flashmla_sparse.py:1268",
    ),
    DcpCaller(
        "Kimi K3.1's decode on FlashMLA", "0.34.0", True, True, f"{KIMI_DECODE}/dcp_stage.py:90"
    ),
    DcpCaller(
        "Kimi K3.1's decode on FlashInfer", "0.34.0", True, True, f"{KIMI_DECODE}/attn_fi.py:241",
        function=CONVERT, buffers=True,
    ),
)  # fmt: skip
"""Read in every release (module docstring); ``where`` is the call in the first release."""


FP8_PAGE = 64
"""The fp8 kernel's page in tokens: its calls pass no block stride at this block size."""


@dataclass(frozen=True)
class StrideCall:
    """A call that passes the converter ``BLOCK_STRIDE_ROWS`` from the cache's flat row
    view (module docstring)."""

    path: str
    since: str
    dcp: bool  # under DCP, the filter; without, the converter
    count: bool  # it passes return_valid_counts
    compact: bool  # it asks its rows packed (the converter packs when it counts, 0.30.0 on)
    fp8_pages: bool  # through _fp8_kv_pages: no stride at block size FP8_PAGE
    where: str  # the call in the first release
    workspace: bool = False  # with a prefill workspace: a mixed batch's decode rows
    calls: str = ""  # the function it calls, where not the one ``dcp`` says

    @property
    def function(self) -> str:
        """The converter it calls."""
        return self.calls or (FILTER if self.dcp else CONVERT)

    def packed(self, packs: bool) -> bool:
        """Whether its rows come back packed (``packs``: the converter packs when it
        counts; the filter packs as asked)."""
        return self.compact and (packs or self.dcp)

    def asks(self, inputs: RemapInputs, packs: bool, function: str) -> bool:
        """Whether the call asks the case of ``function``."""
        if function != self.function:
            return False
        if (self.dcp, self.workspace) != (inputs.dcp_size > 1, inputs.workspace is not None):
            return False
        if self.fp8_pages and inputs.block_size == FP8_PAGE:
            return False
        return (self.packed(packs), self.count) == (inputs.compact, inputs.count_valid)

    def said(self, packs: bool) -> str:
        """The call in words, with its line."""
        rows = "packed" if self.packed(packs) else "in place"
        counts = "counts" if self.count else "no counts"
        sizes = f", block sizes other than {FP8_PAGE}" if self.fp8_pages else ""
        dcp = "under" if self.dcp else "without"
        workspace = ", a prefill workspace" if self.workspace else ""
        return (
            f"{self.path} ({dcp} DCP{workspace}, {rows}, {counts}{sizes}; {self.where} in "
            f"{self.since})"
        )


STRIDE_CALLS = (
    StrideCall(
        "FlashMLA sparse, bf16", "0.29.0", False, True, True, False, "flashmla_sparse.py:644"
    ),
    StrideCall(
        "FlashMLA sparse, fp8 mixed batch", "0.32.0", False, False, False, True,
        "flashmla_sparse.py:1241",
    ),
    StrideCall(
        "FlashMLA sparse, fp8 mixed batch", "0.32.0", True, False, False, True,
        "flashmla_sparse.py:1213",
    ),
    StrideCall(
        "FlashMLA sparse, fp8 separate prefill/decode", "0.32.0", False, True, True, True,
        "flashmla_sparse.py:1038", workspace=True,
    ),
    StrideCall(
        "FlashMLA sparse, bf16", "0.34.0", True, True, True, False, "flashmla_sparse.py:928"
    ),
    StrideCall(
        "FlashInfer sparse MLA", "0.29.0", True, True, True, False,
        "flashinfer_mla_sparse.py:386",
    ),
    StrideCall("XPU sparse MLA", "0.29.0", False, False, False, False, "xpu_mla_sparse.py:268"),
    StrideCall(
        "FlashInfer sparse MLA on SM120", "0.32.0", False, False, False, False,
        "flashinfer_mla_sparse_sm120.py:193",
    ),
    StrideCall(
        "FlashMLA sparse, fp8 mixed batch of 32 rows or more on SM100", "0.34.0", True, True,
        True, True, "flashmla_sparse.py:1268",
    ),
    StrideCall(
        "Kimi K3.1's decode on FlashMLA", "0.34.0", True, True, True, True,
        f"{KIMI_DECODE}/dcp_stage.py:90",
    ),
    StrideCall(
        "Kimi K3.1's decode on FlashInfer", "0.34.0", True, True, True, False,
        f"{KIMI_DECODE}/attn_fi.py:241", calls=CONVERT,
    ),
)  # fmt: skip
"""Read in every release (module docstring); ``where`` is the call in the first release."""


def stride_calls(version: str) -> tuple[StrideCall, ...]:
    """The calls of release ``version`` that pass a block stride."""
    key = releases.version_key(version)
    return tuple(c for c in STRIDE_CALLS if key >= releases.version_key(c.since))


def dcp_callers(version: str, function: str = FILTER) -> tuple[DcpCaller, ...]:
    """The callers of ``function`` that release ``version`` runs under DCP."""
    key = releases.version_key(version)
    return tuple(
        c for c in DCP_CALLERS if c.function == function and key >= releases.version_key(c.since)
    )


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


@dataclass(frozen=True)
class PrefillCall:
    """A call of the converter in the caller's file that passes a prefill workspace. One
    that passes DCP converts one gathered chunk's rows, every one a prefill row; one that
    does not converts the batch, its decode rows (request id -1) beside its prefill rows
    (module docstring)."""

    line: int
    dcp: bool  # it passes the DCP size and the workspace's rank stride
    count: bool  # it passes return_valid_counts, not as False

    def asks(self, packs: bool) -> str:
        """What the call asks of a converter that packs when it counts (``packs``) or not,
        in words, with its line."""
        rows = "packed with counts" if self.count and packs else "in place"
        if not packs:
            rows += ", with counts" if self.count else ", no counts"
        return f"{rows} ({CALLER_FILE}:{self.line})"


def converter_calls(path: Path) -> Iterator[tuple[ast.Call, str, set[str | None]]]:
    """Every call of a converter (``FUNCTIONS``) in the release file ``path``: the call,
    the function called and the keywords it passes."""
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "id", getattr(node.func, "attr", None))
        if name in FUNCTIONS:
            yield node, name, {k.arg for k in node.keywords}


@functools.cache
def prefill_calls(path: Path | None) -> tuple[PrefillCall, ...]:
    """The calls of the converter in ``path`` (the caller's file, None: the release has
    none) that pass ``HAS_PREFILL_WORKSPACE``, by line."""
    if path is None or not path.is_file():
        return ()
    calls = []
    for node, name, keywords in converter_calls(path):
        if name == CONVERT and "HAS_PREFILL_WORKSPACE" in keywords:
            dcp = {"prefill_workspace_rank_stride", "dcp_size"} <= keywords
            count = any(
                k.arg == "return_valid_counts"
                and not (isinstance(k.value, ast.Constant) and k.value.value is False)
                for k in node.keywords
            )
            calls.append(PrefillCall(node.lineno, dcp, count))
    return tuple(sorted(calls, key=lambda c: c.line))


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
    caller_file: Path | None = None
    """The release's ``flashmla_sparse.py``, whose calls with a prefill workspace say which
    a case of a prefill chunk may be asked (module docstring)."""
    topk_multiple: int = COLUMN_TILE
    """The top-k widths its API takes are multiples of this (the property search draws
    only those)."""
    only: str | None = None
    """One function as the release's callers call it (a way of :attr:`asks`); None: each
    case of the function its callers call it with."""

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

    @property
    def asks(self) -> tuple[tuple[str, VllmRemap], ...]:
        """Each way its release's callers call it, with a label its findings carry. One,
        unlabelled, while a case of each kind is asked of one function alone (at DCP1 and
        with a prefill workspace the converter, under DCP the filter); from 0.34.0 a
        caller also asks the converter under DCP without a workspace (``DCP_CALLERS``),
        so each function is judged wherever its callers call it, a way each."""
        if self.named is not None or self.only is not None:
            return (("", self),)
        if not dcp_callers(self.version, CONVERT):
            return (("", self),)
        return tuple((f, replace(self, only=f)) for f in FUNCTIONS)

    def _routine(self, size: int) -> Callable[..., object]:
        """The converter a case at DCP ``size`` without a prefill workspace calls (module
        docstring)."""
        alone = self.named or self.only
        if alone == FILTER or (alone is None and size > 1):
            assert self.filter is not None
            return self.filter
        return self.convert

    def _launched(self, inputs: RemapInputs) -> Callable[..., object]:
        """The converter the case calls: every caller with a prefill workspace calls the
        converter."""
        return self.convert if inputs.workspace is not None else self._routine(inputs.dcp_size)

    def _prefill_not_applicable(self, inputs: RemapInputs) -> str | None:
        """Why a case of a prefill chunk cannot be asked (module docstring), or None."""
        if self.named == FILTER:
            return f"{self.name}'s {FILTER} takes no prefill workspace"
        parameters = _parameters(self.convert)
        if "HAS_PREFILL_WORKSPACE" not in parameters:
            return f"{self.name}'s {CONVERT} takes no prefill workspace"
        calls = prefill_calls(self.caller_file)
        where = ", ".join(f"{CALLER_FILE}:{c.line}" for c in calls) or f"none in {CALLER_FILE}"
        if inputs.dcp_size > 1 and "prefill_workspace_rank_stride" not in parameters:
            return (
                f"{self.name}'s {CONVERT} takes no prefill_workspace_rank_stride: no caller "
                "maps a prefill chunk into a DCP-gathered workspace; its calls with a "
                f"prefill workspace pass no DCP ({where})"
            )
        if self.named is not None:
            return None
        under_dcp = inputs.dcp_size > 1
        asked = [c for c in calls if c.dcp == under_dcp]
        if not asked and under_dcp:
            return (
                f"no caller of {self.name}'s {CONVERT} passes it DCP with a prefill "
                f"workspace ({where})"
            )
        if not asked:
            return f"{self.name}'s calls with a prefill workspace all gather it under DCP ({where})"
        workspace = inputs.workspace
        assert workspace is not None
        if under_dcp and bool((workspace.request_ids < 0).any()):
            lines = ", ".join(f"{CALLER_FILE}:{c.line}" for c in asked)
            return (
                f"no caller of {self.name}'s {CONVERT} converts decode rows under DCP with a "
                f"prefill workspace: its calls there convert one chunk's prefill rows ({lines})"
            )
        packs = "dcp_size" in parameters  # from 0.30.0 it packs exactly when it counts
        if not any(
            (c.count and packs, c.count) == (inputs.compact, inputs.count_valid) for c in asked
        ):
            said = "; ".join(c.asks(packs) for c in asked)
            dcp = "under DCP" if under_dcp else "without DCP"
            return f"{self.name}'s calls with a prefill workspace {dcp} ask its rows {said}"
        return None

    def _stride_not_applicable(self, inputs: RemapInputs) -> str | None:
        """Why a case whose blocks lie other than a block apart cannot be asked (module
        docstring), or None."""
        routine = self._launched(inputs)
        if "BLOCK_STRIDE_ROWS" not in _parameters(routine):
            return (
                f"{self.name}'s {routine.__name__} takes no BLOCK_STRIDE_ROWS: its entries "
                "index blocks a block apart"
            )
        if self.named is not None:
            return None
        packs = "dcp_size" in _parameters(self.convert)
        calls = stride_calls(self.version)
        function = CONVERT if routine is self.convert else FILTER
        if any(c.asks(inputs, packs, function) for c in calls):
            return None
        said = "; ".join(c.said(packs) for c in calls)
        return (
            f"no caller of {self.name} passes a block stride for this call: "
            f"{said or 'none passes BLOCK_STRIDE_ROWS'}"
        )

    def not_applicable(self, inputs: RemapInputs) -> str | None:
        """Why the case cannot be asked (module docstring), or None."""
        reason = self._layout_not_applicable(inputs)
        if reason is None and inputs.stride_rows != inputs.block_size:
            return self._stride_not_applicable(inputs)
        return reason

    def _layout_not_applicable(self, inputs: RemapInputs) -> str | None:
        """Why the case's batch, blocks a block apart, cannot be asked, or None."""
        size, topk = inputs.dcp_size, inputs.topk
        compact, count = inputs.compact, inputs.count_valid
        if topk % self.topk_multiple:
            return (
                f"{self.name}'s converters take a top-k that is a multiple of "
                f"{self.topk_multiple}; "
                "their callers pass the model's index_topk (2048)"
            )
        if inputs.workspace is not None:
            if self.only == FILTER:
                return f"{self.name}'s callers with a prefill workspace call {CONVERT}"
            reason = self._prefill_not_applicable(inputs)
            if reason is not None:
                return reason
            return self._convert_not_applicable(compact, count)
        if FILTER in (self.named, self.only) and size == 1:
            return f"{self.name}'s callers call {FILTER} only under DCP"
        if self.named is None and size > 1:
            function = CONVERT if self.only == CONVERT else FILTER
            callers = dcp_callers(self.version, function)
            if not callers and function == CONVERT:
                return (
                    f"no caller of {self.name}'s {CONVERT} passes it DCP without a prefill "
                    f"workspace: under DCP its backends call {FILTER}"
                )
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
                return f"no caller of {self.name}'s {function} asks this under DCP: {asked}"
        if self._routine(size) is self.convert:
            return self._convert_not_applicable(compact, count)
        return None

    def _into_buffers(self) -> bool:
        """Whether the converter's callers under DCP hand it their own buffers to write
        (``out``, ``valid_counts_out``): the case's poisoned buffers are then given, so an
        entry it leaves unwritten is seen as such."""
        if self.named is not None:
            return False
        return any(c.buffers for c in dcp_callers(self.version, CONVERT))

    def _convert_not_applicable(self, compact: bool, count: bool) -> str | None:
        """Why the converter's API cannot pack or count as asked, or None."""
        parameters = _parameters(self.convert)
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
        workspace = inputs.workspace
        routine = self._launched(inputs)
        parameters = _parameters(routine)
        given: dict[str, object] = {
            "BLOCK_SIZE": inputs.block_size,
            "NUM_TOPK_TOKENS": inputs.topk,
        }
        if inputs.stride_rows != inputs.block_size:
            given["BLOCK_STRIDE_ROWS"] = inputs.stride_rows
        if valid_counts is not None:
            given["return_valid_counts"] = True
        if workspace is not None:
            given.update(
                HAS_PREFILL_WORKSPACE=True,
                prefill_workspace_request_ids=workspace.request_ids,
                prefill_workspace_starts=workspace.starts,
            )
            if inputs.dcp_size > 1:
                given.update(
                    prefill_workspace_rank_stride=workspace.rank_stride,
                    dcp_size=inputs.dcp_size,
                    dcp_rank=inputs.dcp_rank,
                    cp_kv_cache_interleave_size=inputs.interleave,
                )
        elif routine is self.filter:
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
            if inputs.dcp_size > 1 and self._into_buffers():
                given.update(out=out, valid_counts_out=valid_counts)
                # the caller reads its buffers, not what the call returns
                routine(inputs.req_id, inputs.block_table, inputs.token_indices, **given)
                return
        returned = routine(inputs.req_id, inputs.block_table, inputs.token_indices, **given)
        if valid_counts is not None:
            converted, counts = returned  # type: ignore[misc]
            valid_counts.copy_(counts)
        else:
            converted = returned
        out.copy_(converted)
