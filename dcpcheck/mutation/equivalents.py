"""Mutants a kernel's authors have judged, in a small TOML file next to the kernel
(``kernel.py`` -> ``kernel.mutants.toml``), each with the reason::

    [[equivalent]]
    mutant = "kernel.py:_correct_kernel:56:mask-conjunct:& right dropped"
    reason = "BLOCK_H is HEADS rounded up to a power of two: every head it loads is < HEADS"

    [[not_applicable]]
    mutant = "kernels.py:_quant:210:*"
    reason = "sm_100-only branch: an H200 never compiles it"

An ``equivalent`` is an edit no input can observe; a ``not_applicable`` one lies in code
this machine cannot run. Both are reported apart from survivors and not counted in the
score; ``mutant`` may be a glob. A survivor is either killed by a new scenario or strategy,
or explained here.
"""

from __future__ import annotations

import fnmatch
import tomllib
from dataclasses import dataclass
from pathlib import Path

KINDS = ("equivalent", "not_applicable")


class EquivalentsError(ValueError):
    """The file is not what the module docstring says: one line naming where."""


@dataclass(frozen=True)
class Judged:
    """One entry: which mutants (a name or a glob), what they are, and why."""

    pattern: str
    kind: str
    reason: str

    def matches(self, name: str) -> bool:
        return fnmatch.fnmatchcase(name, self.pattern)


def file_for(kernel_file: Path) -> Path:
    """Where ``kernel_file``'s judged mutants live."""
    return kernel_file.with_name(kernel_file.stem + ".mutants.toml")


def load(path: Path) -> list[Judged]:
    """The entries of ``path`` (none when it does not exist); ``EquivalentsError`` with
    one line for a file that is not the module docstring's."""
    if not path.is_file():
        return []
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise EquivalentsError(f"{path}: not TOML: {exc}") from None
    unknown = set(data) - set(KINDS)
    if unknown:
        raise EquivalentsError(f"{path}: unknown table {sorted(unknown)[0]!r} (expected {KINDS})")
    entries = []
    for kind in KINDS:
        for index, entry in enumerate(data.get(kind, [])):
            where = f"{path}: {kind} {index + 1}"
            if not isinstance(entry, dict) or set(entry) != {"mutant", "reason"}:
                raise EquivalentsError(f"{where}: needs exactly `mutant` and `reason`")
            if not all(isinstance(entry[k], str) and entry[k].strip() for k in entry):
                raise EquivalentsError(f"{where}: `mutant` and `reason` must be non-empty text")
            entries.append(Judged(entry["mutant"], kind, entry["reason"]))
    return entries


def judged(name: str, entries: list[Judged]) -> Judged | None:
    """The first entry that names mutant ``name``, or None."""
    return next((e for e in entries if e.matches(name)), None)
