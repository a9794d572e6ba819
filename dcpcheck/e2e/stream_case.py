"""The end-to-end check as one case of a run: the tiny MLA model's greedy token streams at
DCP1 and DCPn (``token_streams``), run in this process, behind a worker
(``CaseRunner.run_token_streams``) or on real ranks (``dcpcheck.distributed.streams``), and
judged here the same way whichever ran them."""

from __future__ import annotations

import time
from collections.abc import Callable

from dcpcheck.backend import Backend
from dcpcheck.cases.verdicts import (
    TOKEN_STREAM_CASE,
    CaseResult,
    CheckResult,
    Finding,
    KernelError,
    RunConfig,
)
from dcpcheck.e2e.token_streams import StreamComparison, compare_streams, stream_config_for
from dcpcheck.ops.decode_stages import ChainError
from dcpcheck.ops.session_cases import CaseRunner


def token_stream_case(
    kernel: object,  # the fused op's kernel, or a CaseRunner
    config: RunConfig,
    backend: Backend,
) -> CaseResult:
    """The end-to-end check (docs/dcp-contract.md) as one more case: the tiny MLA model's greedy
    token streams at DCP1 and at the largest requested DCP size must hash identically."""
    if isinstance(kernel, CaseRunner):
        return kernel.run_token_streams(config)
    dcp_size = config.token_stream_dcp

    def compare() -> StreamComparison:
        try:
            return compare_streams(kernel, stream_config_for(backend), [dcp_size], backend.device)
        except ChainError:
            raise
        except (Exception, SystemExit) as exc:  # the kernel under test raised inside the model
            raise KernelError(f"{type(exc).__name__}: {exc}") from exc

    result = token_stream_verdict(config, dcp_size, compare)
    assert result is not None  # compare() returns a comparison in one process
    return result


def token_stream_verdict(
    config: RunConfig, dcp_size: int, compare: Callable[[], StreamComparison | None]
) -> CaseResult | None:
    """The token-stream case from ``compare``, which runs the DCP1 and DCP-``dcp_size``
    streams in one process (:func:`token_stream_case`) or on real ranks
    (``dcpcheck.distributed.streams``): a divergence fails it, a ``KernelError`` is its
    error, a chain the run's DCP size cannot be asked (``ChainError``) makes it not
    applicable, with the reason. ``None`` where ``compare`` returns None (a real rank other
    than rank 0)."""
    result = CaseResult(
        TOKEN_STREAM_CASE, dcp_size, "pass", replay=config.token_stream_replay(dcp_size)
    )
    start = time.perf_counter()
    try:
        comparison = compare()
    except KernelError as exc:
        result.status, result.error = "error", str(exc)
    except ChainError as exc:
        result.status, result.error = "not_applicable", str(exc)
    else:
        if comparison is None:
            return None
        findings: tuple[Finding, ...] = ()
        if not comparison.identical:
            d = comparison.first_divergence
            findings = (Finding("tokens", d.rank, d.describe()),)
            result.status = "fail"
        result.checks = [CheckResult("token_streams", findings)]
    result.seconds = time.perf_counter() - start
    return result
