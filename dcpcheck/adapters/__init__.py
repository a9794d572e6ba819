"""Adapters: run a kernel whose signature is not the harness's protocol.

The harness speaks one protocol, ``kernel(inputs, outputs, caches)`` (dcpcheck.contract),
and owns every buffer. A kernel from another project has its own signature: an adapter
is a protocol kernel that maps the harness's buffers onto that call (views of the same
memory wherever the foreign API writes, so writes land in the harness's buffers) and
declares, as :class:`~dcpcheck.adapters.protocol.Limitation` s, the contract items the
foreign API has no way to express. The harness reports the checks those rule out as
skipped (dcpcheck.harness.limitations), never as passed.

This package knows only the contract: ``protocol`` (what an adapter is), ``vllm`` (every
API shape vLLM's kernel has had) and ``shims`` (stand-ins for the imports of a kernel file
loaded outside its project). :func:`adapt` picks the adapter for a callable.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from dcpcheck.adapters import vllm
from dcpcheck.adapters.protocol import AdapterError
from dcpcheck.contract import Kernel

ADAPTER_NAMES = ("auto", "native", "vllm")
"""``auto``: vLLM's adapter when the signature is a known vLLM shape, else ``native``;
``native``: the callable follows the harness's protocol itself; ``vllm``: force vLLM's."""


def _follows_protocol(function: Callable[..., object]) -> bool:
    """Whether ``function(inputs, outputs, caches)`` binds; callables without a readable
    signature (some builtins) are given the benefit of the doubt."""
    try:
        inspect.signature(function).bind(None, None, None)
    except TypeError:
        return False
    except ValueError:
        return True
    return True


def adapt(function: Callable[..., object], adapter: str = "auto") -> Kernel:
    """``function`` as a protocol kernel, through the adapter named (see ADAPTER_NAMES)."""
    if adapter not in ADAPTER_NAMES:
        raise AdapterError(f"unknown adapter {adapter!r} (expected {', '.join(ADAPTER_NAMES)})")
    if adapter == "vllm":
        return vllm.adapt(function)
    if adapter == "auto" and vllm.api_shape(function) is not None:
        return vllm.adapt(function)
    if not _follows_protocol(function):
        raise AdapterError(
            "signature is neither kernel(inputs, outputs, caches) nor a known vLLM "
            f"fused_norm_rope shape: {vllm.signature_text(function)}"
        )
    return function
