"""Make each of Triton's CPU interpreter's block types, and each tensor shape, once rather
than once per operation.

What it costs. Every operation the interpreter runs types its result with a
``tl.block_type`` and wraps it in a ``tl.tensor``. ``InterpreterBuilder.get_block_ty`` and
``block_type.with_element_ty`` build a new block type each time: its constructor unwraps the
shape into a ``tl.tuple`` (whose own type is built element by element), checks it and
formats its name, about 30 us (triton 3.9). ``tensor.__init__`` then builds the tensor's
shape again, a ``tl.tuple`` of ``constexpr`` s, and its element count. A kernel has few
distinct types (an element type and a shape each), and the interpreter builds them again
for every operation of every program of its grid: ``dcpcheck hash --dcp 1,4 --kernel
vllm==0.12.0`` built 259,520 block types and 484,659 tensor shapes, 7.5 and 6.6 s of its
55.8 s under cProfile.

Why one object can serve every use. A block type, and a tensor's ``shape`` and ``numel``,
are written once, by their constructors: nothing in Triton's language or interpreter
assigns to them afterwards (the one writer of a ``tl.tuple``, ``_setitem``, is the
compiler's code generator's, which an interpreted kernel never reaches, and a ``tl.tuple``
has no item assignment). Two block types are equal exactly when their element types and
shapes are (``block_type.__eq__``). So the two builders above hand out the block type
Triton's own constructor made the first time that element type and shape were asked, and
a tensor takes the ``shape`` and ``numel`` Triton's constructor made for the first tensor
of its type; every value an operation computes is the same.

Checked, not assumed. Before anything is installed, cached block types and tensors are
compared with fresh ones for a sample of element types and shapes (a block type's name,
shape, element count and equality; a tensor's every attribute). If any differ, or Triton's
internals have moved, nothing is replaced and the status says why in the backend's line:
the interpreter is then only slower.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from dcpcheck.interpreter.builder_methods import wrap_builder_methods

_MARK = "_dcpcheck_block_types_once"
_status: str | None = None
INSTALLED = "block types and tensor shapes built once"


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


def _type_key(ty: Any) -> tuple:
    """A tensor type (a block type or a scalar one) as ``_cache`` keys it."""
    return (_element_key(ty.scalar), _shape_key(ty.shape) if ty.is_block() else None)


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


def _shared_shapes(init: Callable[..., None]) -> Callable[..., None]:
    """``tensor.__init__`` that gives a tensor the ``shape`` and ``numel`` ``init`` built
    for the first tensor of an equal type (module docstring); a type this cannot key goes
    through ``init``."""
    made: dict[tuple, tuple[Any, Any]] = {}

    @functools.wraps(init)
    def tensor_init(self: Any, handle: Any, type: Any) -> None:
        try:
            key = _type_key(type)
            numel, shape = made[key]
        except KeyError:
            init(self, handle, type)
            made[key] = (self.numel, self.shape)
            return
        except (TypeError, AttributeError):  # a type this cannot key
            init(self, handle, type)
            return
        self.handle, self.type, self.dtype = handle, type, type.scalar
        self.numel, self.shape = numel, shape

    return tensor_init


def _described(tensor: Any) -> dict[str, Any]:
    """Every attribute of ``tensor``, constexprs and ``tl.tuple`` s as plain values."""
    return {
        name: [getattr(v, "value", v) for v in value] if name == "shape" else value
        for name, value in vars(tensor).items()
    } | {"numel": tensor.numel.value}


def _disagreement(
    cached: Callable[[Any, Any], Any], tensor_init: Callable[..., None]
) -> str | None:
    """Where a cached block type or a tensor given a shared shape differs from a fresh one,
    in a few words; None if nowhere."""
    import triton.language as tl

    element_types = (tl.float32, tl.bfloat16, tl.int32, tl.int1, tl.pointer_type(tl.float16))
    for element_ty in element_types:
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
        for ty in (element_ty, tl.block_type(element_ty, [4, 8])):
            for _ in range(2):  # the first builds what the second shares
                shared = tl.tensor.__new__(tl.tensor)
                tensor_init(shared, "handle", ty)
            if _described(shared) != _described(tl.tensor("handle", ty)):
                return f"a tensor of {ty} differs with a shared shape"
    return None


def install_block_types_once() -> str:
    """Have the running interpreter build each block type and tensor shape once (module
    docstring), once per process; the status as the backend's line shows it. Call only on
    the interpreted backend (it imports Triton's interpreter)."""
    global _status
    if _status is not None:
        return _status
    try:
        import triton.language as tl

        block_type, tensor = tl.core.block_type, tl.core.tensor
        with_element_ty = block_type.with_element_ty
        if getattr(with_element_ty, _MARK, False):
            _status = INSTALLED
            return _status
        cached = _cache(lambda element_ty, shape: block_type(element_ty, list(shape)))
        tensor_init = _shared_shapes(tensor.__init__)
        problem = _disagreement(cached, tensor_init)
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

        for replacement in (with_element, tensor_init):
            setattr(replacement, _MARK, True)
        block_type.with_element_ty = with_element
        tensor.__init__ = tensor_init
    except (ImportError, AttributeError) as exc:
        _status = f"block types built per operation ({exc})"
    else:
        _status = INSTALLED
    return _status
