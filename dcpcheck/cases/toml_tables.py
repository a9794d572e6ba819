"""Strict reading and exact writing of flat TOML tables: every key known, present when
required, of its declared type (``read_table``), and values written back the way TOML spells
them (``toml_literal``). Scenario files (``dcpcheck.ops.fused_norm_rope.scenario``) are read
and written with these; a typo is an error on one line that names the file and the key.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

TOML_TYPE_NAMES: tuple[tuple[type, str], ...] = (
    (bool, "boolean"),  # before int: bool is a subclass of int
    (int, "integer"),
    (float, "float"),
    (str, "string"),
    (list, "array"),
    (dict, "table"),
)


def toml_type(value: object) -> str:
    for python_type, toml_name in TOML_TYPE_NAMES:
        if isinstance(value, python_type):
            return toml_name
    return "date/time"


def toml_literal(value: object) -> str:
    """A value written back the way TOML spells it, for error messages and for writing."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_literal(v) for v in value) + "]"
    return str(value) if isinstance(value, int | float) else repr(value)


REQUIRED = object()
"""Default of a key that must be present."""


@dataclass(frozen=True)
class Key:
    """One allowed key of a TOML table: the value's expected type and, if optional, its default."""

    expected: str  # TOML type name(s), for messages
    accepts: Callable[[object], bool]
    default: object = REQUIRED


def integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def string(value: object) -> bool:
    return isinstance(value, str)


def number(value: object) -> bool:
    return isinstance(value, float) or integer(value)


def boolean(value: object) -> bool:
    return isinstance(value, bool)


def integer_array(value: object) -> bool:
    return isinstance(value, list) and all(integer(v) for v in value)


def table_array(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, dict) for v in value)


def known(names: Sequence[str] | dict[str, Any]) -> str:
    return ", ".join(sorted(names))


def read_table(
    table: dict[str, Any],
    keys: dict[str, Key],
    where: str,
    error: type[ValueError],
    key_prefix: str = "",
) -> dict[str, Any]:
    """``table`` with defaults filled in, after rejecting unknown, missing and mistyped keys
    (``error``, one line: ``where``, the key, what is wrong)."""
    for key in table:
        if key not in keys:
            raise error(f"{where}: key '{key_prefix}{key}': unknown key (known: {known(keys)})")
    values = {}
    for key, spec in keys.items():
        if key not in table:
            if spec.default is REQUIRED:
                raise error(f"{where}: key '{key_prefix}{key}': required but missing")
            values[key] = spec.default
            continue
        value = table[key]
        if not spec.accepts(value):
            raise error(
                f"{where}: key '{key_prefix}{key}': expected {spec.expected}, got "
                f"{toml_literal(value)} ({toml_type(value)})"
            )
        values[key] = value
    return values


TOML_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\t": "\\t",
    "\n": "\\n",
    "\f": "\\f",
    "\r": "\\r",
}


def toml_string(text: str) -> str:
    """A TOML basic string: quotes, backslashes and control characters escaped."""
    out = []
    for char in text:
        if char in TOML_ESCAPES:
            out.append(TOML_ESCAPES[char])
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\u{ord(char):04X}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'
