"""Aliases dropped before partitioning (fuseml/alias_drop.py)."""

import torch

from fuseml.alias_drop import drop_aliases

aten = torch.ops.aten


def test_an_alias_between_ops_is_dropped_and_a_returned_one_kept():
    """An alias (detach decomposed) read by an op of the graph is dropped, its reader reading
    its operand (a view between two pointwise ops would cut their group in two); one the graph
    returns stays. The graph computes what it did."""

    def f(x):
        t = aten.tanh.default(x)
        inner = aten.mul.Tensor(aten.alias.default(t), 2.0)
        return inner, aten.alias.default(t)

    gm = torch.fx.symbolic_trace(f)
    x = torch.randn(4, 8)
    want = f(x)
    assert drop_aliases(gm) == 1
    aliases = [n for n in gm.graph.nodes if n.target is aten.alias.default]
    assert len(aliases) == 1 and [u.op for u in aliases[0].users] == ["output"]
    mul = next(n for n in gm.graph.nodes if n.target is aten.mul.Tensor)
    assert mul.args[0].target is aten.tanh.default
    for a, b in zip(gm(x), want):
        assert torch.equal(a, b)
