"""Scenario files of every op: where the shipped ones lie, how files are chosen by name,
and the ``op`` a file names; and, for the op packages, the scenario itself
(:class:`NamedBatch`) and how its file is read and written (:class:`ScenarioFormat`).

Each op declares its own keys and builds its batch from them (``dcpcheck.ops.<op>.scenario``);
what is the same for all of them is here, so a ``--scenario`` pattern, a name that must
match its file's stem and a one-line ``ScenarioError`` mean one thing whatever the op.
"""

from __future__ import annotations

import fnmatch
import re
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from dcpcheck.cases import limits
from dcpcheck.cases.toml_tables import (
    Key,
    integer,
    integer_array,
    known,
    read_table,
    string,
    toml_literal,
)

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


def read_toml(path: Path, where: str) -> dict[str, Any]:
    """The TOML table of the scenario file ``path``; ``ScenarioError`` of one line naming
    it as ``where`` when it is no file or no TOML."""
    if not path.is_file():
        raise ScenarioError(f"{where}: no such scenario file")
    try:
        with path.open("rb") as file:
            return tomllib.load(file)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise ScenarioError(f"{where}: invalid TOML: {error}") from None


def read_op_scenario(path: Path, keys: dict[str, Key], op: str) -> dict[str, Any]:
    """The keys of an op package's scenario file, read strictly, with what every op's file
    must say checked: the ``op``, a ``name`` that is a valid name, a ``description`` that
    is not blank, ``dcp`` sizes within the limits and the ``seed``. The op checks its own
    keys. ``ScenarioError`` of one line naming the file (and the key) otherwise."""
    path = Path(path)
    where = str(path)
    values = read_table(read_toml(path, where), keys, where, ScenarioError)

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


def key_error(where: str, key: str, problem: str) -> ScenarioError:
    """The one-line error of a scenario file's ``key`` (``where``: the file)."""
    return ScenarioError(f"{where}: key '{key}': {problem}")


def check_range(values: dict[str, Any], key: str, least: int, most: int, where: str) -> None:
    """``values[key]`` within ``least..most``; ``ScenarioError`` naming the key otherwise."""
    if not least <= values[key] <= most:
        raise key_error(where, key, f"must be in {least}..{most}, got {values[key]}")


def check_block_size(values: dict[str, Any], where: str) -> None:
    """A scenario's ``interleave`` and its ``block_size``, a multiple of it, within
    ``limits.BLOCK_SIZE_MAX``."""
    interleave = values["interleave"]
    check_range(values, "interleave", 1, limits.BLOCK_SIZE_MAX, where)
    size = values["block_size"]
    if not 1 <= size <= limits.BLOCK_SIZE_MAX or size % interleave:
        raise key_error(
            where,
            "block_size",
            f"must be in 1..{limits.BLOCK_SIZE_MAX} and a multiple of the interleave "
            f"{interleave}, got {size}",
        )


def read_tables(
    tables: list[dict[str, Any]], keys: dict[str, Key], where: str, name: str = "requests"
) -> list[tuple[str, dict[str, Any]]]:
    """Each table of the array ``name`` (``[[requests]]``) read strictly, with the prefix
    its messages name its keys by (``requests[0].``)."""
    read = []
    for index, table in enumerate(tables):
        prefix = f"{name}[{index}]."
        read.append((prefix, read_table(table, keys, where, ScenarioError, prefix)))
    return read


def check_context_tokens(total: int, where: str) -> None:
    """The tokens a batch's requests hold within ``limits.CONTEXT_TOKENS_MAX``."""
    if total > limits.CONTEXT_TOKENS_MAX:
        raise ScenarioError(
            f"{where}: key 'requests': {total} cached tokens, over {limits.CONTEXT_TOKENS_MAX} "
            "(CONTEXT_TOKENS_MAX, dcpcheck/cases/limits.py)"
        )


HEAD_KEYS: dict[str, Key] = {
    "op": Key("string", string),
    "name": Key("string", string),
    "description": Key("string", string),
}
"""The keys every op package's scenario file opens with (``read_op_scenario`` checks them)."""

RUN_KEYS: dict[str, Key] = {
    "dcp": Key("array of integers", integer_array),
    "seed": Key("integer", integer),
}
"""The DCP sizes a scenario runs at and the seed of its batch, in every op package's file."""


def batch_rows(requests: Sequence[tuple[int, int]], padding: int) -> int:
    """A batch's rows: every request's rows of the step (the second of its pair), then the
    ``padding`` rows, which belong to no request."""
    return sum(rows for _, rows in requests) + padding


def requests_in_words(requests: Sequence[tuple[int, int]], rows: int) -> str:
    """The start of a batch's summary: how many requests, each one's context (the first of
    its pair) and the batch's rows."""
    contexts = ", ".join(str(context) for context, _ in requests)
    return f"{len(requests)} request(s) of context {contexts}, {rows} row(s)"


class Seeded(Protocol):
    """What :class:`NamedBatch` reads of an op's batch: the seed its values are drawn from."""

    @property
    def seed(self) -> int: ...


B = TypeVar("B", bound=Seeded)


@dataclass(frozen=True)
class NamedBatch(Generic[B]):
    """A scenario of an op package: one named, replayable batch of the op, the DCP sizes it
    runs at and the file it was read from (None: built in code)."""

    name: str
    description: str
    batch: B
    dcp_sizes: tuple[int, ...]
    source: Path | None = field(default=None, compare=False)

    @property
    def seed(self) -> int:
        return self.batch.seed


@dataclass(frozen=True)
class ScenarioFormat(Generic[B]):
    """How an op package's scenario file is read and written: every key of the file, in the
    order it is written (``HEAD_KEYS``, the op's, ``RUN_KEYS``, the op's table arrays);
    ``batch(values, where)``, the op's batch from the values read (checking the op's own
    keys, one-line ``ScenarioError`` otherwise); ``tables``, the keys of each table array's
    tables, in the order of the batch's rows of it (``requests``: pairs of integers).

    A key's value is written from the batch's field of its name (a tuple as an array);
    ``values(batch)`` gives those of the keys that are no field of the batch."""

    op: str
    keys: dict[str, Key]
    batch: Callable[[dict[str, Any], str], B]
    tables: dict[str, dict[str, Key]]
    values: Callable[[B], dict[str, object]] = lambda batch: {}

    @property
    def scenarios(self) -> Path:
        """The op's shipped scenarios."""
        return shipped_scenarios(self.op)

    def load_scenario(self, path: Path) -> NamedBatch[B]:
        """Read and check one scenario file of the op, wherever it lies."""
        path = Path(path)
        values = read_op_scenario(path, self.keys, self.op)
        batch = self.batch(values, str(path))
        return NamedBatch(
            values["name"], values["description"], batch, tuple(values["dcp"]), source=path
        )

    def load_scenarios(self, patterns: list[str], root: Path | None = None) -> list[NamedBatch[B]]:
        """The op's scenarios under ``root`` (the shipped ones by default) whose names match
        a pattern (all without one), sorted by name."""
        files = scenario_files(patterns, root or self.scenarios, f"{self.op} scenario")
        return load_named(files, self.load_scenario)

    def scenario_to_toml(self, scenario: NamedBatch[B]) -> str:
        """The TOML text of ``scenario``, every key spelled out in the order of ``keys``:
        plain keys first, then each table of a table array."""
        values = {
            "op": self.op,
            "name": scenario.name,
            "description": scenario.description,
            "dcp": scenario.dcp_sizes,
            **self.values(scenario.batch),
        }
        lines, tables = [], []
        for key in self.keys:
            value = values[key] if key in values else getattr(scenario.batch, key)
            if key not in self.tables:
                lines.append(f"{key} = {toml_literal(_array(value))}")
                continue
            for row in value:
                pairs = zip(self.tables[key], row, strict=True)
                tables += ["", f"[[{key}]]", *(f"{k} = {toml_literal(v)}" for k, v in pairs)]
        return "\n".join(lines + tables) + "\n"


def _array(value: object) -> object:
    """A batch's value as TOML writes it: a tuple as an array."""
    return list(value) if isinstance(value, tuple) else value
