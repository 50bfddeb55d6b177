"""Per-column ops on a column reduction's result run in the reduction's shape
(column_shape.py): batch norm's rsqrt(var + eps), running-statistic updates and casts read
the [1, C] mean through views to [1, C, 1, 1] or [C]; rewritten, they read the mean itself
(and join its column group), their other operands viewed to [1, C], and their users get the
old shapes back through views. Values exactly as before."""

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from fuseml import ops
from fuseml.column_shape import keep_column_shape

aten = torch.ops.aten


def stats(x, running):
    m = x.mean(0, keepdim=True)  # [1, C]: a column reduction
    r = torch.rsqrt(m.view(1, 1, 1, -1).permute(0, 3, 1, 2) + 1e-5)  # [1, C, 1, 1]
    new_running = m.squeeze(0) * 0.1 + running * 0.9  # [C]
    big = x * m  # a broadcast over the rows: not per column, left as it was
    return r, new_running.to(torch.bfloat16), big


def test_per_column_ops_read_the_reduction():
    x, running = torch.rand(64, 8), torch.randn(8)
    gm = make_fx(stats, tracing_mode="fake")(x, running)
    moved = keep_column_shape(gm)
    assert moved >= 4  # add, rsqrt, the two scalings, their add, the cast
    (mean,) = [n for n in gm.graph.nodes if ops.column_reduction(n)]
    readers = {u.target for u in mean.users}
    assert aten.add.Tensor in readers and aten.mul.Tensor in readers
    for n in gm.graph.nodes:  # every pointwise op of C elements now computes [1, C]
        v = n.meta.get("val")
        if n.op == "call_function" and n.target in (aten.rsqrt.default, aten._to_copy.default):
            assert list(v.shape) == [1, 8], n.format_node()
    got = gm(x, running)
    want = stats(x, running)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)


def test_nothing_without_a_column_reduction():
    """Per-channel ops of parameters alone (eval batch norm's rsqrt(running_var + eps)) stay
    as they were: they join the normalising kernel, which computes them per element."""

    def f(x, var):
        return x * torch.rsqrt(var.view(1, -1) + 1e-5)

    gm = make_fx(f, tracing_mode="fake")(torch.randn(4, 8), torch.rand(8))
    before = [n.format_node() for n in gm.graph.nodes]
    assert keep_column_shape(gm) == 0
    assert [n.format_node() for n in gm.graph.nodes] == before
