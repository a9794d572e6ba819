"""The fused op's adapters: a protocol kernel over a foreign callable.

The harness speaks one protocol, ``kernel(inputs, outputs, caches)`` (``contract``), and
owns every buffer. A kernel from another project has its own signature: an adapter is a
protocol kernel that maps the harness's buffers onto that call (views of the same memory
wherever the foreign API writes, so writes land in the harness's buffers) and declares,
as :class:`~dcpcheck.adapters.protocol.Limitation` s, the contract items the foreign API
has no way to express. The runner reports the checks those rule out as skipped
(``limitations``), never as passed.

:class:`Adapter` is what an adapter is; ``vllm`` holds every API shape vLLM's kernel has
had; :func:`adapt` picks the adapter for a callable.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Protocol, runtime_checkable

from dcpcheck.adapters.protocol import AdapterError, Limitation
from dcpcheck.ops.fused_norm_rope import vllm
from dcpcheck.ops.fused_norm_rope.contract import (
    FusedOpCaches,
    FusedOpInputs,
    FusedOpOutputs,
    Kernel,
)

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


@runtime_checkable
class Adapter(Protocol):
    """A protocol kernel wrapping a foreign callable."""

    name: str

    def __call__(
        self, inputs: FusedOpInputs, outputs: FusedOpOutputs, caches: FusedOpCaches
    ) -> None: ...

    def limitations(self, inputs: FusedOpInputs) -> tuple[Limitation, ...]:
        """What the foreign API cannot express for a launch with these inputs."""
        ...


def kernel_not_applicable(kernel: Kernel, inputs: FusedOpInputs) -> str | None:
    """Why ``kernel`` cannot run a case with these inputs on this machine at all, or is
    never asked it by its release's callers, or None.

    An adapter may say so with a ``not_applicable(inputs)`` method: a case the foreign
    kernel cannot even launch here (an instruction this GPU lacks, a format the file never
    names), or one whose inputs its release's callers never pass (with the lines that show
    it), is reported ``not_applicable`` with that reason, never run and never passed.
    Unlike a :class:`Limitation`, which skips checks of a case that runs, it covers the
    whole case. It is asked of the scenario's shared inputs and of each rank's inputs at
    every DCP size (``runner.case_not_applicable``), which carry the slot mappings."""
    ask = getattr(kernel, "not_applicable", None)
    return ask(inputs) if isinstance(kernel, Adapter) and callable(ask) else None


def kernel_limitations(kernel: Kernel, inputs: Iterable[FusedOpInputs]) -> tuple[Limitation, ...]:
    """Every limitation of ``kernel`` over the launches of one case (one entry per rank),
    without repeats; none for a kernel that is not an :class:`Adapter`."""
    if not isinstance(kernel, Adapter):
        return ()
    found: dict[Limitation, None] = {}
    for launch_inputs in inputs:
        found.update(dict.fromkeys(kernel.limitations(launch_inputs)))
    return tuple(found)
