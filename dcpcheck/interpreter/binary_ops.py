"""Make Triton's CPU interpreter skip the conversions of a binary operation whose operands
need none.

What it costs. Every ``+``, ``*``, ``<``, ``&`` of an interpreted kernel first goes through
``TritonSemantic.binary_op_type_checking_impl``: it checks pointer operands, works out the
computation type (``computation_type_impl``, a ladder of dtype predicates), casts both
operands to it, then broadcasts them to one shape (``broadcast_impl_value``, which compares
the shapes as ``tl.tuple`` s, about 10 us a comparison). For two operands of one type, the
commonest case in a kernel (``offsets * stride``, ``acc + x``), every step hands the
operands back unchanged; for two blocks of one shape the broadcast does. The interpreter
pays this for every operation of every program of its grid: skipping it takes a tenth off
a kernel-bound property search (two of the suite's, 15.3 s and 15.5 s of CPU against 13.6 s
and 13.8 s, triton 3.9; BENCHMARKS.md).

Why each shortcut changes nothing. Three replacements, each answering what Triton's own
function answers:

* ``computation_type_impl`` is a function of its two dtypes' names, the two scalar flags
  and ``div_or_mod`` alone (every predicate it asks of a dtype reads the name), so its
  answer is kept per those five values; a pair it refuses is asked again every time.
* ``binary_op_type_checking_impl`` of two tensors of one non-pointer type, whose
  computation type is that type: the pointer checks pass, both casts return their input
  (``cast`` returns a tensor already of the asked element type), and the broadcast of two
  blocks of one shape returns its operands. So it returns ``(lhs, rhs)`` at once.
* ``broadcast_impl_value`` of two blocks of one shape returns ``(lhs, rhs)``, as Triton's
  does when no dimension differs.

Only the interpreter's own ``TritonSemantic`` instance is changed, never the class, so a
compile for a GPU in the same process goes through Triton's code. Checked, not assumed:
before anything is installed, each replacement is compared with Triton's function over
every pair of a sample of element types, shapes and Python scalars; if any answer
differs, or Triton's internals have moved, nothing is replaced and the backend's line
says why (the interpreter is then only slower).
"""

from __future__ import annotations

import functools
import importlib
import itertools
from collections.abc import Callable
from typing import Any

from dcpcheck.interpreter.block_types import _shape_key

_status: str | None = None
INSTALLED = "binary operations of one type unconverted"
_NAMES = ("computation_type_impl", "binary_op_type_checking_impl", "broadcast_impl_value")


def _computation_types(original: Callable[..., Any]) -> Callable[..., Any]:
    """``computation_type_impl`` answering each dtype pair once (module docstring)."""
    answers: dict[tuple, Any] = {}

    @functools.wraps(original)
    def computation_type_impl(a_ty, a_is_scalar, b_ty, b_is_scalar, div_or_mod):
        key = (a_ty.name, a_is_scalar, b_ty.name, b_is_scalar, div_or_mod)
        try:
            return answers[key]
        except KeyError:
            answers[key] = answer = original(a_ty, a_is_scalar, b_ty, b_is_scalar, div_or_mod)
            return answer

    return computation_type_impl


def _same_type_operands(
    original: Callable[..., Any], computation_type: Callable[..., Any], tensor: type
) -> Callable[..., Any]:
    """``binary_op_type_checking_impl`` returning two operands of one type at once."""

    @functools.wraps(original)
    def binary_op_type_checking_impl(
        lhs,
        rhs,
        allow_lhs_ptr=False,
        allow_rhs_ptr=False,
        arithmetic_check=True,
        div_or_mod=False,
    ):
        if arithmetic_check and type(lhs) is tensor and type(rhs) is tensor:
            ty = lhs.type
            if ty is rhs.type or ty == rhs.type:
                scalar = ty.scalar
                if not scalar.is_ptr():
                    wanted = computation_type(scalar, False, scalar, False, div_or_mod)
                    if wanted.name == scalar.name:
                        return lhs, rhs
        return original(lhs, rhs, allow_lhs_ptr, allow_rhs_ptr, arithmetic_check, div_or_mod)

    return binary_op_type_checking_impl


def _same_shape_broadcast(original: Callable[..., Any]) -> Callable[..., Any]:
    """``broadcast_impl_value`` returning two blocks of one shape at once."""

    @functools.wraps(original)
    def broadcast_impl_value(lhs, rhs):
        left, right = lhs.type, rhs.type
        blocks = left.is_block() and right.is_block()
        if blocks and _shape_key(left.shape) == _shape_key(right.shape):
            return lhs, rhs
        return original(lhs, rhs)

    return broadcast_impl_value


def _outcome(function: Callable[..., Any], *args: Any) -> Any:
    """What ``function(*args)`` returns as comparable values (each tensor its type, and
    whether it is the first or second argument handed back), or the class of what it
    raises."""
    try:
        answer = function(*args)
    except Exception as exc:  # Triton refuses many pairs: the refusal is the answer
        return type(exc)
    if isinstance(answer, tuple):
        return tuple((t is args[0], t is args[1], str(t.type)) for t in answer)
    return answer.name


def _disagreement(semantic: Any, replaced: dict[str, Callable[..., Any]]) -> str | None:
    """Where a replacement answers otherwise than Triton's function, in a few words; None
    if nowhere. Operands are built on the interpreter's builder, as a kernel's are."""
    import triton.language as tl

    def differs(name: str, *args: Any) -> bool:
        return _outcome(replaced[name], *args) != _outcome(getattr(semantic, name), *args)

    scalars = (tl.int1, tl.uint8, tl.int32, tl.int64, tl.float16, tl.bfloat16, tl.float32)
    scalars += (tl.float8e4nv,)
    flags = ((False, False, False), (True, False, False), (False, True, True), (False, False, True))
    for (a, b), (a_is, b_is, div) in itertools.product(itertools.product(scalars, repeat=2), flags):
        if differs("computation_type_impl", a, a_is, b, b_is, div):
            return f"computation type of {a} and {b} differs"

    def made(element_ty: Any, shape: tuple[int, ...]) -> Any:
        if not shape:
            return semantic.scalar_constant(0, element_ty)
        return semantic.full(list(shape), 0, element_ty)

    shapes = {tl.int1: [(4,)], tl.int32: [(), (4,), (2, 4)], tl.bfloat16: [(4,), (2, 4)]}
    shapes[tl.float32] = [(), (4,), (1, 4)]
    operands = [made(element, shape) for element, some in shapes.items() for shape in some]
    addresses = semantic.full([4], 0, tl.int64).handle
    pointers = semantic.tensor(addresses, tl.block_type(tl.pointer_type(tl.float32), [4]))
    operands += [pointers, 3, 2.5]
    for lhs, rhs in itertools.product(operands, repeat=2):
        for options in ((False, False, True, False), (True, True, True, True)):
            if differs("binary_op_type_checking_impl", lhs, rhs, *options):
                return f"operands {lhs} and {rhs} converted otherwise"
        tensors = isinstance(lhs, tl.tensor) and isinstance(rhs, tl.tensor)
        if tensors and differs("broadcast_impl_value", lhs, rhs):
            return f"blocks of {lhs.type} and {rhs.type} broadcast otherwise"
    return None


def install_binary_ops_unconverted() -> str:
    """Have the running interpreter skip the conversions of operands that need none
    (module docstring), once per process; the status as the backend's line shows it. Call
    only on the interpreted backend (it imports Triton's interpreter)."""
    global _status
    if _status is not None:
        return _status
    try:
        import triton.language as tl

        interpreter = importlib.import_module("triton.runtime.interpreter")
        semantic = interpreter.interpreter_semantic
        originals = {name: getattr(semantic, name) for name in _NAMES}
        computation_type = _computation_types(originals["computation_type_impl"])
        replaced = {
            "computation_type_impl": computation_type,
            "binary_op_type_checking_impl": _same_type_operands(
                originals["binary_op_type_checking_impl"], computation_type, tl.tensor
            ),
            "broadcast_impl_value": _same_shape_broadcast(originals["broadcast_impl_value"]),
        }
        problem = _disagreement(semantic, replaced)
    except Exception as exc:  # moved internals: a speed-up must never cost the backend
        _status = f"binary operations converted as Triton does ({exc})"
        return _status
    if problem is not None:
        _status = f"binary operations converted as Triton does ({problem})"
        return _status
    for name, replacement in replaced.items():
        setattr(semantic, name, replacement)
    _status = INSTALLED
    return _status
