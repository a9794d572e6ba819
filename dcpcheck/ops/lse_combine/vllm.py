"""vLLM's merges of the DCP ranks' partial attentions, release by release, under the op's
protocol: ``cp_lse_ag_out_rs`` (an all-gather of the LSEs, a Triton correction, a
reduce-scatter by heads; every release) and ``dcp_a2a_lse_reduce`` (an all-to-all of the
partials and their LSEs, then a Triton merge of each rank's heads; from 0.18.0, in
``vllm/v1/attention/ops/dcp_alltoall.py``, and with ``dcp.py`` from 0.29.0). The
all-to-all calls ``torch.distributed.all_to_all_single`` on its group's
``device_group``, which ``dcpcheck.cases.collectives.TorchDistributed`` answers over the
case's group.

``cp_lse_ag_out_rs``'s file moved: ``vllm/attention/ops/common.py`` (0.10.2 - 0.13.x),
``vllm/v1/attention/ops/common.py`` (0.14.0 - 0.28.x), ``vllm/v1/attention/ops/dcp.py``
(0.29.0 on). The later files import half of vLLM (its config, its environment, its
symmetric-memory workspaces), so the routine is taken alone from its file with what it
needs of that file (``loading.definitions_alone``): its correction kernel, the context
or the JIT warm-up class that launches it, the empty-shard mask; what it imports from
the op's other files of the release is taken alone from them the same way. Its other
globals are Triton, torch, ``torch.distributed`` as ``dist`` (``TorchDistributed``),
``dataclass``, from 0.30.0 vLLM's warm-up base class and kernel launcher, stood in for
by ``dcpcheck.adapters.shims.vllm.jit_warmup`` (which says what vLLM's launcher does), and
for the all-to-all of 0.21.0 - 0.23.0 vLLM's workspace manager, which hands it its send
and receive buffers (``dcpcheck.adapters.shims.vllm.workspace``: stale ones). A release
whose merge needs anything else is refused with one line naming it.

Its API grew: ``return_lse`` (0.11.1), ``is_lse_base_on_e`` (0.12.0), ``seq_lens`` and
``query_start_loc`` (the empty-shard mask, 0.28.0); the all-to-all's, ``out`` (0.29.0),
which its callers leave unset. Either is called as the MLA attention
layer calls it (``vllm/v1/attention/backends/mla/common.py``, later
``vllm/model_executor/layers/attention/mla_attention.py``): the partial output and LSE
and the DCP group, the base the case declares, the lengths when the caller passes them,
and ``return_lse`` as the backends that ask for the merged LSE pass it. What the API
cannot say is judged as the routine then behaves, with its caller's arguments: a base-2
LSE where it has no base is merged as the routine merges any LSE, an empty shard without
the lengths is merged as whatever its decode kernel left there. Only three things are not
applicable: a head dim that is not a power of two (its kernels tile it with one
``tl.arange``, which Triton refuses otherwise), the merged LSE from a routine that cannot
return it (none of its callers asks), and DCP1 (every caller merges only when
``dcp_world_size > 1``; the routine then returns its input as it is).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
import triton.language as tl

from dcpcheck.adapters.protocol import AdapterError
from dcpcheck.adapters.shims.vllm import jit_warmup, workspace
from dcpcheck.cases.collectives import TorchDistributed
from dcpcheck.kernels.loading import definitions_alone
from dcpcheck.op_registry import LSE_COMBINE, OPS
from dcpcheck.ops.lse_combine import vllm_attention, vllm_state_merge
from dcpcheck.ops.lse_combine.case import CombineBatch
from dcpcheck.ops.lse_combine.contract import CombineInputs, Merged

MEMBERS = tuple(
    m
    for m in OPS[LSE_COMBINE].wheel_members
    if m not in vllm_attention.MEMBERS + vllm_state_merge.MEMBERS
)
"""The files the group merges lived in, oldest first; a release has one of them."""

FUNCTION = OPS[LSE_COMBINE].function
A2A_FUNCTION = "dcp_a2a_lse_reduce"
FUNCTIONS = (FUNCTION, A2A_FUNCTION)
"""The group merges a spec may name (``vllm==X`` is the first); each is the other's
counterpart (``paths``)."""

PARAMETERS = ("cp_attn_out", "cp_attn_lse", "cp_group")
"""The routine's first parameters in every release."""

OPTIONAL = ("ctx", "return_lse", "is_lse_base_on_e", "seq_lens", "query_start_loc", "out")
"""The parameters it gained; any other is an API the adapter does not know."""

DCP_ONLY = "its callers merge only under DCP (dcp_world_size > 1); at DCP1 it returns its input"


def routine_of(
    path: Path, function: str, where: str, neighbours: dict[str, Path] | None = None
) -> Callable[..., object]:
    """The release's ``function`` taken alone from ``path`` (module docstring), with what
    it imports from the release's other files of the op (``neighbours``: module name ->
    file)."""
    warmup = {
        name: getattr(shim, name) for shim in (jit_warmup, workspace) for name in shim.STANDS_IN_FOR
    }
    provided = {
        "torch": torch,
        "triton": triton,
        "tl": tl,
        "dist": TorchDistributed,
        "dataclass": dataclass,
        **warmup,
    }
    found = definitions_alone(path, function, provided, where, neighbours)
    return found[function]  # type: ignore[return-value]


@dataclass(frozen=True)
class VllmMerge:
    """A release's merge (``function``) under the op's protocol (module docstring)."""

    routine: Callable[..., object]
    name: str
    function: str = FUNCTION
    counterpart: VllmMerge | None = None
    """The release's other merge, when it has one (``paths``)."""

    def __post_init__(self) -> None:
        parameters = self.parameters
        unknown = [p for p in parameters[len(PARAMETERS) :] if p not in OPTIONAL]
        if parameters[: len(PARAMETERS)] != PARAMETERS or unknown:
            raise AdapterError(
                f"{self.name}: {self.function} takes ({', '.join(parameters)}), not the "
                f"({', '.join(PARAMETERS)}, ...) the adapter knows how its caller fills"
            )

    @functools.cached_property
    def parameters(self) -> tuple[str, ...]:
        """The routine's parameters, read once: every case asks them."""
        return tuple(inspect.signature(self.routine).parameters)

    def not_applicable(self, asked: tuple[CombineBatch, int]) -> str | None:
        """Why the routine cannot be asked this case (module docstring), or None."""
        batch, size = asked
        if size == 1:
            return DCP_ONLY
        if batch.head_dim & (batch.head_dim - 1):
            return (
                f"{self.name}'s {self.function} tiles the head dim with tl.arange(0, HEAD_DIM), "
                f"which takes a power of two (MLA's latent 512 is)"
            )
        if batch.return_lse and "return_lse" not in self.parameters:
            return f"{self.name}'s {self.function} cannot return the merged LSE, and no caller asks"
        return None

    def __call__(self, inputs: CombineInputs) -> Merged:
        given: dict[str, object] = {}
        if "return_lse" in self.parameters:
            given["return_lse"] = inputs.return_lse
        if "is_lse_base_on_e" in self.parameters:
            given["is_lse_base_on_e"] = inputs.base_e
        if "seq_lens" in self.parameters and inputs.seq_lens is not None:
            given["seq_lens"] = inputs.seq_lens
            given["query_start_loc"] = inputs.query_start_loc
        returned = self.routine(inputs.partial_out, inputs.partial_lse, inputs.group, **given)
        if inputs.return_lse:
            out, lse = returned  # type: ignore[misc]
            return Merged(out, lse)
        return Merged(returned)  # type: ignore[arg-type]
