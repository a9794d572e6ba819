"""Requests answered by worker processes that read one JSON line and write one back.

Compiling a Triton binary holds the GIL for most of a second, so the fit check
(``dcpcheck.gpu_fit``) and the gate's ahead-of-time compiles (``dcpcheck.gate_binaries``)
hand their compiles to processes of their own: each worker takes a request a line on its
stdin and answers it a line on its stdout, one thread of this process feeding each worker
from a shared queue until the queue is empty. A worker that dies or closes its pipe leaves
its request, and its share of the rest, unanswered; the caller says what that means.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

DIED = "its worker process died"
"""Why a request has no answer: the worker it was handed to ended before answering."""

NOT_TAKEN = "no worker process was left"
"""Why a request has no answer: every worker had ended before it was taken."""


def answered(
    command: Sequence[str],
    requests: Sequence[Any],
    jobs: int | None = None,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    stderr: int | None = None,
) -> list[dict[str, Any] | str]:
    """Each of ``requests`` sent, as a JSON line, to one of ``jobs`` workers running
    ``command`` (default: one a core, never more than the requests), in the order given;
    its answer, the JSON object the worker wrote back, at the request's index, or why there
    is none (:data:`DIED`, :data:`NOT_TAKEN`). ``stderr`` is the workers' (``None``: this
    process's)."""
    if not requests:
        return []
    todo: queue.Queue[int] = queue.Queue()
    for index in range(len(requests)):
        todo.put(index)
    answers: list[dict[str, Any] | str] = [NOT_TAKEN] * len(requests)

    def serve() -> None:
        worker = subprocess.Popen(
            list(command),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=env,
            cwd=cwd,
        )
        assert worker.stdin is not None and worker.stdout is not None
        try:
            while True:
                try:
                    index = todo.get_nowait()
                except queue.Empty:
                    break
                try:
                    worker.stdin.write(json.dumps(requests[index]) + "\n")
                    worker.stdin.flush()
                    line = worker.stdout.readline()
                except OSError:  # its pipe closed: the worker is gone
                    line = ""
                if not line:
                    answers[index] = DIED
                    break
                answers[index] = json.loads(line)
        finally:  # its input ends: it leaves after the request it is on, if any
            with contextlib.suppress(OSError):
                worker.stdin.close()
            worker.wait()
            worker.stdout.close()

    count = min(jobs or os.cpu_count() or 1, len(requests))
    threads = [threading.Thread(target=serve) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers
