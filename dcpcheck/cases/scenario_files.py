"""Scenario files of every op: where the shipped ones lie, how files are chosen by name,
and the ``op`` a file names.

Each op reads its own keys (``dcpcheck.ops.<op>.scenario``); what is the same for all of
them is here, so a ``--scenario`` pattern, a name that must match its file's stem and a
one-line ``ScenarioError`` mean one thing whatever the op.
"""

from __future__ import annotations

import fnmatch
import re
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dcpcheck.cases import limits
from dcpcheck.cases.toml_tables import Key, known, read_table

SCENARIO_DIR = Path(__file__).parents[2] / "scenarios"
"""The scenarios shipped with the repository: an op's in the folder of its name
(``scenarios/<op>/``, ``shipped_scenarios``), which ``--scenario NAME`` selects from.
Files below an op's folder (``scenarios/lse-combine/findings/``) are not shipped
scenarios: they are replayed by path (``dcpcheck repro FILE``)."""

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
"""Scenario names are file stems and CLI arguments: no spaces, slashes or glob characters."""


def shipped_scenarios(op: str) -> Path:
    """The folder of the scenarios shipped for ``op`` (a name of ``op_registry.OPS``)."""
    return SCENARIO_DIR / op


class ScenarioError(ValueError):
    """A scenario that cannot be run. The message is one line naming the file and the key."""


def display_path(path: Path) -> str:
    """A path as the user most likely typed it: relative to the working directory if inside."""
    cwd = Path.cwd()
    return (
        str(path.relative_to(cwd)) if path.is_absolute() and path.is_relative_to(cwd) else str(path)
    )


def where_of(source: Path | None, name: str) -> str:
    """How a message names a scenario: its file as the user would type it, else its name
    (a scenario built in code)."""
    return display_path(source) if source is not None else f"scenario {name!r}"


def scenario_files(patterns: Sequence[str], root: Path, kind: str = "scenario") -> list[Path]:
    """The ``*.toml`` files under ``root`` whose stems match any of ``patterns`` (all with
    none), sorted by stem; a pattern matching none is a ``ScenarioError`` naming ``kind``."""
    paths = {path.stem: path for path in Path(root).glob("*.toml")}
    chosen: set[str] = set()
    for pattern in patterns:
        matches = fnmatch.filter(paths, pattern)
        if not matches:
            raise ScenarioError(
                f"{display_path(Path(root))}: no {kind} matches {pattern!r} "
                f"(known: {known(paths) or 'none'})"
            )
        chosen.update(matches)
    return [paths[name] for name in sorted(chosen if patterns else paths)]


def load_named(paths: Sequence[Path], load: Callable[[Path], Any]) -> list[Any]:
    """``load`` (a scenario reader of any op) of every file of ``paths``, each in a scenario
    directory, so its ``name`` must be its stem (``load_scenarios`` says why)."""
    scenarios = []
    for path in paths:
        scenario = load(path)
        if scenario.name != path.stem:
            raise ScenarioError(
                f"{display_path(path)}: key 'name': {scenario.name!r} does not match the file "
                f"name (expected {path.stem!r}: in a scenario directory --scenario selects "
                f"files by name; `dcpcheck repro FILE` replays a file of any name)"
            )
        scenarios.append(scenario)
    return scenarios


def op_of(path: Path) -> str | None:
    """The ``op`` a scenario file names (None: none, the fused op's files), or None when it
    cannot be read: the loader of the file's op then says why."""
    try:
        with Path(path).open("rb") as file:
            op = tomllib.load(file).get("op")
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return None
    return op if isinstance(op, str) else None


def read_op_scenario(path: Path, keys: dict[str, Key], op: str) -> dict[str, Any]:
    """The keys of an op package's scenario file, read strictly, with what every op's file
    must say checked: the ``op``, a ``name`` that is a valid name, a ``description`` that
    is not blank, ``dcp`` sizes within the limits and the ``seed``. The op checks its own
    keys. ``ScenarioError`` of one line naming the file (and the key) otherwise."""
    path = Path(path)
    where = str(path)
    if not path.is_file():
        raise ScenarioError(f"{where}: no such scenario file")
    try:
        with path.open("rb") as file:
            table = tomllib.load(file)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise ScenarioError(f"{where}: invalid TOML: {error}") from None
    values = read_table(table, keys, where, ScenarioError)

    def fail(key: str, problem: str) -> None:
        raise ScenarioError(f"{where}: key '{key}': {problem}")

    if values["op"] != op:
        fail("op", f"expected {op!r} in a {op} scenario, got {values['op']!r}")
    if NAME_PATTERN.fullmatch(values["name"]) is None:
        fail("name", f"{values['name']!r} is not a valid name ({NAME_PATTERN.pattern})")
    if not values["description"].strip():
        fail("description", "must say what the scenario catches, got a blank string")
    sizes = values["dcp"]
    if not sizes or any(not 1 <= n <= limits.DCP_SIZE_MAX for n in sizes):
        fail("dcp", f"must name DCP sizes in 1..{limits.DCP_SIZE_MAX}, got {sizes}")
    if not 0 <= values["seed"] <= limits.SEED_MAX:
        fail("seed", f"must be in 0..{limits.SEED_MAX}, got {values['seed']}")
    return values
