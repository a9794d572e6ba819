"""A variant of the project's kernel compiled (``variants``): its edits applied to copies of
the kernel's files, each copy imported as a module of its own, and the kernel function of
the copy of ``kernel.py`` handed to the launcher.

The copies are written under the temporary directory, in a folder named by the SHA256 of
their text (Triton reads a jit function's source from its file, and compiles it once per
text whatever process asks). ``kernel.py`` imports its helpers (``index_cache``,
``nvfp4_ds_mla``) by name; a copy of it sees the edited copy of a helper in their place,
rebound in its namespace before anything is compiled. The correct kernel is the shipped
module itself.

Import this module only once ``dcpcheck.backend.current_backend()`` has chosen between
compiling and Triton's interpreter: Triton decides that when a kernel is defined.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import sys
import tempfile
from pathlib import Path
from types import ModuleType

from dcpcheck.files import write_atomic
from dcpcheck.ops.fused_norm_rope import index_cache, kernel, nvfp4_ds_mla
from dcpcheck.ops.fused_norm_rope.variants import (
    EDITABLE_FILES,
    KERNEL,
    MODULE,
    KernelVariant,
    SourceEdit,
)

HERE = Path(__file__).parent
SHIPPED: dict[str, ModuleType] = {
    KERNEL: kernel,
    "index_cache.py": index_cache,
    "nvfp4_ds_mla.py": nvfp4_ds_mla,
}
"""The shipped module of each editable file."""


class VariantError(RuntimeError):
    """An edit that does not apply to today's kernel: one line naming the variant, the
    file, the function and the text it looked for."""


def _span(text: str, function: str) -> tuple[int, int]:
    """The character range of ``function``'s definition in ``text`` (the file for
    ``MODULE``)."""
    if function == MODULE:
        return 0, len(text)
    lines = text.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef) and node.name == function:
            return starts[node.lineno - 1], starts[node.end_lineno]  # type: ignore[index]
    raise KeyError(function)


def applied(text: str, edit: SourceEdit, variant: str) -> str:
    """``text`` with ``edit`` applied; ``VariantError`` unless its ``old`` occurs exactly
    once in its function."""
    where = f"{variant}: {edit.file}, {edit.function}"
    try:
        start, end = _span(text, edit.function)
    except KeyError:
        raise VariantError(f"{where}: no such function") from None
    found = text.count(edit.old, start, end)
    if found != 1:
        first = edit.old.strip().splitlines()[0]
        raise VariantError(f"{where}: {first!r} occurs {found} times, not once")
    at = text.index(edit.old, start, end)
    return text[:at] + edit.new + text[at + len(edit.old) :]


def edited_sources(variant: KernelVariant) -> dict[str, str]:
    """The text of each file ``variant`` edits, edited."""
    texts: dict[str, str] = {}
    for edit in variant.edits:
        if edit.file not in EDITABLE_FILES:
            raise VariantError(f"{variant.name}: {edit.file} is not a file of the kernel")
        text = texts.get(edit.file) or (HERE / edit.file).read_text(encoding="utf-8")
        texts[edit.file] = applied(text, edit, variant.name)
    return texts


def _imported(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # Triton looks a kernel's module up by name
    spec.loader.exec_module(module)
    return module


@functools.cache
def kernel_of(variant: KernelVariant):  # -> triton.JITFunction
    """The fused kernel of ``variant`` (module docstring)."""
    if not variant.edits:
        return kernel._fused_norm_rope_kernel
    texts = edited_sources(variant)
    texts.setdefault(KERNEL, (HERE / KERNEL).read_text(encoding="utf-8"))
    digest = hashlib.sha256("\0".join(f"{f}\0{t}" for f, t in sorted(texts.items())).encode())
    folder = Path(tempfile.gettempdir()) / "dcpcheck-variants" / digest.hexdigest()[:16]
    modules: dict[str, ModuleType] = {}
    for file in sorted(texts, key=lambda f: f == KERNEL):  # helpers first, kernel.py last
        path = folder / file
        if not path.is_file() or path.read_text(encoding="utf-8") != texts[file]:
            folder.mkdir(parents=True, exist_ok=True)
            write_atomic(path, texts[file])
        name = f"dcpcheck_variant_{digest.hexdigest()[:12]}_{Path(file).stem}"
        modules[file] = _imported(path, name)
    copy = modules[KERNEL]
    for file, helper in modules.items():
        if file == KERNEL:
            continue
        shipped = SHIPPED[file]
        for name, value in list(vars(copy).items()):
            if getattr(shipped, name, None) is value and hasattr(helper, name):
                setattr(copy, name, getattr(helper, name))
    return copy._fused_norm_rope_kernel
