"""The size questions (shapes.py) by what each means: a plain int is a Python int, a known
int may also be a SymInt whose value is a number. The partition rules ask the first, the
fragment builders the second; the two differ exactly on such a SymInt."""

import sympy
import torch
from torch.fx.experimental.sym_node import SymNode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from fuseml import shapes


def _sizes():
    env = ShapeEnv()
    known = torch.SymInt(SymNode(sympy.Integer(4), env, int, hint=4))  # a symbol since fixed
    dynamic = env.create_symintnode(sympy.Symbol("s0", positive=True, integer=True), hint=8)
    return known, dynamic


def test_plain_and_known_differ_on_a_symint_of_known_value():
    known, dynamic = _sizes()
    assert shapes.is_plain_int(4) and shapes.is_known_int(4)
    assert not shapes.is_plain_int(known) and shapes.is_known_int(known)
    assert not shapes.is_plain_int(dynamic) and not shapes.is_known_int(dynamic)
    assert not shapes.plain_equal(known, 4) and shapes.known_equal(known, 4)
    assert not shapes.same_plain_shape([known, 2], [4, 2])
    assert shapes.same_known_shape([known, 2], [4, 2])


def test_symbolic_sizes_compare_without_a_guard():
    _, dynamic = _sizes()
    assert shapes.plain_equal(dynamic, dynamic) and shapes.known_equal(dynamic, dynamic)
    assert not shapes.plain_equal(dynamic, 8) and not shapes.known_equal(dynamic, 8)
    assert shapes.known_true(dynamic == dynamic) and not shapes.known_true(dynamic == 8)
    assert shapes.known_true(True) and not shapes.known_true(False)
    assert shapes.provably_same_ints([dynamic, 3], [dynamic, 3])
    assert not shapes.provably_same_ints([dynamic], [8])


def test_size_at_hand_is_the_value_or_the_hint():
    known, dynamic = _sizes()
    assert [shapes.size_at_hand(x) for x in (5, known, dynamic)] == [5, 4, 8]


def test_plain_layout_and_plain_reals():
    assert shapes.has_plain_layout(torch.empty(2, 3).t())
    assert not shapes.has_plain_layout(3)
    assert shapes.is_plain_real(1.5) and shapes.is_plain_real(True)
    assert shapes.is_finite_plain_real(2.0)
    assert not any(shapes.is_finite_plain_real(x) for x in (float("nan"), float("inf"), "1"))
