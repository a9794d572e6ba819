"""Adapters: run a kernel whose signature is not the harness's protocol, and say what its
API cannot express.

The harness speaks one protocol, ``kernel(inputs, outputs, caches)`` (dcpcheck.contract),
and owns every buffer. A kernel from another project has its own signature: an adapter
is a protocol kernel that maps the harness's buffers onto that call (views of the same
memory wherever the foreign API writes, so writes land in the harness's buffers) and
declares, as :class:`Limitation` s, the contract items the foreign API has no way to
express (an output it has no buffer for, a slot mapping it cannot take). A check the
kernel could not have been asked to pass is reported as skipped, with the reason, never
counted as passed.

Surfacing limitations in a run (the runner's part)::

    limitations = adapters.kernel_limitations(kernel, [r.inputs for r in case.ranks])
    result.checks = adapters.apply_limitations(check_case(case, baseline, changes), limitations)

A plain protocol kernel has no limitations, so this is a no-op for it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

from dcpcheck.checks import CheckResult
from dcpcheck.contract import FusedOpCaches, FusedOpInputs, FusedOpOutputs, Kernel

ADAPTER_NAMES = ("auto", "native", "vllm")
"""``auto``: vLLM's adapter when the signature is a known vLLM shape, else ``native``;
``native``: the callable follows the harness's protocol itself; ``vllm``: force vLLM's."""


class AdapterError(ValueError):
    """The callable does not fit the adapter asked for (a kernel load error)."""


@dataclass(frozen=True)
class Limitation:
    """A contract item an API cannot express, so the checks of it are skipped.

    ``field`` names what the findings of ``checks`` are about (``index_k_out``,
    ``index_cache``; it also covers sub-fields such as ``index_cache.values``), or is
    ``None`` when the whole check cannot apply.
    """

    checks: tuple[str, ...]
    field: str | None
    reason: str

    def covers(self, finding_field: str) -> bool:
        return self.field is not None and (
            finding_field == self.field or finding_field.startswith(f"{self.field}.")
        )


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


def kernel_limitations(kernel: Kernel, inputs: Iterable[FusedOpInputs]) -> tuple[Limitation, ...]:
    """Every limitation of ``kernel`` over the launches of one case (one entry per rank),
    without repeats; none for a kernel that is not an :class:`Adapter`."""
    if not isinstance(kernel, Adapter):
        return ()
    found: dict[Limitation, None] = {}
    for launch_inputs in inputs:
        found.update(dict.fromkeys(kernel.limitations(launch_inputs)))
    return tuple(found)


def apply_limitations(
    results: Sequence[CheckResult], limitations: Sequence[Limitation]
) -> list[CheckResult]:
    """``results`` with what ``limitations`` rule out reported as skipped.

    A whole-check limitation replaces the check by a skipped one. A field limitation
    drops that field's findings from the check and adds ``check[field]``, skipped with
    the reason, so the report shows both what was checked and what could not be.
    A check already skipped for its own reason stays as it is.
    """
    adjusted: list[CheckResult] = []
    for result in results:
        relevant = [lim for lim in limitations if result.check in lim.checks]
        if not relevant or result.skipped is not None:
            adjusted.append(result)
            continue
        whole = next((lim for lim in relevant if lim.field is None), None)
        if whole is not None:
            adjusted.append(replace(result, findings=(), skipped=whole.reason))
            continue
        kept = tuple(f for f in result.findings if not any(lim.covers(f.field) for lim in relevant))
        adjusted.append(replace(result, findings=kept))  # keeps its without_oracle note
        adjusted += [
            CheckResult(f"{result.check}[{lim.field}]", skipped=lim.reason) for lim in relevant
        ]
    return adjusted


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
    from dcpcheck.adapters import vllm

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
