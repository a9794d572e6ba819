"""Every bad input is one line on stderr and a documented exit code, never a traceback.

Exit 2 for bad input found before any work (options, scenario files, output paths, a
`--kernel` name the registry does not know);
125 for a kernel that cannot be loaded (``git bisect run`` skips it). Each row of
``BAD_INPUTS`` runs ``dcpcheck.cli.main`` in this process (fast: the backend is already
fixed, no torch import per row); a few rows run again as real ``python -m dcpcheck``
processes, to prove the same line and code reach a shell.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import click
import pytest
import torch

from dcpcheck.cases.limits import (
    BLOCK_SIZE_MAX,
    DCP_SIZE_MAX,
    PADDING_MAX,
    SEED_MAX,
    TIMEOUT_MAX_S,
)
from dcpcheck.cli import cli, main
from dcpcheck.ops.fused_norm_rope.scenario import load_scenarios, scenario_to_toml
from tests.conftest import BACKEND

REPO = Path(__file__).parents[1]
NAME = "decode-single-dcp4"
VALID_SCENARIO = scenario_to_toml(load_scenarios([NAME])[0])
VALID_KERNEL = "def fused(inputs, outputs, caches):\n    pass\n"

SLOT_SCENARIO = """op = "slot-mapping"
name = "negative"
description = "a request with a negative prefix"
block_sizes = [16]
sharded = [true]
dcp = [1, 2]
seed = 0

[[requests]]
prefix = 37
new = 1
"""

MERGE_SCENARIO = """op = "lse-combine"
name = "no-rows"
description = "a request without a query row"
heads = 8
head_dim = 16
dtype = "bfloat16"
dcp = [1, 2]
seed = 0

[[requests]]
context = 4
queries = 0
"""


def scenario_with(old: str, new: str) -> str:
    """The valid scenario file with one line changed."""
    assert old in VALID_SCENARIO
    return VALID_SCENARIO.replace(old, new, 1)


@dataclass(frozen=True)
class BadInput:
    """``args`` with ``{tmp}`` standing for the test's directory, where ``files`` are
    written first (path relative to it -> text)."""

    args: tuple[str, ...]
    code: int
    message: str  # part of the one error line
    files: dict[str, str] = field(default_factory=dict)


SCENARIO_FILE = f"scenarios/{NAME}.toml"
IN_TMP_DIR = ("--scenario-dir", "{tmp}/scenarios")

BAD_INPUTS: dict[str, BadInput] = {
    "DCP size zero": BadInput(("run", "--dcp", "0"), 2, "--dcp: DCP size must be >= 1, got 0"),
    "DCP size not a number": BadInput(("run", "--dcp", "2,four"), 2, "'four' is not an integer"),
    "DCP size too large": BadInput(
        ("run", "--dcp", str(DCP_SIZE_MAX + 1)), 2, f"DCP size must be <= {DCP_SIZE_MAX}"
    ),
    "unknown scenario": BadInput(
        ("run", "--scenario", "no-such"), 2, "no scenario matches 'no-such'"
    ),
    "scenario dir missing": BadInput(
        ("run", "--scenario-dir", "{tmp}/nowhere"),
        2,
        "--scenario-dir: {tmp}/nowhere does not exist",
    ),
    "scenario dir is a file": BadInput(
        ("run", "--scenario-dir", "{tmp}/notes.txt"),
        2,
        "is not a directory",
        {"notes.txt": "hello"},
    ),
    "scenario dir without scenarios": BadInput(
        ("run", *IN_TMP_DIR), 2, "no scenario files (*.toml) in", {"scenarios/notes.txt": ""}
    ),
    "malformed scenario file": BadInput(
        ("run", *IN_TMP_DIR), 2, "invalid TOML", {SCENARIO_FILE: "name = \n"}
    ),
    "unknown scenario key": BadInput(
        ("run", *IN_TMP_DIR),
        2,
        "key 'blok_size': unknown key",
        {SCENARIO_FILE: "blok_size = 16\n" + VALID_SCENARIO},
    ),
    "wrong value type": BadInput(
        ("run", *IN_TMP_DIR),
        2,
        "key 'block_size': expected integer, got \"16\" (string)",
        {SCENARIO_FILE: scenario_with("block_size = 16", 'block_size = "16"')},
    ),
    "interleave not dividing the block size": BadInput(
        ("run", *IN_TMP_DIR),
        2,
        "key 'interleave': interleave 3 does not divide block_size 16",
        {SCENARIO_FILE: scenario_with("interleave = 1", "interleave = 3")},
    ),
    "scenario seed too large": BadInput(
        ("run", *IN_TMP_DIR),
        2,
        f"key 'seed': must be <= {SEED_MAX}, got {SEED_MAX + 1}",
        {SCENARIO_FILE: scenario_with("seed = 0", f"seed = {SEED_MAX + 1}")},
    ),
    # A scenario file gets the command line's limits (dcpcheck.cases.limits).
    "scenario block size too large": BadInput(
        ("run", *IN_TMP_DIR),
        2,
        f"key 'block_size': must be <= {BLOCK_SIZE_MAX}, got 1099511627776",
        {SCENARIO_FILE: scenario_with("block_size = 16", "block_size = 1099511627776")},
    ),
    "scenario padding too large": BadInput(
        ("run", *IN_TMP_DIR),
        2,
        f"key 'padding': must be <= {PADDING_MAX}, got 50000000",
        {SCENARIO_FILE: scenario_with("padding = 0", "padding = 50000000")},
    ),
    "scenario DCP size too large": BadInput(
        ("run", *IN_TMP_DIR),
        2,
        f"key 'dcp': DCP size must be <= {DCP_SIZE_MAX}, got 100000000",
        {SCENARIO_FILE: scenario_with("dcp = [4]", "dcp = [100000000]")},
    ),
    "repro of a file with a DCP size too large": BadInput(
        ("repro", "{tmp}/saved.toml"),
        2,
        f"{{tmp}}/saved.toml: key 'dcp': DCP size must be <= {DCP_SIZE_MAX}, got 100000000",
        {"saved.toml": scenario_with("dcp = [4]", "dcp = [100000000]")},
    ),
    "scenario named unlike its file": BadInput(
        ("run", *IN_TMP_DIR),
        2,
        f"key 'name': '{NAME}' does not match the file name (expected 'renamed'",
        {"scenarios/renamed.toml": VALID_SCENARIO},
    ),
    "negative seed": BadInput(("run", "--seed", "-1"), 2, "Invalid value for '--seed'"),
    "seed too large": BadInput(("run", "--seed", str(2**40)), 2, "Invalid value for '--seed'"),
    "case timeout zero": BadInput(
        ("run", "--case-timeout", "0"), 2, "--case-timeout: must be a number of seconds > 0"
    ),
    "case timeout not finite": BadInput(
        ("run", "--case-timeout", "nan"), 2, "--case-timeout: must be a number of seconds > 0"
    ),
    "case timeout past what a wait takes": BadInput(
        ("run", "--case-timeout", "1e308"),
        2,
        f"--case-timeout: must be a number of seconds > 0 and at most {TIMEOUT_MAX_S:.0f}, "
        "got 1e+308",
    ),
    "rank timeout past what a wait takes": BadInput(
        ("run", "--launcher", "torchrun", "--dcp", "2", "--rank-timeout", "1e308"),
        2,
        "Invalid value for '--rank-timeout': 1e+308 is not in the range",
    ),
    "case timeout without isolation": BadInput(
        ("run", "--no-isolate", "--case-timeout", "5"), 2, "--case-timeout needs --isolate"
    ),
    "report directory missing": BadInput(
        ("run", "--json", "{tmp}/missing/r.json"), 2, "directory {tmp}/missing does not exist"
    ),
    "report path is a directory": BadInput(
        ("run", "--junit", "{tmp}"), 2, "{tmp}: is a directory, expected a file path"
    ),
    "report directory not writable": BadInput(
        ("run", "--json", "/proc/r.json"), 2, "/proc/r.json: directory /proc is not writable"
    ),
    "both reports to one file": BadInput(
        ("run", "--json", "{tmp}/r", "--junit", "{tmp}/r"),
        2,
        "--json and --junit name the same file",
    ),
    "home under a file": BadInput(
        ("run", "--examples", "1", "--home", "{tmp}/notes.txt/home"),
        2,
        "--home: {tmp}/notes.txt/home: {tmp}/notes.txt is not a directory",
        {"notes.txt": "hello"},
    ),
    "scenario and property-only": BadInput(
        ("run", "--scenario", NAME, "--property-only"), 2, "exclude each other"
    ),
    "zero examples": BadInput(("run", "--examples", "0"), 2, "Invalid value for '--examples'"),
    "unknown option": BadInput(("run", "--fast"), 2, "No such option '--fast'"),
    "repro of a missing file": BadInput(
        ("repro", "{tmp}/gone.toml"), 2, "{tmp}/gone.toml: no such scenario file"
    ),
    "repro of a malformed file": BadInput(
        ("repro", "{tmp}/" + SCENARIO_FILE), 2, "invalid TOML", {SCENARIO_FILE: "[[requests]\n"}
    ),
    "hash with an unknown preset": BadInput(("hash", "--preset", "tiny"), 2, "unknown preset"),
    "sanitize without a CUDA device": BadInput(
        ("run", "--sanitize", "memcheck", "--device", "cpu"), 2, "needs a CUDA device"
    ),
    "sanitize without isolation": BadInput(
        ("run", "--sanitize", "initcheck", "--no-isolate"), 2, "--sanitize needs --isolate"
    ),
    "sanitize with the property search": BadInput(
        ("run", "--sanitize", "racecheck", "--property-only"), 2, "--sanitize runs named"
    ),
    "hash seed out of range": BadInput(
        ("hash", "--seed", str(SEED_MAX + 1)), 2, "Invalid value for '--seed'"
    ),
    "bisect seed negative": BadInput(
        ("bisect", "--releases", "0.28.0,0.29.0", "--seed", "-1"),
        2,
        "Invalid value for '--seed'",
    ),
    "bisect DCP size zero": BadInput(
        ("bisect", "--releases", "0.28.0,0.29.0", "--dcp", "0"),
        2,
        "--dcp: DCP size must be >= 1, got 0",
    ),
    "home that is a file": BadInput(
        ("run", "--home", "{tmp}/home", "--scenario", NAME, "--no-tokens"),
        2,
        "--home: {tmp}/home: {tmp}/home is not a directory",
        {"home": "not a folder"},
    ),
    "repro report path that is a directory": BadInput(
        ("repro", f"{{tmp}}/{SCENARIO_FILE}", "--json", "{tmp}"),
        2,
        "{tmp}: is a directory",
        {SCENARIO_FILE: VALID_SCENARIO},
    ),
    "release version that is no version": BadInput(
        ("run", "--kernel", "vllm==0.3O.0"), 2, "vllm==0.3O.0: '0.3O.0' is not a version"
    ),
    "unknown kernel": BadInput(
        ("run", "--kernel", "no-such-kernel"), 2, "unknown kernel 'no-such-kernel'"
    ),
    "kernel file without the function": BadInput(
        ("run", "--kernel", "{tmp}/k.py:missing"),
        125,
        "{tmp}/k.py: has no function 'missing'",
        {"k.py": VALID_KERNEL},
    ),
    "kernel file with a syntax error": BadInput(
        ("run", "--kernel", "{tmp}/k.py:fused"),
        125,
        "{tmp}/k.py:1: syntax error",
        {"k.py": "def fused(inputs,:\n"},
    ),
    "mutate of a missing kernel file": BadInput(
        ("mutate", "--kernel", "{tmp}/gone.py:fused", "--list"),
        125,
        "{tmp}/gone.py: cannot read: No such file or directory",
    ),
    "mutate of a kernel file with a syntax error": BadInput(
        ("mutate", "--kernel", "{tmp}/k.py:fused", "--list"),
        125,
        "{tmp}/k.py:1: syntax error",
        {"k.py": "def fused(inputs,:\n"},
    ),
    "slot-mapping request with a negative prefix": BadInput(
        ("run", "--op", "slot-mapping", "--scenario-dir", "{tmp}/slots"),
        2,
        "{tmp}/slots/negative.toml: key 'requests[0].prefix': must be >= 0, got -1",
        {"slots/negative.toml": SLOT_SCENARIO.replace("prefix = 37", "prefix = -1")},
    ),
    "lse-combine request without a query row": BadInput(
        ("run", "--op", "lse-combine", "--scenario-dir", "{tmp}/merge"),
        2,
        "{tmp}/merge/no-rows.toml: key 'requests[0].queries': a request needs 1 <= queries",
        {"merge/no-rows.toml": MERGE_SCENARIO},
    ),
    "kernel signature fits no adapter": BadInput(
        ("run", "--kernel", "{tmp}/k.py:fused"),
        125,
        "neither kernel(inputs, outputs, caches) nor a known vLLM",
        {"k.py": "def fused(x):\n    pass\n"},
    ),
    "an option the op does not take": BadInput(
        ("run", "--op", "slot-mapping", "--profile", "thorough"),
        2,
        "--op slot-mapping does not take --profile",
    ),
    "the off side of a flag pair the op does not take": BadInput(
        ("run", "--op", "lse-combine", "--no-isolate", "--stats"),
        2,
        "--op lse-combine does not take --no-isolate, --stats",
    ),
    "an option the op's selftest does not take": BadInput(
        ("selftest", "--op", "slot-mapping", "--mutant", "padding-left-alone"),
        2,
        "--op slot-mapping does not take --mutant",
    ),
    "an option the replay of an op's file does not take": BadInput(
        ("repro", str(REPO / "scenarios/slot-mapping/decode-single.toml"), "--runs", "2"),
        2,
        "repro of a slot-mapping scenario file does not take --runs",
    ),
    "an option real ranks do not take": BadInput(
        ("run", "--launcher", "torchrun", "--dcp", "2", "--profile", "ci"),
        2,
        "--launcher torchrun does not support --profile",
    ),
}


def unspellable_names() -> set[str]:
    """Each name a command keeps an option's value under that is none of its option
    strings (``profile_name`` of ``--profile``), as the option it is not
    (``--profile-name``) and, when no English word (``patterns``), as itself: an error
    line naming one names what nobody can type."""
    names = set()
    for command in (cli.get_command(None, name) for name in cli.list_commands(None)):
        for param in command.params:
            option = "--" + param.name.replace("_", "-")
            if isinstance(param, click.Option) and option not in param.opts:
                names |= {option, param.name} if "_" in param.name else {option}
    return names


UNSPELLABLE = unspellable_names()

IN_A_REAL_PROCESS = [
    "scenario dir missing",
    "scenario seed too large",
    "scenario block size too large",
    "report directory not writable",
    "case timeout zero",
    "repro of a missing file",
    "kernel file with a syntax error",
    "an option the op does not take",
    "mutate of a missing kernel file",
    "sanitize without a CUDA device",
]


def prepare(bad: BadInput, tmp: Path) -> list[str]:
    for relative, text in bad.files.items():
        path = tmp / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return [arg.format(tmp=tmp) for arg in bad.args]


def asks_for_the_interpreter(args: tuple[str, ...]) -> bool:
    return any(a == "--device" and b == "cpu" for a, b in itertools.pairwise(args))


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("dcpcheck: error:")]


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_bad_input_is_one_line_and_its_exit_code(name, tmp_path, monkeypatch, capsys):
    bad = BAD_INPUTS[name]
    if asks_for_the_interpreter(bad.args) and not BACKEND.interpreted:
        pytest.skip(
            "this process's kernels are compiled for CUDA, and the interpreter cannot be "
            "chosen after them; test_a_shell_sees_the_same_line_and_no_traceback judges it"
        )
    monkeypatch.setattr(sys, "argv", ["dcpcheck", *prepare(bad, tmp_path)])
    with pytest.raises(SystemExit) as exited:
        main()  # a traceback would be an exception other than SystemExit, failing here
    stderr = capsys.readouterr().err
    assert exited.value.code == bad.code, stderr
    [line] = error_lines(stderr)
    assert bad.message.format(tmp=tmp_path) in line
    assert not [name for name in UNSPELLABLE if name in line]


@pytest.mark.parametrize("name", IN_A_REAL_PROCESS)
def test_a_shell_sees_the_same_line_and_no_traceback(name, tmp_path):
    bad = BAD_INPUTS[name]
    done = subprocess.run(
        [sys.executable, "-m", "dcpcheck", *prepare(bad, tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == bad.code, done.stderr
    assert "Traceback" not in done.stderr
    [line] = error_lines(done.stderr)
    assert bad.message.format(tmp=tmp_path) in line
    assert not [name for name in UNSPELLABLE if name in line]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is visible")
def test_device_cuda_without_one_is_bad_input(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["dcpcheck", "run", "--device", "cuda"])
    with pytest.raises(SystemExit) as exited:
        main()
    assert exited.value.code == 2
    [line] = error_lines(capsys.readouterr().err)
    assert "torch sees no CUDA device" in line
