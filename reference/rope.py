"""Rotary position embedding (RoPE): the cos/sin table and the two lane pairings.

A RoPE'd vector of ``2h`` lanes is rotated in ``h`` planes; plane ``i`` turns by the
angle ``p * f_i`` at position ``p``. The two conventions differ only in which lanes form
plane ``i``: interleaved pairs ``(2i, 2i+1)`` (MLA's ``k_pe``, GLM-5.x's indexer) and
NeoX split-half pairs ``(i, i+h)`` (DeepSeek-V3.2's indexer).
"""

from __future__ import annotations

import torch


def cos_sin_table(max_position: int, rope_dim: int, base: float) -> torch.Tensor:
    """The ``[max_position, rope_dim]`` fp32 table whose row ``p`` is
    ``[cos(p*f_0) .. cos(p*f_{h-1}) | sin(p*f_0) .. sin(p*f_{h-1})]``, ``h = rope_dim // 2``.

    ``f_i = 1 / base**(i/h)`` and the angles are ``outer(arange(max_position), f)``, all in
    fp32 and in exactly this order, because that is how the golden vectors' tables were
    built (tests/vectors/README.md); computing the angles in fp64 would move the cos/sin
    of large positions by more than an fp32 ulp.
    """
    if rope_dim % 2:
        raise ValueError(f"rope_dim must be even, got {rope_dim}")
    half = rope_dim // 2
    exponents = torch.arange(half, dtype=torch.float32) / half
    inv_freq = 1.0 / (base**exponents)
    angles = torch.outer(torch.arange(max_position, dtype=torch.float32), inv_freq)
    return torch.cat([angles.cos(), angles.sin()], dim=-1)


def _check_rope_shapes(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    if cos.shape != sin.shape:
        raise ValueError(f"cos {tuple(cos.shape)} and sin {tuple(sin.shape)} differ in shape")
    if x.shape[-1] != 2 * cos.shape[-1]:
        raise ValueError(
            f"x has {x.shape[-1]} lanes but cos/sin rotate {cos.shape[-1]} planes "
            f"(expected {2 * cos.shape[-1]} lanes)"
        )


def rope_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs ``(x[2i], x[2i+1])`` of ``x`` ``[T, 2h]`` by ``cos``/``sin``
    ``[T, h]``, in fp32: ``r1 = x1*cos - x2*sin``, ``r2 = x2*cos + x1*sin``."""
    _check_rope_shapes(x, cos, sin)
    x32 = x.float()
    x1, x2 = x32[..., 0::2], x32[..., 1::2]
    r1 = x1 * cos - x2 * sin
    r2 = x2 * cos + x1 * sin
    return torch.stack([r1, r2], dim=-1).flatten(-2)


def rope_neox(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate split-half pairs ``(x[i], x[i+h])`` of ``x`` ``[T, 2h]`` by ``cos``/``sin``
    ``[T, h]``, in fp32, with the same rotation as :func:`rope_interleaved`."""
    _check_rope_shapes(x, cos, sin)
    x32 = x.float()
    half = cos.shape[-1]
    x1, x2 = x32[..., :half], x32[..., half:]
    r1 = x1 * cos - x2 * sin
    r2 = x2 * cos + x1 * sin
    return torch.cat([r1, r2], dim=-1)
