"""Where the kernel under test runs, for ``run`` and ``repro``: in this process, or behind a
worker process (``--isolate``, ``--case-timeout``, ``--sanitize``), loaded here first either
way so that a load error is one line and its exit code before any process starts."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import click

from dcpcheck.cli.common import InputError, KernelLoadFailure, kernel_errors, load
from dcpcheck.harness import sanitizer
from dcpcheck.harness.isolation import DEFAULT_CASE_TIMEOUT_S, IsolatedKernel, resolve_case_timeout
from dcpcheck.ops.fused_norm_rope.kernels import KERNELS
from dcpcheck.ops.fused_norm_rope.runner import KernelUnderTest, declared_ds_mla_scale

isolate_option = click.option(
    "--isolate/--no-isolate",
    default=None,
    help="Run the kernel in a worker process, so that a crash (segfault, CUDA illegal "
    "memory access) or a hang fails its case (status crash / timeout) and the run goes on "
    "with a fresh worker. Default: on for kernels from outside the registry "
    "(module:function, file.py:function), off for registry kernels.",
)


sanitize_option = click.option(
    "--sanitize",
    type=click.Choice(sanitizer.TOOLS),
    default=None,
    help="Run every case's kernel under NVIDIA's compute-sanitizer with this tool (CUDA "
    "only; implies --isolate): memcheck (out-of-bounds and misaligned accesses), initcheck "
    "(reads of unwritten global memory), racecheck (shared-memory races), synccheck "
    "(barrier misuse). Each report fails its case as check 'sanitizer', naming the kernel, "
    "the rank and the sanitizer's own text. Many times slower.",
)


case_timeout_option = click.option(
    "--case-timeout",
    type=float,
    default=None,
    metavar="SECONDS",
    help=f"Seconds to wait for each case's result before killing the worker and reporting "
    f"the case as timeout (default {DEFAULT_CASE_TIMEOUT_S:g}: a scenario's first case "
    "includes its DCP1 baseline and, on a GPU, Triton's compilation). Implies --isolate.",
)


def case_timeout_for(
    kernel_name: str, isolate: bool | None, case_timeout: float | None, sanitize: str | None
):
    """The per-case timeout if the kernel is to run isolated, else None (in process).

    Isolation defaults to on for kernels from outside the registry (code this project has
    not vetted) and off for registry kernels; an explicit ``--case-timeout`` asks for it,
    since only a worker process can be stopped in the middle of a case, and so does
    ``--sanitize``: compute-sanitizer runs the worker process.
    """
    if sanitize is not None and isolate is False:
        raise InputError("--sanitize needs --isolate: compute-sanitizer runs the worker process")
    if sanitize is not None:
        isolate = True
    if isolate is None:
        isolate = case_timeout is not None or kernel_name not in KERNELS
    try:
        return resolve_case_timeout(
            isolate, case_timeout, timeout_option="--case-timeout", isolate_option="--isolate"
        )
    except ValueError as exc:
        raise InputError(str(exc)) from None


@contextlib.contextmanager
def kernel_under_test(
    name: str, adapter: str, backend, case_timeout: float | None, sanitize: str | None = None
) -> Iterator[KernelUnderTest]:
    """The kernel, in this process (``case_timeout`` None) or behind a worker process.

    The kernel is loaded here first in both cases, so a load error is one line and exit
    125 without starting a process; leaving the ``with`` kills the worker, whatever ends it.
    A kernel that declares an fp8_ds_mla tile-scale rule dcpcheck does not know is a load
    error too (``runner.declared_ds_mla_scale``): its cases could not say what they demand.
    """
    kernel = load(name, adapter)
    try:
        declared_ds_mla_scale(kernel)
    except ValueError as exc:
        raise KernelLoadFailure(f"{name}: {exc}") from None
    if case_timeout is None:
        yield kernel
        return
    isolated = IsolatedKernel(name, adapter, backend, case_timeout, sanitizer=sanitize)
    with kernel_errors():
        isolated.start()
    try:
        yield isolated
    finally:
        isolated.close()
