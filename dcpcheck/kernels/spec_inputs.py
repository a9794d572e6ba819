"""The files a ``--kernel`` spec reads that can be named before it is loaded: what no
report of the run may be written over (``dcpcheck.files.ensure_not_input``), refused before
the kernel is imported.

* ``path/to/file.py:function``: the file;
* ``package.module:function``: the module's file, found as the import system would find it
  from the working directory and ``sys.path`` (``loading._load_module``), without running
  any of its packages' code;
* ``vllm==X``: every file of the release's folder in the release cache;
* a registry name: none (dcpcheck's own modules).
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
from pathlib import Path

from dcpcheck.kernels import releases
from dcpcheck.kernels.loading import KernelSpecError, release_of


def spec_inputs(spec: str) -> tuple[Path, ...]:
    """The files ``spec`` reads that can be named before loading it (module docstring);
    a spec wrong in itself names none (its load says why)."""
    try:
        release = release_of(spec)
    except KernelSpecError:  # a release spec that is no version: its load refuses it
        return ()
    if release is not None:
        folder = releases.release_dir(release.version)
        return tuple(sorted(Path(top, name) for top, _, names in os.walk(folder) for name in names))
    where, colon, _ = spec.rpartition(":")
    if not colon or not where:
        return ()
    if where.endswith(".py"):
        return (Path(where),)
    found = _module_file(where)
    return () if found is None else (found,)


def _module_file(name: str) -> Path | None:
    """The file of module ``name`` (imported already, else found by its parents' search
    locations, from the working directory first), None where none is found."""
    loaded = sys.modules.get(name)
    if loaded is not None:
        source = getattr(loaded, "__file__", None)
        return None if source is None else Path(source)
    search: list[str] | None = [os.getcwd(), *sys.path]
    spec = None
    parts = name.split(".")
    for depth in range(len(parts)):
        if search is None:  # a parent that is a module, not a package
            return None
        try:
            spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: depth + 1]), search)
        except (ImportError, ValueError):
            return None
        if spec is None:
            return None
        search = (
            None
            if spec.submodule_search_locations is None
            else list(spec.submodule_search_locations)
        )
    if spec is None or not spec.has_location or spec.origin is None:
        return None
    return Path(spec.origin)
