"""One kernel file stood in for by another in this process: ``dcpcheck mutate`` runs a
mutant of a file through exactly the loading the file itself goes through.

After :func:`substitute`, every load of the original file reads the replacement instead:
``loading.load_file`` and ``loading.definitions_alone`` (a ``path.py:function`` spec, a
release's cached file) ask :func:`substituted`, and an import of a module whose file is
the original (the project's kernels, a ``package.module:function`` spec) finds the
replacement through a finder placed first on ``sys.meta_path``. The replacement's own
path is the module's ``__file__``, so Triton reads the mutant's source, at the lines the
original has. A module imported before the substitution keeps the original: substitute
first.
With ``$DCPCHECK_RAN_DIR`` set, the process records which of the replacement's functions
run (``dcpcheck.kernels.ran``).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from pathlib import Path

from dcpcheck.kernels import ran

_SUBSTITUTES: dict[Path, Path] = {}


def substituted(path: Path) -> Path:
    """The file to read where ``path`` is asked for."""
    return _SUBSTITUTES.get(path.resolve(), path) if _SUBSTITUTES else path


class _Finder(importlib.abc.MetaPathFinder):
    """Finds a module as Python would, and loads it from the substitute of its file."""

    def find_spec(self, fullname, path, target=None):  # type: ignore[no-untyped-def]
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.origin is None:
            return None
        replacement = _SUBSTITUTES.get(Path(spec.origin).resolve())
        if replacement is None:
            return None
        return importlib.util.spec_from_file_location(fullname, replacement)


_FINDER = _Finder()


def substitutes() -> tuple[tuple[Path, Path], ...]:
    """Every (original, replacement) in place in this process: what a worker that loads the
    kernel for this process must put in place too (``dcpcheck.harness.isolation``)."""
    return tuple(_SUBSTITUTES.items())


def substitute(original: Path, replacement: Path) -> None:
    """Read ``replacement`` wherever ``original`` is loaded, from now on (module
    docstring)."""
    _SUBSTITUTES[original.resolve()] = replacement.resolve()
    ran.watch(replacement.resolve(), original.resolve())
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
