"""Make each of Triton's CPU interpreter's block types once, not once per operation.

What it costs. Every operation the interpreter runs types its result with a
``tl.block_type``: ``InterpreterBuilder.get_block_ty`` and ``block_type.with_element_ty``
build a new one each time, and its constructor unwraps the shape into a ``tl.tuple``
(whose own type is built element by element), checks it and formats its name: about 30 us
(triton 3.9). A kernel has few distinct block types (an element type and a shape each),
and the interpreter builds them again for every operation of every program of its grid:
``dcpcheck hash --dcp 1,4 --kernel vllm==0.12.0`` built 259,520, 7.5 s of its 55.8 s under
cProfile.

Why one object can serve every use. A block type is written once, by its constructor:
nothing in Triton's language or interpreter assigns to one afterwards, and two are equal
exactly when their element types and shapes are (``block_type.__eq__``). So the two
builders above hand out the block type Triton's own constructor made the first time that
element type and shape were asked, and the values every operation computes are the same.

Checked, not assumed. Before anything is installed, a block type from the cache is
compared with a fresh one for a sample of element types and shapes (name, shape, element
count, equality). If they differ, or Triton's internals have moved, nothing is replaced and
the status says why in the backend's line: the interpreter is then only slower.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from dcpcheck.interpreter.builder_methods import wrap_builder_methods

_MARK = "_dcpcheck_block_types_once"
_status: str | None = None


def _shape_key(shape: Any) -> tuple:
    """``shape`` (a list or tuple of ints or constexprs, or a ``tl.tuple``) as plain ints."""
    return tuple(getattr(size, "value", size) for size in shape)


def _element_key(element_ty: Any) -> tuple:
    """What makes two element types equal, hashable: a pointer type (which Triton leaves
    unhashable) by what it points to, its address space and constness; any other by its
    class and name (``dtype.__eq__`` compares names)."""
    if element_ty.is_ptr():
        pointee = _element_key(element_ty.element_ty)
        return (type(element_ty), pointee, element_ty.address_space, element_ty.const)
    return (type(element_ty), element_ty.name)


def _cache(make: Callable[[Any, tuple], Any]) -> Callable[[Any, Any], Any]:
    """``made(element_ty, shape)``: the block type ``make`` built for that element type and
    shape, built on first use. A shape or element type this cannot key is built afresh
    each time, as Triton would."""
    made: dict[tuple, Any] = {}

    def block_type(element_ty: Any, shape: Any) -> Any:
        try:
            key = (_element_key(element_ty), _shape_key(shape))
            return made[key]
        except KeyError:
            made[key] = answer = make(element_ty, shape)
            return answer
        except (TypeError, AttributeError):  # a shape or type this cannot key
            return make(element_ty, shape)

    return block_type


def _disagreement(cached: Callable[[Any, Any], Any]) -> str | None:
    """Where a cached block type differs from a fresh one, in a few words; None if nowhere."""
    import triton.language as tl

    for element_ty in (tl.float32, tl.bfloat16, tl.int32, tl.int1, tl.pointer_type(tl.float16)):
        for shape in ([16], (4, 8), [1, 128], (2, 4, 8)):
            first, again = cached(element_ty, shape), cached(element_ty, list(shape))
            fresh = tl.block_type(element_ty, list(shape))
            same = (first.name, first.numel, list(first.shape)) == (
                fresh.name,
                fresh.numel,
                list(fresh.shape),
            )
            if not (same and first == fresh and again is first):
                return f"block type {fresh.name} differs when cached"
    return None


def install_block_types_once() -> str:
    """Have the running interpreter build each block type once (module docstring), once
    per process; the status as the backend's line shows it. Call only on the interpreted
    backend (it imports Triton's interpreter)."""
    global _status
    if _status is not None:
        return _status
    try:
        import triton.language as tl

        block_type = tl.core.block_type
        with_element_ty = block_type.with_element_ty
        if getattr(with_element_ty, _MARK, False):
            _status = "block types built once"
            return _status
        cached = _cache(lambda element_ty, shape: block_type(element_ty, list(shape)))
        problem = _disagreement(cached)
        if problem is not None:
            _status = f"block types built per operation ({problem})"
            return _status

        def builder_method(_original: Callable[..., Any], _interpreter: Any) -> Callable:
            @functools.wraps(_original)
            def get_block_ty(self, dtype, shape):
                return cached(dtype, shape)

            return get_block_ty

        wrap_builder_methods({"get_block_ty": builder_method}, _MARK)

        @functools.wraps(with_element_ty)
        def with_element(self, scalar_ty):
            return cached(scalar_ty, self.shape)

        setattr(with_element, _MARK, True)
        block_type.with_element_ty = with_element
    except (ImportError, AttributeError) as exc:
        _status = f"block types built per operation ({exc})"
    else:
        _status = "block types built once"
    return _status
