"""Stand-in for what vLLM's V1 block table (``vllm/v1/worker/block_table.py``) imports: the
DCP and PCP process groups it asks its rank from, a logger, a ceiling division, and the
paired host/device buffer (``CpuGpuBuffer``) it keeps its table and slots in.

The slot-mapping op builds the file's own ``BlockTable`` as the runner builds it, once per
rank, so the groups answer with the rank being built (:func:`as_rank`): DCP ``dcp_size``
and ``dcp_rank``, PCP 1 and 0 (prefill context parallelism is another feature). The
buffer is a CPU tensor with its numpy view and a device copy, as vLLM's: ``copy_to_gpu``
copies the host rows to the device, which the Triton versions of the table read.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class _Group:
    world_size: int
    rank_in_group: int


_dcp = _Group(1, 0)


@contextlib.contextmanager
def as_rank(dcp_size: int, dcp_rank: int) -> Iterator[None]:
    """While the block table of ``dcp_rank`` of ``dcp_size`` is built, the DCP group is
    that rank's."""
    global _dcp
    kept, _dcp = _dcp, _Group(dcp_size, dcp_rank)
    try:
        yield
    finally:
        _dcp = kept


def get_dcp_group() -> _Group:
    """``vllm.distributed.get_dcp_group``: the rank being built (:func:`as_rank`)."""
    return _dcp


def get_pcp_group() -> _Group:
    """``vllm.distributed.get_pcp_group``: no prefill context parallelism."""
    return _Group(1, 0)


def get_total_cp_world_size() -> int:
    """``vllm.v1.worker.cp_utils.get_total_cp_world_size``: PCP times DCP."""
    return get_pcp_group().world_size * get_dcp_group().world_size


def init_logger(name: str) -> logging.Logger:
    """``vllm.logger.init_logger``."""
    return logging.getLogger(name)


def cdiv(a: int, b: int) -> int:
    """Ceiling division, as ``vllm.utils.cdiv`` (``vllm.utils.math_utils.cdiv`` from
    0.11.1)."""
    return -(-a // b)


class CpuGpuBuffer:
    """``vllm.v1.utils.CpuGpuBuffer``: a host tensor (``cpu``, and ``np``, its numpy view)
    and a device tensor of the same shape (``gpu``)."""

    def __init__(
        self,
        *size: int,
        dtype: torch.dtype,
        device: torch.device | str,
        pin_memory: bool = False,
        with_numpy: bool = True,
    ) -> None:
        self.cpu = torch.zeros(*size, dtype=dtype, device="cpu")
        self.gpu = torch.zeros(*size, dtype=dtype, device=device)
        self.np = self.cpu.numpy() if with_numpy else None

    def copy_to_gpu(self, n: int | None = None) -> torch.Tensor:
        if n is None:
            return self.gpu.copy_(self.cpu)
        return self.gpu[:n].copy_(self.cpu[:n])

    def copy_to_cpu(self, n: int | None = None) -> torch.Tensor:
        if n is None:
            return self.cpu.copy_(self.gpu)
        return self.cpu[:n].copy_(self.gpu[:n])
