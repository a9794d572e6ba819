"""Requests answered by line workers (dcpcheck.line_workers): every answer lands at its
request's index whichever worker gave it, and a worker that dies leaves its request and
the rest it would have taken marked with why, never a hang or a thread's traceback."""

from __future__ import annotations

import sys

from dcpcheck import line_workers

DOUBLES = (
    "import json, os, sys\n"
    "for line in sys.stdin:\n"
    "    print(json.dumps({'twice': 2 * json.loads(line), 'pid': os.getpid()}), flush=True)\n"
)
ANSWERS_ONCE = (
    "import json, sys\n"
    "print(json.dumps({'first': json.loads(sys.stdin.readline())}), flush=True)\n"
    "sys.stdin.readline()\n"  # the second request: read, never answered
)


def test_each_answer_lands_at_its_requests_index_from_several_workers():
    answers = line_workers.answered([sys.executable, "-c", DOUBLES], list(range(40)), jobs=3)
    assert [answer["twice"] for answer in answers] == [2 * n for n in range(40)]
    assert 1 <= len({answer["pid"] for answer in answers}) <= 3


def test_a_worker_that_dies_leaves_its_request_and_the_untaken_ones_said_why(capfd):
    answers = line_workers.answered([sys.executable, "-c", ANSWERS_ONCE], [7, 8, 9], jobs=1)
    assert answers == [{"first": 7}, line_workers.DIED, line_workers.NOT_TAKEN]
    assert "Traceback" not in capfd.readouterr().err


def test_no_requests_start_no_worker():
    assert line_workers.answered(["/nonexistent/worker"], []) == []
