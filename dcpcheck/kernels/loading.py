"""Resolve ``--kernel`` to the callable it names, for every op.

Accepted forms: a name of the op's registry (``default``, ``regress/pre-54908``), a
released kernel (``vllm==0.29.0``, fetched and cached by :mod:`dcpcheck.kernels.releases`),
an importable ``package.module:function``, or ``path/to/file.py:function`` loaded straight
from a file without installing the project it belongs to. A file's module-level imports of its
host project (vLLM's platform query and Triton re-export) are answered by the stand-ins
of :mod:`dcpcheck.adapters.shims` when that project is not installed; the substitution is logged.

Each op fits the function found to its own protocol, through its adapters
(``dcpcheck.ops.<op>.kernels``).

A ``package.module:function`` is imported with the working directory first on ``sys.path``,
as ``python -m dcpcheck`` has it, so the ``dcpcheck`` script resolves a module spec from
where the user stands as well (:func:`_import_from_working_directory`).

Every way of failing raises :class:`KernelLoadError` with one line naming the cause; the
CLI turns it into exit code 125, which ``git bisect run`` treats as "skip this commit". A
module that raises while it is imported does not import, ``SystemExit`` (``sys.exit()``)
included: that is a load error too, never the exit status of the process importing it.
A module whose import ends or hangs that process is another matter
(:mod:`dcpcheck.kernels.import_probe`, which :func:`load_callable` asks first while a
command holds ``import_probe.probing``).
A spec that is wrong in itself, whatever the revision (a registry name the registry does
not know, ``file.py`` without ``:function``, an adapter that does not apply, a release
version that is no version or that the package index does not publish), raises its
subclass :class:`KernelSpecError`, which the CLI reports as bad input (exit code 2): a
typo is then an error to fix, not a revision to skip (``dcpcheck bisect`` stops on it). So
does a release cache that cannot be trusted (a cached file that differs from the lock
file or its wheel's RECORD) or used (not a writable folder): fixing it is the user's, not a
revision's (``releases.CacheFault`` is a :class:`KernelSpecError`, whichever op's file
it was found in).

A file is compiled from the bytes read once (:func:`source_of`): a release file's are the
bytes whose SHA256 was checked, and no bytecode cache is read or written beside any file.
``linecache`` is given the same text, since Triton reads a ``@triton.jit`` function's
source through ``inspect`` to compile it (and to interpret it): what it compiles is what
was read, not the file as it may be by then.

:func:`judged_file` names a file a loaded kernel's code comes from, with its SHA256, so
every report says exactly what was judged.
"""

from __future__ import annotations
import __future__

import ast
import builtins
import dataclasses
import difflib
import hashlib
import importlib
import importlib.machinery
import importlib.util
import linecache
import logging
import os
import sys
from pathlib import Path
from types import ModuleType

from dcpcheck.adapters import shims
from dcpcheck.adapters.protocol import AdapterError
from dcpcheck.kernels import import_probe, releases
from dcpcheck.kernels.errors import KernelLoadError, KernelSpecError
from dcpcheck.kernels.substitution import substituted

log = logging.getLogger(__name__)

SUGGESTIONS_MAX = 3
"""Registered names an unknown name's message offers (``difflib``'s default cutoff, 0.6)."""


class UnknownKernelName(KernelSpecError):
    """A name the registry does not know, where only a registry name fits: no ``:``, not a
    release (``vllm==X.Y.Z``), not a ``.py`` file. ``suggestions``: the closest registered
    names, best first (maybe none)."""

    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        self.suggestions = difflib.get_close_matches(name, known, n=SUGGESTIONS_MAX)
        closest = f"closest: {', '.join(self.suggestions)}; " if self.suggestions else ""
        super().__init__(
            f"unknown kernel {name!r}: no registry kernel has that name ({closest}all: "
            "dcpcheck list kernels); other kernels are package.module:function, "
            "path/to/file.py:function or vllm==X.Y.Z"
        )


def _module_name(path: Path) -> str:
    """A stable module name per file: tracebacks and Triton's caches name the file's
    module, and two files called ``kernels.py`` must not share one."""
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    return f"dcpcheck_external_{path.stem}_{digest}"


def source_of(path: Path) -> str:
    """The text of the file at ``path`` that a loader compiles or reads (module docstring):
    a release file's as its SHA256 was checked (``releases.verified_source``), any other
    file's as read now; ``linecache`` holds the same text from then on."""
    source = releases.verified_source(path)
    if source is None:
        if not path.is_file():
            raise KernelLoadError(f"{path}: no such kernel file")
        try:
            source = path.read_bytes()
        except OSError as exc:
            raise KernelLoadError(f"{path}: cannot read: {exc.strerror}") from exc
    try:
        text = importlib.util.decode_source(source)
    except (SyntaxError, UnicodeDecodeError) as exc:
        raise KernelLoadError(f"{path}: cannot decode: {exc}") from exc
    # No modification time: linecache.checkcache keeps the entry rather than read the file.
    linecache.cache[str(path)] = (len(text), None, text.splitlines(keepends=True), str(path))
    return text


def _parsed(path: Path) -> ast.Module:
    try:
        return ast.parse(source_of(path), filename=str(path))
    except SyntaxError as exc:
        raise KernelLoadError(f"{path}:{exc.lineno}: syntax error: {exc.msg}") from exc


def load_file(path: Path) -> ModuleType:
    """The module of the Python file at ``path``, compiled from :func:`source_of` (no
    bytecode cache), its host project's imports answered by the stand-ins where that
    project is not installed (module docstring)."""
    path = substituted(path)
    tree = _parsed(path)
    module_name = _module_name(path)
    code = compile(tree, str(path), "exec", dont_inherit=True)
    module = ModuleType(module_name)
    module.__file__ = str(path)
    sys.modules[module_name] = module  # Triton and dataclasses look the module up by name
    with shims.stand_ins_for(shims.imported_modules(tree)) as stood_in:
        if stood_in:
            log.warning(
                "%s: %s is not installed; loading with dcpcheck's stand-ins for %s "
                "(dcpcheck/adapters/shims)",
                path,
                stood_in[0].split(".")[0],
                ", ".join(stood_in),
            )
        try:
            exec(code, module.__dict__)
        except ImportError as exc:
            del sys.modules[module_name]
            why = shims.missing_stand_in(exc, stood_in) or f"import failed: {exc}"
            raise KernelLoadError(f"{path}: {why}") from exc
        except (Exception, SystemExit) as exc:  # its own failure, sys.exit too (module docstring)
            del sys.modules[module_name]
            raise KernelLoadError(f"{path}: import failed: {type(exc).__name__}: {exc}") from exc
    return module


def _import_from_working_directory() -> None:
    """Put the working directory first on ``sys.path`` unless it is on it already.

    ``python -m dcpcheck`` starts with it there, the ``dcpcheck`` script with its own
    directory instead; without this, a replay printed as ``dcpcheck run --kernel
    mypkg.kernels:f`` would not find ``mypkg`` where ``python -m`` does. It stays, as it
    does under ``python -m``: the kernel's module may import more of its package's siblings
    when it is first called, and ``--isolate``'s worker is handed this ``sys.path``
    (dcpcheck.harness.isolation). As under ``python -m``, a module there shadows an
    installed one of the same name.
    """
    here = os.path.realpath(os.getcwd())
    if all(os.path.realpath(entry or os.curdir) != here for entry in sys.path):
        sys.path.insert(0, here)


def _load_module(name: str) -> ModuleType:
    _import_from_working_directory()
    try:
        return importlib.import_module(name)
    except SyntaxError as exc:
        raise KernelLoadError(
            f"{name}: syntax error at {exc.filename}:{exc.lineno}: {exc.msg}"
        ) from exc
    except ImportError as exc:
        raise KernelLoadError(f"{name}: cannot import: {exc}") from exc
    except (Exception, SystemExit) as exc:  # its own failure, sys.exit too (module docstring)
        raise KernelLoadError(f"{name}: import failed: {type(exc).__name__}: {exc}") from exc


def module_of(where: str) -> ModuleType:
    """The module of a spec's ``where``: a ``path/to/file.py`` (:func:`load_file`) or a
    ``package.module`` (imported)."""
    return load_file(Path(where)) if where.endswith(".py") else _load_module(where)


def _split_spec(spec: str, registry: list[str]) -> tuple[str, str]:
    """``where:function`` -> (where, function), or a one-line error naming what is missing."""
    if ":" not in spec:
        if spec.endswith(".py"):
            raise KernelSpecError(f"{spec}: name the function too, as {spec}:FUNCTION")
        raise UnknownKernelName(spec, registry)
    where, function = spec.rsplit(":", 1)
    if not where or not function:
        raise KernelSpecError(f"{spec!r}: expected module:function or path/to/file.py:function")
    return where, function


def found_module(name: str) -> importlib.machinery.ModuleSpec | None:
    """How ``name`` is or would be imported here, found without running any module's code
    (``importlib.util.find_spec`` of a dotted name imports its parents): the module already
    imported, else its top-level package by the import system's finders (an editable
    install's too) from the working directory's path (:func:`_import_from_working_directory`),
    then each level below in its parent's ``__path__``. None where it is not found.

    A parent that never imports an outside module (isolation's, whose worker imports it)
    still names its file and its root for the reports and replays."""
    module = sys.modules.get(name)
    if module is not None:
        return getattr(module, "__spec__", None)
    _import_from_working_directory()
    parts = name.split(".")
    try:
        found = importlib.util.find_spec(parts[0])
    except (ImportError, ValueError):
        return None
    for depth in range(2, len(parts) + 1):
        if found is None or found.submodule_search_locations is None:
            return None
        search = list(found.submodule_search_locations)
        found = importlib.machinery.PathFinder.find_spec(".".join(parts[:depth]), search)
    return found


def _module_file(where: str) -> Path | None:
    """The file of module ``where`` (:func:`found_module`), None for one without a file."""
    found = found_module(where)
    if found is None or not found.has_location or found.origin is None:
        return None
    return Path(found.origin)


def import_root(spec: str) -> Path | None:
    """The ``sys.path`` directory that a ``package.module:function`` spec's module is
    imported from (the directory holding its top-level package), imported or not
    (:func:`found_module`); None for the other forms of spec and for a module not found,
    or not found in a file.

    A command printed for another process (a replay) names the module only; that process
    finds it from its working directory (:func:`_import_from_working_directory`) or its
    ``PYTHONPATH``, so a root that is neither (a ``src/`` layout on pytest's
    ``pythonpath``) must go on the printed command's ``PYTHONPATH``.
    """
    if ":" not in spec or release_of(spec) is not None:
        return None
    where = spec.rsplit(":", 1)[0]
    source = None if where.endswith(".py") else _module_file(where)
    if source is None:
        return None
    # Module a.b.c is <root>/a/b/c.py and package a.b is <root>/a/b/__init__.py: two
    # levels below the root either way.
    levels = where.count(".") + (source.name == "__init__.py")
    return source.resolve().parents[levels]


def release_of(
    spec: str, default_function: str = releases.DEFAULT_FUNCTION
) -> releases.ReleaseSpec | None:
    """``spec`` as a vLLM release (``vllm==X``, its version normalised, its function
    ``default_function`` unless it names one), None when it names none;
    :class:`KernelSpecError` when its version is not a version."""
    try:
        return releases.parse_spec(spec, default_function)
    except releases.MalformedVersion as exc:
        raise KernelSpecError(f"{spec}: {exc}") from None


def release_file(version: str, name: str, function: str, members: tuple[str, ...]) -> JudgedFile:
    """The file of release ``version`` (``name``) that defines ``function``: the newest of
    ``members`` (the files the routine lived in, oldest first) it has that does (a moved
    routine can leave its old file behind). ``KernelLoadError`` with one line when none
    does."""
    found = release_file_defining(version, function, members)
    if found is None:
        raise KernelLoadError(f"{name}: none of {', '.join(members)} defines {function}")
    return found


def release_file_defining(
    version: str, function: str, members: tuple[str, ...]
) -> JudgedFile | None:
    """:func:`release_file`, or None when no file of ``members`` the release has defines
    ``function``; a fetch that fails for any other reason raises."""
    for member in reversed(members):
        if releases.lacks(version, member):
            continue
        try:
            kept = releases.fetch(version, member)
        except KernelLoadError:
            if releases.lacks(version, member):  # learnt by this fetch
                continue
            raise
        if f"def {function}(".encode() in kept.source:
            return JudgedFile(str(kept.path), kept.sha256)
    return None


def canonical_spec(spec: str) -> str:
    """``spec`` as reports and replays spell it: a release with its version normalised
    (``vllm==0.30`` is ``vllm==0.30.0``) and the function it names kept as named, anything
    else as given. The function stays even when it is the fused op's: the op the spec is
    for is not known here, and another op must see the function it was given (to refuse
    one it does not judge), not its own default in its place."""
    release = release_of(spec)
    if release is None:
        return spec
    return f"{release.name}:{release.function}" if ":" in spec else release.name


def _defined_by(node: ast.stmt) -> set[str]:
    """The module-level names a top-level statement binds."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {node.name}
    targets = node.targets if isinstance(node, ast.Assign) else []
    if isinstance(node, ast.AnnAssign | ast.AugAssign):
        targets = [node.target]
    return {t.id for t in targets if isinstance(t, ast.Name)}


def _free_names(node: ast.stmt) -> set[str]:
    """The names a statement reads that it does not bind itself (its arguments, its
    locals), builtins and annotations (never evaluated, see ``definitions_alone``)
    excepted: what it needs from its module."""
    annotations = [
        a
        for n in ast.walk(node)
        for a in (
            getattr(n, "annotation", None) if isinstance(n, ast.arg | ast.AnnAssign) else None,
            n.returns if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) else None,
        )
        if a is not None
    ]
    in_annotations = {id(n) for a in annotations for n in ast.walk(a)}
    names = [n for n in ast.walk(node) if isinstance(n, ast.Name) and id(n) not in in_annotations]
    local = {a.arg for a in ast.walk(node) if isinstance(a, ast.arg)}
    local |= {n.id for n in names if isinstance(n.ctx, ast.Store)}
    nested = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef  # a class body's methods
    local |= {n.name for n in ast.walk(node) if isinstance(n, nested) and n is not node}
    local |= {
        alias.asname or alias.name.split(".")[0]
        for i in ast.walk(node)
        if isinstance(i, ast.Import | ast.ImportFrom)
        for alias in i.names
    }
    used = {n.id for n in names if isinstance(n.ctx, ast.Load)}
    return used - local - set(dir(builtins)) - _defined_by(node)


def _imported_from(tree: ast.Module) -> dict[str, tuple[str, str]]:
    """Each name a module's top-level ``from X import name [as alias]`` binds:
    ``alias -> (X, name)``."""
    return {
        alias.asname or alias.name: (node.module, alias.name)
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0
        for alias in node.names
    }


def definitions_alone(
    path: Path,
    entry: str,
    provided: dict[str, object],
    where: str,
    neighbours: dict[str, Path] | None = None,
) -> dict[str, object]:
    """``entry`` of the file at ``path`` and the top-level definitions of that file it
    needs, compiled alone (annotations left unevaluated) with ``provided`` as their only
    other globals: the file's own code, without the imports of the project it belongs to.
    A name the file imports from one of ``neighbours`` (module name -> its file, files of
    the same project at hand) is taken alone from there the same way. Returns the
    namespace they were defined in. ``AdapterError`` naming what is missing when
    ``entry`` is not defined there or needs a name neither the files nor ``provided``
    give. Compiled at their own lines of ``path``, so Triton reads a kernel's source where
    it lies."""
    neighbours = neighbours or {}
    path = substituted(path)
    tree = ast.parse(source_of(path), filename=str(path))
    imported = _imported_from(tree)
    statements = {name: node for node in tree.body for name in _defined_by(node)}
    if entry not in statements:
        raise AdapterError(f"{where}: {path} has no {entry!r}")
    needed: list[ast.stmt] = []
    foreign: set[str] = set()
    pending = [entry]
    while pending:
        node = statements[pending.pop()]
        if node in needed:
            continue
        needed.append(node)
        for name in sorted(_free_names(node)):
            if name in statements:
                pending.append(name)
            elif name in provided:
                continue
            elif imported.get(name, ("", ""))[0] in neighbours:
                module, original = imported[name]
                found = definitions_alone(neighbours[module], original, provided, where, neighbours)
                provided = {**provided, name: found[original]}
            else:
                foreign.add(name)
    if foreign:
        given = ", ".join(provided)
        raise AdapterError(f"{where}: {entry} uses {', '.join(sorted(foreign))}, not {given} alone")
    code = compile(
        ast.Module(body=sorted(needed, key=lambda n: n.lineno), type_ignores=[]),
        str(path),
        "exec",
        flags=__future__.annotations.compiler_flag,
        dont_inherit=True,
    )
    # a module of its own in sys.modules, as dataclasses and Triton look a class's or a
    # kernel's module up there
    name = f"dcpcheck_alone_{hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]}"
    module = ModuleType(name, f"{entry} of {path}, alone")
    module.__dict__.update(provided)
    sys.modules[name] = module
    try:
        exec(code, module.__dict__)
    except Exception as exc:  # the file's own code, run without its project
        del sys.modules[name]
        first = f"{type(exc).__name__}: {exc}".splitlines()[0]
        raise AdapterError(f"{where}: {entry} does not load alone from {path}: {first}") from exc
    return module.__dict__


def check_callable_spec(spec: str, registry: list[str]) -> None:
    """What :func:`load_callable` would refuse of ``spec`` before running any of its code:
    a spec wrong in itself (:class:`KernelSpecError`), a file that is not there or does not
    parse (:class:`KernelLoadError`)."""
    where, _ = _split_spec(spec, registry)
    if where.endswith(".py"):
        _parsed(substituted(Path(where)))


def load_callable(spec: str, registry: list[str]) -> object:
    """The callable a ``package.module:function`` or ``path/to/file.py:function`` spec
    names, as its module defines it (no adapter); ``registry`` names the registered kernels
    a spec without ``:`` is taken to misspell. :class:`KernelLoadError` (or its
    :class:`KernelSpecError`) with one line otherwise; ``import_probe.KernelImportLost`` when
    a probe, asked for, ends in its import (module docstring)."""
    where, function = _split_spec(spec, registry)
    if import_probe.wanted() and (where.endswith(".py") or where not in sys.modules):
        import_probe.probe(where)
    module = module_of(where)
    target = getattr(module, function, None)
    if target is None:
        raise KernelLoadError(f"{where}: has no function {function!r}")
    if not callable(target):
        raise KernelLoadError(f"{where}:{function} is not callable")
    return target


@dataclasses.dataclass(frozen=True)
class JudgedFile:
    """A file a kernel's code comes from, as the reports name it; ``runs`` is False for a
    file read only for its callers' lines, none of whose code the kernel runs (what
    ``dcpcheck mutate`` never edits)."""

    path: str
    sha256: str
    runs: bool = True

    def reported(self) -> dict[str, str]:
        """What a report says of it: the path and its SHA256."""
        return {"path": self.path, "sha256": self.sha256}


def judged_file(path: Path) -> JudgedFile:
    """``path`` and its SHA256 now, as a report names a judged file."""
    return JudgedFile(str(path.resolve()), hashlib.sha256(path.read_bytes()).hexdigest())


def spec_files(spec: str) -> tuple[JudgedFile, ...]:
    """The file a ``path/to/file.py:function`` or ``package.module:function`` spec's code
    comes from, imported or not (:func:`found_module`), and its SHA256 now; none for a
    module without a file. Each op names its own registry's and releases' files and asks
    this of the rest."""
    where = spec.rsplit(":", 1)[0]
    source = Path(where) if where.endswith(".py") else _module_file(where)
    return () if source is None else (judged_file(source),)


def mutant_name(function: object) -> str:
    """The registry name of an op's mutant function: ``mutant/`` and its name in dashes
    (``interleave_ignored`` is ``mutant/interleave-ignored``)."""
    return "mutant/" + function.__name__.replace("_", "-")  # type: ignore[attr-defined]


def summary(function: object) -> str:
    """A mutant's description, as ``dcpcheck list kernels`` and the selftest print it: the
    first line of its docstring."""
    return (function.__doc__ or "").split("\n")[0]
