"""Where the kernel under test runs, for ``run`` and ``repro``: in this process, or behind a
worker process (``--isolate``, ``--case-timeout``, ``--sanitize``), which alone imports its
module (``dcpcheck.harness.isolation``). A spec wrong in itself is one line and exit 2
either way before any process starts (the op's ``check_kernel``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from dcpcheck.cli.common import InputError, KernelLoadFailure, kernel_errors, load
from dcpcheck.harness.isolation import IsolatedKernel, resolve_case_timeout
from dcpcheck.ops import package


def case_timeout_for(
    op: str,
    kernel_name: str,
    isolate: bool | None,
    case_timeout: float | None,
    sanitize: str | None,
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
        isolate = case_timeout is not None or kernel_name not in package(op).kernels()
    try:
        return resolve_case_timeout(
            isolate, case_timeout, timeout_option="--case-timeout", isolate_option="--isolate"
        )
    except ValueError as exc:
        raise InputError(str(exc)) from None


def loaded_here(op: str, name: str, adapter: str) -> object:
    """The session op's kernel ``name``, loaded in this process (``common.load``), its
    declarations read: one it declares that dcpcheck cannot read (the op's
    ``declarations``: an fp8_ds_mla tile-scale rule it does not know) is a load error, exit
    125, since its cases could not say what they demand."""
    kernel = load(op, name, adapter)
    try:
        package(op).session_cases().declarations(kernel)
    except ValueError as exc:
        raise KernelLoadFailure(f"{name}: {exc}") from None
    return kernel


@contextlib.contextmanager
def kernel_under_test(
    op: str,
    name: str,
    adapter: str,
    backend,
    case_timeout: float | None,
    sanitize: str | None = None,
) -> Iterator[object]:
    """The kernel, in this process (``case_timeout`` None) or behind a worker process.

    In this process it is loaded here, its module probed first (``import_probe``, as the
    command line asks). Behind a worker, only its spec is checked here
    (the op's ``check_kernel``) and the worker loads it: a load error or a lost import is the
    same one line and exit code either way (``common.kernel_errors``), and so is a
    declaration it cannot read (:func:`loaded_here`). Leaving the ``with`` kills the
    worker, whatever ends it.
    """
    if case_timeout is None:
        yield loaded_here(op, name, adapter)
        return
    with kernel_errors():
        package(op).check_kernel(name, adapter)
        isolated = IsolatedKernel(name, adapter, backend, case_timeout, sanitizer=sanitize)
        isolated.start()
    try:
        yield isolated
    finally:
        isolated.close()
