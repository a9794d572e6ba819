"""A copy of every input of one launch, to prove the kernel only read them.

One buffer holds them all: taking the snapshot is one device copy and checking it one
comparison. A tensor at a time (a clone, a comparison and a reduction per input), the
launches of a DCP4 case and its baseline cost about 250 small device operations, a sixth
of the case's (``benchmarks/harness_overhead.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dcpcheck.ops.fused_norm_rope.contract import FusedOpInputs


def _input_bytes(inputs: FusedOpInputs) -> tuple[torch.Tensor, dict[str, slice]]:
    """Every input tensor's bytes in one buffer (one copy on the device), and where each
    one lies in it."""
    parts, spans, at = [], {}, 0
    for name, value in vars(inputs).items():
        if isinstance(value, torch.Tensor):
            parts.append(value.reshape(-1).view(torch.uint8))
            spans[name] = slice(at, at + parts[-1].numel())
            at += parts[-1].numel()
    if not parts:
        return torch.empty(0, dtype=torch.uint8), spans
    return torch.cat(parts), spans


@dataclass(frozen=True)
class InputSnapshot:
    """Every input tensor of one launch as it was (module docstring); compared with the
    inputs after the launch by ``checks.input_changes``."""

    bytes: torch.Tensor
    spans: dict[str, slice]
    inputs: FusedOpInputs

    def original(self, name: str) -> torch.Tensor:
        """Input ``name`` as it was, with its dtype and shape: a copy of its bytes, which
        then start where any dtype may view them (read only once an input changed)."""
        like = getattr(self.inputs, name)
        return self.bytes[self.spans[name]].clone().view(like.dtype).view(like.shape)

    def unchanged(self) -> bool:
        """Whether every input still holds the bytes it had (one comparison)."""
        now, spans = _input_bytes(self.inputs)
        return spans == self.spans and torch.equal(now, self.bytes)


def snapshot_inputs(inputs: FusedOpInputs) -> InputSnapshot:
    """Copies of every input tensor, to prove afterwards the kernel did not modify them."""
    data, spans = _input_bytes(inputs)
    return InputSnapshot(data, spans, inputs)
