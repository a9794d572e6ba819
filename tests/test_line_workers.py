"""Requests answered by forked workers (dcpcheck.line_workers): every answer lands at its
request's index whichever worker gave it, the template prepares once with every request
before it forks, what a worker prints never reaches the answers, and a worker that dies
loses only the request it held, said so, never a hang or a thread's traceback."""

from __future__ import annotations

import os
import time

from dcpcheck import line_workers

WORKER = """
import os

prepared = []


def prepare(requests):
    prepared.append([os.getpid(), len(requests)])


def answer(request):
    print("a worker's own output", flush=True)
    if request == "die":
        os._exit(3)
    return {"twice": 2 * request if isinstance(request, int) else request,
            "pid": os.getpid(), "prepared": prepared}
"""


def workers_module(tmp_path) -> dict[str, object]:
    """The options that make ``doubling_worker`` (``WORKER``) importable by the template."""
    (tmp_path / "doubling_worker.py").write_text(WORKER)
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    return {"env": {**os.environ, "PYTHONPATH": path}}


def test_each_answer_lands_at_its_requests_index_from_workers_forked_once_prepared(
    tmp_path,
):
    options = workers_module(tmp_path)
    answers = line_workers.answered("doubling_worker", list(range(40)), jobs=3, **options)
    assert [answer["twice"] for answer in answers] == [2 * n for n in range(40)]
    workers = {answer["pid"] for answer in answers}
    assert 1 <= len(workers) <= 3 and os.getpid() not in workers
    prepared = [answer["prepared"] for answer in answers]
    assert all(p == prepared[0] for p in prepared) and len(prepared[0]) == 1  # once, forked
    template, asked = prepared[0][0]
    assert template not in workers and asked == 40  # in the template, with every request


def test_a_worker_that_dies_loses_only_the_request_it_held(tmp_path, capfd):
    options = workers_module(tmp_path)
    answers = line_workers.answered("doubling_worker", [7, "die", 9, 10], jobs=2, **options)
    assert answers[1] == line_workers.DIED
    assert [answers[i]["twice"] for i in (0, 2, 3)] == [14, 18, 20]
    said = capfd.readouterr()
    assert "Traceback" not in said.out + said.err
    assert "a worker's own output" in said.err  # a worker's stdout is its stderr


def test_requests_no_worker_was_left_to_take_are_said_so(tmp_path):
    options = workers_module(tmp_path)
    answers = line_workers.answered("doubling_worker", [7, "die", 9], jobs=1, **options)
    assert answers == [answers[0], line_workers.DIED, line_workers.NOT_TAKEN]
    assert answers[0]["twice"] == 14


def test_a_module_that_does_not_import_leaves_every_request_not_taken(tmp_path, capfd):
    answers = line_workers.answered("no_such_worker_module", [1, 2], jobs=2)
    assert answers == [line_workers.NOT_TAKEN] * 2
    assert "No module named 'no_such_worker_module'" in capfd.readouterr().err


def test_no_requests_start_no_template(monkeypatch):
    def started(*args, **kwargs):
        raise AssertionError("a template was started")

    monkeypatch.setattr(line_workers.subprocess, "Popen", started)
    assert line_workers.answered("doubling_worker", []) == []


def test_a_template_asked_nothing_is_stopped_without_waiting_for_its_imports(tmp_path):
    (tmp_path / "slow_import.py").write_text("import time\ntime.sleep(30)\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    started = time.monotonic()
    with line_workers.Workers("slow_import", jobs=2, env=env) as workers:
        assert workers.answer([]) == []
    assert time.monotonic() - started < 10


def test_the_template_forks_with_one_thread_after_importing_torch(tmp_path):
    """torch starts a CPU thread pool's thread as it is imported unless told one thread
    (``ONE_THREAD_ENV``); the template is told so, and forks with its one thread."""
    (tmp_path / "torch_worker.py").write_text(
        "import torch\n"
        "threads = []\n"
        "def prepare(requests):\n"
        "    threads.append(len(__import__('os').listdir('/proc/self/task')))\n"
        "def answer(request):\n"
        "    return {'threads': threads}\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    env.pop("OMP_NUM_THREADS", None)
    assert line_workers.answered("torch_worker", [1], env=env) == [{"threads": [1]}]


def test_what_a_module_prints_as_it_is_imported_never_reaches_the_answers(tmp_path, capfd):
    (tmp_path / "chatty_worker.py").write_text(
        "print('imported')\ndef answer(request):\n    return {'got': request}\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    assert line_workers.answered("chatty_worker", [1, 2], jobs=2, env=env) == [
        {"got": 1},
        {"got": 2},
    ]
    assert "imported" in capfd.readouterr().err


def test_a_template_that_cannot_start_leaves_every_request_not_taken(monkeypatch):
    monkeypatch.setattr(line_workers.sys, "executable", "/nonexistent/python")
    assert line_workers.answered("doubling_worker", [1, 2]) == [line_workers.NOT_TAKEN] * 2
