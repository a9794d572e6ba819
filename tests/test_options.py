"""The option table (``dcpcheck.cases.options``) is where every option that reaches a run
comes from: ``run``, ``repro``, a rank process's ``run`` and the pytest plugin take its
records' spelling, help and defaults; an op's registry record says which it takes, and
every other one is refused naming it as typed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import click
import pytest

from dcpcheck import pytest_plugin
from dcpcheck.cases.options import COMMANDS, OPTIONS, PASSED_TO_RANKS, ops_taking
from dcpcheck.cases.verdicts import RunConfig
from dcpcheck.cli import main, options, ranks
from dcpcheck.cli import run as run_module
from dcpcheck.distributed import launcher
from dcpcheck.op_registry import OPS
from dcpcheck.ops import package, runner_ops
from dcpcheck.ops.fused_norm_rope import search
from tests.test_pytest_plugin import PLUGIN_ARGS

REPO = Path(__file__).resolve().parents[1]

CLICK_COMMANDS = {
    "run": run_module.run_command,
    "repro": run_module.repro_command,
    "ranks": ranks.run_command,
}


def _params(command: click.Command) -> dict[str, click.Option]:
    return {p.name: p for p in command.params if isinstance(p, click.Option) and p.name != "help"}


@pytest.mark.parametrize("command", list(CLICK_COMMANDS))
def test_a_commands_options_are_the_tables(command):
    """Each option of the command is one of the table's, in its order, with its help, its
    default and its spelling; and the command has no other."""
    params = _params(CLICK_COMMANDS[command])
    records = [OPTIONS[name].on(command, options.FILLS) for name in COMMANDS[command]]
    assert list(params) == [record.key for record in records]
    for record in records:
        param = params[record.key]
        assert param.help == record.help, record.name
        assert param.default == record.default, record.name
        assert record.flag in param.opts, record.name
        assert param.metavar == record.metavar, record.name


def test_the_plugins_options_are_the_tables():
    """``--dcpcheck-NAME`` for each of the plugin's records, with its help and default."""
    added: list[tuple[str, dict]] = []

    class Group:
        def addoption(self, flag: str, **settings) -> None:
            added.append((flag, settings))

    class Parser:
        def getgroup(self, *args) -> Group:
            return Group()

        def addini(self, *args, **kwargs) -> None:
            pass

    pytest_plugin.pytest_addoption(Parser())
    records = [OPTIONS[name].on("pytest") for name in COMMANDS["pytest"]]
    assert [flag for flag, _ in added] == [f"--dcpcheck-{r.name}" for r in records]
    for (_, settings), record in zip(added, records, strict=True):
        assert settings["help"] == record.help, record.name
        default = [] if record.multiple else record.default
        assert settings["default"] == default, record.name


def _help_texts() -> set[str]:
    return {
        OPTIONS[name].on(command, options.FILLS).help
        for command, names in COMMANDS.items()
        for name in names
    }


@pytest.mark.parametrize(
    "path", [*sorted((REPO / "dcpcheck" / "cli").glob("*.py")), REPO / "dcpcheck/pytest_plugin.py"]
)
def test_no_help_text_is_written_twice(path):
    """The commands generate their options: none spells out a help text of the table."""
    source = " ".join(path.read_text().split())
    for text in _help_texts():
        assert text[:60] not in source, (path.name, text[:60])


def test_every_declared_option_is_the_tables():
    for op, record in OPS.items():
        for command in ("run", "repro"):
            declared = record.run_options if command == "run" else record.repro_options
            assert set(declared or ()) <= set(COMMANDS[command]), (op, command)


def _typed(name: str, tmp_path: Path) -> list[list[str]]:
    """Ways to give option ``name`` on the command line (a flag pair's both sides)."""
    option = OPTIONS[name]
    if option.kind == "flag":
        return [[option.flag]]
    if option.kind == "switch":
        return [[option.flag], [f"--no-{option.name}"]]
    value = {
        "choice": None,
        "int": "1",
        "float": "5",
        "path": str(tmp_path / "x"),
        "dir": str(tmp_path / "d"),
    }.get(option.kind, "x")
    if option.kind == "choice":
        choices = option.on("run", options.FILLS).choices
        value = [c for c in choices if c != option.default][-1]
    return [[option.flag, value]]


def _refused(command: str) -> list[tuple[str, str]]:
    """(op, option) for every option of ``command`` an op package does not take (the
    plugin's are ``run``'s: ``--dcpcheck-op OP`` is ``run --op OP`` in pytest)."""
    declared = "repro" if command == "repro" else "run"
    return [
        (op, name)
        for name in COMMANDS[command]
        for op in runner_ops()
        if op not in ops_taking(name, declared)
    ]


def _error(argv: list[str], monkeypatch, capsys) -> tuple[int, list[str]]:
    monkeypatch.setattr(sys, "argv", ["dcpcheck", *argv])
    with pytest.raises(SystemExit) as exited:
        main()
    lines = capsys.readouterr().err.splitlines()
    return exited.value.code, [line for line in lines if line.startswith("dcpcheck: error:")]


@pytest.mark.parametrize(("op", "name"), _refused("run"))
def test_run_refuses_each_option_an_op_does_not_take(op, name, tmp_path, monkeypatch, capsys):
    for given in _typed(name, tmp_path):
        code, lines = _error(["run", "--op", op, *given], monkeypatch, capsys)
        assert code == 2
        assert lines == [f"dcpcheck: error: --op {op} does not take {given[0]}"]


@pytest.mark.parametrize(("op", "name"), _refused("repro"))
def test_repro_refuses_each_option_an_ops_file_does_not_take(
    op, name, tmp_path, monkeypatch, capsys
):
    scenario = sorted(package(op).scenarios.glob("*.toml"))[0]
    for given in _typed(name, tmp_path):
        code, lines = _error(["repro", str(scenario), *given], monkeypatch, capsys)
        assert code == 2
        assert lines == [f"dcpcheck: error: repro of a {op} scenario file does not take {given[0]}"]


class _Config:
    """What ``_op_plan`` reads of pytest's config, for the options ``given``."""

    def __init__(self, given: dict[str, object]) -> None:
        self.values = {
            name: pytest_plugin._pytest_option(OPTIONS[name].on("pytest"))[1]["default"]
            for name in COMMANDS["pytest"]
        }
        self.values.update(given)

    def getoption(self, name: str) -> object:
        return self.values[name.removeprefix("--dcpcheck-").replace("_", "-")]

    def getini(self, name: str) -> list:
        return []


@pytest.mark.parametrize(("op", "name"), _refused("pytest"))
def test_the_plugin_refuses_each_option_an_op_does_not_take(op, name):
    option = OPTIONS[name].on("pytest")
    value = True if option.kind == "flag" else ([c for c in option.choices] or [5.0])[-1]
    config = _Config({"op": op, name: value})
    with pytest.raises(pytest.UsageError) as refused:
        pytest_plugin._op_plan(config, "default", op)
    assert str(refused.value) == f"--dcpcheck-op {op} does not take --dcpcheck-{name}"


def test_the_plugin_refuses_an_option_an_op_does_not_take_as_typed(tmp_path):
    """In a pytest process of its own, this tree's plugin loaded."""
    done = subprocess.run(
        [
            sys.executable, "-m", "pytest", *PLUGIN_ARGS, "--co",
            "--dcpcheck-kernel=default", "--dcpcheck-op=slot-mapping", "--dcpcheck-no-tokens",
        ],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
        text=True, check=False,
    )  # fmt: skip
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stderr
    assert "--dcpcheck-op slot-mapping does not take --dcpcheck-no-tokens" in done.stderr


def test_the_ranks_take_exactly_what_a_real_rank_run_passes(tmp_path, monkeypatch, capsys):
    """Every option a real-rank run passes on, given at once: the argv the ranks get is
    one a rank's ``run`` parses, and a rank's ``run`` takes nothing else but the
    ``--rank-timeout`` the launcher adds."""
    passed: list[list[str]] = []

    def launch(size: int, argv: list[str], timeout: float) -> int:
        passed.append(list(argv))
        return 0

    monkeypatch.setattr(launcher, "launch", launch)
    argv = ["run", "--launcher", "torchrun"]
    for name in PASSED_TO_RANKS:
        given = ["--dcp", "2"] if name == "dcp" else _typed(name, tmp_path)[0]
        argv += given
    monkeypatch.setattr(sys, "argv", ["dcpcheck", *argv])
    with pytest.raises(SystemExit) as exited:
        main()
    assert exited.value.code == 0, capsys.readouterr().err
    [rank_argv] = passed
    assert rank_argv[0] == "run"
    context = ranks.run_command.make_context("run", [*rank_argv[1:], "--rank-timeout", "5"])
    given = {
        name
        for name in context.params
        if context.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE
    }
    assert given == set(_params(ranks.run_command))
    assert {OPTIONS[name].on("ranks", options.FILLS).key for name in PASSED_TO_RANKS} == given - {
        "rank_timeout_s"
    }


def test_parsed_values_become_the_runs_config(tmp_path):
    values = {
        "kernel": "default",
        "dcp": "1,4",
        "seed": 3,
        "fail-fast": True,
        "ds-mla-scale": "pow2",
        "oracle": "off",
        "sanitize": "memcheck",
        "case-timeout": 7.0,
        "profile": None,
        "examples": 5,
        "home": tmp_path,
        "no-tokens": True,
    }
    assert options.config(RunConfig, values) == RunConfig(
        "default", (1, 4), 3, True, (("ds-mla-scale", "pow2"),), False, "memcheck", 7.0
    )
    searched = options.config(search.SearchConfig, values)
    assert searched == search.SearchConfig(
        "default",
        search.PROFILES["ci"],
        5,
        (1, 4),
        3,
        tmp_path,
        (("ds-mla-scale", "pow2"),),
        False,
    )
