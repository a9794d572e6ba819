"""Stand-in for what vLLM's GPU block-table module (``vllm/v1/worker/gpu/block_table.py``)
imports: the padding slot id, the buffer classes of its
``BlockTables``, and, from vLLM 0.24.0 on, the pointer loader its slot-mapping kernel
calls (before that the file defines its own).

The slot-mapping op launches the file's ``_compute_slot_mappings_kernel`` the way
``BlockTables.compute_slot_mappings`` does, and never builds a ``BlockTables``: the buffer
classes are here only so the file imports, and refuse to be made. ``_load_ptr`` does what
vLLM's does: it reads an ``int64``/``uint64`` device address from a table of addresses and
turns it into a pointer to ``elem_dtype`` elements. (vLLM also asserts 16-byte alignment
with ``tl.multiple_of``, a compiler hint that changes no value; the harness's tables are
whole tensors, which are aligned.)

Imported only after ``dcpcheck.backend`` has fixed ``TRITON_INTERPRET``.
"""

from __future__ import annotations

import triton
import triton.language as tl

PAD_SLOT_ID = -1
"""vLLM's slot of a row with no cache entry (``vllm.v1.attention.backends.utils``)."""


class _NotBuilt:
    """A buffer class of vLLM's ``BlockTables``, which the harness never builds."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError(
            f"dcpcheck's stand-in for vLLM's {type(self).__name__} is not a buffer: the "
            "slot-mapping op launches the kernel, it does not build BlockTables"
        )


class StagedWriteTensor(_NotBuilt):
    """``vllm.v1.worker.gpu.buffer_utils.StagedWriteTensor``."""


class UvaBackedTensor(_NotBuilt):
    """``vllm.v1.worker.gpu.buffer_utils.UvaBackedTensor``."""


class FusedStagedWriter(_NotBuilt):
    """``vllm.v1.worker.gpu.buffer_utils.FusedStagedWriter``."""


@triton.jit
def _load_ptr(ptr_to_ptr, elem_dtype):
    address = tl.load(ptr_to_ptr)
    return address.to(tl.pointer_type(elem_dtype))
