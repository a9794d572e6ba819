"""``dcpcheck mutate``: every operator's edits of a small kernel, each outcome read from a
worker's exit and report, the cache, the equivalents file, the substitution a worker
loads a mutant through, and the command on the project's merge and fused kernel."""

from __future__ import annotations

import ast
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from dcpcheck.kernels import ran
from dcpcheck.mutation import campaign, equivalents, reach, runner, selection
from dcpcheck.mutation.operators import OPERATORS, fp32_ulp, mutants_of
from dcpcheck.workflows.session import INTERNAL_ERROR_CASE

REPO = Path(__file__).resolve().parents[1]

SMALL = textwrap.dedent(
    '''
    import torch
    import triton
    import triton.language as tl

    LIMIT = tl.constexpr(448.0)


    @triton.jit
    def _copy(src_ptr, dst_ptr, n, stride, FLAG: tl.constexpr, BLOCK: tl.constexpr):
        """A docstring: never edited."""
        row = tl.program_id(0)
        if row >= n:
            return
        lanes = tl.arange(0, BLOCK)
        inside = (lanes < n) & (lanes >= 0)
        x = tl.load(src_ptr + row * stride + lanes, mask=inside, other=0.0)
        y = tl.where(x > LIMIT, LIMIT, x).to(tl.float32)
        tl.store(dst_ptr + row * stride + lanes, y, mask=inside)


    def copy(src, n_rows):
        dst = torch.empty_like(src, dtype=torch.float32)
        _copy[(n_rows,)](src, dst, n_rows, src.stride(0), True, BLOCK=16)
        return dst


    def untouched(a, b):
        return a + b < 3
    '''
)


@pytest.fixture
def small(tmp_path) -> Path:
    path = tmp_path / "small.py"
    path.write_text(SMALL)
    return path


def test_every_operator_edits_the_small_kernel_once_per_site_keeping_its_lines(small):
    mutants = mutants_of(small)
    assert {m.operator for m in mutants} == set(OPERATORS)
    assert len({m.name for m in mutants}) == len(mutants)
    for mutant in mutants:
        ast.parse(mutant.source)  # still Python
        assert mutant.source.count("\n") == SMALL.count("\n")
        body = mutant.diff.splitlines()[2:]
        removed = [line for line in body if line.startswith("-")]
        assert len(removed) == len([line for line in body if line.startswith("+")]) >= 1
    assert all(m.function in ("_copy", "copy", "<module>") for m in mutants)  # not `untouched`
    assert not any(m.line == 11 for m in mutants)  # the docstring's
    names = {m.name for m in mutants}
    for expected in (
        "small.py:_copy:13:compare:>= to >",
        "small.py:_copy:13:early-return:condition negated",
        "small.py:_copy:13:early-return:if removed",
        "small.py:_copy:16:mask-conjunct:& right dropped",
        "small.py:_copy:17:branch-swapped:other to 1",
        "small.py:_copy:17:offset:pointer + 1",
        "small.py:_copy:18:branch-swapped:where branches swapped",
        "small.py:_copy:18:dtype:tl.float32 to tl.bfloat16",
        "small.py:_copy:19:store-removed:tl.store removed",
        "small.py:_copy:19:arithmetic:* to /",
        "small.py:copy:24:arguments-swapped:dst and n_rows swapped",
        "small.py:copy:24:constant:True to False",
        "small.py:<module>:6:constant:LIMIT + 1 ulp",
    ):
        assert expected in names, expected
    [removed] = [m for m in mutants if m.name.endswith("if removed")]
    assert "    pass\n" in removed.source and "return\n" not in removed.source.split("lanes")[0]


def test_a_float_moves_by_one_fp32_ulp_and_zero_only_to_its_boundaries():
    assert fp32_ulp(448.0) == 2.0**-15
    assert fp32_ulp(1.0) == 2.0**-23
    source = "import triton\n@triton.jit\ndef k(p):\n    x = 0.0\n    y = 0\n"
    changes = [m.change for m in mutants_of(Path("k.py"), source)]
    assert changes == ["0.0 to 1", "0.0 to -1", "0 to 1", "0 to -1"]  # no denormal


def test_the_sample_is_deterministic_and_takes_every_operator_in_turn(small):
    mutants = mutants_of(small)
    chosen = selection.sample(mutants, len(OPERATORS))
    assert {m.operator for m in chosen} == set(OPERATORS)
    assert selection.sample(mutants, 5) == selection.sample(mutants, 5)
    assert selection.sample(mutants, 10_000) == mutants
    assert [m.name for m in selection.named(mutants, ["small.py:copy:*"])] == [
        m.name for m in mutants if m.function == "copy"
    ]


def _report(*cases: dict, search: dict | None = None) -> dict:
    return {"cases": list(cases), **({"search": search} if search else {})}


def _case(status: str, checks=(), error: str | None = None) -> dict:
    return {"scenario": "s", "dcp": 4, "status": status, "error": error, "checks": list(checks)}


FAILED = {"check": "merged_out", "status": "fail", "findings": [{"detail": "row 0 off"}]}
BROKE_OFF = {**_case("error", error="dcpcheck stopped on an internal error: KeyError: 'x'"),
             "scenario": INTERNAL_ERROR_CASE}  # fmt: skip


@pytest.mark.parametrize(
    ("code", "report", "outcome", "check"),
    [
        (0, _report(_case("pass")), runner.SURVIVED, None),
        (1, _report(_case("pass"), _case("fail", [FAILED])), runner.KILLED, "merged_out"),
        (1, _report(_case("error", error="IndexError: out of range")), runner.KILLED, "error"),
        (1, _report(_case("fail", [FAILED]), BROKE_OFF), runner.KILLED, "merged_out"),
        (1, _report(search={"status": "fail", "failed_checks": ["chain"]}), runner.KILLED, "chain"),
        (None, None, runner.TIMED_OUT, None),
        (-11, None, runner.CRASHED, None),
        (1, None, runner.CRASHED, None),
        (125, None, runner.NOT_COMPILED, None),
        (
            1,
            _report(_case("error", error="NameError: name 'q' is not defined")),
            runner.NOT_COMPILED,
            None,
        ),
    ],
)
def test_each_outcome_is_read_from_the_workers_exit_and_report(code, report, outcome, check):
    found = runner.classify("m", code, report, "dcpcheck: last line\n")
    assert found.outcome == outcome
    assert found.check == check
    if outcome == runner.KILLED:
        assert found.scenario in ("s[dcp4]", "property search")


def test_a_run_that_broke_on_dcpchecks_own_error_is_a_crash_that_says_so():
    """No check saw the mutant: the harness broke on it, which the gate notices (exit 1)
    but which must not read as a kill by a check."""
    found = runner.classify("m", 1, _report(_case("pass"), BROKE_OFF), "")
    assert (found.outcome, found.detail, found.check) == (runner.CRASHED, BROKE_OFF["error"], None)


def test_the_cache_keeps_a_kill_while_its_scenario_stands_and_reruns_survivors(small, tmp_path):
    mutant = mutants_of(small)[0]
    (tmp_path / "s.toml").write_text("x = 1\n")  # the scenario that kills it
    gate = runner.Gate("lse-combine", "default", (4,), scenario_dir=tmp_path)
    cache = runner.Cache(tmp_path / "cache", gate)
    assert cache.get(mutant) is None
    cache.put(mutant, runner.Outcome(mutant.name, runner.KILLED, "s[dcp4]", "merged_out"))
    assert cache.get(mutant).check == "merged_out"
    assert cache.get(mutant, search=True) is None
    other_gate = runner.Gate("lse-combine", "default", (2,), scenario_dir=tmp_path)
    assert runner.Cache(tmp_path / "cache", other_gate).get(mutant) is None
    survivor = mutants_of(small)[1]
    cache.put(survivor, runner.Outcome(survivor.name, runner.SURVIVED))
    (tmp_path / "new.toml").write_text("x = 1\n")  # a scenario added
    grown = runner.Cache(tmp_path / "cache", gate)
    assert grown.get(mutant).check == "merged_out"  # its killer is unchanged: it stands
    assert grown.get(survivor) is None  # the new scenario may kill it: run again
    (tmp_path / "s.toml").write_text("x = 2\n")  # the killer edited
    assert runner.Cache(tmp_path / "cache", gate).get(mutant) is None


def test_a_rerun_takes_every_outcome_from_the_cache_and_launches_nothing(
    small, tmp_path, monkeypatch
):
    mutants = mutants_of(small)[:3]
    gate = runner.Gate("lse-combine", "default", (4,), scenario_dir=tmp_path)
    cache = runner.Cache(tmp_path / "cache", gate)
    for m in mutants:
        cache.put(m, runner.Outcome(m.name, runner.SURVIVED))

    def no_launch(*args):
        raise AssertionError("a cached mutant was launched")

    monkeypatch.setattr(runner, "_launch", no_launch)
    found = runner.run_mutants(mutants, gate, cache, 2)
    assert [o.outcome for o in found.values()] == [runner.SURVIVED] * 3


@pytest.mark.parametrize(
    ("jobs", "outside", "threads"),
    [(4, None, "1"), (1, None, None), (4, "3", "3")],
    ids=["several-jobs-one-thread-each", "one-job-torch-default", "a-set-value-kept"],
)
def test_workers_run_side_by_side_on_one_torch_thread_each(
    small, tmp_path, monkeypatch, jobs, outside, threads
):
    if outside is None:
        monkeypatch.delenv(runner.ONE_THREAD_ENV, raising=False)
    else:
        monkeypatch.setenv(runner.ONE_THREAD_ENV, outside)
    environments = []

    class Exited:  # a worker that exits at once with the gate's "passed"
        pid = os.getpid()
        returncode = 0

        def poll(self):
            return 0

        def wait(self):
            return 0

    def start(module, arguments, *, env, **popen):
        environments.append(env)
        return Exited()

    monkeypatch.setattr(runner.fork_server, "start", start)
    gate = runner.Gate("lse-combine", "default", (4,), scenario_dir=tmp_path)
    runner.run_mutants(mutants_of(small)[:2], gate, runner.Cache(tmp_path / "c", gate), jobs)
    assert len(environments) == 2
    assert all(env.get(runner.ONE_THREAD_ENV) == threads for env in environments)
    assert all(env["PYTHONPATH"].split(os.pathsep)[0] == str(REPO) for env in environments)


def test_the_equivalents_file_is_read_and_a_bad_one_is_one_line(tmp_path):
    path = tmp_path / "kernel.mutants.toml"
    assert equivalents.file_for(tmp_path / "kernel.py") == path
    path.write_text('[[equivalent]]\nmutant = "kernel.py:k:*"\nreason = "always true"\n')
    [entry] = equivalents.load(path)
    assert equivalents.judged("kernel.py:k:3:compare:< to <=", [entry]) == entry
    assert equivalents.judged("kernel.py:h:3:compare:< to <=", [entry]) is None
    path.write_text('[[equivalent]]\nmutant = "x"\n')
    with pytest.raises(equivalents.EquivalentsError, match="needs exactly") as error:
        equivalents.load(path)
    assert "\n" not in str(error.value)


def test_a_worker_imports_the_mutant_wherever_the_original_module_is_imported(tmp_path):
    original = REPO / "dcpcheck" / "op_registry.py"
    replacement = tmp_path / "op_registry.py"
    replacement.write_text(original.read_text() + "\nSUBSTITUTED = True\n")
    code = (
        "import sys; from pathlib import Path\n"
        "from dcpcheck.kernels.substitution import substitute\n"
        f"substitute(Path({str(original)!r}), Path({str(replacement)!r}))\n"
        "import dcpcheck.op_registry as r; print(r.SUBSTITUTED, r.__file__)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert done.stdout.split() == ["True", str(replacement)], done.stderr


def test_the_kernel_must_pass_its_own_gate_first(tmp_path):
    broken = tmp_path / "kernel.py"
    broken.write_text((REPO / "dcpcheck/ops/lse_combine/kernel.py").read_text())
    gate = runner.Gate("lse-combine", "mutant/heads-rolled", (2,), ("decode-empty-ranks",))
    with pytest.raises(campaign.MutationError, match="does not pass its own gate"):
        campaign.mutate(gate, [broken], [], tmp_path / "home", 1)


def _mutate(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    report = tmp_path / "mutants.json"
    command = [sys.executable, "-m", "dcpcheck", "mutate", *args, "--json", str(report)]
    command += ["--home", str(tmp_path / "home"), "--junit", str(tmp_path / "mutants.xml")]
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # this checkout's dcpcheck, from tmp_path
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=env)
    assert "Traceback" not in done.stderr, done.stderr
    return done, json.loads(report.read_text())


def test_mutate_on_the_projects_merge_kills_survives_and_caches(tmp_path):
    """Dropping the mask of ranks survives two ranks (a power of two: no lane past the
    last rank) and dies on odd-shapes' three and six; removing the store of the merged
    LSE dies at once; an edit the kernel's mutants file explains is reported apart, never
    run."""
    picked = [
        "--mutant",
        "kernel.py:_correct_kernel:72:store-removed:*",
        "--mutant",
        "kernel.py:_correct_kernel:56:mask-conjunct:& left dropped",
        "--mutant",
        "kernel.py:_correct_kernel:61:constant:0.0 to 1",  # kernel.mutants.toml: equivalent
    ]
    narrow = ["--op", "lse-combine", "--dcp", "2", "--scenario", "base2-sink-speculative"]
    done, report = _mutate(tmp_path, *narrow, *picked)
    assert done.returncode == 1, done.stdout + done.stderr
    statuses = {m["operator"]: m["status"] for m in report["mutants"]}
    assert statuses == {
        "store-removed": "killed",
        "mask-conjunct": "survived",
        "constant": "equivalent",
    }
    assert report["score"] == 50.0  # the equivalent one is not counted
    [equivalent] = [m for m in report["mutants"] if m["status"] == "equivalent"]
    assert "exp(-inf - shift)" in equivalent["reason"]
    [survivor] = [m for m in report["mutants"] if m["status"] == "survived"]
    assert "+        mask=(heads[None, :] < HEADS)," in survivor["diff"]
    assert survivor["replay"].startswith("dcpcheck mutate --op lse-combine")
    assert "<failure" in (tmp_path / "mutants.xml").read_text()
    wider = ["--op", "lse-combine", "--scenario", "odd-shapes", *picked]
    done, report = _mutate(tmp_path, *wider)
    assert done.returncode == 0, done.stdout + done.stderr
    assert {m["status"] for m in report["mutants"]} == {"killed", "equivalent"}


def test_a_mutation_run_that_judged_no_mutant_is_not_0(tmp_path):
    """Every mutant asked for is one the kernel's mutants file explains: none ran, so
    there is no score, and no pass either."""
    equivalent = ["--mutant", "kernel.py:_correct_kernel:61:constant:0.0 to 1"]
    done, report = _mutate(tmp_path, "--op", "lse-combine", "--dcp", "2", *equivalent)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "no mutant was judged: each of the 1 is explained by its mutants file" in done.stderr
    assert report["score"] is None and report["summary"] == {"equivalent": 1}


def test_a_kernel_that_fails_its_own_gate_still_writes_the_reports(tmp_path):
    gate = ["--op", "lse-combine", "--kernel", "mutant/heads-rolled", "--dcp", "2"]
    done, report = _mutate(tmp_path, *gate, "--scenario", "decode-empty-ranks", "--limit", "1")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "does not pass its own gate" in done.stderr and "no mutant was judged" in done.stderr
    assert report["partial"] is True and report["mutants"] == []
    assert "does not pass its own gate" in report["error"]
    assert "<error message=" in (tmp_path / "mutants.xml").read_text()


def test_mutate_runs_a_handful_of_the_fused_kernels_mutants(tmp_path):
    _, report = _mutate(
        tmp_path,
        "--scenario",
        "decode-single-dcp4",
        "--dcp",
        "4",
        "--operator",
        "store-removed",
        "--limit",
        "3",
    )
    assert len(report["mutants"]) == 3
    assert {m["status"] for m in report["mutants"]} <= {"killed", "survived", "crashed"}
    assert report["files"][0]["path"].endswith("fused_norm_rope/kernel.py")
    assert report["by_check"], "no check failed on any removed store"


def test_the_search_pass_kills_what_the_named_scenario_lets_through(tmp_path):
    """extreme-lse does not ask for the merged LSE, so removing its store survives the
    named scenario; the property search draws return_lse and kills it. Each pass counts
    its own progress: the gate's over the mutants, the search's over the survivors."""
    done, report = _mutate(
        tmp_path,
        "--op",
        "lse-combine",
        "--dcp",
        "2",
        "--scenario",
        "extreme-lse",
        "--mutant",
        "kernel.py:_correct_kernel:72:store-removed:*",
        "--search",
        "20",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    [mutant] = report["mutants"]
    assert (mutant["status"], mutant["by"], mutant["check"]) == ("killed", "search", "merged_lse")
    progress = re.findall(r"^\[(.+?)\] (\w+)", done.stderr, re.MULTILINE)
    assert progress == [("1/1", "survived"), ("search 1/1", "killed")], done.stderr


def test_a_gate_that_refuses_its_arguments_stops_the_run_never_a_kill():
    with pytest.raises(runner.GateError, match="refused its arguments: dcpcheck: error: bad"):
        runner.classify("m", 2, None, "dcpcheck: error: bad\n")


def test_sigterm_ends_a_campaign_with_143_and_its_partial_report(tmp_path):
    """SIGTERM (a CI job's timeout) ended ``mutate`` with 130, Ctrl-C's code; every other
    command exits 143 on it. The signal lands while the mutants run (the first has been
    judged, three are left, one at a time)."""
    report = tmp_path / "mutants.json"
    command = [
        sys.executable, "-m", "dcpcheck", "mutate", "--op", "slot-mapping", "--scenario",
        "decode-single", "--dcp", "2", "--jobs", "1", "--limit", "4", "--json", str(report),
        "--home", str(tmp_path / "home"),
    ]  # fmt: skip
    proc = subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    seen = []
    for line in proc.stderr:  # one progress line per mutant judged
        seen.append(line)
        if line.startswith("[1/4]"):
            break
    proc.send_signal(signal.SIGTERM)
    _, rest = proc.communicate(timeout=300)
    assert proc.returncode == 143, "".join(seen) + rest
    assert "Traceback" not in rest
    document = json.loads(report.read_text())
    assert document["partial"] is True
    assert 1 <= len(document["mutants"]) < 4


REACHED = textwrap.dedent(
    '''
    import triton


    @triton.jit
    def _launched(x_ptr):
        _inlined(x_ptr + 1)


    @triton.jit
    def _inlined(x_ptr):
        pass


    @triton.jit
    def _other_layout(x_ptr):
        pass


    def _by_table(x):
        return x


    LIMIT = 448


    def _unused_host(x):
        _other_layout[(1,)](x + 2)


    TABLE = {"a": _by_table}


    class Table:
        def __init__(self):
            self.rows = 0

        def write(self, x):
            return x

        def unread(self, x):
            return x


    def _reads_unread(table):
        return table.unread


    def entry(x, table):
        _launched[(1,)](x)
        table.write(x)
        return TABLE["a"](x) < LIMIT
    '''
)


def test_the_gate_reaches_what_the_functions_it_ran_name_and_nothing_else(tmp_path):
    """From ``entry``: its launch, the launched kernel's inlined call, a method read as an
    attribute, a function through a module-level table. ``_other_layout`` is launched only
    by a function nothing reaches; a class whose body ran on import reaches no method
    until some reached code reads it."""
    path = tmp_path / "reached.py"
    path.write_text(REACHED)
    assert reach.reachable(path, ["entry"]) == {
        "entry", "_launched", "_inlined", "write", "TABLE", "_by_table", "LIMIT",
    }  # fmt: skip
    assert reach.reachable(path, ["entry", "_unused_host"]) >= {"_unused_host", "_other_layout"}
    assert "unread" not in reach.reachable(path, ["entry", "Table"])  # its body ran, on import
    assert "unread" in reach.reachable(path, ["entry", "_reads_unread"])


def test_a_mutant_is_unreached_only_by_a_record_of_what_ran(tmp_path):
    path = tmp_path / "reached.py"
    path.write_text(REACHED)
    mutants = {m.function: m for m in mutants_of(path)}
    ran = {str(path.resolve()): ["entry"]}
    judged = campaign.unreached(mutants["_unused_host"], ran)
    assert judged is not None and judged.kind == campaign.UNREACHED
    assert "runs only entry of reached.py" in judged.reason
    assert campaign.unreached(mutants["_launched"], ran) is None
    assert campaign.unreached(mutants["_unused_host"], {}) is None  # no record: no claim
    module_level = next(m for m in mutants_of(path) if m.function == "<module>")
    assert campaign.unreached(module_level, {str(path.resolve()): ["<module>"]}) is None


def test_a_worker_records_what_of_the_stood_in_file_ran_and_launched(small, tmp_path):
    """Python entered ``copy``; Triton launched ``_copy`` (on a GPU its body is compiled,
    never entered: the launch records it)."""
    stand_in = tmp_path / "stand_in.py"
    stand_in.write_text(small.read_text())
    code = (
        "import torch; from pathlib import Path\n"
        "from dcpcheck import backend; backend.select_backend('auto')\n"
        "from dcpcheck.kernels.substitution import substitute\n"
        "from dcpcheck.kernels.loading import load_file\n"
        f"substitute(Path({str(small)!r}), Path({str(stand_in)!r}))\n"
        f"module = load_file(Path({str(small)!r}))\n"
        "device = 'cuda' if torch.cuda.is_available() else 'cpu'\n"
        "module.copy(torch.ones(2, 16, device=device), 2)\n"
    )
    (tmp_path / "ran").mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "DCPCHECK_RAN_DIR": str(tmp_path / "ran")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert ran.read(tmp_path / "ran") == {str(small.resolve()): {"<module>", "copy", "_copy"}}


JIT_HELPERS = textwrap.dedent(
    """
    import triton


    @triton.jit
    def by_instruction(x):
        return x + 1


    @triton.jit
    def by_arithmetic(x):
        return x - 1


    @triton.jit
    def under_flag(x):
        return x * 2


    codes = by_instruction  # the alias a machine's capability picks
    """
)

JIT_KERNEL = textwrap.dedent(
    """
    import triton
    import triton.language as tl

    import jit_helpers
    from jit_helpers import codes


    @triton.jit
    def kernel(x_ptr, FLAG: tl.constexpr):
        x = jit_helpers.by_arithmetic(codes(tl.load(x_ptr)))
        if FLAG:
            x = jit_helpers.under_flag(x)
        tl.store(x_ptr, x)
    """
)


def test_a_gpu_compile_records_the_jitted_functions_of_other_files_it_calls(tmp_path):
    """Compiled for sm_90 (no device needed), a kernel's calls into another watched file
    are recorded under the names Triton compiled: the alias as the function it is bound
    to, an attribute of the module, and not the call a false constexpr leaves out."""
    (tmp_path / "jit_helpers.py").write_text(JIT_HELPERS)
    (tmp_path / "jit_kernel.py").write_text(JIT_KERNEL)
    helpers, kernel = tmp_path / "jit_helpers.py", tmp_path / "jit_kernel.py"
    code = (
        "import sys; from pathlib import Path\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        "from dcpcheck.kernels import ran\n"
        f"ran.watch(Path({str(kernel)!r}), Path({str(kernel)!r}))\n"
        "import triton; from triton.backends.compiler import GPUTarget\n"
        "import jit_kernel\n"
        "source = triton.compiler.ASTSource(\n"
        "    jit_kernel.kernel, {'x_ptr': '*fp32', 'FLAG': 'constexpr'}, {'FLAG': False})\n"
        "triton.compile(source, target=GPUTarget('cuda', 90, 32))\n"
    )
    (tmp_path / "ran").mkdir()
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(
        PYTHONPATH=str(REPO),
        TRITON_CACHE_DIR=str(tmp_path / "triton"),
        **{ran.RAN_DIR_ENV: str(tmp_path / "ran"), ran.RAN_FILES_ENV: str(helpers)},
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert ran.read(tmp_path / "ran") == {
        str(helpers): {"<module>", "by_instruction", "by_arithmetic"},
        str(kernel): {"<module>"},  # imported and compiled, never launched
    }


def test_this_tritons_code_generator_has_the_call_ran_records():
    """``ran`` records a GPU's compiled calls where Triton's code generator compiles a call
    to a jitted function; a Triton without that method would leave them unrecorded."""
    import inspect

    from triton.compiler.code_generator import CodeGenerator

    method = getattr(CodeGenerator, ran.COMPILED_CALL, None)
    assert callable(method) and "fn" in inspect.signature(method).parameters


def test_the_fused_kernels_unedited_gate_passes_while_its_record_is_taken(tmp_path):
    """A worker that records what ran (the unedited kernel's gate in ``mutate``) judges as
    any run does: the fused kernel's fp8 and nvfp4 caches pass, and the fp8 encoding this
    backend compiles is recorded, the other not: the integer arithmetic under the
    interpreter, the conversion instruction on a GPU (its constexpr branch compiles alone)."""
    kernel = REPO / "dcpcheck/ops/fused_norm_rope/kernel.py"
    codes = REPO / "dcpcheck/ops/fused_norm_rope/fp8_codes.py"
    (tmp_path / "ran").mkdir()
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # as a shell's
    env.update(
        PYTHONPATH=str(REPO),
        # A binary loaded from Triton's cache is not compiled, so its callees would go
        # unrecorded on a GPU: the worker gets a cache of its own, as ``mutate``'s does.
        TRITON_CACHE_DIR=str(tmp_path / "triton"),
        **{ran.RAN_DIR_ENV: str(tmp_path / "ran"), ran.RAN_FILES_ENV: str(codes)},
    )
    command = [sys.executable, "-m", "dcpcheck.mutation.worker", str(kernel), str(kernel)]
    command += ["run", "--op", "fused-norm-rope", "--no-tokens", "--scenario", "fp8-cache"]
    command += ["--scenario", "below-floor-nvfp4-fp16"]  # the nvfp4 writer's launches too
    command += ["--dcp", "1", "--home", str(tmp_path / "home")]
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stdout[-2000:]
    encodings = {"fp8_e4m3_codes_by_arithmetic", "fp8_e4m3_codes_by_instruction"}
    recorded = ran.read(tmp_path / "ran")[str(codes)] & encodings
    on_a_gpu = torch.cuda.is_available()
    assert recorded == {f"fp8_e4m3_codes_by_{'instruction' if on_a_gpu else 'arithmetic'}"}


def test_mutate_does_not_run_the_mutants_of_a_kernel_the_gate_never_launches(tmp_path):
    """The project's merge with a second kernel appended that nothing launches: its
    mutants are reported unreached, never run; the merge's own are run."""
    kernel = tmp_path / "merge.py"
    kernel.write_text(
        (REPO / "dcpcheck/ops/lse_combine/kernel.py").read_text()
        + "\n\n@triton.jit\ndef _never_launched(x_ptr):\n    tl.store(x_ptr, 1.0)\n"
    )
    gate = ["--op", "lse-combine", "--kernel", f"{kernel}:combine", "--dcp", "2"]
    gate += ["--scenario", "base2-sink-speculative"]
    picked = ["--mutant", "merge.py:_never_launched:*", "--mutant", "merge.py:*:72:store-removed:*"]
    done, report = _mutate(tmp_path, *gate, *picked)
    statuses = {m["function"]: m["status"] for m in report["mutants"]}
    assert statuses == {"_never_launched": "unreached", "_correct_kernel": "killed"}, done.stdout
    assert "unreached, not run: " in done.stdout and "_never_launched" in done.stdout
