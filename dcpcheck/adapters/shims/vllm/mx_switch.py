"""Whether the case being run wants MX-packed indexer scales: the answer the stand-in for
vLLM's ``mqa_logits_use_mx_scales`` gives (``mx_scales``). Set by the vLLM adapter around
each call. A module of its own, free of Triton, so the adapter can import it before the
backend is chosen (Triton's interpreter must be switched on before Triton is imported)."""

from __future__ import annotations

from contextvars import ContextVar

MX_SCALES_WANTED: ContextVar[bool] = ContextVar("mx_scales_wanted", default=False)
"""True while the vLLM adapter runs a case whose indexer format is MX (``IndexScale.MX``)."""
