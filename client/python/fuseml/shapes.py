"""Questions about sizes, strides and scalars as fake tensors give them: plain Python numbers,
or SymInts/SymFloats where a dim is dynamic. Every answer here is given without adding a
guard: a guard would specialise the compiled graph on the size at hand.

Two words say how much a size is trusted:
  plain  a Python int (or number), never a SymInt, even one whose value is known;
  known  an int, or a SymInt whose expression is a number (a symbol since replaced by one).
The partition rules (ops.py, chains.py, siblings.py) ask for plain sizes, which the fragment
and the runtime can bake in; the fragment builders (fragment.py and its vocabularies) accept
known ones, which they turn into ints themselves."""

import numbers

import torch
from torch.fx.experimental.symbolic_shapes import is_concrete_int, statically_known_true


def is_plain_int(x):
    """x is a Python int, not a SymInt."""
    return isinstance(x, int) and not isinstance(x, torch.SymInt)


def is_known_int(x):
    """x is an int, or a SymInt whose value is a known number."""
    return isinstance(x, int) or is_concrete_int(x)


def is_plain_real(v):
    """v is a Python real number (bool, int or float), not a symbolic one."""
    return isinstance(v, numbers.Real) and not isinstance(v, torch.SymInt | torch.SymFloat | torch.SymBool)


def is_finite_plain_real(x):
    """A plain real that is neither NaN nor infinite."""
    return is_plain_real(x) and x == x and abs(x) != float("inf")


def known_true(expr):
    """True only when provable without a guard on a symbolic size."""
    return bool(expr) if isinstance(expr, bool) else statically_known_true(expr)


def plain_equal(a, b):
    """Two sizes that are equal: both plain ints of one value, or both symbolic and provably
    equal. A plain int never equals a SymInt, even one known to have its value."""
    if is_plain_int(a) and is_plain_int(b):
        return int(a) == int(b)
    if is_plain_int(a) != is_plain_int(b):
        return False
    return known_true(a == b)


def known_equal(a, b):
    """Two sizes that are equal: both known ints of one value, or both symbolic and provably
    equal. A known SymInt equals the plain int of its value."""
    if is_known_int(a) and is_known_int(b):
        return int(a) == int(b)
    if is_known_int(a) or is_known_int(b):
        return False
    return statically_known_true(a == b)


def same_plain_shape(a, b):
    """Shapes of one rank whose sizes are pairwise plain_equal."""
    return len(a) == len(b) and all(plain_equal(x, y) for x, y in zip(a, b))


def same_known_shape(a, b):
    """Shapes of one rank whose sizes are pairwise known_equal."""
    return len(a) == len(b) and all(known_equal(x, y) for x, y in zip(a, b))


def provably_same_ints(xs, ys):
    """Sequences of one length whose ints are equal and whose symbolic entries are provably
    equal to their counterparts (a SymInt may equal an int it is known to be)."""
    if len(xs) != len(ys):
        return False
    for x, y in zip(xs, ys):
        if isinstance(x, int) and isinstance(y, int):
            if x != y:
                return False
        elif not statically_known_true(x == y):
            return False
    return True


def has_plain_layout(v):
    """v is a tensor whose sizes, strides and storage offset are all plain ints."""
    if not isinstance(v, torch.Tensor):
        return False
    try:
        return all(isinstance(s, int) for s in (*v.shape, *v.stride(), v.storage_offset()))
    except (RuntimeError, NotImplementedError):  # a sparse or opaque tensor
        return False


def size_at_hand(x):
    """The value of a size now: its own when known, else its symbol's hint (the size of the
    example inputs); None when a symbolic size has no hint."""
    if is_known_int(x):
        return int(x)
    try:
        return int(x.node.hint)
    except (AttributeError, TypeError):
        return None


def dense_order(val):
    """The dims of val, outermost first, that lay it out contiguously when it is a permuted
    dense layout other than row-major (a transpose of a contiguous value); else None."""
    if not isinstance(val, torch.Tensor) or val.is_contiguous():
        return None
    sizes, strides = list(val.shape), list(val.stride())
    if not all(is_known_int(x) for x in sizes + strides):
        return None
    order = sorted(range(val.dim()), key=lambda d: (-int(strides[d]), d))
    expect = 1
    for d in reversed(order):
        if int(sizes[d]) != 1 and int(strides[d]) != expect:
            return None
        expect *= int(sizes[d])
    return order
