"""A copy of every input of one launch, to prove the kernel only read them.

One buffer holds them all: taking the snapshot is one device copy and checking it one
comparison. A tensor at a time (a clone, a comparison and a reduction per input), the
launches of a DCP4 case and its baseline cost about 250 small device operations, a sixth
of the case's (``benchmarks/harness_overhead.py``).

Each input starts at a multiple of 8 bytes in the buffer (zero bytes fill the gaps), so
that the buffer reads as 64-bit words and any input's bytes view as its own dtype in place.
Compared as words, it is compared in an eighth as many elements as bytes, which matters on
a CPU, where the real presets' RoPE tables are 42-52 MB: the checks of the gate's fused
cases take 2.1 - 2.3 s there instead of 3.0 - 3.1 s (BENCHMARKS.md, "The CPU figures of
this tree").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dcpcheck.ops.fused_norm_rope.contract import FusedOpInputs

_WORD = 8  # bytes of the words the buffer is compared in (int64)


def _input_bytes(inputs: FusedOpInputs) -> tuple[torch.Tensor, dict[str, slice]]:
    """Every input tensor's bytes in one buffer (one copy on the device), each starting at
    a multiple of :data:`_WORD` bytes, and where each one lies in it."""
    parts, spans, at = [], {}, 0
    for name, value in vars(inputs).items():
        if isinstance(value, torch.Tensor):
            raw = value.reshape(-1).view(torch.uint8)
            spans[name] = slice(at, at + raw.numel())
            gap = -raw.numel() % _WORD
            parts += [raw, torch.zeros(gap, dtype=torch.uint8, device=raw.device)] if gap else [raw]
            at += raw.numel() + gap
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
        """Input ``name`` as it was, with its dtype and shape: a view of the snapshot's
        bytes (read only once an input changed)."""
        like = getattr(self.inputs, name)
        return self.bytes[self.spans[name]].view(like.dtype).view(like.shape)

    def unchanged(self) -> bool:
        """Whether every input still holds the bytes it had (one comparison)."""
        now, spans = _input_bytes(self.inputs)
        words = torch.int64
        return spans == self.spans and torch.equal(now.view(words), self.bytes.view(words))


def snapshot_inputs(inputs: FusedOpInputs) -> InputSnapshot:
    """Copies of every input tensor, to prove afterwards the kernel did not modify them."""
    data, spans = _input_bytes(inputs)
    return InputSnapshot(data, spans, inputs)
